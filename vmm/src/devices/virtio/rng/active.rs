//! The virtio-rng's serving half: where the bytes come from ([`Entropy`])
//! and [`RngServer`], which fills the activated queue's buffers. The device
//! (`device.rs`) and its snapshot state (`persist.rs`) both build on it.
//!
//! Requests are served on the notifying vCPU's thread: the work per notify
//! is bounded (at most the queue size of requests, each at most
//! `MAX_REQUEST_BYTES`), and there is no I/O besides getrandom(2).
//!
//! Hostile queues: read-only descriptors in a chain are skipped, buffers
//! outside guest memory end that request with what was written so far, loops
//! and over-long chains are cut by virtio-queue. Nothing the guest writes can
//! make the device allocate: bytes go through a fixed bounce buffer.

use std::sync::Arc;

use rand_chacha::rand_core::{Rng as _, SeedableRng};
use rand_chacha::ChaCha20Rng;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::defs::{CHUNK_BYTES, MAX_REQUEST_BYTES};
use crate::devices::virtio::VirtioInterrupt;
use crate::guest_memory::GuestMemoryMmap;

/// How an rng device is built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RngConfig {
    /// `rng_seed`: a deterministic stream; `None`: host randomness.
    pub seed: Option<u64>,
}

/// Where the bytes come from.
#[derive(Clone)]
pub enum Entropy {
    /// ChaCha20 keyed by the seed (stream position advances with every byte).
    Seeded(Box<ChaCha20Rng>),
    /// The host kernel's getrandom(2).
    Host,
}

impl Entropy {
    /// The source `cfg` asks for.
    pub fn new(cfg: RngConfig) -> Entropy {
        match cfg.seed {
            Some(s) => Entropy::Seeded(Box::new(ChaCha20Rng::seed_from_u64(s))),
            None => Entropy::Host,
        }
    }

    /// Fills `buf`. getrandom(2) on the urandom pool does not fail for
    /// lengths this small once the host has booted; if it ever does, the
    /// error is returned and the request ends short.
    pub fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        match self {
            Entropy::Seeded(r) => {
                r.fill_bytes(buf);
                Ok(())
            }
            Entropy::Host => {
                let mut done = 0;
                while done < buf.len() {
                    let rest = &mut buf[done..];
                    // SAFETY: writes at most rest.len() bytes into rest, which
                    // is valid writable memory for the call.
                    let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
                    if n < 0 {
                        let e = std::io::Error::last_os_error();
                        if e.kind() == std::io::ErrorKind::Interrupted {
                            continue;
                        }
                        return Err(e);
                    }
                    done += usize::try_from(n).expect("getrandom returns a non-negative count");
                }
                Ok(())
            }
        }
    }
}

/// An activated device's queue.
pub(super) struct Active {
    pub(super) mem: GuestMemoryMmap,
    pub(super) queue: Queue,
    pub(super) interrupt: Arc<dyn VirtioInterrupt>,
}

/// The byte source, what it has served, and the queue while activated.
pub struct RngServer {
    pub(super) entropy: Entropy,
    /// Bytes handed to the guest so far (for tests and metrics).
    pub(super) bytes_served: u64,
    pub(super) active: Option<Active>,
}

impl RngServer {
    /// A server over `entropy`, not activated.
    pub fn new(entropy: Entropy) -> RngServer {
        RngServer {
            entropy,
            bytes_served: 0,
            active: None,
        }
    }

    /// The guest notified the queue: serve what it made available and
    /// interrupt it if that completed anything it wants to hear of.
    pub(super) fn serve(&mut self) {
        if self.process() {
            if let Some(a) = &mut self.active {
                if a.queue.needs_notification(&a.mem).unwrap_or(true) {
                    a.interrupt.signal_used_queue(0);
                }
            }
        }
    }

    /// Serves every available request; returns whether any completed.
    fn process(&mut self) -> bool {
        let Some(a) = self.active.as_mut() else {
            return false;
        };
        let mut completed = false;
        let mut chunk = [0u8; CHUNK_BYTES];
        while let Some(chain) = a.queue.pop_descriptor_chain(&a.mem) {
            let head = chain.head_index();
            let mut written: u32 = 0;
            'chain: for desc in chain.writable() {
                let mut addr = desc.addr();
                let mut left = desc.len().min(MAX_REQUEST_BYTES - written);
                while left > 0 {
                    let n = left.min(CHUNK_BYTES as u32);
                    let buf = &mut chunk[..n as usize];
                    if self.entropy.fill(buf).is_err() {
                        break 'chain;
                    }
                    if a.mem.write_slice(buf, addr).is_err() {
                        break 'chain;
                    }
                    written += n;
                    left -= n;
                    let Some(next) = addr.0.checked_add(u64::from(n)) else {
                        break 'chain;
                    };
                    addr = GuestAddress(next);
                }
                if written >= MAX_REQUEST_BYTES {
                    break;
                }
            }
            self.bytes_served += u64::from(written);
            // add_used only fails for a head out of range, which a popped chain
            // cannot have; there is no one to tell if it did.
            completed |= a.queue.add_used(&a.mem, head, written).is_ok();
        }
        completed
    }
}
