//! Refines the derived document where a derive cannot say enough: the
//! event kinds.
//!
//! utoipa renders [`kiln_protocol::EventBody`] (serde's adjacently tagged
//! `kind`/`payload`) as a `oneOf` of inline objects. Here each kind becomes
//! a named component (`tool.result` → `ToolResultEvent`), `EventBody` a
//! `oneOf` of references with a `kind` discriminator (so generated clients
//! get one type per kind), and `SseEvent` says how each kind travels over
//! SSE: `event:` the kind, `data:` the payload as JSON. Working from the
//! derived schema means a kind added to `EventBody` appears here with no
//! change to this file.

use serde_json::{Map, Value, json};

const COMPONENTS: &str = "#/components/schemas/";

#[derive(Debug, thiserror::Error)]
#[error("the derived EventBody schema is not the expected oneOf of {{kind, payload}} objects: {0}")]
pub struct ShapeError(&'static str);

pub fn refine(doc: &mut Value) -> Result<(), ShapeError> {
    let schemas = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
        .ok_or(ShapeError("no components.schemas"))?;
    let variants = match schemas.get_mut("EventBody").and_then(|b| b.get_mut("oneOf")).map(Value::take) {
        Some(Value::Array(variants)) => variants,
        _ => return Err(ShapeError("EventBody has no oneOf")),
    };
    let mut refs = Vec::new();
    let mut mapping = Map::new();
    let mut sse = Vec::new();
    for mut variant in variants {
        dedupe_description(&mut variant);
        let kind = variant
            .pointer("/properties/kind/enum/0")
            .and_then(Value::as_str)
            .ok_or(ShapeError("a variant has no kind"))?
            .to_owned();
        let name = component_name(&kind);
        if schemas.contains_key(&name) {
            return Err(ShapeError("an event kind's component name is taken"));
        }
        let reference = format!("{COMPONENTS}{name}");
        refs.push(json!({ "$ref": reference }));
        mapping.insert(kind.clone(), Value::String(reference.clone()));
        sse.push(sse_variant(&kind, &reference));
        schemas.insert(name, variant);
    }
    schemas.insert(
        "EventBody".into(),
        json!({
            "description": "What happened, by `kind`; `payload` depends on the kind. Clients should skip \
                kinds they do not know: newer servers may add kinds.",
            "oneOf": refs,
            "discriminator": { "propertyName": "kind", "mapping": mapping },
        }),
    );
    schemas.insert(
        "SseEvent".into(),
        json!({
            "description": "One Server-Sent Event of a run's stream, as its fields: `id` is the event's seq \
                (send it back as `Last-Event-ID` to resume), `event` its kind and `data` its payload as \
                JSON: together, `event` and `data` are an `EventBody`'s `kind` and `payload`. Between \
                events the server sends `: keep-alive` comments, which carry no event.",
            "oneOf": sse,
        }),
    );
    Ok(())
}

/// utoipa puts a variant's doc comment on both the variant and its payload;
/// once is enough.
fn dedupe_description(variant: &mut Value) {
    let outer = variant.get("description").cloned();
    if let Some(payload) = variant.pointer_mut("/properties/payload").and_then(Value::as_object_mut)
        && outer.is_some()
        && payload.get("description") == outer.as_ref()
    {
        payload.remove("description");
    }
}

/// `tool_call.started` → `ToolCallStartedEvent`.
fn component_name(kind: &str) -> String {
    let mut name: String = kind
        .split(['.', '_'])
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
        })
        .collect();
    name.push_str("Event");
    name
}

fn sse_variant(kind: &str, reference: &str) -> Value {
    json!({
        "type": "object",
        "required": ["id", "event", "data"],
        "properties": {
            "id": { "type": "string", "pattern": "^[1-9][0-9]*$", "description": "The event's seq." },
            "event": { "const": kind },
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": { "$ref": format!("{reference}/properties/payload") },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_a_component_behind_the_discriminator() {
        let doc = crate::openapi::document().unwrap();
        let schemas = &doc["components"]["schemas"];
        let mapping = schemas["EventBody"]["discriminator"]["mapping"].as_object().unwrap();
        assert_eq!(mapping["tool.result"], "#/components/schemas/ToolResultEvent");
        assert_eq!(mapping.len(), schemas["SseEvent"]["oneOf"].as_array().unwrap().len());
        let sandbox = &schemas["SandboxReadyEvent"];
        assert!(sandbox["description"].is_string());
        assert!(sandbox["properties"]["payload"].get("description").is_none(), "said once");
    }

    #[test]
    fn kinds_name_their_components() {
        assert_eq!(component_name("tool_call.started"), "ToolCallStartedEvent");
        assert_eq!(component_name("todo"), "TodoEvent");
        assert_eq!(component_name("run.timed_out"), "RunTimedOutEvent");
    }
}
