//! The Unix backend of a vsock device ([`VsockBackend`]): the host-facing
//! handle through which the harness connects to a guest port or listens for
//! the guest's connections, each connection's host end one end of a Unix
//! socketpair. It outlives resets (the rebuilt device takes a clone), so the
//! harness keeps one per VM.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{
    channel, sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError,
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use super::defs::LISTEN_BACKLOG;
use super::{ConnectRequest, VsockBackend, VsockConnectError};

#[derive(Default)]
pub(crate) struct HostState {
    /// True while a device worker runs (the guest driver set DRIVER_OK).
    pub active: bool,
    pub connects: Vec<ConnectRequest>,
    /// Each listened port's backlog, at most `LISTEN_BACKLOG` connections.
    pub listeners: HashMap<u32, SyncSender<UnixStream>>,
}

struct HostInner {
    guest_cid: u64,
    state: Mutex<HostState>,
    /// Wakes the muxer when `connects` grows.
    wake: EventFd,
}

/// Handle to a vsock device's host side. Cheap to clone.
#[derive(Clone)]
pub struct VsockHost {
    inner: Arc<HostInner>,
}

impl std::fmt::Debug for VsockHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockHost")
            .field("guest_cid", &self.inner.guest_cid)
            .finish()
    }
}

/// Guest-initiated connections to one host port.
pub struct VsockListener {
    port: u32,
    rx: Receiver<UnixStream>,
    host: VsockHost,
}

impl VsockListener {
    /// The next connection, or `None` after `timeout`.
    pub fn accept_timeout(&self, timeout: Duration) -> Option<UnixStream> {
        self.rx.recv_timeout(timeout).ok()
    }
}

impl Drop for VsockListener {
    fn drop(&mut self) {
        self.host.state().listeners.remove(&self.port);
    }
}

impl VsockHost {
    /// A handle for a device with `guest_cid` (3 or more; 0-2 are reserved).
    pub fn new(guest_cid: u64) -> std::io::Result<VsockHost> {
        Ok(VsockHost {
            inner: Arc::new(HostInner {
                guest_cid,
                state: Mutex::new(HostState::default()),
                wake: EventFd::new(libc::EFD_NONBLOCK)?,
            }),
        })
    }

    /// The guest's CID.
    pub fn guest_cid(&self) -> u64 {
        self.inner.guest_cid
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, HostState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connects to guest `port`: returns the host end once the guest accepted.
    /// Reads see the guest's bytes; EOF means the guest closed or reset.
    pub fn connect(&self, port: u32, timeout: Duration) -> Result<UnixStream, VsockConnectError> {
        let (mine, theirs) =
            UnixStream::pair().map_err(|e| VsockConnectError::Host(e.to_string()))?;
        let (reply, rx) = channel();
        {
            let mut st = self.state();
            if !st.active {
                return Err(VsockConnectError::NotActive);
            }
            st.connects.push(ConnectRequest {
                port,
                stream: theirs,
                reply,
            });
        }
        self.inner
            .wake
            .write(1)
            .map_err(|e| VsockConnectError::Host(e.to_string()))?;
        match rx.recv_timeout(timeout) {
            Ok(Ok(())) => Ok(mine),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Err(VsockConnectError::Timeout {
                cid: self.guest_cid(),
                port,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
            Err(RecvTimeoutError::Disconnected) => Err(VsockConnectError::Dropped { port }),
        }
    }

    /// Accepts guest connections to host `port` until the listener drops.
    /// At most `LISTEN_BACKLOG` of them wait to be accepted; the guest's
    /// connects beyond that are refused (RST).
    pub fn listen(&self, port: u32) -> Result<VsockListener, VsockConnectError> {
        let (tx, rx) = sync_channel(LISTEN_BACKLOG);
        let mut st = self.state();
        if st.listeners.contains_key(&port) {
            return Err(VsockConnectError::PortInUse(port));
        }
        st.listeners.insert(port, tx);
        drop(st);
        Ok(VsockListener {
            port,
            rx,
            host: self.clone(),
        })
    }
}

impl VsockBackend for VsockHost {
    fn guest_cid(&self) -> u64 {
        self.inner.guest_cid
    }

    fn wake_fd(&self) -> RawFd {
        self.inner.wake.as_raw_fd()
    }

    fn clear_wake(&self) {
        let _ = self.inner.wake.read();
    }

    fn take_connects(&self) -> Vec<ConnectRequest> {
        std::mem::take(&mut self.state().connects)
    }

    fn accept_guest_connect(&self, port: u32) -> Option<UnixStream> {
        let listener = self.state().listeners.get(&port).cloned()?;
        let (mine, theirs) = UnixStream::pair().ok()?;
        match listener.try_send(theirs) {
            Ok(()) => Some(mine),
            // The backlog is full: refused; both ends close here.
            Err(TrySendError::Full(_)) => None,
            Err(TrySendError::Disconnected(_)) => {
                // The listener was dropped: nobody listens there any more.
                self.state().listeners.remove(&port);
                None
            }
        }
    }

    fn set_active(&self, active: bool) {
        let mut st = self.state();
        st.active = active;
        if !active {
            // The device went away: pending connects learn so (their
            // reply channels close).
            st.connects.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connects_wait_for_an_active_device_and_listeners_get_guest_connections() {
        let host = VsockHost::new(3).expect("host");
        assert_eq!(
            host.connect(5, Duration::from_millis(1)).unwrap_err(),
            VsockConnectError::NotActive
        );
        host.set_active(true);
        let h = host.clone();
        let t = std::thread::spawn(move || h.connect(5, Duration::from_secs(10)));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let req = loop {
            if let Some(r) = host.take_connects().pop() {
                break r;
            }
            assert!(std::time::Instant::now() < deadline, "no connect request");
            std::thread::yield_now();
        };
        assert_eq!(req.port, 5);
        req.reply.send(Ok(())).expect("caller waits");
        t.join().expect("thread").expect("connected");
        host.clear_wake();

        assert!(host.accept_guest_connect(80).is_none(), "nobody listens");
        let l = host.listen(80).expect("listen");
        assert_eq!(
            host.listen(80).err().expect("second listener refused"),
            VsockConnectError::PortInUse(80)
        );
        assert!(host.accept_guest_connect(80).is_some());
        assert!(l.accept_timeout(Duration::from_secs(5)).is_some());
        drop(l);
        assert!(host.accept_guest_connect(80).is_none(), "listener gone");
        host.set_active(false);
        assert!(host.take_connects().is_empty());
    }

    #[test]
    fn a_full_backlog_refuses_guest_connects_until_the_host_accepts() {
        let host = VsockHost::new(3).expect("host");
        let l = host.listen(80).expect("listen");
        // Connections the guest reset at once still wait in the backlog
        // (the host reads EOF on them): the device's ends are dropped here.
        for _ in 0..LISTEN_BACKLOG {
            assert!(host.accept_guest_connect(80).is_some());
        }
        assert!(
            host.accept_guest_connect(80).is_none(),
            "backlog of {LISTEN_BACKLOG} full: refused"
        );
        let mut s = l.accept_timeout(Duration::from_secs(5)).expect("waiting");
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut s, &mut rest).expect("EOF: the device end is gone");
        assert!(
            host.accept_guest_connect(80).is_some(),
            "room for one again"
        );
        assert!(host.accept_guest_connect(80).is_none());
        assert!(host.state().listeners.contains_key(&80), "still listening");
    }
}
