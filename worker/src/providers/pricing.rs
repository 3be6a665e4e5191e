//! What model calls cost: a table of per-model prices in US dollars per
//! million tokens, and the cost of one call's [`Usage`].
//!
//! The table is data, not code: [`PriceTable::from_file`] reads the JSON
//! file the operator keeps current (the worker is pointed at it with
//! [`PRICES_FILE_ENV`]), in the shape
//!
//! ```json
//! {"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cache_read": 0.075, "cache_write": 0}}
//! ```
//!
//! [`PriceTable::default`] is a small built-in table of well-known models,
//! a fallback so costs are not silently zero out of the box. Prices change;
//! treat those numbers as placeholders to be overridden, not as a source of
//! truth.
//!
//! A model name matches its exact entry, else the longest entry it starts
//! with, so a dated snapshot (`gpt-4o-mini-2024-07-18`) is priced as its
//! family (`gpt-4o-mini`) and never as a shorter, different model (`gpt-4o`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_protocol::Usage;
use serde::{Deserialize, Serialize};

/// The environment variable naming the price file.
pub const PRICES_FILE_ENV: &str = "KILN_PRICES_FILE";

const PER_MILLION: f64 = 1_000_000.0;

/// Prices of one model, US dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Input tokens not read from the cache (Kiln's `input_tokens`).
    pub input: f64,
    pub output: f64,
    /// Input tokens read from the prompt cache. Absent means the provider
    /// has no discount: such tokens cost the input price.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Input tokens written to the prompt cache (Anthropic charges extra).
    /// Absent means the input price.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

impl ModelPrice {
    /// The cost of `usage` in US dollars.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let tokens = |n: u64| n as f64 / PER_MILLION;
        tokens(usage.input_tokens) * self.input
            + tokens(usage.output_tokens) * self.output
            + tokens(usage.cache_read_tokens) * self.cache_read.unwrap_or(self.input)
            + tokens(usage.cache_write_tokens) * self.cache_write.unwrap_or(self.input)
    }

    fn is_valid(&self) -> bool {
        [Some(self.input), Some(self.output), self.cache_read, self.cache_write]
            .into_iter()
            .flatten()
            .all(|p| p.is_finite() && p >= 0.0)
    }
}

/// Per-model prices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable {
    models: BTreeMap<String, ModelPrice>,
}

/// A price file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    #[error("reading price file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("price table is not valid JSON of the form {{\"model\": {{\"input\": …, \"output\": …}}}}: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("price of model {0:?} must be finite and not negative")]
    Invalid(String),
}

/// The built-in fallback: USD per million tokens as published by the
/// providers when this was written. Defaults only; a price file overrides
/// them entirely.
const DEFAULT_PRICES: &[(&str, ModelPrice)] = &[
    // price(input, output, cache_read, cache_write)
    ("gpt-4o", price(2.5, 10.0, Some(1.25), Some(0.0))),
    ("gpt-4o-mini", price(0.15, 0.6, Some(0.075), Some(0.0))),
    ("gpt-4.1", price(2.0, 8.0, Some(0.5), Some(0.0))),
    ("gpt-4.1-mini", price(0.4, 1.6, Some(0.1), Some(0.0))),
    ("gpt-4.1-nano", price(0.1, 0.4, Some(0.025), Some(0.0))),
    // Longest-prefix matching makes siblings with other prices necessary:
    // without "o3-mini" an o3-mini snapshot would be priced as o3.
    ("o3", price(2.0, 8.0, Some(0.5), Some(0.0))),
    ("o3-mini", price(1.1, 4.4, Some(0.55), Some(0.0))),
    ("o3-pro", price(20.0, 80.0, None, Some(0.0))),
    ("o4-mini", price(1.1, 4.4, Some(0.275), Some(0.0))),
    ("gpt-5", price(1.25, 10.0, Some(0.125), Some(0.0))),
    ("gpt-5-pro", price(15.0, 120.0, None, Some(0.0))),
    ("gpt-5-mini", price(0.25, 2.0, Some(0.025), Some(0.0))),
    ("gpt-5-nano", price(0.05, 0.4, Some(0.005), Some(0.0))),
    ("claude-opus-4", price(15.0, 75.0, Some(1.5), Some(18.75))),
    ("claude-opus-4-5", price(5.0, 25.0, Some(0.5), Some(6.25))),
    ("claude-sonnet-4", price(3.0, 15.0, Some(0.3), Some(3.75))),
    ("claude-3-5-haiku", price(0.8, 4.0, Some(0.08), Some(1.0))),
    ("claude-haiku-4-5", price(1.0, 5.0, Some(0.1), Some(1.25))),
];

const fn price(input: f64, output: f64, cache_read: Option<f64>, cache_write: Option<f64>) -> ModelPrice {
    ModelPrice { input, output, cache_read, cache_write }
}

impl Default for PriceTable {
    /// The built-in fallback table; see the module docs.
    fn default() -> Self {
        let models = DEFAULT_PRICES.iter().map(|&(model, price)| (model.to_owned(), price)).collect();
        PriceTable { models }
    }
}

impl PriceTable {
    /// A table with no prices: every cost is unknown.
    pub fn empty() -> Self {
        PriceTable { models: BTreeMap::new() }
    }

    /// Parses a JSON object of model name to prices.
    pub fn from_json(json: &str) -> Result<Self, PriceError> {
        let table: PriceTable = serde_json::from_str(json)?;
        if let Some((model, _)) = table.models.iter().find(|(_, price)| !price.is_valid()) {
            return Err(PriceError::Invalid(model.clone()));
        }
        Ok(table)
    }

    /// Reads a price file (see [`Self::from_json`]).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PriceError> {
        let path = path.as_ref();
        let json =
            std::fs::read_to_string(path).map_err(|source| PriceError::Read { path: path.to_owned(), source })?;
        Self::from_json(&json)
    }

    /// The table from the file named by [`PRICES_FILE_ENV`] when it is set
    /// (an unreadable file is an error, not a silent fallback), else the
    /// built-in defaults.
    pub fn from_env() -> Result<Self, PriceError> {
        match std::env::var_os(PRICES_FILE_ENV).filter(|v| !v.is_empty()) {
            Some(path) => Self::from_file(path),
            None => Ok(Self::default()),
        }
    }

    /// Sets (or replaces) one model's prices.
    pub fn insert(&mut self, model: impl Into<String>, price: ModelPrice) {
        self.models.insert(model.into(), price);
    }

    /// The prices for `model`: its exact entry, else the longest entry that
    /// is a prefix of it.
    pub fn price(&self, model: &str) -> Option<&ModelPrice> {
        if let Some(price) = self.models.get(model) {
            return Some(price);
        }
        self.models
            .iter()
            .filter(|(name, _)| !name.is_empty() && model.starts_with(name.as_str()))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, price)| price)
    }

    /// The cost of one call in US dollars, or `None` for a model the table
    /// does not know.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.price(model).map(|price| price.cost(usage))
    }

    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "pricing_tests.rs"]
mod tests;
