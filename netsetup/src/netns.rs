//! Running a closure inside another network namespace.
//!
//! Only a thread may change its network namespace, and a thread that did
//! must not go back to serving the rest of the process: so the closure runs
//! on a short-lived thread of its own that enters the namespace first and
//! ends with the call. Cheaper than an `ip` or `tc` process (a thread, not
//! a fork of the whole process and an exec), which is why the kernel path's
//! per-port steps and a TAP port's drop use it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Runs `f` on a new thread inside the network namespace `netns` and
/// returns what it returned; an error when the thread could not start or
/// enter the namespace (it needs CAP_SYS_ADMIN).
pub(crate) fn run_in<T: Send>(
    netns: BorrowedFd<'_>,
    f: impl FnOnce() -> T + Send,
) -> io::Result<T> {
    let ns = netns.try_clone_to_owned()?;
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("netns".into())
            .spawn_scoped(s, move || {
                // SAFETY: setns on a namespace fd we own; it moves only this
                // thread, which ends with the scope.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            })?;
        worker
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))?
    })
}
