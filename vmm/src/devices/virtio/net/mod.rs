//! virtio-net (virtio 1.2, 5.1): one receive and one transmit queue whose
//! frames go to and come from a port of a bridge's userspace switch
//! (`provium_netsetup::Port`).
//!
//! Features offered: VERSION_1, MAC (the bridge's deterministic MAC for this
//! VM, in config space), STATUS (link status in config space), and the
//! offloads: CSUM and HOST_TSO4/6 (the guest hands over checksum-pending
//! frames and 64 KiB TCP super-frames with a virtio-net header, which goes to
//! the switch with the frame: `Port::send_offload` validates it, an invalid
//! one drops the frame and counts it on the port), GUEST_CSUM and GUEST_TSO4/6
//! (the port is told, `Port::set_offloads`, so the switch hands the guest
//! super-frames whole and segments only for ports that cannot take them) and
//! MRG_RXBUF (a frame spans as many RX chains as it needs). A guest that
//! negotiates none of them gets the old behaviour: headers read and ignored,
//! "nothing to do" written, one chain per frame.

//! Link status follows the switch port: `Switch::disconnect` (`nic:disconnect()`)
//! runs the port's link watcher, which clears VIRTIO_NET_S_LINK_UP and raises a
//! configuration-change interrupt; the guest driver re-reads the status and
//! drops carrier. `reconnect` does the reverse.
//!
//! `device.rs` is the `VirtioDevice`; `active.rs` the worker's half (one
//! worker per activation, its events mapped in `event_handler.rs`);
//! `packet.rs` moves frames between the virtqueues and the port;
//! `persist.rs` is its snapshot state.
//!
//! The guest is hostile: TX chains longer than one header plus
//! [`defs::MAX_FRAME_BYTES`], chains outside guest memory, RX chains with
//! device-readable buffers or too small for the frame are completed with
//! nothing forwarded and counted in [`NetMetrics`]; loops and over-long chains
//! are cut by virtio-queue. At most one frame waits inside the device for RX
//! buffers; the rest wait in the switch port's bounded queue.

pub mod active;
pub mod device;
pub mod event_handler;
pub mod packet;
pub mod persist;
pub mod plug;

pub use device::Net;
pub use packet::NetMetrics;
pub use plug::PortPlug;

/// Constants of the net device.
pub mod defs {
    /// Queue index of the receive queue.
    pub const RXQ: usize = 0;
    /// Queue index of the transmit queue.
    pub const TXQ: usize = 1;
    /// Queue size offered for both queues.
    pub const QUEUE_SIZE: u16 = 256;
    /// `struct virtio_net_hdr_v1` (with `num_buffers`): what precedes every
    /// frame once VERSION_1 is negotiated.
    pub const HDR_V1_BYTES: usize = 12;
    /// The legacy header without `num_buffers` (VERSION_1 not negotiated).
    pub const HDR_LEGACY_BYTES: usize = 10;
    /// Largest frame forwarded either way: the switch's own bound.
    pub const MAX_FRAME_BYTES: usize = provium_netsetup::MAX_FRAME_BYTES;
    /// Largest TX chain accepted: a header plus the largest frame (65561
    /// bytes). Longer chains are dropped without being read past this.
    pub const MAX_TX_CHAIN_BYTES: usize = HDR_V1_BYTES + MAX_FRAME_BYTES;
    /// Config space: mac (6 bytes), then status (le16).
    pub const CONFIG_STATUS_OFFSET: usize = 6;
    /// Config space length exposed.
    pub const CONFIG_BYTES: usize = 8;
}
