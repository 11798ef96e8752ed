//! The host-facing handle of a console device: where the harness connects
//! to the guest's port. Each connect gets one end of a Unix socketpair, the
//! device worker the other; the handle outlives resets (a rebuilt device
//! takes a clone), so the harness keeps one per VM.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use super::defs::AGENT_PORT_NAME;
use super::ConsoleConnectError;

#[derive(Default)]
struct HostState {
    /// A device worker runs (the driver set DRIVER_OK).
    active: bool,
    /// Number of the latest connect.
    seq: u64,
    /// The device's end of the latest connect, until the worker takes it.
    pending: Option<(u64, UnixStream)>,
    /// The connect whose session runs (the guest was told PORT_OPEN 1).
    live: Option<u64>,
}

struct HostInner {
    state: Mutex<HostState>,
    changed: Condvar,
    /// Wakes the worker when a connect is pending.
    wake: EventFd,
}

/// Handle to a console device's host side. Cheap to clone.
#[derive(Clone)]
pub struct ConsoleHost {
    inner: Arc<HostInner>,
}

impl std::fmt::Debug for ConsoleHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleHost")
            .field("port", &AGENT_PORT_NAME)
            .finish()
    }
}

impl ConsoleHost {
    /// A handle for one device.
    pub fn new() -> std::io::Result<ConsoleHost> {
        Ok(ConsoleHost {
            inner: Arc::new(HostInner {
                state: Mutex::new(HostState::default()),
                changed: Condvar::new(),
                wake: EventFd::new(libc::EFD_NONBLOCK)?,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, HostState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a session on the port: returns the host end once the guest
    /// has the port open for this session (a fresh open, see the module
    /// docs of `console`). A session already running ends (its stream reads
    /// EOF). Reads see the guest's bytes; EOF means the guest closed the
    /// port or the session was replaced.
    pub fn connect(&self, timeout: Duration) -> Result<UnixStream, ConsoleConnectError> {
        let host_err = ConsoleConnectError::Host;
        let (mine, theirs) = UnixStream::pair().map_err(host_err)?;
        let seq = {
            let mut st = self.state();
            if !st.active {
                return Err(ConsoleConnectError::NotActive);
            }
            st.seq += 1;
            st.pending = Some((st.seq, theirs));
            st.seq
        };
        self.inner.wake.write(1).map_err(host_err)?;
        let deadline = Instant::now() + timeout;
        let mut st = self.state();
        loop {
            if st.live == Some(seq) {
                return Ok(mine);
            }
            if st.seq != seq || !st.active {
                return Err(ConsoleConnectError::Dropped);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Withdrawn if the worker has not taken it yet; otherwise
                // the worker sees `mine` close and lets it go.
                if st.pending.as_ref().is_some_and(|(s, _)| *s == seq) {
                    st.pending = None;
                }
                return Err(ConsoleConnectError::Timeout {
                    name: AGENT_PORT_NAME,
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            st = self
                .inner
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Whether a session runs now (for tests and diagnostics).
    pub fn is_live(&self) -> bool {
        self.state().live.is_some()
    }

    /// The eventfd that is readable while a connect waits for the worker.
    pub(super) fn wake_fd(&self) -> RawFd {
        self.inner.wake.as_raw_fd()
    }

    /// Clears `wake_fd`'s readiness.
    pub(super) fn clear_wake(&self) {
        let _ = self.inner.wake.read();
    }

    /// The connect waiting for the worker, if any.
    pub(super) fn take_pending(&self) -> Option<(u64, UnixStream)> {
        self.state().pending.take()
    }

    /// Connect `seq`'s session runs (`Some`) or no session runs (`None`).
    pub(super) fn set_live(&self, seq: Option<u64>) {
        self.state().live = seq;
        self.inner.changed.notify_all();
    }

    /// Whether a connect waits for the device worker to take it.
    pub fn connect_waiting(&self) -> bool {
        self.state().pending.is_some()
    }

    /// The driver runs (DRIVER_OK) or went away (connects waiting fail).
    /// The device calls it; fuzzing drives a device without its transport.
    pub fn set_active(&self, active: bool) {
        let mut st = self.state();
        st.active = active;
        if !active {
            st.pending = None;
            st.live = None;
        }
        drop(st);
        self.inner.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_waits_for_an_active_device_and_its_session() {
        let host = ConsoleHost::new().expect("host");
        assert!(matches!(
            host.connect(Duration::from_millis(1)).unwrap_err(),
            ConsoleConnectError::NotActive
        ));
        host.set_active(true);
        let e = host.connect(Duration::from_millis(10)).unwrap_err();
        assert!(
            matches!(e, ConsoleConnectError::Timeout { .. }),
            "{e}: nobody made it live"
        );
        assert!(
            host.take_pending().is_none(),
            "a timed-out connect is withdrawn"
        );
        host.clear_wake();
        let h = host.clone();
        let t = std::thread::spawn(move || h.connect(Duration::from_secs(10)));
        let deadline = Instant::now() + Duration::from_secs(10);
        let (seq, _theirs) = loop {
            if let Some(p) = host.take_pending() {
                break p;
            }
            assert!(Instant::now() < deadline, "no pending connect");
            std::thread::yield_now();
        };
        host.set_live(Some(seq));
        t.join().expect("thread").expect("connected");
        assert!(host.is_live());
        host.set_active(false);
        assert!(!host.is_live());
    }
}
