//! A bench's phases and their statistics: min / median / p90 / p99 / max by
//! nearest rank, and when a phase's spread makes its numbers noisy.

use std::time::Duration;

/// A phase's min and max further apart than this factor draw a warning.
pub const NOISY_MAX_OVER_MIN: f64 = 2.0;

/// What a phase's samples measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Ns,
    Bytes,
}

impl Unit {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::Bytes => "bytes",
        }
    }
}

/// One phase of a bench: its samples, or why there are none.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: &'static str,
    /// One line on what it measures (also in the JSON).
    pub what: &'static str,
    /// Who took the timestamps: "vmm" (the VMM's boot timer), "harness".
    pub source: &'static str,
    pub unit: Unit,
    pub samples: Vec<u64>,
    /// Set when the phase cannot be measured here.
    pub unavailable: Option<String>,
}

impl Phase {
    pub(super) fn new(
        name: &'static str,
        what: &'static str,
        source: &'static str,
        unit: Unit,
    ) -> Phase {
        Phase {
            name,
            what,
            source,
            unit,
            samples: Vec::new(),
            unavailable: None,
        }
    }

    pub(super) fn push_duration(&mut self, d: Option<Duration>) {
        if let Some(d) = d {
            self.samples
                .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        }
    }

    /// Marks it unavailable unless it has samples.
    pub(super) fn unless_measured(&mut self, why: impl Into<String>) {
        if self.samples.is_empty() && self.unavailable.is_none() {
            self.unavailable = Some(why.into());
        }
    }

    pub(super) fn available(&self) -> bool {
        self.unavailable.is_none() && !self.samples.is_empty()
    }
}

/// min / median / p90 / p99 / max (nearest rank) and the mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub min: u64,
    pub median: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

/// Nearest-rank percentiles of `samples` (None when empty).
pub fn stats(samples: &[u64]) -> Option<Stats> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    };
    Some(Stats {
        min: v[0],
        median: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: v[v.len() - 1],
        mean: v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64,
    })
}

/// Whether max > 2x min (a phase whose spread says the machine was busy).
pub fn is_noisy(s: &Stats) -> bool {
    s.min > 0 && s.max as f64 > NOISY_MAX_OVER_MIN * s.min as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_stats() {
        let s = stats(&[5, 1, 4, 2, 3, 6, 7, 8, 9, 10]).expect("samples");
        assert_eq!((s.min, s.median, s.p90, s.p99, s.max), (1, 5, 9, 10, 10));
        assert!((s.mean - 5.5).abs() < 1e-9);
        assert!(stats(&[]).is_none());
        let one = stats(&[7]).expect("one");
        assert_eq!((one.min, one.median, one.max), (7, 7, 7));
        assert!(is_noisy(&stats(&[1, 3]).expect("two")));
        assert!(!is_noisy(&stats(&[2, 4]).expect("two")));
    }
}
