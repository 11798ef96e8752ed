//! virtio-vsock (virtio 1.2, 5.10) in userspace: no /dev/vhost-vsock.
//!
//! The guest gets a CID (config space); the host is CID 2. Stream sockets
//! only. Host-initiated connections (`VsockHost::connect`) and guest-initiated
//! ones (to a port the host `listen`s on) each end, host side, in one end of a
//! Unix socketpair, so the harness's agent client reads and writes a plain
//! stream. Credit flow control works both ways: the guest may not send more
//! than `defs::CONN_BUF_BYTES` unforwarded bytes per connection, and the host
//! sends no more than the guest's advertised buffer allows. A request to a port
//! nobody listens on, or a packet for an unknown connection, is answered with
//! RST.
//!
//! `device.rs` is the `VirtioDevice` (a `worker::DeviceWorker` per
//! activation runs the muxer's events, `event_handler.rs`); `muxer.rs` moves
//! packets between the queues and connections;
//! `csm.rs` is one connection's state and credit accounting; `host.rs` is the
//! host-facing handle.
//!
//! The guest is hostile: packets are parsed by virtio-vsock with a 64 KiB cap
//! on payloads; a guest that overruns its credit is reset; connections are
//! capped at `MAX_CONNECTIONS`; replies the device owes the guest are capped at
//! `MAX_PENDING_REPLIES`, beyond which the TX queue is left unread until the
//! guest supplies RX buffers (backpressure, no unbounded growth).

pub mod csm;
pub mod device;
pub mod event_handler;
pub mod host;
pub mod muxer;
pub mod persist;

pub use device::Vsock;
pub use host::{VsockConnectError, VsockHost, VsockListener};

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
