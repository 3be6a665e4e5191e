//! Median, p95 and ratios, printed the same way by every benchmark.

use std::time::Duration;

/// Figures of one measured series, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median_ms: f64,
    pub p95_ms: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Summary {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        Summary { median_ms: median(&ms), p95_ms: nearest_rank(&ms, 0.95), n: ms.len() }
    }
}

/// Median of sorted values (mean of the middle two for an even count).
fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Nearest-rank percentile of sorted values: the smallest value with at
/// least `q` of the samples at or below it.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Prints one series and returns its summary.
pub fn report(name: &str, samples: &[Duration]) -> Summary {
    let s = Summary::of(samples);
    println!("{name:<44} median {:>9.2} ms   p95 {:>9.2} ms   (n={})", s.median_ms, s.p95_ms, s.n);
    s
}

/// Prints `kiln / baseline` (medians) and whether it meets `goal` (at most).
pub fn ratio(name: &str, kiln: Summary, baseline: Summary, goal: Option<f64>) -> f64 {
    let r = kiln.median_ms / baseline.median_ms;
    let verdict = match goal {
        Some(g) if r <= g => format!("   goal <= {g}: met"),
        Some(g) => format!("   goal <= {g}: NOT met"),
        None => String::new(),
    };
    println!("ratio {name:<38} {r:>8.4}x{verdict}");
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn median_and_p95_of_twenty() {
        let s = Summary::of(&ms(&(1..=20).rev().collect::<Vec<_>>()));
        assert_eq!(s.median_ms, 10.5);
        assert_eq!(s.p95_ms, 19.0);
        assert_eq!(s.n, 20);
    }

    #[test]
    fn odd_counts_and_single_samples() {
        assert_eq!(Summary::of(&ms(&[3, 1, 2])).median_ms, 2.0);
        let one = Summary::of(&ms(&[7]));
        assert_eq!((one.median_ms, one.p95_ms), (7.0, 7.0));
    }
}
