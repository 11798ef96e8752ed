//! The virtio-rng `VirtioDevice`: features, no config space, one queue.
//! Requests are served on the notifying vCPU's thread by the device's
//! [`RngServer`] (`active.rs`), which is also what a snapshot saves.

use std::sync::Arc;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_queue::Queue;

use super::active::{Active, Entropy, RngConfig, RngServer};
use super::defs::QUEUE_SIZE;
use super::persist::{RngConstructorArgs, RngState};
use crate::devices::virtio::persist::{decode_state, encode_state, QueueSnapshot};
use crate::devices::virtio::{
    ActivateError, ActiveArgs, DeviceSnapshot, VirtioDevice, VirtioInterrupt, VirtioPersistError,
};
use crate::guest_memory::GuestMemoryMmap;
use provium_snapshot::Persist;

/// A virtio-rng device.
pub struct Rng {
    server: RngServer,
    acked_features: u64,
}

impl Rng {
    /// A device over `cfg`.
    pub fn new(cfg: RngConfig) -> Rng {
        Rng {
            server: RngServer::new(Entropy::new(cfg)),
            acked_features: 0,
        }
    }

    /// Random bytes written into guest buffers since creation.
    pub fn bytes_served(&self) -> u64 {
        self.server.bytes_served
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
        self.server.active = Some(Active {
            mem,
            queue: queues.remove(0),
            interrupt,
        });
        Ok(())
    }

    fn queue_notify(&mut self, _index: u32) {
        self.server.serve();
    }

    fn reset(&mut self) {
        self.server.active = None;
        self.acked_features = 0;
    }

    fn save(&mut self) -> DeviceSnapshot {
        DeviceSnapshot {
            queues: self
                .server
                .active
                .iter()
                .map(|a| QueueSnapshot::of(&a.queue))
                .collect(),
            state: encode_state(&self.server.save()),
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
            entropy: self.server.entropy.clone(),
            active,
        };
        self.server = RngServer::restore(args, &state)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::rng::defs::MAX_REQUEST_BYTES;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use rand_chacha::rand_core::{Rng as _, SeedableRng};
    use rand_chacha::ChaCha20Rng;
    use std::sync::atomic::Ordering;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::Address;
    use vm_memory::{Bytes, GuestAddress};

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
