//! virtio-rng (virtio 1.2, 5.4): one request queue whose device-writable
//! buffers the device fills with random bytes.
//!
//! With `rng_seed` (boot opts) the bytes are a deterministic ChaCha20 stream
//! from that seed, so a guest that reads the same way sees the same bytes on
//! every run; without it they come from the host's getrandom(2).
//!
//! `device.rs` is the `VirtioDevice`; `active.rs` the serving half (the byte
//! source and the queue it fills), which `persist.rs` saves and rebuilds.

pub mod active;
pub mod device;
pub mod persist;

pub use active::{Entropy, RngConfig, RngServer};
pub use device::Rng;

/// Constants of the rng device.
pub mod defs {
    /// Queue size offered.
    pub const QUEUE_SIZE: u16 = 64;
    /// Most bytes written for one request, whatever the guest's buffer sizes:
    /// bounds the work a notify does on a vCPU thread. Linux's hw_random asks
    /// for at most a page at a time.
    pub const MAX_REQUEST_BYTES: u32 = 64 << 10;
    /// Bounce buffer between the generator and guest memory.
    pub const CHUNK_BYTES: usize = 4096;
}
