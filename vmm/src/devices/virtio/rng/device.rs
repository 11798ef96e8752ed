//! The virtio-rng `VirtioDevice`. Requests are served on the notifying vCPU's
//! thread: the work per notify is bounded (at most the queue size of requests,
//! each at most `MAX_REQUEST_BYTES`), and there is no I/O besides getrandom(2).
//!
//! Hostile queues: read-only descriptors in a chain are skipped, buffers
//! outside guest memory end that request with what was written so far, loops
//! and over-long chains are cut by virtio-queue. Nothing the guest writes can
//! make the device allocate: bytes go through a fixed bounce buffer.

use std::sync::Arc;

use rand_chacha::rand_core::{Rng as _, SeedableRng};
use rand_chacha::ChaCha20Rng;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::defs::{CHUNK_BYTES, MAX_REQUEST_BYTES, QUEUE_SIZE};
use super::persist::{RngConstructorArgs, RngState};
use crate::devices::virtio::persist::{decode_state, encode_state, QueueSnapshot};
use crate::devices::virtio::{
    ActivateError, ActiveArgs, DeviceSnapshot, VirtioDevice, VirtioInterrupt, VirtioPersistError,
};
use crate::vstate::memory::GuestMemoryMmap;
use provium_snapshot::Persist;

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

pub(super) struct Active {
    pub(super) mem: GuestMemoryMmap,
    pub(super) queue: Queue,
    pub(super) interrupt: Arc<dyn VirtioInterrupt>,
}

/// A virtio-rng device.
pub struct Rng {
    pub(super) entropy: Entropy,
    pub(super) acked_features: u64,
    pub(super) active: Option<Active>,
    /// Bytes handed to the guest so far (for tests and metrics).
    pub(super) bytes_served: u64,
}

impl Rng {
    /// A device over `cfg`.
    pub fn new(cfg: RngConfig) -> Rng {
        Rng {
            entropy: Entropy::new(cfg),
            acked_features: 0,
            active: None,
            bytes_served: 0,
        }
    }

    /// Random bytes written into guest buffers since creation.
    pub fn bytes_served(&self) -> u64 {
        self.bytes_served
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

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // virtio-rng has no configuration space.
        data.fill(0);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        mut queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        ActivateError::check_queue_count(&queues, 1)?;
        self.active = Some(Active {
            mem,
            queue: queues.remove(0),
            interrupt,
        });
        Ok(())
    }

    fn queue_notify(&mut self, _index: u32) {
        if self.process() {
            if let Some(a) = &mut self.active {
                if a.queue.needs_notification(&a.mem).unwrap_or(true) {
                    a.interrupt.signal_used_queue(0);
                }
            }
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
    }

    fn save(&mut self) -> DeviceSnapshot {
        DeviceSnapshot {
            queues: self
                .active
                .iter()
                .map(|a| QueueSnapshot::of(&a.queue))
                .collect(),
            state: encode_state(&Persist::save(&*self)),
        }
    }

    fn resume_after_save(&mut self) {
        // Requests are served on vCPU threads; nothing was stopped.
    }

    fn restore(
        &mut self,
        active: Option<ActiveArgs>,
        state: &[u8],
    ) -> Result<(), VirtioPersistError> {
        let state: RngState = decode_state("virtio-rng", state)?;
        let args = RngConstructorArgs {
            entropy: self.entropy.clone(),
            acked_features: self.acked_features,
            active,
        };
        *self = <Rng as Persist>::restore(args, &state)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use std::sync::atomic::Ordering;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::Address;

    const W: u16 = VRING_DESC_F_WRITE as u16;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;

    fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    /// A device activated on a 16-entry mock queue at GPA 0.
    fn rig<'a>(
        mem: &'a GuestMemoryMmap,
        seed: Option<u64>,
    ) -> (
        Rng,
        MockSplitQueue<'a, GuestMemoryMmap>,
        Arc<CountingInterrupt>,
    ) {
        let q = MockSplitQueue::create(mem, GuestAddress(0), 16);
        let mut dev = Rng::new(RngConfig { seed });
        let irq = Arc::new(CountingInterrupt::default());
        dev.activate(
            mem.clone(),
            vec![q.create_queue().expect("queue")],
            irq.clone(),
        )
        .expect("activate");
        (dev, q, irq)
    }

    fn used(mem: &GuestMemoryMmap, q: &MockSplitQueue<'_, GuestMemoryMmap>, i: u64) -> (u32, u32) {
        let base = q.used_addr().unchecked_add(4 + 8 * i);
        let id: u32 = mem.read_obj(base).expect("id");
        let len: u32 = mem.read_obj(base.unchecked_add(4)).expect("len");
        (id, len)
    }

    fn used_idx(mem: &GuestMemoryMmap, q: &MockSplitQueue<'_, GuestMemoryMmap>) -> u16 {
        mem.read_obj(q.used_addr().unchecked_add(2)).expect("idx")
    }

    /// Runs two 100-byte requests (the second split over two buffers) and
    /// returns the 200 bytes the guest got.
    fn read_200(seed: Option<u64>) -> Vec<u8> {
        let mem = guest_memory();
        let (mut dev, q, irq) = rig(&mem, seed);
        let descs = vec![
            d(0x10_0000, 100, W, 0),
            d(0x10_0064, 40, W | NEXT, 2),
            d(0x10_008c, 60, W, 0),
        ];
        q.add_desc_chains(&descs, 0).expect("chains");
        dev.queue_notify(0);
        assert_eq!(used_idx(&mem, &q), 2);
        assert_eq!(used(&mem, &q, 0), (0, 100));
        assert_eq!(used(&mem, &q, 1), (1, 100));
        assert_eq!(irq.used.load(Ordering::SeqCst), 1);
        assert_eq!(dev.bytes_served(), 200);
        let mut got = vec![0u8; 200];
        mem.read_slice(&mut got, GuestAddress(0x10_0000))
            .expect("read");
        got
    }

    #[test]
    fn equal_seeds_give_equal_bytes() {
        let a = read_200(Some(0xdead_beef));
        let b = read_200(Some(0xdead_beef));
        let c = read_200(Some(1));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The stream is ChaCha20 from the seed: the guest's bytes are its first 200.
        let mut want = vec![0u8; 200];
        ChaCha20Rng::seed_from_u64(0xdead_beef).fill_bytes(&mut want);
        assert_eq!(a, want);
    }

    #[test]
    fn host_randomness_without_a_seed() {
        let a = read_200(None);
        let b = read_200(None);
        assert_ne!(a, b, "two reads of host randomness differ");
        assert!(a.iter().any(|&x| x != 0));
    }

    #[test]
    fn hostile_chains_are_bounded_and_harmless() {
        let mem = guest_memory();
        let (mut dev, q, _irq) = rig(&mem, Some(7));
        let descs = vec![
            // A read-only buffer: skipped, used length 0.
            d(0x10_0000, 64, 0, 0),
            // A buffer mostly outside the 4 MiB of memory: ends at the edge.
            d(0x3f_fff0, 4096, W, 0),
            // A huge buffer: capped at MAX_REQUEST_BYTES.
            d(0x20_0000, 1 << 30, W, 0),
            // A loop: virtio-queue cuts it.
            d(0x10_1000, 16, W | NEXT, 4),
            d(0x10_2000, 16, W | NEXT, 3),
        ];
        q.add_desc_chains(&descs, 0).expect("chains");
        dev.queue_notify(u32::MAX);
        assert_eq!(used_idx(&mem, &q), 4);
        assert_eq!(used(&mem, &q, 0).1, 0);
        assert!(used(&mem, &q, 1).1 < 4096);
        assert_eq!(used(&mem, &q, 2).1, MAX_REQUEST_BYTES);
        assert!(used(&mem, &q, 3).1 <= 32 * 16);
        let mut ro = [0u8; 64];
        mem.read_slice(&mut ro, GuestAddress(0x10_0000))
            .expect("read");
        assert_eq!(ro, [0; 64], "read-only buffer untouched");
    }

    #[test]
    fn notify_before_activation_and_after_reset_is_ignored() {
        let mut dev = Rng::new(RngConfig { seed: Some(1) });
        dev.queue_notify(0);
        assert_eq!(dev.device_type(), 4);
        let mut cfg = [0xffu8; 4];
        dev.read_config(0, &mut cfg);
        assert_eq!(cfg, [0; 4]);
        let mem = guest_memory();
        let (mut dev, q, _irq) = rig(&mem, Some(1));
        dev.reset();
        q.add_desc_chains(&[d(0x10_0000, 8, W, 0)], 0)
            .expect("chain");
        dev.queue_notify(0);
        assert_eq!(used_idx(&mem, &q), 0);
        assert!(dev
            .activate(mem.clone(), vec![], Arc::new(CountingInterrupt::default()))
            .is_err());
    }
}
