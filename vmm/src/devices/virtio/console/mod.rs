//! virtio-console (virtio 1.2, 5.3) with one named port: the agent's channel
//! for guest kernels without vsock (Linux's `kvm_guest.config` has
//! VIRTIO_CONSOLE but no VSOCKETS).
//!
//! The device offers VIRTIO_CONSOLE_F_MULTIPORT with `max_nr_ports` 1: four
//! queues (port 0's receiveq and transmitq, then the control receiveq and
//! transmitq). Port 0 is announced with DEVICE_ADD and named with
//! PORT_NAME ([`defs::AGENT_PORT_NAME`], so the guest finds it by
//! `/sys/class/virtio-ports/*/name`; devtmpfs makes `/dev/vport<N>p0`, and
//! `/dev/virtio-ports/<name>` is a udev symlink). It is never a console
//! (no CONSOLE_PORT): bytes are not a tty's.
//!
//! The host side is a byte stream: [`ConsoleHost::connect`] hands the
//! harness one end of a Unix socketpair, as vsock does. One host session at
//! a time. Sessions are separated so that no byte of one is ever read as
//! part of the next:
//! - the device tells the guest the host is there with PORT_OPEN 1 only
//!   while a host stream is attached and the guest's open of the port is
//!   *fresh*: made after the previous host session ended;
//! - when a host session ends (the host closed its end, a new connect
//!   replaced it, or the VM was restored, whose old host side is gone), the
//!   device sends PORT_OPEN 0 and the guest's current open becomes stale.
//!   The guest's reader then reads the old session's bytes, then end of
//!   file; it closes the port (Linux discards what is buffered) and opens
//!   it again: only that new open starts the next session;
//! - while the guest's open is stale, what it writes is dropped and the
//!   host's bytes wait in the socket.
//!
//! `device.rs` is the `VirtioDevice`; `active.rs` the worker's half (queues,
//! control messages, the host stream); `host.rs` the host-facing handle;
//! `event_handler.rs` maps the worker's fds to its handlers; `persist.rs`
//! its snapshot state.
//!
//! The guest is hostile: control messages are parsed from at most
//! `defs::MAX_CONTROL_BYTES` (longer ones are read short), a port buffer's
//! bytes are bounded by `defs::MAX_CHAIN_BYTES`, messages the device owes
//! the guest are capped at `defs::MAX_PENDING_CONTROL`, and a port id or
//! event the device does not know is counted and ignored.

pub mod active;
pub mod device;
pub mod event_handler;
pub mod host;
pub mod persist;

pub use active::ConsoleMetrics;
pub use device::VirtioConsole;
pub use host::ConsoleHost;

/// A failed host connect.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleConnectError {
    /// The guest's driver has not set the device up (not booted yet, or reset).
    #[error("the guest's virtio-console driver is not running (wait for the guest to boot, or check its kernel has CONFIG_VIRTIO_CONSOLE)")]
    NotActive,
    /// The guest has not opened the port (again) in time.
    #[error("the guest did not open console port `{name}` within {timeout_ms} ms (is the agent running on the console channel?)")]
    Timeout {
        /// The port's name.
        name: &'static str,
        /// How long it waited.
        timeout_ms: u64,
    },
    /// Another connect replaced this one, or the device went away.
    #[error("the console port's host side was taken over or reset while connecting")]
    Dropped,
    /// The host could not make a socketpair or eventfd write.
    #[error("cannot set up the host side of the console port")]
    Host(#[source] std::io::Error),
}

/// Protocol constants (virtio 1.2, 5.3) and the device's limits.
pub mod defs {
    /// Port 0's receiveq (device → guest bytes).
    pub const RXQ: usize = 0;
    /// Port 0's transmitq (guest → device bytes).
    pub const TXQ: usize = 1;
    /// Control receiveq (device → guest messages).
    pub const CTRL_RXQ: usize = 2;
    /// Control transmitq (guest → device messages).
    pub const CTRL_TXQ: usize = 3;
    /// Queues with MULTIPORT and one port.
    pub const QUEUE_COUNT: usize = 4;
    /// Queue size offered for each queue.
    pub const QUEUE_SIZE: u16 = 64;
    /// Feature bit: the config space has `max_nr_ports`, control queues exist.
    pub const F_MULTIPORT: u64 = 1;
    /// Ports offered.
    pub const MAX_NR_PORTS: u32 = 1;
    /// The one port's id.
    pub const PORT_ID: u32 = 0;
    /// The port's name (PORT_NAME).
    pub const AGENT_PORT_NAME: &str = "org.provium.agent";
    /// `struct virtio_console_control`: le32 id, le16 event, le16 value.
    pub const CONTROL_HEADER_BYTES: usize = 8;
    /// Longest control message read from the guest (only the header means
    /// anything to the device).
    pub const MAX_CONTROL_BYTES: usize = 64;
    /// Most control messages waiting for control receiveq buffers; beyond
    /// it new ones are dropped and counted.
    pub const MAX_PENDING_CONTROL: usize = 32;
    /// Most bytes taken from one transmitq chain (Linux writes at most
    /// 32 KiB per buffer); the rest is dropped and counted.
    pub const MAX_CHAIN_BYTES: usize = 64 << 10;
    /// Most host bytes read at once, staged for receiveq buffers.
    pub const HOST_READ_BYTES: usize = 64 << 10;

    /// Control events (virtio 1.2, 5.3.6.2).
    pub const DEVICE_READY: u16 = 0;
    /// Device → driver: a port exists.
    pub const DEVICE_ADD: u16 = 1;
    /// Device → driver: a port is gone.
    pub const DEVICE_REMOVE: u16 = 2;
    /// Driver → device: a port is set up (value 1) or failed (0).
    pub const PORT_READY: u16 = 3;
    /// Device → driver: the port is a console.
    pub const CONSOLE_PORT: u16 = 4;
    /// Device → driver: console size.
    pub const RESIZE: u16 = 5;
    /// Both ways: the sender opened (1) or closed (0) its end of the port.
    pub const PORT_OPEN: u16 = 6;
    /// Device → driver: the port's name follows the header.
    pub const PORT_NAME: u16 = 7;
}
