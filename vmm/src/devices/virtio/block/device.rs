//! The virtio-blk `VirtioDevice`: features, config space (capacity), and a
//! device worker per activated device (`worker_slot::WorkerSlot`) that
//! drains the request queue. What the worker owns and does is
//! [`ActiveBlock`] (`active.rs`).

use std::collections::VecDeque;
use std::sync::Arc;

use virtio_bindings::virtio_blk::{VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::Queue;

use super::active::{ActiveBlock, Pending};
use super::defs::QUEUE_SIZE;
use super::io::BlockConfig;
use super::persist::{BlockConstructorArgs, BlockState};
use super::slot::{BlockSlot, Media};
use crate::devices::virtio::persist::{
    check_queue_count, decode_state, encode_state, QueueSnapshot,
};
use crate::devices::virtio::worker_slot::WorkerSlot;
use crate::devices::virtio::{
    read_config_bytes, ActivateError, ActiveArgs, DeviceSnapshot, VirtioDevice, VirtioInterrupt,
    VirtioPersistError,
};
use crate::guest_memory::GuestMemoryMmap;
use provium_snapshot::Persist;

/// A virtio-blk device.
pub struct Block {
    cfg: Media,
    acked_features: u64,
    /// The activated device, on its worker or parked by a save.
    worker: WorkerSlot<ActiveBlock>,
}

impl Block {
    /// A device over `cfg`.
    pub fn new(cfg: BlockConfig) -> Block {
        Block::with_media(Media::Fixed(cfg))
    }

    /// A device whose medium comes and goes with `slot` (see `slot.rs`).
    pub fn in_slot(slot: Arc<BlockSlot>) -> Block {
        Block::with_media(Media::Slot(slot))
    }

    fn with_media(cfg: Media) -> Block {
        Block {
            cfg,
            acked_features: 0,
            worker: WorkerSlot::new("virtio-blk"),
        }
    }

    /// The capacity config space reports now, in sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.cfg.capacity_sectors()
    }

    /// Features the driver accepted.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    fn stop_worker(&mut self) {
        // A slot's medium change has no device to signal until the next
        // activation.
        self.cfg.set_interrupt(None);
        drop(self.worker.stop());
    }

    fn start_worker(&mut self, active: ActiveBlock) -> Result<(), ActivateError> {
        let irq = active.interrupt.clone();
        self.worker.start(active)?;
        self.cfg.set_interrupt(Some(irq));
        Ok(())
    }

    fn activate_with(
        &mut self,
        mem: GuestMemoryMmap,
        queue: Queue,
        pending: VecDeque<Pending>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        let active = ActiveBlock::new(mem, queue, pending, self.cfg.clone(), interrupt)
            .map_err(ActivateError::Worker)?;
        self.start_worker(active)
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1) | (1u64 << VIRTIO_BLK_F_FLUSH);
        if self.cfg.fixed_read_only() {
            f |= 1u64 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.capacity_sectors().to_le_bytes(), offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // Capacity is read-only (a guest cannot resize or eject a slot's
        // medium); writeback mode is not offered.
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        mut queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        ActivateError::check_queue_count(&queues, 1)?;
        self.stop_worker();
        self.activate_with(mem, queues.remove(0), VecDeque::new(), interrupt)
    }

    fn queue_notify(&mut self, _index: u32) {
        self.worker.notify();
    }

    fn reset(&mut self) {
        self.stop_worker();
        self.acked_features = 0;
    }

    fn save(&mut self) -> DeviceSnapshot {
        let Some(parked) = self.worker.park() else {
            return DeviceSnapshot {
                queues: Vec::new(),
                state: encode_state(&BlockState {
                    capacity_sectors: self.capacity_sectors(),
                    ..BlockState::default()
                }),
            };
        };
        DeviceSnapshot {
            queues: vec![QueueSnapshot::of(&parked.queue)],
            state: encode_state(&parked.save()),
        }
    }

    fn resume_after_save(&mut self) {
        // The same queue and held completions go back to a new worker. A
        // failed spawn leaves the device stopped, as a failed activate would.
        let _ = self.worker.resume();
    }

    fn restore(
        &mut self,
        active: Option<ActiveArgs>,
        state: &[u8],
    ) -> Result<(), VirtioPersistError> {
        let state: BlockState = decode_state("virtio-blk", state)?;
        state.check_capacity(self.capacity_sectors())?;
        let Some(mut a) = active else {
            return Ok(());
        };
        check_queue_count("virtio-blk", &a.queues, 1)?;
        let args = BlockConstructorArgs {
            mem: a.mem,
            queue: a.queues.remove(0),
            cfg: self.cfg.clone(),
            interrupt: a.interrupt,
        };
        let active = ActiveBlock::restore(args, &state)?;
        Ok(self.start_worker(active)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block::defs::SLOW_COMPLETION_MS;
    use crate::devices::virtio::block::{BlockFaults, DiskImage};
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use std::io::Write;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    const W: u16 = VRING_DESC_F_WRITE as u16;
    const NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;

    struct Rig {
        mem: GuestMemoryMmap,
        faults: Arc<BlockFaults>,
        irq: Arc<CountingInterrupt>,
        dev: Block,
        _file: tempfile::NamedTempFile,
    }

    fn rig(mem: &GuestMemoryMmap, q: &MockSplitQueue<'_, GuestMemoryMmap>) -> Rig {
        let mut f = tempfile::NamedTempFile::new().expect("tempfile");
        f.write_all(&vec![0x5a; 64 * 512]).expect("write");
        let disk = Arc::new(DiskImage::open(f.path(), false, "vda-id").expect("open"));
        let faults = Arc::new(BlockFaults::default());
        let mut dev = Block::new(BlockConfig {
            disk,
            faults: faults.clone(),
        });
        let irq = Arc::new(CountingInterrupt::default());
        let queue: Queue = q.create_queue().expect("queue");
        dev.activate(mem.clone(), vec![queue], irq.clone())
            .expect("activate");
        Rig {
            mem: mem.clone(),
            faults,
            irq,
            dev,
            _file: f,
        }
    }

    fn header(mem: &GuestMemoryMmap, at: u64, t: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&t.to_le_bytes());
        h[8..].copy_from_slice(&sector.to_le_bytes());
        mem.write_slice(&h, GuestAddress(at)).expect("in memory");
    }

    fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    /// Three-descriptor request at table slots `base..base+3`, buffers at
    /// `buf` (header, +0x1000 data, +0x2000 status); the header is written apart.
    fn request(base: u16, buf: u64, data_flags: u16) -> Vec<RawDescriptor> {
        vec![
            d(buf, 16, NEXT, base + 1),
            d(buf + 0x1000, 512, data_flags | NEXT, base + 2),
            d(buf + 0x2000, 1, W, 0),
        ]
    }

    fn used_idx(mem: &GuestMemoryMmap, q: &MockSplitQueue<'_, GuestMemoryMmap>) -> u16 {
        mem.read_obj(q.used_addr().unchecked_add(2))
            .expect("used idx")
    }

    fn wait_used(
        mem: &GuestMemoryMmap,
        q: &MockSplitQueue<'_, GuestMemoryMmap>,
        n: u16,
    ) -> Duration {
        let start = Instant::now();
        while used_idx(mem, q) < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "used ring stuck at {}",
                used_idx(mem, q)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        start.elapsed()
    }

    use vm_memory::Address;

    #[test]
    fn write_then_read_through_the_queue() {
        let mem = guest_memory();
        let q = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let mut r = rig(&mem, &q);
        header(&mem, 0x10_0000, VIRTIO_BLK_T_OUT, 2);
        mem.write_slice(&[0xc3; 512], GuestAddress(0x10_1000))
            .expect("mem");
        header(&mem, 0x20_0000, VIRTIO_BLK_T_IN, 2);
        header(&mem, 0x30_0000, VIRTIO_BLK_T_GET_ID, 0);
        let mut descs = request(0, 0x10_0000, 0);
        descs.extend(request(3, 0x20_0000, W));
        descs.extend(request(6, 0x30_0000, W));
        q.add_desc_chains(&descs, 0).expect("chains");
        r.dev.queue_notify(0);
        wait_used(&mem, &q, 3);
        let mut got = [0u8; 512];
        mem.read_slice(&mut got, GuestAddress(0x20_1000))
            .expect("mem");
        assert_eq!(got, [0xc3; 512]);
        for st in [0x10_2000, 0x20_2000, 0x30_2000] {
            let s: u8 = mem.read_obj(GuestAddress(st)).expect("mem");
            assert_eq!(s, 0, "status at {st:#x}");
        }
        let mut id = [0u8; 6];
        mem.read_slice(&mut id, GuestAddress(0x30_1000))
            .expect("mem");
        assert_eq!(&id, b"vda-id");
        assert!(r.irq.used.load(Ordering::SeqCst) >= 1);
        r.dev.reset();
    }

    #[test]
    fn eio_read_reaches_the_guest() {
        let mem = guest_memory();
        let q = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let mut r = rig(&mem, &q);
        r.faults.set("eio_read", true);
        header(&mem, 0x10_0000, VIRTIO_BLK_T_IN, 0);
        q.add_desc_chains(&request(0, 0x10_0000, W), 0)
            .expect("chain");
        r.dev.queue_notify(0);
        wait_used(&r.mem, &q, 1);
        let s: u8 = mem.read_obj(GuestAddress(0x10_2000)).expect("mem");
        assert_eq!(s, 1, "VIRTIO_BLK_S_IOERR");
    }

    #[test]
    fn slow_delays_completion_without_blocking_notify() {
        let mem = guest_memory();
        let q = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let mut r = rig(&mem, &q);
        r.faults.set("slow", true);
        header(&mem, 0x10_0000, VIRTIO_BLK_T_IN, 0);
        q.add_desc_chains(&request(0, 0x10_0000, W), 0)
            .expect("chain");
        let t0 = Instant::now();
        r.dev.queue_notify(0);
        assert!(
            t0.elapsed() < Duration::from_millis(SLOW_COMPLETION_MS),
            "notify returned at once"
        );
        let took = wait_used(&mem, &q, 1);
        assert!(
            took >= Duration::from_millis(SLOW_COMPLETION_MS - 5),
            "completed after {took:?}"
        );
    }

    #[test]
    fn hostile_chains_complete_without_harm() {
        let mem = guest_memory();
        let q = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let mut r = rig(&mem, &q);
        // A descriptor loop, and a data buffer outside guest memory. (Chains
        // over 4 GiB in total are cut short by virtio-queue itself.)
        let descs = vec![
            d(0x10_0000, 16, NEXT, 1),
            d(0x10_1000, 512, NEXT | W, 0), // loops back to 0
        ];
        q.add_desc_chains(&descs, 0).expect("loop chain");
        header(&mem, 0x20_0000, VIRTIO_BLK_T_IN, 0);
        let bad = vec![
            d(0x20_0000, 16, NEXT, 3),
            d(0xffff_ffff_0000, 4096, W | NEXT, 4),
            d(0x20_2000, 1, W, 0),
        ];
        q.add_desc_chains(&bad, 2).expect("bad chain");
        r.dev.queue_notify(0);
        r.dev.queue_notify(u32::MAX);
        wait_used(&mem, &q, 2);
        let s: u8 = mem.read_obj(GuestAddress(0x20_2000)).expect("mem");
        assert_eq!(s, 1, "out-of-memory buffer is an I/O error");
    }

    #[test]
    fn features_and_config() {
        let mem = guest_memory();
        let q = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let mut r = rig(&mem, &q);
        assert_eq!(r.dev.device_type(), 2);
        assert_ne!(r.dev.avail_features() & (1 << VIRTIO_F_VERSION_1), 0);
        let mut cap = [0u8; 8];
        r.dev.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), 64);
        let mut past = [0xffu8; 4];
        r.dev.read_config(u64::MAX - 1, &mut past);
        assert_eq!(past, [0; 4]);
        r.dev.set_acked_features(u64::MAX);
        assert_eq!(r.dev.acked_features(), r.dev.avail_features());
        r.dev.reset();
    }

    fn capacity(dev: &Block) -> u64 {
        let mut b = [0u8; 8];
        dev.read_config(0, &mut b);
        u64::from_le_bytes(b)
    }

    /// One read of sector 0 through chain slots `base..base+3` at `buf`;
    /// returns its status byte.
    fn read_sector0(
        dev: &mut Block,
        mem: &GuestMemoryMmap,
        q: &MockSplitQueue<'_, GuestMemoryMmap>,
        base: u16,
        buf: u64,
        done: u16,
    ) -> u8 {
        header(mem, buf, VIRTIO_BLK_T_IN, 0);
        mem.write_slice(&[0xee], GuestAddress(buf + 0x2000))
            .expect("mem");
        q.add_desc_chains(&request(base, buf, W), base)
            .expect("chain");
        dev.queue_notify(0);
        wait_used(mem, q, done + 1);
        mem.read_obj(GuestAddress(buf + 0x2000)).expect("mem")
    }

    #[test]
    fn a_slot_takes_and_loses_its_medium_while_the_guest_runs() {
        let mem = guest_memory();
        let q = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let slot = BlockSlot::empty();
        let mut dev = Block::in_slot(slot.clone());
        // Features are fixed at probe: a slot never offers RO.
        assert_eq!(dev.avail_features() & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(capacity(&dev), 0, "an empty slot reads as size 0");
        let irq = Arc::new(CountingInterrupt::default());
        dev.activate(
            mem.clone(),
            vec![q.create_queue().expect("queue")],
            irq.clone(),
        )
        .expect("activate");
        // Empty: a request fails (the guest's driver sees an I/O error).
        assert_eq!(read_sector0(&mut dev, &mem, &q, 0, 0x10_0000, 0), 1);
        assert_eq!(irq.config.load(Ordering::SeqCst), 0);

        let mut f = tempfile::NamedTempFile::new().expect("tempfile");
        f.write_all(&vec![0x7b; 8 * 512]).expect("write");
        let faults = Arc::new(BlockFaults::default());
        let cfg = BlockConfig {
            disk: Arc::new(DiskImage::open(f.path(), true, "late").expect("open")),
            faults: faults.clone(),
        };
        slot.insert(cfg.clone()).expect("insert");
        assert_eq!(irq.config.load(Ordering::SeqCst), 1, "config interrupt");
        assert_eq!(capacity(&dev), 8);
        assert_eq!(read_sector0(&mut dev, &mem, &q, 3, 0x20_0000, 1), 0);
        let mut got = [0u8; 512];
        mem.read_slice(&mut got, GuestAddress(0x20_1000))
            .expect("mem");
        assert_eq!(got, [0x7b; 512], "the medium's bytes");
        // Its faults apply, as on a disk present at boot.
        faults.set("eio_read", true);
        assert_eq!(read_sector0(&mut dev, &mem, &q, 6, 0x30_0000, 2), 1);
        faults.set("eio_read", false);
        // A second medium is refused while one is in.
        let e = slot.insert(cfg).unwrap_err().to_string();
        assert!(e.contains("already holds disk `late`"), "{e}");
        // A hostile guest cannot resize or eject through config writes.
        dev.write_config(0, &[0; 8]);
        dev.write_config(u64::MAX, &[0xff; 4]);
        assert_eq!(capacity(&dev), 8);

        assert!(slot.eject().is_some());
        assert_eq!(irq.config.load(Ordering::SeqCst), 2);
        assert_eq!(capacity(&dev), 0);
        assert_eq!(read_sector0(&mut dev, &mem, &q, 9, 0x34_0000, 3), 1);
        assert!(slot.eject().is_none(), "nothing to eject: no signal");
        assert_eq!(irq.config.load(Ordering::SeqCst), 2);
        // A stopped device no longer signals.
        dev.reset();
        slot.insert(BlockConfig {
            disk: Arc::new(DiskImage::open(f.path(), false, "again").expect("open")),
            faults,
        })
        .expect("insert");
        assert_eq!(irq.config.load(Ordering::SeqCst), 2);
        // The state records the capacity; a restore onto an empty slot is refused.
        let snap = dev.save();
        let mut fresh = Block::in_slot(BlockSlot::empty());
        let e = fresh.restore(None, &snap.state).unwrap_err().to_string();
        assert!(e.contains("had 8 sectors"), "{e}");
        let mut same = Block::in_slot(BlockSlot::holding(slot.medium().expect("in")));
        same.restore(None, &snap.state).expect("same size restores");
    }
}
