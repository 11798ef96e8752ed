//! Time sources for the switch.
//!
//! The delay queue, the token buckets, MAC ageing and pcap timestamps all read
//! one [`Clock`]. Production uses [`SystemClock`] (monotonic `Instant`, plus the
//! wall-clock time at creation so pcap timestamps are real dates). Tests use
//! [`ManualClock`], which only moves when told to, so latency and bandwidth are
//! asserted as exact release times rather than measured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic time source.
pub trait Clock: Send + Sync {
    /// Time elapsed since this clock's origin. Never goes backwards.
    fn now(&self) -> Duration;
    /// The Unix time of this clock's origin; pcap timestamps are
    /// `unix_origin() + now()`.
    fn unix_origin(&self) -> Duration;
}

/// The real clock: `Instant` for ordering, `SystemTime` at creation for dates.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
    unix_at_start: Duration,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        SystemClock {
            start: Instant::now(),
            unix_at_start: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
    fn unix_origin(&self) -> Duration {
        self.unix_at_start
    }
}

/// A clock that moves only through [`ManualClock::advance`] /
/// [`ManualClock::set`]. Its origin is the Unix epoch, so pcap timestamps
/// equal `now()`.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: AtomicU64,
}

impl ManualClock {
    /// A clock at t = 0.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Move forward by `d` (saturating at u64::MAX nanoseconds).
    pub fn advance(&self, d: Duration) {
        let add = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .now_ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(add))
            });
    }

    /// Jump to `t`; ignored if `t` is earlier than now (time never goes back).
    pub fn set(&self, t: Duration) {
        let t = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        self.now_ns.fetch_max(t, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns.load(Ordering::SeqCst))
    }
    fn unix_origin(&self) -> Duration {
        Duration::ZERO
    }
}

/// `d` (a time on a switch clock, from its start) in whole nanoseconds, as
/// the switch publishes times in atomics; saturates far past any run.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::new();
        assert_eq!(c.now(), Duration::ZERO);
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now(), Duration::from_millis(5));
        c.set(Duration::from_millis(2));
        assert_eq!(c.now(), Duration::from_millis(5));
        c.set(Duration::from_secs(1));
        assert_eq!(c.now(), Duration::from_secs(1));
        assert_eq!(c.unix_origin(), Duration::ZERO);
    }

    #[test]
    fn system_clock_is_monotonic_and_dated() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        // Any date after 2020-01-01 proves the origin is a real Unix time.
        assert!(c.unix_origin() > Duration::from_secs(1_577_836_800));
    }
}
