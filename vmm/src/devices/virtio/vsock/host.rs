//! The host-facing handle of a vsock device: connect to a guest port, listen
//! for the guest's connections. It outlives resets (the rebuilt device takes
//! a clone), so the harness keeps one per VM.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

/// A connection the host asked for, waiting for the muxer.
pub(crate) struct ConnectRequest {
    pub port: u32,
    pub stream: UnixStream,
    pub reply: Sender<Result<(), VsockConnectError>>,
}

#[derive(Default)]
pub(crate) struct HostState {
    /// True while a device worker runs (the guest driver set DRIVER_OK).
    pub active: bool,
    pub connects: Vec<ConnectRequest>,
    pub listeners: HashMap<u32, Sender<UnixStream>>,
}

struct HostInner {
    guest_cid: u64,
    state: Mutex<HostState>,
    /// Wakes the muxer when `connects` grows.
    wake: EventFd,
}

/// A failed host-initiated connection.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum VsockConnectError {
    /// The guest answered RST: nothing listens there.
    #[error("guest CID {cid} refused the vsock connection to port {port} (nothing listens there)")]
    Refused {
        /// Guest CID.
        cid: u64,
        /// Port.
        port: u32,
    },
    /// The guest's driver is not running (not booted yet, or reset).
    #[error("the guest's vsock driver is not running (wait for the guest to boot, or check its kernel has CONFIG_VIRTIO_VSOCKETS)")]
    NotActive,
    /// No answer in time.
    #[error("no answer from guest CID {cid} port {port} within {timeout_ms} ms")]
    Timeout {
        /// Guest CID.
        cid: u64,
        /// Port.
        port: u32,
        /// How long it waited.
        timeout_ms: u64,
    },
    /// Too many connections, or the device went away mid-connect.
    #[error(
        "the vsock device dropped the connection to port {port} (device reset or connection limit)"
    )]
    Dropped {
        /// Port.
        port: u32,
    },
    /// The host could not make a socketpair or eventfd write.
    #[error("cannot set up the host side of a vsock connection: {0}")]
    Host(String),
    /// Someone already listens on that port.
    #[error("vsock port {0} already has a listener")]
    PortInUse(u32),
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

    pub(crate) fn wake_fd(&self) -> &EventFd {
        &self.inner.wake
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
    pub fn listen(&self, port: u32) -> Result<VsockListener, VsockConnectError> {
        let (tx, rx) = channel();
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
