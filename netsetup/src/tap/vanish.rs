//! Waiting, when a [`TapPort`](super::TapPort) goes, until its interface
//! has gone too.
//!
//! Closing our TAP fd unregisters the interface only when ours was the
//! open file's last reference. A process that another thread of ours forks
//! at that moment (a sandbox being started by another test file, an `ip`
//! or `tc` run building a kernel-path wire) holds a copy of every
//! descriptor, close-on-exec ones included, until it execs; the interface
//! then outlives our close by that long, and a guest that looks right after
//! its NIC was detached still sees it. Detaching promises the NIC is gone
//! when it returns, so the port's drop waits for it, bounded, looking from
//! inside the TAP's namespace.

use std::ffi::CString;
use std::time::{Duration, Instant};

use crate::kernel_path::KernelNic;

/// How long a port's drop waits for its interface: a forked child execs
/// within milliseconds; anything longer is a holder we cannot wait out.
const VANISH_BOUND: Duration = Duration::from_secs(2);
/// Between looks.
const VANISH_POLL: Duration = Duration::from_millis(1);

/// The interface of a TAP whose port is going. Declared after the port's
/// fd, so its drop (which waits) runs after the fd's.
#[derive(Debug)]
pub(super) struct VanishingInterface {
    nic: KernelNic,
    /// False once the interface is meant to stay (a parked TAP).
    armed: bool,
}

impl VanishingInterface {
    pub(super) fn new(nic: KernelNic) -> VanishingInterface {
        VanishingInterface { nic, armed: true }
    }

    /// The interface stays by design: the drop waits for nothing.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for VanishingInterface {
    fn drop(&mut self) {
        if self.armed && wait_gone(&self.nic, VANISH_BOUND) == Some(false) {
            eprintln!(
                "provium: warning: TAP interface `{}` still exists {} s after its port closed: \
                 another process holds its descriptor",
                self.nic.ifname(),
                VANISH_BOUND.as_secs()
            );
        }
    }
}

/// Waits up to `bound` until `nic`'s interface no longer exists in its
/// namespace: `Some(true)` when gone, `Some(false)` when still there at
/// the bound, `None` when we cannot look (not allowed into the namespace).
fn wait_gone(nic: &KernelNic, bound: Duration) -> Option<bool> {
    let name = CString::new(nic.ifname()).ok()?;
    crate::netns::run_in(nic.netns(), || {
        let deadline = Instant::now() + bound;
        loop {
            // SAFETY: `name` is a NUL-terminated string.
            if unsafe { libc::if_nametoindex(name.as_ptr()) } == 0 {
                // ENODEV: gone; any other error: we cannot tell.
                let errno = std::io::Error::last_os_error().raw_os_error();
                return (errno == Some(libc::ENODEV)).then_some(true);
            }
            if Instant::now() >= deadline {
                return Some(false);
            }
            std::thread::sleep(VANISH_POLL);
        }
    })
    .ok()
    .flatten()
}
