use super::*;

fn usage(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, cache_read_tokens: cache_read, cache_write_tokens: cache_write }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

const TABLE: &str = r#"{
    "gpt-4o": {"input": 2.5, "output": 10, "cache_read": 1.25, "cache_write": 0},
    "gpt-4o-mini": {"input": 0.15, "output": 0.6, "cache_read": 0.075, "cache_write": 0},
    "claude-sonnet-4": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75},
    "local": {"input": 0, "output": 0}
}"#;

#[test]
fn cost_of_each_kind_of_token() {
    let table = PriceTable::from_json(TABLE).unwrap();
    assert_eq!(table.len(), 4);
    let cost = table.cost("claude-sonnet-4", &usage(1_000_000, 2_000_000, 10_000_000, 1_000_000)).unwrap();
    assert!(close(cost, 3.0 + 30.0 + 3.0 + 3.75), "{cost}");
    let cost = table.cost("gpt-4o-mini", &usage(1000, 500, 2000, 0)).unwrap();
    assert!(close(cost, (1000.0 * 0.15 + 500.0 * 0.6 + 2000.0 * 0.075) / 1e6), "{cost}");
    assert_eq!(table.cost("gpt-4o-mini", &Usage::default()), Some(0.0));
    assert_eq!(table.cost("local", &usage(5, 5, 5, 5)), Some(0.0));
}

#[test]
fn missing_cache_prices_fall_back_to_the_input_price() {
    let table = PriceTable::from_json(r#"{"m": {"input": 2, "output": 4}}"#).unwrap();
    let cost = table.cost("m", &usage(0, 0, 1_000_000, 1_000_000)).unwrap();
    assert!(close(cost, 4.0), "{cost}");
}

#[test]
fn exact_then_longest_prefix() {
    let table = PriceTable::from_json(TABLE).unwrap();
    assert_eq!(table.price("gpt-4o-mini").unwrap().input, 0.15);
    assert_eq!(table.price("gpt-4o-mini-2024-07-18").unwrap().input, 0.15, "not gpt-4o");
    assert_eq!(table.price("gpt-4o-2024-08-06").unwrap().input, 2.5);
    assert_eq!(table.price("gpt-4o").unwrap().input, 2.5);
    assert_eq!(table.price("claude-sonnet-4-5-20250929").unwrap().output, 15.0);
    assert_eq!(table.price("gpt-4"), None, "a prefix of an entry is not that entry");
    assert_eq!(table.price("my-gpt-4o"), None);
    assert_eq!(table.cost("unknown-model", &usage(1, 1, 0, 0)), None);
    assert_eq!(table.cost("", &usage(1, 1, 0, 0)), None);
}

#[test]
fn an_empty_entry_never_matches_everything() {
    let table = PriceTable::from_json(r#"{"": {"input": 1, "output": 1}}"#).unwrap();
    assert!(table.price("gpt-4o").is_none());
    assert!(table.price("").is_some(), "only its exact name");
}

#[test]
fn bad_tables_are_errors() {
    for json in [
        "",
        "[]",
        r#"{"m": {"input": 1}}"#,
        r#"{"m": {"input": "1", "output": 1}}"#,
        r#"{"m": {"input": 1, "output": 1, "cache_reed": 1}}"#,
        r#"{"m": 3}"#,
    ] {
        assert!(matches!(PriceTable::from_json(json), Err(PriceError::Parse(_))), "{json}");
    }
    for json in [r#"{"m": {"input": -1, "output": 1}}"#, r#"{"m": {"input": 1, "output": 1, "cache_read": -0.5}}"#] {
        assert!(matches!(PriceTable::from_json(json), Err(PriceError::Invalid(m)) if m == "m"), "{json}");
    }
    assert!(PriceTable::from_json("{}").unwrap().is_empty());
}

#[test]
fn from_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prices.json");
    std::fs::write(&path, TABLE).unwrap();
    let table = PriceTable::from_file(&path).unwrap();
    assert_eq!(table, PriceTable::from_json(TABLE).unwrap());
    let err = PriceTable::from_file(dir.path().join("missing.json")).unwrap_err();
    assert!(matches!(err, PriceError::Read { .. }) && err.to_string().contains("missing.json"), "{err}");
}

#[test]
fn defaults_cover_well_known_models_and_round_trip() {
    let table = PriceTable::default();
    assert!(!table.is_empty());
    for model in ["gpt-4o-mini-2024-07-18", "gpt-4.1-2025-04-14", "gpt-5-mini", "claude-sonnet-4-5", "o4-mini"] {
        assert!(table.price(model).is_some(), "{model}");
    }
    assert_eq!(table.price("gpt-4.1-mini-2025-04-14").unwrap().input, 0.4, "not gpt-4.1");
    assert_eq!(table.price("o3-mini-2025-01-31").unwrap().input, 1.1, "not o3");
    assert_eq!(table.price("claude-opus-4-5-20251101").unwrap().input, 5.0, "not claude-opus-4");
    assert_eq!(table.price("claude-opus-4-1-20250805").unwrap().input, 15.0);
    let cost = table.cost("gpt-4o-mini", &usage(1_000_000, 1_000_000, 0, 0)).unwrap();
    assert!(close(cost, 0.75), "{cost}");
    // A price file in the documented shape reproduces the defaults.
    let json = serde_json::to_string(&table).unwrap();
    assert_eq!(PriceTable::from_json(&json).unwrap(), table);
    assert!(PriceTable::empty().cost("gpt-4o", &usage(1, 1, 0, 0)).is_none());
}

#[test]
fn insert_overrides() {
    let mut table = PriceTable::empty();
    table.insert("x", ModelPrice { input: 1.0, output: 2.0, cache_read: None, cache_write: None });
    assert!(close(table.cost("x-1", &usage(1_000_000, 1_000_000, 0, 0)).unwrap(), 3.0));
}
