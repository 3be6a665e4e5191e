//! Nested objects of a request body, read as JSON Schema reads them.
//!
//! Two places where serde's derive and the OpenAPI document disagree, both
//! settled here in the document's favour:
//! - serde reads a struct from an array of its fields in order
//!   (`"limits": [null, 5]`); the document says an object, so an array is
//!   refused.
//! - JSON Schema's `integer` is any number without a fraction (`5.0` is
//!   one); serde's `u32` refuses `5.0`, so such numbers are read as
//!   integers.

use serde::de::{DeserializeOwned, Error};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Number, Value};

/// For `#[serde(deserialize_with = "…")]` on an optional nested struct.
pub(crate) fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let Some(mut map) = Option::<Map<String, Value>>::deserialize(deserializer)? else {
        return Ok(None);
    };
    for value in map.values_mut() {
        integral_as_integer(value);
    }
    T::deserialize(Value::Object(map)).map(Some).map_err(D::Error::custom)
}

/// `5.0` → `5`, within the range of an `i64` (every integer field's range
/// is inside it; a number outside stays what it is and is refused).
fn integral_as_integer(value: &mut Value) {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    if let Value::Number(n) = value
        && let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < LIMIT)
    {
        *n = Number::from(f as i64);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::run::{CreateRun, Limits};

    fn parse(body: serde_json::Value) -> Result<CreateRun, serde_json::Error> {
        serde_json::from_value(body)
    }

    #[test]
    fn a_nested_struct_is_an_object_not_an_array() {
        for field in ["limits", "model", "sandbox", "repo"] {
            assert!(parse(json!({"prompt": "x", field: [null, null]})).is_err(), "{field}");
        }
        assert_eq!(parse(json!({"prompt": "x", "limits": null})).unwrap().limits, None);
    }

    #[test]
    fn an_integral_number_is_an_integer() {
        let spec = parse(json!({"prompt": "x", "limits": {"max_steps": 5.0, "max_cost_usd": 2.0}})).unwrap();
        assert_eq!(spec.limits, Some(Limits { max_steps: Some(5), max_cost_usd: Some(2.0), ..Default::default() }));
        assert!(parse(json!({"prompt": "x", "limits": {"max_steps": 5.5}})).is_err());
        let error = parse(json!({"prompt": "x", "limits": {"max_step": 5}})).unwrap_err().to_string();
        assert!(error.contains("unknown field `max_step`"), "{error}");
    }
}
