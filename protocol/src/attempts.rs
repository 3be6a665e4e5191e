//! Best-of-N attempts: a run submitted with `"attempts": N` is a group of N
//! attempts at the same task, each a run of its own (its own session and
//! sandbox), of which a client chooses one (`POST /v1/runs/{id}/select`).

use serde::{Deserialize, Serialize};

use crate::input;

/// The group's budget: what its attempts may spend together. Each attempt
/// gets an equal share of it (with its own `limits` as well), so the sum
/// never exceeds it however the attempts run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupLimits {
    /// Model calls of all attempts together; at least one per attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Input plus output tokens of all attempts together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Model spend of all attempts together, in US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

/// Body of `POST /v1/runs/{id}/select`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SelectAttempt {
    /// Which attempt (1 for the first) becomes the group's result.
    pub attempt: u32,
}

/// Why the attempts of a submitted run are not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttemptsError {
    #[error("attempts must be between {} and {}", input::ATTEMPTS.min, input::ATTEMPTS.max)]
    Count,
    #[error(
        "attempt_models must be model names of {} to {} characters without control characters",
        input::MODEL_NAME.min_chars,
        input::MODEL_NAME.max_chars
    )]
    ModelName,
    #[error("group_limits.max_steps must be between {} and {}", input::MAX_STEPS.min, input::MAX_STEPS.max)]
    MaxSteps,
    #[error("group_limits.max_tokens must be between {} and {}", input::RUN_MAX_TOKENS.min, input::RUN_MAX_TOKENS.max)]
    MaxTokens,
    #[error("group_limits.max_cost_usd must be a positive number of dollars, at most {}", input::MAX_COST_USD.max)]
    MaxCost,
    #[error("attempt_models must be a list of at most {} model names", input::ATTEMPT_MODELS.max_items)]
    Models,
}

/// Checks `attempts`, `attempt_models` and `group_limits` of a submission.
/// None depends on another: a run without `attempts` is its own single
/// attempt (the first of `attempt_models` is its model, `group_limits`
/// narrows its budget), and attempt K takes the K-th model, round the list.
pub fn validate(
    attempts: Option<u32>,
    models: Option<&[String]>,
    group: Option<&GroupLimits>,
) -> Result<(), AttemptsError> {
    if attempts.is_some_and(|n| !input::ATTEMPTS.contains(n)) {
        return Err(AttemptsError::Count);
    }
    if let Some(models) = models
        && !input::ATTEMPT_MODELS.accepts(models, &input::MODEL_NAME)
    {
        return Err(if models.len() > input::ATTEMPT_MODELS.max_items {
            AttemptsError::Models
        } else {
            AttemptsError::ModelName
        });
    }
    if let Some(group) = group {
        group.validate()?;
    }
    Ok(())
}

/// The model attempt `number` (1 for the first) runs on, from `models`.
pub fn model_of(models: &[String], number: u32) -> Option<&String> {
    let index = (number.max(1) - 1) as usize;
    models.get(index.checked_rem(models.len())?)
}

impl GroupLimits {
    fn validate(&self) -> Result<(), AttemptsError> {
        if self.max_steps.is_some_and(|s| !input::MAX_STEPS.contains(s)) {
            return Err(AttemptsError::MaxSteps);
        }
        if self.max_tokens.is_some_and(|t| !input::RUN_MAX_TOKENS.contains(t)) {
            return Err(AttemptsError::MaxTokens);
        }
        if self.max_cost_usd.is_some_and(|c| !input::MAX_COST_USD.contains(c)) {
            return Err(AttemptsError::MaxCost);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Limits;

    #[test]
    fn counts_models_and_group_limits_are_checked() {
        assert_eq!(validate(None, None, None), Ok(()));
        assert_eq!(validate(Some(0), None, None), Err(AttemptsError::Count));
        assert_eq!(validate(Some(5), None, None), Err(AttemptsError::Count));
        let two = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(validate(Some(3), Some(&two), None), Ok(()));
        assert_eq!(validate(None, Some(&two), None), Ok(()));
        let bad = vec!["a".to_owned(), "b\n".to_owned()];
        assert_eq!(validate(Some(2), Some(&bad), None), Err(AttemptsError::ModelName));
        let many = vec!["a".to_owned(); 5];
        assert_eq!(validate(Some(2), Some(&many), None), Err(AttemptsError::Models));
        let group = GroupLimits { max_steps: Some(0), ..Default::default() };
        assert_eq!(validate(Some(2), None, Some(&group)), Err(AttemptsError::MaxSteps));
        assert_eq!(model_of(&two, 3).map(String::as_str), Some("a"));
        assert_eq!(model_of(&[], 1), None);
    }

    #[test]
    fn each_attempt_gets_its_share_within_its_own_limits_and_the_shares_add_up() {
        let group = GroupLimits { max_steps: Some(7), max_tokens: Some(1000), max_cost_usd: Some(3.0) };
        let own = Limits { max_steps: Some(2), timeout_s: Some(60), ..Default::default() };
        let first = group.share(&own, 1, 3);
        assert_eq!((first.max_steps, first.max_tokens, first.max_cost_usd), (Some(2), Some(334), Some(1.0)));
        assert_eq!(first.timeout_s, Some(60));
        let shares: Vec<Limits> = (1..=3).map(|k| group.share(&Limits::default(), k, 3)).collect();
        assert_eq!(shares.iter().map(|l| l.max_steps.unwrap()).sum::<u32>(), 7);
        assert_eq!(shares.iter().map(|l| l.max_tokens.unwrap()).sum::<u64>(), 1000);
        let thin = GroupLimits { max_steps: Some(2), ..Default::default() };
        assert_eq!(thin.share(&Limits::default(), 3, 3).max_steps, Some(0));
    }
}
