//! virtio-blk (virtio 1.2, 5.2): one request queue over a host file, with the
//! Disk page's fault modes applied to the guest's requests (`io::BlockFaults`).
//!
//! `device.rs` is the `VirtioDevice`; `active.rs` the worker's half (the
//! queue, in-flight completions, the request loop), its events mapped in
//! `event_handler.rs`; `persist.rs` its snapshot state; `request.rs` parses
//! requests and `io/` runs them against the file.

pub mod active;
pub mod device;
pub mod event_handler;
pub mod io;
pub mod persist;
pub mod request;
pub mod slot;

pub use device::Block;
pub use io::{BlockConfig, BlockFaults, DiskImage};
pub use slot::{BlockSlot, SlotError};

/// Constants of the block device.
pub mod defs {
    /// Sector size in bytes (virtio-blk always counts 512-byte sectors).
    pub const SECTOR_BYTES: u64 = 512;
    /// Queue size offered.
    pub const QUEUE_SIZE: u16 = 256;
    /// Length of the request header (type, reserved, sector).
    pub const REQUEST_HEADER_BYTES: u32 = 16;
    /// Length of the device ID returned by GET_ID.
    pub const DEVICE_ID_BYTES: usize = 20;
    /// How long `slow` delays each completion.
    pub const SLOW_COMPLETION_MS: u64 = 50;
    /// Bounce buffer for file I/O (bounded whatever the guest's lengths).
    pub const IO_CHUNK_BYTES: usize = 64 << 10;
}

/// A block device error.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The backing file could not be opened or measured.
    #[error("cannot open disk image {path}")]
    Open {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}
