//! A kvm NIC's path through the switch, without a guest: device queue →
//! switch → device queue.
//!
//!   cargo bench -p provium-vmm --bench net_path
//!
//! Guest-to-guest traffic between kvm VMs always crosses the userspace
//! switch, and an emulated guest kernel (this project's kvm_pvm hosts) is
//! far too slow to load it. So a host-side driver plays both guests: two
//! virtio-net devices' queues ([`NetQueues`], the code a device worker runs)
//! over two guest memories, on one switch. Per round the driver makes
//! `ROUND` TX chains available on A (each one frame: a 12-byte header and
//! the frame, already in A's memory) and `ROUND` RX chains on B, then runs
//! A's `process_tx` (frames into the switch, which queues them on B's port)
//! and B's `process_rx` (frames into B's chains). Everything runs in this
//! one thread: the figures are the device and switch work per frame, with
//! no wake-up (a VM's device worker sleeps on an eventfd between kicks).
//!
//! Prints, per frame size, frames per second and Gbit/s through the whole
//! path, the copies each frame takes (read by the bench from the code path,
//! see `COPIES_PER_FRAME`) and, as the floor of that design in the same
//! run, the rate of the same number of plain `copy_from_slice`s of the
//! frame. Environment: NET_PATH_SECONDS (default 2) per size,
//! NET_PATH_REPS (default 3).

use std::sync::Arc;
use std::time::{Duration, Instant};

use provium_vmm::devices::virtio::net::defs::HDR_V1_BYTES;
use provium_vmm::devices::virtio::net::packet::{NetMetrics, NetQueues};
use provium_vmm::guest_memory::GuestMemoryMmap;
use provium_vmm::netsetup::{MacAddr, Switch, SwitchConfig, VnetHdr};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};

/// Ring size of both queues (the device's QUEUE_SIZE).
const QUEUE: u16 = 256;
/// Chains made available per round: half a ring.
const ROUND: u16 = 128;
const RXQ_GPA: u64 = 0;
const TXQ_GPA: u64 = 0x1_0000;
/// Chain i's buffer: one 4 KiB page each, TX and RX apart.
const TX_BUF_GPA: u64 = 0x10_0000;
const RX_BUF_GPA: u64 = 0x20_0000;
const BUF_BYTES: u32 = 4096;
const MEM_BYTES: usize = 4 << 20;

/// Copies of a frame's bytes on this path, as the code makes them:
/// `read_tx_chain` (A's guest memory → the device's TX buffer), the
/// switch's `RxQueue::push` for an in-process port (TX buffer → B's port
/// queue), `write_rx_chain` (port queue → B's guest memory).
const COPIES_PER_FRAME: usize = 3;

const A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xa]);
const B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xb]);

fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

fn frame(dst: MacAddr, src: MacAddr, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x88, 0xb5]);
    f.resize(len, 0x5a);
    f
}

/// One device's memory and rings, driven from the host side.
struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    q: MockSplitQueue<'a, GuestMemoryMmap>,
    /// The next avail index the driver publishes.
    avail_idx: u16,
}

impl<'a> Driver<'a> {
    /// A ring at `gpa` whose descriptor i is buffer i at `buf_gpa`,
    /// device-writable when `rx`.
    fn new(mem: &'a GuestMemoryMmap, gpa: u64, buf_gpa: u64, len: u32, rx: bool) -> Driver<'a> {
        let q = MockSplitQueue::create(mem, GuestAddress(gpa), QUEUE);
        let flags = if rx { VRING_DESC_F_WRITE as u16 } else { 0 };
        for i in 0..QUEUE {
            let addr = buf_gpa + u64::from(i) * u64::from(BUF_BYTES);
            let d = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0));
            q.desc_table().store(i, d).expect("descriptor in the table");
        }
        Driver {
            mem,
            q,
            avail_idx: 0,
        }
    }

    /// The device's view of this ring. The mock lays a 256-entry used ring
    /// over the second half of the avail ring (it leaves 4 + len bytes for
    /// the avail ring, which takes 4 + 2 * len), so the used ring moves to
    /// 32 KiB past the ring's start.
    fn queue(&self) -> Queue {
        let mut q: Queue = self.q.create_queue().expect("queue");
        let used = self.q.start().unchecked_add(0x8000).0;
        q.set_used_ring_address(
            Some(u32::try_from(used & 0xffff_ffff).expect("low half")),
            Some(u32::try_from(used >> 32).expect("high half")),
        );
        assert!(q.is_valid(self.mem), "the moved used ring is valid");
        q
    }

    /// Makes the next `n` descriptors available, one chain each. (The mock's
    /// own `add_desc_chains` does not wrap the ring, so the driver writes
    /// the avail ring itself.)
    fn publish(&mut self, n: u16) {
        let ring = self.q.avail_addr().unchecked_add(4);
        for _ in 0..n {
            let slot = self.avail_idx % QUEUE;
            self.mem
                .write_obj(slot.to_le(), ring.unchecked_add(u64::from(slot) * 2))
                .expect("avail ring entry");
            self.avail_idx = self.avail_idx.wrapping_add(1);
        }
        self.mem
            .write_obj(self.avail_idx.to_le(), self.q.avail_addr().unchecked_add(2))
            .expect("avail idx");
    }
}

/// Frames per second through A's TX, the switch and B's RX, for
/// `seconds`; fails unless every frame arrived.
fn path_fps(len: usize, seconds: u64) -> f64 {
    let (mem_a, mem_b) = (
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_BYTES)]).expect("memory a"),
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_BYTES)]).expect("memory b"),
    );
    let sw = Switch::new("bench", SwitchConfig::default());
    let port_a = Arc::new(sw.attach("a", A).expect("attach a"));
    let port_b = Arc::new(sw.attach("b", B).expect("attach b"));
    // B is known to the switch, so A's frames are unicast, not flooded.
    port_b
        .send_offload(VnetHdr::default(), &frame(A, B, 60))
        .expect("b's first frame");
    let f = frame(B, A, len);
    let mut chain = vec![0u8; HDR_V1_BYTES];
    chain.extend_from_slice(&f);
    for i in 0..u64::from(QUEUE) {
        mem_a
            .write_slice(&chain, GuestAddress(TX_BUF_GPA + i * u64::from(BUF_BYTES)))
            .expect("frame in a's memory");
    }
    let chain_len = u32::try_from(chain.len()).expect("a frame fits a page");
    let mut tx = Driver::new(&mem_a, TXQ_GPA, TX_BUF_GPA, chain_len, false);
    let mut rx = Driver::new(&mem_b, RXQ_GPA, RX_BUF_GPA, BUF_BYTES, true);
    let (metrics_a, metrics_b) = (
        Arc::new(NetMetrics::default()),
        Arc::new(NetMetrics::default()),
    );
    // Unused rings of each device (A's RX, B's TX) sit apart, empty.
    let idle_a = MockSplitQueue::create(&mem_a, GuestAddress(0x3_0000), QUEUE);
    let idle_b = MockSplitQueue::create(&mem_b, GuestAddress(0x3_0000), QUEUE);
    let mut dev_a = NetQueues::new(
        mem_a.clone(),
        idle_a.create_queue().expect("a rx"),
        tx.queue(),
        port_a,
        HDR_V1_BYTES,
        metrics_a.clone(),
    );
    let mut dev_b = NetQueues::new(
        mem_b.clone(),
        rx.queue(),
        idle_b.create_queue().expect("b tx"),
        port_b,
        HDR_V1_BYTES,
        metrics_b.clone(),
    );
    let mut round = || {
        tx.publish(ROUND);
        rx.publish(ROUND);
        dev_a.process_tx();
        dev_b.process_rx();
    };
    for _ in 0..1000 {
        round();
    }
    let (start, got0) = (
        Instant::now(),
        metrics_b
            .rx_frames
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    let mut rounds = 0u64;
    while start.elapsed() < Duration::from_secs(seconds) {
        round();
        rounds += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let got = metrics_b
        .rx_frames
        .load(std::sync::atomic::Ordering::Relaxed)
        - got0;
    let sent = rounds * u64::from(ROUND);
    if got != sent {
        eprintln!(
            "net_path: {sent} frames sent, {got} arrived (a {len}-byte frame should never drop here); switch {:?}; a {:?}; b {:?}",
            sw.stats(),
            metrics_a.snapshot(),
            metrics_b.snapshot()
        );
        std::process::exit(2);
    }
    got as f64 / secs
}

/// The floor in the same run: `COPIES_PER_FRAME` plain copies of the frame
/// per frame, between buffers as far apart as the path's.
fn copies_fps(len: usize, seconds: u64) -> f64 {
    let mut bufs: Vec<Vec<u8>> = (0..=COPIES_PER_FRAME).map(|_| vec![0x5au8; len]).collect();
    let start = Instant::now();
    let mut frames = 0u64;
    while start.elapsed() < Duration::from_secs(seconds) {
        for _ in 0..ROUND {
            for c in 0..COPIES_PER_FRAME {
                let (from, to) = bufs.split_at_mut(c + 1);
                to[0].copy_from_slice(&from[c]);
            }
            std::hint::black_box(&bufs);
        }
        frames += u64::from(ROUND);
    }
    frames as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let seconds = env_count("NET_PATH_SECONDS", 2);
    let reps = env_count("NET_PATH_REPS", 3);
    println!(
        "net_path: nproc={} loadavg=\"{}\" rounds of {ROUND} frames, queue {QUEUE}, copies_per_frame={COPIES_PER_FRAME}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    for len in [60usize, 1514] {
        let (mut path, mut floor) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            let p = path_fps(len, seconds);
            let c = copies_fps(len, seconds);
            println!(
                "net_path: run={} frame_bytes={len} path_kfps={:.1} path_gbit_per_s={:.3} copies_only_kfps={:.1}",
                rep + 1,
                p / 1e3,
                p * len as f64 * 8.0 / 1e9,
                c / 1e3
            );
            path.push(p);
            floor.push(c);
        }
        let (p, c) = (median(path), median(floor));
        println!(
            "net_path: median frame_bytes={len} path_kfps={:.1} path_gbit_per_s={:.3} copies_only_kfps={:.1} path/copies_only={:.3}",
            p / 1e3,
            p * len as f64 * 8.0 / 1e9,
            c / 1e3,
            p / c
        );
    }
}
