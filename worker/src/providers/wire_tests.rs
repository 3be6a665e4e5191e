use serde::Deserialize;
use serde_json::json;

use super::*;

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
struct Probe {
    #[serde(deserialize_with = "lenient")]
    text: Option<String>,
    #[serde(deserialize_with = "lenient")]
    count: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    inner: Option<Inner>,
    #[serde(deserialize_with = "lenient_list")]
    items: Vec<Inner>,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
struct Inner {
    #[serde(deserialize_with = "lenient")]
    n: Option<u64>,
}

fn inner(n: u64) -> Inner {
    Inner { n: Some(n) }
}

#[test]
fn fields_of_the_expected_shape_are_read() {
    let probe: Probe = parse(r#"{"text":"a","count":3,"inner":{"n":2},"items":[{"n":1}],"other":[1]}"#, "x").unwrap();
    assert_eq!(probe, Probe { text: Some("a".into()), count: Some(3), inner: Some(inner(2)), items: vec![inner(1)] });
}

#[test]
fn fields_of_another_shape_read_as_absent() {
    let probe: Probe = parse(r#"{"text":5,"count":-1,"inner":"x","items":{"n":1}}"#, "x").unwrap();
    assert_eq!(probe, Probe::default());
    let probe: Probe = parse(r#"{"text":null,"count":1.5,"inner":null,"items":null}"#, "x").unwrap();
    assert_eq!(probe, Probe::default());
}

#[test]
fn a_list_element_of_another_shape_keeps_its_place() {
    let probe: Probe = parse(r#"{"items":[{"n":1},null,7,{"n":"x"},[4],{"n":5}]}"#, "x").unwrap();
    let blank = Inner::default;
    assert_eq!(probe.items, vec![inner(1), blank(), blank(), blank(), blank(), inner(5)]);
}

#[test]
fn lists_never_read_as_structs() {
    // serde would take a list's items as a struct's fields in order.
    assert_eq!(parse::<Probe>(r#"["a", 3]"#, "x").unwrap(), Probe::default());
    assert_eq!(parse::<Probe>(r#"{"inner":[2]}"#, "x").unwrap(), Probe::default());
}

#[test]
fn only_data_that_is_not_json_is_an_error() {
    for data in ["null", "5", "\"x\"", "[]", "{}", "true"] {
        assert_eq!(parse::<Probe>(data, "x").unwrap(), Probe::default(), "{data}");
    }
    for data in ["{not json", "{\"text\":\"a\"} x", "", "[1,"] {
        let err = parse::<Probe>(data, "chunk").unwrap_err();
        assert!(matches!(&err, ProviderError::Decode(m) if m.starts_with("chunk is not JSON")), "{data}: {err:?}");
        assert!(!err.is_retryable());
    }
}

#[test]
fn arguments_come_as_text_or_as_an_object() {
    let read = |value: serde_json::Value| lenient::<_, Arguments>(value).unwrap();
    let text = read(json!("{\"a\":1}")).unwrap();
    assert_eq!((text.is_empty(), text.into_text()), (false, "{\"a\":1}".to_owned()));
    let object = read(json!({"a": 1})).unwrap();
    assert_eq!((object.is_empty(), object.into_text()), (false, "{\"a\":1}".to_owned()));
    assert!(read(json!("")).unwrap().is_empty());
    assert!(read(json!({})).unwrap().is_empty());
    assert!(read(json!(5)).is_none() && read(json!(["a"])).is_none());
}

#[test]
fn cached_tokens_are_taken_out_of_the_input() {
    let cached = CachedTokens { cached_tokens: Some(60) };
    let usage = usage_with_cached_input(Some(100), Some(5), Some(&cached));
    assert_eq!(usage, Usage { input_tokens: 40, output_tokens: 5, cache_read_tokens: 60, cache_write_tokens: 0 });
    // A report that claims more cached than input tokens does not wrap.
    let usage = usage_with_cached_input(Some(10), None, Some(&cached));
    assert_eq!((usage.input_tokens, usage.output_tokens, usage.cache_read_tokens), (0, 0, 60));
    assert_eq!(usage_with_cached_input(None, None, None), Usage::default());
}
