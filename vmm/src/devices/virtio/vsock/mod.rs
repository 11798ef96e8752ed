//! virtio-vsock (virtio 1.2, 5.10) in userspace: no /dev/vhost-vsock.
//!
//! The guest gets a CID (config space); the host is CID 2. Stream sockets
//! only. The device's host side is a [`VsockBackend`]; the one in use is
//! `unix::VsockHost`: host-initiated connections (`VsockHost::connect`) and
//! guest-initiated ones (to a port the host `listen`s on) each end, host
//! side, in one end of a Unix socketpair, so the harness's agent client reads
//! and writes a plain stream. Credit flow control works both ways: the guest may not send more
//! than `defs::CONN_BUF_BYTES` unforwarded bytes per connection, and the host
//! sends no more than the guest's advertised buffer allows. A request to a port
//! nobody listens on, or a packet for an unknown connection, is answered with
//! RST.
//!
//! `device.rs` is the `VirtioDevice` (a `worker::DeviceWorker` per
//! activation runs the muxer's events, `event_handler.rs`); `muxer.rs` moves
//! packets between the queues and connections;
//! `csm.rs` is one connection's state and credit accounting; `unix/` is the
//! host-facing handle behind the backend trait; `test_utils.rs` has a mock
//! backend for unit tests.
//!
//! The guest is hostile: packets are parsed by virtio-vsock with a 64 KiB cap
//! on payloads; a guest that overruns its credit is reset; connections are
//! capped at `MAX_CONNECTIONS`, and those waiting in a host listener at
//! `LISTEN_BACKLOG`; replies the device owes the guest are capped at
//! `MAX_PENDING_REPLIES`, beyond which the TX queue is left unread until the
//! guest supplies RX buffers (backpressure, no unbounded growth).

pub mod csm;
pub mod device;
pub mod event_handler;
pub mod muxer;
pub mod persist;
#[cfg(test)]
pub mod test_utils;
pub mod unix;

use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;

pub use device::Vsock;
pub use unix::{VsockHost, VsockListener};

/// The host side of a vsock device: where host-initiated connections come
/// from and where the guest's connections go. The muxer calls it from the
/// device worker; the host's own threads (the harness's agent client) talk
/// to the implementation directly.
pub trait VsockBackend: Send + Sync {
    /// The guest's CID (config space).
    fn guest_cid(&self) -> u64;
    /// An fd that is readable while host connects wait (`take_connects`);
    /// the worker watches it.
    fn wake_fd(&self) -> RawFd;
    /// Clears `wake_fd`'s readiness (after it fired).
    fn clear_wake(&self);
    /// The connections the host asked for since the last call.
    fn take_connects(&self) -> Vec<ConnectRequest>;
    /// The guest asks to connect to host `port`: the device's end of a new
    /// connection (the host got the other), or `None` when nothing listens
    /// there or its backlog (`defs::LISTEN_BACKLOG`) is full (the guest is
    /// answered RST).
    fn accept_guest_connect(&self, port: u32) -> Option<UnixStream>;
    /// The guest driver is running (DRIVER_OK) or went away (reset, device
    /// dropped: connects still waiting are dropped, their callers told).
    fn set_active(&self, active: bool);
}

/// A connection the host asked for, waiting for the muxer.
pub struct ConnectRequest {
    /// Guest port.
    pub port: u32,
    /// The device's end of the connection's socketpair.
    pub stream: UnixStream,
    /// Tells the caller whether the guest accepted.
    pub reply: Sender<Result<(), VsockConnectError>>,
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

/// Protocol constants (virtio 1.2, 5.10.6) and the device's limits.
pub mod defs {
    /// The host's CID.
    pub const HOST_CID: u64 = 2;
    /// Queue indices.
    pub const RXQ: usize = 0;
    /// TX queue.
    pub const TXQ: usize = 1;
    /// Event queue.
    pub const EVQ: usize = 2;
    /// Queue size offered for each queue.
    pub const QUEUE_SIZE: u16 = 256;
    /// `type`: stream.
    pub const TYPE_STREAM: u16 = 1;
    /// Connection request.
    pub const OP_REQUEST: u16 = 1;
    /// Connection accepted.
    pub const OP_RESPONSE: u16 = 2;
    /// Connection refused or torn down.
    pub const OP_RST: u16 = 3;
    /// No more data in the flagged direction(s).
    pub const OP_SHUTDOWN: u16 = 4;
    /// Data.
    pub const OP_RW: u16 = 5;
    /// Unsolicited credit report.
    pub const OP_CREDIT_UPDATE: u16 = 6;
    /// Please send a credit update.
    pub const OP_CREDIT_REQUEST: u16 = 7;
    /// SHUTDOWN flag: the sender will receive no more.
    pub const SHUTDOWN_RCV: u32 = 1;
    /// SHUTDOWN flag: the sender will send no more.
    pub const SHUTDOWN_SEND: u32 = 2;
    /// Largest payload accepted in one TX packet.
    pub const MAX_PKT_DATA_BYTES: u32 = 64 << 10;
    /// Per-connection buffer for guest→host bytes the host has not read yet:
    /// the `buf_alloc` the device advertises.
    pub const CONN_BUF_BYTES: u32 = 256 << 10;
    /// Most open connections.
    pub const MAX_CONNECTIONS: usize = 1024;
    /// Most guest connections waiting in one host listener for the host to
    /// accept them (`VsockListener::accept_timeout`); beyond it the guest is
    /// answered RST, as Linux answers a connect to a full accept queue. Each
    /// waiting connection holds a socketpair (two fds) even after the guest
    /// reset it, so without this a guest that connects and resets in a loop
    /// grows the VMM's fds and memory until the host accepts.
    pub const LISTEN_BACKLOG: usize = 128;
    /// Most control packets (RESPONSE, RST, ...) waiting for RX buffers.
    pub const MAX_PENDING_REPLIES: usize = 256;
    /// Event-queue event id: the transport was reset (virtio 1.2, 5.10.6.6).
    pub const EVENT_TRANSPORT_RESET: u32 = 0;
    /// First local port handed out for host-initiated connections.
    pub const FIRST_EPHEMERAL_PORT: u32 = 1 << 30;
    /// How long a connection that asked the guest to close waits for its RST.
    pub const CLOSE_TIMEOUT_MS: u64 = 2000;
    /// How long a host-initiated connection waits for the guest's answer.
    pub const CONNECT_TIMEOUT_MS: u64 = 10_000;
}
