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
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src, &mut files);
        assert!(files.len() > 50, "the walk found harness/src");
        let forbidden = [
            ".lock().unwrap()",
            ".lock().expect(",
            ".lock().unwrap_or_else(",
        ];
        let mut found = Vec::new();
        for file in files.iter().filter(|f| !f.ends_with("src/lock.rs")) {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in code.lines().enumerate() {
                if forbidden.iter().any(|f| line.contains(f)) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "take locks with crate::lock::Locked::locked:\n{}",
            found.join("\n")
        );
    }
}
