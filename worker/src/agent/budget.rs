//! The run's budgets: steps, tokens, cost, wall clock. Checked before every
//! model call, so a run never overshoots by more than one step's spend; at
//! 80 % of any budget the model gets a note so it can wrap up.

use std::time::Duration;

use kiln_protocol::{Limits, Usage};

/// Share of a budget after which the model is warned.
const WARN_AT: f64 = 0.8;

#[derive(Debug, Clone, PartialEq)]
pub enum BudgetCheck {
    Ok,
    /// Go on, but tell the model this.
    Warn(String),
    /// Stop: this budget is spent.
    Exhausted(Exhausted),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Exhausted {
    /// The wall clock ran out (the run ends `timed_out`).
    Time { limit_s: u32 },
    /// Another budget ran out (the run ends `failed` with this reason).
    Budget(String),
}

#[derive(Debug, Clone)]
pub struct Budget {
    limits: Limits,
    pub steps: u32,
    /// Steps the run's sub-agents took: they count against its step budget.
    pub child_steps: u32,
    pub usage: Usage,
    /// Spend so far; `None` once a step's price was unknown.
    pub cost_usd: Option<f64>,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Budget { limits, steps: 0, child_steps: 0, usage: Usage::default(), cost_usd: Some(0.0) }
    }

    /// Adds one step's usage and cost (`None`: the model has no price).
    pub fn record(&mut self, usage: &Usage, cost: Option<f64>) {
        self.usage.add(usage);
        self.cost_usd = match (self.cost_usd, cost) {
            (Some(total), Some(c)) => Some(total + c),
            _ => None,
        };
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn tokens(&self) -> u64 {
        self.usage.input_tokens + self.usage.output_tokens
    }

    /// Whether another model call may be made after `elapsed` of wall clock.
    pub fn check(&self, elapsed: Duration) -> BudgetCheck {
        if let Some(exhausted) = self.exhausted(elapsed) {
            return BudgetCheck::Exhausted(exhausted);
        }
        let notes = self.running_low(elapsed);
        if notes.is_empty() {
            BudgetCheck::Ok
        } else {
            BudgetCheck::Warn(format!(
                "[kiln] Budget note: {}. Wrap up: finish the most important part and summarise.",
                notes.join("; ")
            ))
        }
    }

    /// The first limit reached, if any.
    fn exhausted(&self, elapsed: Duration) -> Option<Exhausted> {
        let max_steps = self.limits.max_steps();
        let steps = self.steps + self.child_steps;
        if steps >= max_steps {
            return Some(Exhausted::Budget(format!(
                "step budget exhausted: {steps} of {max_steps} steps used before the task was finished"
            )));
        }
        let timeout = self.limits.timeout_s();
        if elapsed.as_secs_f64() >= f64::from(timeout) {
            return Some(Exhausted::Time { limit_s: timeout });
        }
        if let Some(max) = self.limits.max_tokens
            && self.tokens() >= max
        {
            return Some(Exhausted::Budget(format!("token budget exhausted: {} of {max} tokens used", self.tokens())));
        }
        match (self.limits.max_cost_usd, self.cost_usd) {
            (Some(max), Some(cost)) if cost >= max => {
                Some(Exhausted::Budget(format!("cost budget exhausted: ${cost:.4} of ${max:.4} spent")))
            }
            (Some(_), None) => Some(Exhausted::Budget(
                "cost budget cannot be enforced: the model has no price in the worker's price table".into(),
            )),
            _ => None,
        }
    }

    /// A note for each limit that is close (past `WARN_AT` of it).
    fn running_low(&self, elapsed: Duration) -> Vec<String> {
        let max_steps = self.limits.max_steps();
        let steps = self.steps + self.child_steps;
        let timeout = self.limits.timeout_s();
        let mut notes = Vec::new();
        if f64::from(steps) >= WARN_AT * f64::from(max_steps) {
            notes.push(format!("{} of {max_steps} steps left", max_steps - steps));
        }
        if elapsed.as_secs_f64() >= WARN_AT * f64::from(timeout) {
            let left = f64::from(timeout) - elapsed.as_secs_f64();
            notes.push(format!("{left:.0} s of {timeout} s left"));
        }
        if let Some(max) = self.limits.max_tokens
            && self.tokens() as f64 >= WARN_AT * max as f64
        {
            notes.push(format!("{} of {max} tokens left", max - self.tokens()));
        }
        if let (Some(max), Some(cost)) = (self.limits.max_cost_usd, self.cost_usd)
            && cost >= WARN_AT * max
        {
            notes.push(format!("${:.4} of ${max:.4} left", max - cost));
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(steps: u32, tokens: Option<u64>, cost: Option<f64>) -> Limits {
        Limits { max_steps: Some(steps), timeout_s: Some(100), max_tokens: tokens, max_cost_usd: cost }
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage { input_tokens: input, output_tokens: output, ..Default::default() }
    }

    #[test]
    fn steps_warn_at_eighty_percent_and_stop_at_the_limit() {
        let mut b = Budget::new(limits(5, None, None));
        b.steps = 3;
        assert_eq!(b.check(Duration::ZERO), BudgetCheck::Ok);
        b.steps = 4;
        assert!(matches!(b.check(Duration::ZERO), BudgetCheck::Warn(n) if n.contains("1 of 5 steps left")));
        b.steps = 5;
        assert!(
            matches!(b.check(Duration::ZERO), BudgetCheck::Exhausted(Exhausted::Budget(r)) if r.contains("step budget"))
        );
    }

    #[test]
    fn tokens_count_input_and_output() {
        let mut b = Budget::new(limits(50, Some(1000), None));
        b.record(&usage(700, 100), None);
        assert!(matches!(b.check(Duration::ZERO), BudgetCheck::Warn(n) if n.contains("200 of 1000 tokens")));
        b.record(&usage(150, 50), None);
        assert!(
            matches!(b.check(Duration::ZERO), BudgetCheck::Exhausted(Exhausted::Budget(r)) if r.contains("token budget"))
        );
    }

    #[test]
    fn cost_stops_and_unknown_prices_refuse_a_cost_budget() {
        let mut b = Budget::new(limits(50, None, Some(1.0)));
        b.record(&usage(1, 1), Some(0.5));
        assert_eq!(b.check(Duration::ZERO), BudgetCheck::Ok);
        b.record(&usage(1, 1), Some(0.6));
        assert!(
            matches!(b.check(Duration::ZERO), BudgetCheck::Exhausted(Exhausted::Budget(r)) if r.contains("cost budget exhausted"))
        );
        let mut unknown = Budget::new(limits(50, None, Some(1.0)));
        unknown.record(&usage(1, 1), None);
        assert!(matches!(unknown.check(Duration::ZERO), BudgetCheck::Exhausted(_)));
    }

    #[test]
    fn wall_clock_is_its_own_ending() {
        let b = Budget::new(limits(50, None, None));
        assert!(matches!(b.check(Duration::from_secs(85)), BudgetCheck::Warn(n) if n.contains("15 s of 100 s left")));
        assert_eq!(b.check(Duration::from_secs(100)), BudgetCheck::Exhausted(Exhausted::Time { limit_s: 100 }));
    }
}
