//! A child's budget: carved from what its parent has left, so the parent
//! can never spend more through its children than its own limits allow.
//!
//! The `n` children a step starts split the parent's remaining steps,
//! tokens and cost evenly; one step stays with the parent, to read their
//! answers. A kind's `budget_share` caps one child at that fraction of what
//! is left (which only lowers the even split, so the children together still
//! fit). Time is not split (children run at once); a child gets the
//! parent's remaining wall clock.

use kiln_protocol::Limits;

pub use crate::agent::spawn::Spent;

/// The limits of each of `n` children, each at most `fraction` (0 to 1) of
/// what is left, or why there is nothing left to give.
pub fn share(parent: &Limits, spent: &Spent, n: u32, fraction: f64) -> Result<Limits, String> {
    let n = n.max(1);
    let fraction = fraction.clamp(0.0, 1.0);
    // The smaller of an even split and the kind's fraction; whole numbers
    // are split as integers, so rounding can never give more than is left.
    let part = |left: f64| (left / f64::from(n)).min(left * fraction);
    let whole = |left: u64| (left / u64::from(n)).min((left as f64 * fraction) as u64);
    // One step is kept for the parent to read the answers.
    let steps = whole(u64::from(parent.max_steps().saturating_sub(spent.steps).saturating_sub(1))) as u32;
    if steps == 0 {
        return Err(format!(
            "no step budget left for a sub-agent ({} of {} steps used; one stays with this agent)",
            spent.steps,
            parent.max_steps()
        ));
    }
    let max_tokens = match parent.max_tokens {
        Some(max) => {
            let each = whole(max.saturating_sub(spent.tokens));
            if each == 0 {
                return Err(format!("no token budget left for a sub-agent ({} of {max} used)", spent.tokens));
            }
            Some(each)
        }
        None => None,
    };
    let max_cost_usd = match (parent.max_cost_usd, spent.cost_usd) {
        (Some(max), Some(cost)) => {
            let each = part(max - cost);
            if each <= 0.0 {
                return Err(format!("no cost budget left for a sub-agent (${cost:.4} of ${max:.4} spent)"));
            }
            Some(each)
        }
        // Unpriced: the child's check refuses just as the parent's would.
        (Some(max), None) => Some(max * fraction),
        (None, _) => None,
    };
    let left = f64::from(parent.timeout_s()) - spent.elapsed.as_secs_f64();
    if left < 1.0 {
        return Err("no time left for a sub-agent".into());
    }
    Ok(Limits { max_steps: Some(steps), timeout_s: Some(left as u32), max_tokens, max_cost_usd })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spent(steps: u32, tokens: u64, cost: f64, elapsed_s: u64) -> Spent {
        Spent { steps, tokens, cost_usd: Some(cost), elapsed: Duration::from_secs(elapsed_s) }
    }

    #[test]
    fn children_split_what_is_left_and_the_parent_keeps_a_step() {
        let parent =
            Limits { max_steps: Some(11), timeout_s: Some(100), max_tokens: Some(1000), max_cost_usd: Some(1.0) };
        let each = share(&parent, &spent(2, 200, 0.2, 40), 2, 1.0).unwrap();
        assert_eq!(each.max_steps, Some(4));
        assert_eq!(each.max_tokens, Some(400));
        assert!((each.max_cost_usd.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(each.timeout_s, Some(60));
        // Together the children can never spend more than the parent has.
        assert!(each.max_tokens.unwrap() * 2 + 200 <= 1000);
    }

    #[test]
    fn a_kinds_fraction_caps_its_child_below_the_even_split() {
        let parent =
            Limits { max_steps: Some(11), timeout_s: Some(100), max_tokens: Some(1000), max_cost_usd: Some(1.0) };
        let each = share(&parent, &spent(0, 0, 0.0, 0), 1, 0.25).unwrap();
        assert_eq!(each.max_steps, Some(2));
        assert_eq!(each.max_tokens, Some(250));
        assert!((each.max_cost_usd.unwrap() - 0.25).abs() < 1e-9);
        // Split evenly four ways, a quarter is no cap at all.
        let each = share(&parent, &spent(0, 0, 0.0, 0), 4, 0.5).unwrap();
        assert_eq!(each.max_tokens, Some(250));
    }

    #[test]
    fn nothing_left_is_refused() {
        let parent = Limits { max_steps: Some(3), max_tokens: Some(100), ..Limits::default() };
        assert!(share(&parent, &spent(2, 0, 0.0, 0), 1, 1.0).is_err());
        assert!(share(&parent, &spent(0, 100, 0.0, 0), 1, 1.0).is_err());
        let no_time = Limits { timeout_s: Some(10), ..Limits::default() };
        assert!(share(&no_time, &spent(0, 0, 0.0, 10), 1, 1.0).is_err());
    }
}
