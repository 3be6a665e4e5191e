//! Nested objects of a request body, read as the OpenAPI document says.
//!
//! serde's derive also reads a struct from an array of its fields in order
//! (`"limits": [null, 5]`); the document says an object, so for the fields
//! marked with [`object`] anything but an object (or null) is refused. The
//! fields inside are read as they come, so an error still names its path
//! (`limits.max_steps: …`).

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// For `#[serde(deserialize_with = "…")]` on an optional nested struct.
pub(crate) fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_option(Nullable(PhantomData))
}

struct Nullable<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Nullable<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object or null")
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(Object(PhantomData)).map(Some)
    }
}

struct Object<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::run::CreateRun;

    fn parse(body: serde_json::Value) -> Result<CreateRun, serde_json::Error> {
        serde_json::from_value(body)
    }

    #[test]
    fn a_nested_struct_is_an_object_not_an_array() {
        for field in ["limits", "model", "sandbox", "repo"] {
            assert!(parse(json!({"prompt": "x", field: [null, null]})).is_err(), "{field}");
            assert!(parse(json!({"prompt": "x", field: null})).is_ok(), "{field}");
        }
        let spec = parse(json!({"prompt": "x", "limits": {"max_steps": 5}})).unwrap();
        assert_eq!(spec.limits.and_then(|l| l.max_steps), Some(5));
        let error = parse(json!({"prompt": "x", "limits": {"max_step": 5}})).unwrap_err().to_string();
        assert!(error.contains("unknown field `max_step`"), "{error}");
    }
}
