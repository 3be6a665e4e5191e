//! Best-of-N attempts: a run submitted with `"attempts": N` is a group of N
//! attempts at the same task, each a run of its own (its own session and
//! sandbox), of which a client chooses one (`POST /v1/runs/{id}/select`).

use serde::{Deserialize, Serialize};

use crate::input;
use crate::run::Limits;

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
    #[error("attempt_models must name one model for each of the {0} attempts")]
    ModelCount(u32),
    #[error(
        "attempt_models must be model names of {} to {} characters without control characters",
        input::MODEL_NAME.min_chars,
        input::MODEL_NAME.max_chars
    )]
    ModelName,
    #[error("attempt_models and group_limits need attempts")]
    WithoutAttempts,
    #[error("group_limits.max_steps must be between {} and {}", input::MAX_STEPS.min, input::MAX_STEPS.max)]
    MaxSteps,
    #[error("group_limits.max_tokens must be between {} and {}", input::RUN_MAX_TOKENS.min, input::RUN_MAX_TOKENS.max)]
    MaxTokens,
    #[error("group_limits.max_cost_usd must be a positive number of dollars, at most {}", input::MAX_COST_USD.max)]
    MaxCost,
    #[error("group_limits.{0} must leave each of the {1} attempts at least one {2}")]
    TooSmall(&'static str, u32, &'static str),
}

/// Checks `attempts`, `attempt_models` and `group_limits` of a submission.
pub fn validate(
    attempts: Option<u32>,
    models: Option<&[String]>,
    group: Option<&GroupLimits>,
) -> Result<(), AttemptsError> {
    let Some(n) = attempts else {
        return match (models, group) {
            (None, None) => Ok(()),
            _ => Err(AttemptsError::WithoutAttempts),
        };
    };
    if !input::ATTEMPTS.contains(n) {
        return Err(AttemptsError::Count);
    }
    if let Some(models) = models {
        if models.len() != n as usize {
            return Err(AttemptsError::ModelCount(n));
        }
        if !models.iter().all(|m| input::MODEL_NAME.accepts(m)) {
            return Err(AttemptsError::ModelName);
        }
    }
    if let Some(group) = group {
        group.validate(n)?;
    }
    Ok(())
}

impl GroupLimits {
    fn validate(&self, attempts: u32) -> Result<(), AttemptsError> {
        if let Some(steps) = self.max_steps {
            if !input::MAX_STEPS.contains(steps) {
                return Err(AttemptsError::MaxSteps);
            }
            if steps < attempts {
                return Err(AttemptsError::TooSmall("max_steps", attempts, "step"));
            }
        }
        if let Some(tokens) = self.max_tokens {
            if !input::RUN_MAX_TOKENS.contains(tokens) {
                return Err(AttemptsError::MaxTokens);
            }
            if tokens < u64::from(attempts) {
                return Err(AttemptsError::TooSmall("max_tokens", attempts, "token"));
            }
        }
        if self.max_cost_usd.is_some_and(|c| !input::MAX_COST_USD.contains(c)) {
            return Err(AttemptsError::MaxCost);
        }
        Ok(())
    }

    /// One attempt's budget out of `attempts`: its own `limits`, narrowed
    /// to an equal share of the group's.
    pub fn share(&self, limits: &Limits, attempts: u32) -> Limits {
        let n = attempts.max(1);
        let narrow_u32 = |own: Option<u32>, group: Option<u32>| match (own, group.map(|g| g / n)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let narrow_u64 = |own: Option<u64>, group: Option<u64>| match (own, group.map(|g| g / u64::from(n))) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let cost = match (limits.max_cost_usd, self.max_cost_usd.map(|c| c / f64::from(n))) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Limits {
            max_steps: narrow_u32(limits.max_steps, self.max_steps),
            timeout_s: limits.timeout_s,
            max_tokens: narrow_u64(limits.max_tokens, self.max_tokens),
            max_cost_usd: cost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_models_and_group_limits_are_checked() {
        assert_eq!(validate(None, None, None), Ok(()));
        assert_eq!(validate(Some(0), None, None), Err(AttemptsError::Count));
        assert_eq!(validate(Some(5), None, None), Err(AttemptsError::Count));
        let two = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(validate(Some(2), Some(&two), None), Ok(()));
        assert_eq!(validate(Some(3), Some(&two), None), Err(AttemptsError::ModelCount(3)));
        assert_eq!(validate(None, Some(&two), None), Err(AttemptsError::WithoutAttempts));
        let bad = vec!["a".to_owned(), "b\n".to_owned()];
        assert_eq!(validate(Some(2), Some(&bad), None), Err(AttemptsError::ModelName));
        let group = GroupLimits { max_steps: Some(2), ..Default::default() };
        assert!(matches!(validate(Some(3), None, Some(&group)), Err(AttemptsError::TooSmall(..))));
        assert_eq!(validate(Some(2), None, Some(&group)), Ok(()));
    }

    #[test]
    fn each_attempt_gets_an_equal_share_within_its_own_limits() {
        let group = GroupLimits { max_steps: Some(7), max_tokens: Some(1000), max_cost_usd: Some(3.0) };
        let own = Limits { max_steps: Some(2), timeout_s: Some(60), ..Default::default() };
        let share = group.share(&own, 3);
        assert_eq!(share.max_steps, Some(2));
        assert_eq!(share.max_tokens, Some(333));
        assert_eq!(share.max_cost_usd, Some(1.0));
        assert_eq!(share.timeout_s, Some(60));
        let roomy = group.share(&Limits::default(), 3);
        assert_eq!(roomy.max_steps, Some(2));
        assert!(roomy.max_steps.unwrap() * 3 <= 7);
    }
}
