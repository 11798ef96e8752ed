//! SIGINT and SIGTERM stop a run gracefully: the first one is recorded
//! here; the scheduler dispatches no more files, each running file's
//! watchdog cancels its work (its VMs are torn down, so blocked calls
//! return), the results so far are reported, and the run exits
//! [`exit_code`] (128 + the signal, as a shell reports a death by it).
//! The handler is installed with `SA_RESETHAND`: a second signal ends the
//! process at once.
//!
//! This is the process's one signal handler: `provium console` installs it
//! too ([`install_for_console`]), for SIGHUP as well and without the reset
//! (every signal detaches the terminal the same way), and polls
//! [`received`] like the scheduler does.

use std::sync::atomic::{AtomicI32, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    let _ = RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Install the handler for SIGINT and SIGTERM (idempotent).
pub fn install() {
    install_on(
        &[libc::SIGINT, libc::SIGTERM],
        libc::SA_RESETHAND | libc::SA_RESTART,
    );
}

/// Install the handler for `provium console`: SIGTERM, SIGHUP and SIGINT,
/// kept installed (each one detaches; the console polls [`received`]).
pub fn install_for_console() {
    install_on(
        &[libc::SIGTERM, libc::SIGHUP, libc::SIGINT],
        libc::SA_RESTART,
    );
}

fn install_on(sigs: &[libc::c_int], flags: libc::c_int) {
    for &sig in sigs {
        // SAFETY: a zeroed sigaction is valid; the handler only stores an
        // atomic; sigemptyset/sigaction get valid pointers.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = flags;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The first SIGINT/SIGTERM received, if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// The exit code of a run stopped by `sig`: 130 for SIGINT, 143 for SIGTERM.
pub fn exit_code(sig: i32) -> i32 {
    128 + sig
}

/// `SIGINT`, `SIGTERM` (or the number).
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_128_plus_the_signal() {
        assert_eq!(exit_code(libc::SIGINT), 130);
        assert_eq!(exit_code(libc::SIGTERM), 143);
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
    }

    /// The rule in the module doc, held: no other harness code installs a
    /// signal handler (STYLE.md §5: signal setup is process-wide, in one
    /// place).
    #[test]
    fn no_other_harness_code_installs_a_signal_handler() {
        let found = crate::source_scan::lines_containing(
            "runner/interrupt.rs",
            &["libc::signal(", "libc::sigaction(", "signal_hook"],
        );
        assert!(
            found.is_empty(),
            "install signal handlers in runner/interrupt.rs only:\n{}",
            found.join("\n")
        );
    }
}
