//! `clock_get`, `clock_set`, `clock_advance`.
//!
//! In the local backend the agent shares the host's clock, so it is started
//! with `--no-clock` and refuses to set it (the host's time is never touched).

use provium_protocol::result::OpError;
use provium_protocol::OpValue;

use crate::op_error;

const NS_PER_S: i64 = 1_000_000_000;

const NO_CLOCK: &str = "setting the clock is not supported on the local backend \
                        (the sandbox shares the host's clock)";

fn now_ns(clock: libc::clockid_t) -> Result<i64, OpError> {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a live timespec for the call.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(op_error::last_os("clock_gettime"));
    }
    Ok(ts
        .tv_sec
        .saturating_mul(NS_PER_S)
        .saturating_add(ts.tv_nsec))
}

pub fn get() -> Result<OpValue, OpError> {
    Ok(OpValue::Clock {
        realtime_ns: now_ns(libc::CLOCK_REALTIME)?,
        monotonic_ns: now_ns(libc::CLOCK_MONOTONIC)?,
    })
}

pub fn set(no_clock: bool, realtime_ns: i64) -> Result<OpValue, OpError> {
    if no_clock {
        return Err(op_error::unsupported(NO_CLOCK));
    }
    let ts = libc::timespec {
        tv_sec: realtime_ns.div_euclid(NS_PER_S),
        tv_nsec: realtime_ns.rem_euclid(NS_PER_S),
    };
    // SAFETY: `ts` is a live, normalised timespec for the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        return Err(op_error::last_os(format!(
            "clock_settime to {realtime_ns} ns"
        )));
    }
    Ok(OpValue::Unit)
}

pub fn advance(no_clock: bool, delta_ns: i64) -> Result<OpValue, OpError> {
    if no_clock {
        return Err(op_error::unsupported(NO_CLOCK));
    }
    let now = now_ns(libc::CLOCK_REALTIME)?;
    let target = now.checked_add(delta_ns).ok_or_else(|| {
        op_error::invalid(format!(
            "advancing the clock by {delta_ns} ns from {now} ns overflows 64-bit nanoseconds"
        ))
    })?;
    set(false, target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::result::ErrorCode;

    #[test]
    fn get_and_refusals() {
        let OpValue::Clock {
            realtime_ns,
            monotonic_ns,
        } = get().unwrap()
        else {
            panic!()
        };
        assert!(realtime_ns > 1_600_000_000 * NS_PER_S);
        assert!(monotonic_ns > 0);
        let err = set(true, 0).unwrap_err();
        assert_eq!(err.code, ErrorCode::Unsupported);
        assert_eq!(err.message, NO_CLOCK);
        assert_eq!(advance(true, 1).unwrap_err().code, ErrorCode::Unsupported);
        assert_eq!(
            advance(false, i64::MAX).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }
}
