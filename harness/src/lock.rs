//! [`Locked::locked`]: the harness's one way to take a `std::sync::Mutex`.
//!
//! A poisoned mutex only says that a thread panicked while holding it. The
//! harness turns panics into test failures (a panic inside a test poisons
//! the rest of its *file*, `scheduler/executor.rs`), and the data behind
//! its locks (a VM's phase, a bridge's members, a counter) stays usable, so
//! a later lock must not panic too and hide the first failure behind a
//! second. Every lock takes the guard, poisoned or not, through this one
//! method instead of `.lock().unwrap()` and hand-written
//! `unwrap_or_else(|p| p.into_inner())` copies; a test holds that.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locking that survives a panicked holder (see the module doc).
pub trait Locked<T: ?Sized> {
    /// The guard, whether or not a holder panicked.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicked_holder_does_not_make_the_next_lock_panic() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = held.locked();
            panic!("a holder panics");
        })
        .join();
        assert!(m.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
    }

    /// No other harness code takes a lock another way (test code may).
    #[test]
    fn every_lock_goes_through_locked() {
        let found = crate::source_scan::lines_containing(
            "src/lock.rs",
            &[
                ".lock().unwrap()",
                ".lock().expect(",
                ".lock().unwrap_or_else(",
            ],
        );
        assert!(
            found.is_empty(),
            "take locks with crate::lock::Locked::locked:\n{}",
            found.join("\n")
        );
    }
}
