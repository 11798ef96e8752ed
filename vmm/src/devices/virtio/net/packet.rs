//! Moves frames between the two virtqueues and the switch port (virtio 1.2,
//! 5.1.6): a TX chain is a device-readable header plus frame, handed to
//! `Port::send`; an RX chain is device-writable space for one header plus one
//! frame taken from the port.
//!
//! Every chain is guest data. A TX chain is read into one reused buffer that
//! never grows past [`MAX_TX_CHAIN_BYTES`]; a longer chain is dropped before
//! its excess is read. An RX chain's buffers are listed (at most
//! [`MAX_CHAIN_DESCRIPTORS`], bounding the list whatever indirect table the
//! guest claims) and checked for direction and room before a byte is written.
//! A bad chain is still returned to the guest (used length 0) so the ring keeps
//! moving, and counted. Nothing here panics on guest input.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use provium_netsetup::Port;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::defs::{HDR_V1_BYTES, MAX_TX_CHAIN_BYTES, QUEUE_SIZE};
use crate::vstate::memory::GuestMemoryMmap;

/// Most descriptors one RX chain may have: a queue's worth. Linux uses one
/// or two per RX buffer.
pub const MAX_CHAIN_DESCRIPTORS: usize = QUEUE_SIZE as usize;

/// Per-device counters (from the guest's perspective: `tx` is what it sent).
/// Shared with the host so tests and the harness can read them.
#[derive(Debug, Default)]
pub struct NetMetrics {
    /// Frames the guest sent that the switch accepted.
    pub tx_frames: AtomicU64,
    /// Frames the guest sent that the switch refused (link down, detached,
    /// runt, bad source MAC).
    pub tx_dropped: AtomicU64,
    /// TX chains that were not a frame (writable buffer, outside memory,
    /// longer than a header plus the largest frame, shorter than a header).
    pub tx_bad_chains: AtomicU64,
    /// Frames written into guest RX buffers.
    pub rx_frames: AtomicU64,
    /// Frames taken from the port that did not fit the guest's RX chain (or
    /// whose chain was bad) and were dropped.
    pub rx_dropped: AtomicU64,
    /// RX chains that were not usable (read-only buffer, outside memory, too
    /// many descriptors).
    pub rx_bad_chains: AtomicU64,
}

impl NetMetrics {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A plain copy of the counters: (tx_frames, tx_dropped, tx_bad_chains,
    /// rx_frames, rx_dropped, rx_bad_chains).
    pub fn snapshot(&self) -> [u64; 6] {
        [
            &self.tx_frames,
            &self.tx_dropped,
            &self.tx_bad_chains,
            &self.rx_frames,
            &self.rx_dropped,
            &self.rx_bad_chains,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}

/// Why a TX chain carried no frame.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxChainError {
    /// A device-writable descriptor in a TX chain.
    #[error("tx chain has a device-writable descriptor")]
    Writable,
    /// More bytes than a header plus the largest frame.
    #[error("tx chain is longer than {MAX_TX_CHAIN_BYTES} bytes")]
    TooLong,
    /// A buffer outside guest memory.
    #[error("tx buffer at {0:#x} is not in guest memory")]
    Memory(u64),
    /// Not even a full header.
    #[error("tx chain of {0} bytes is shorter than the virtio-net header")]
    TooShort(usize),
}

/// Why an RX chain could not take a frame.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RxChainError {
    /// A device-readable descriptor in an RX chain.
    #[error("rx chain has a device-readable descriptor")]
    ReadOnly,
    /// More descriptors than [`MAX_CHAIN_DESCRIPTORS`].
    #[error("rx chain has more than {MAX_CHAIN_DESCRIPTORS} descriptors")]
    TooManyDescriptors,
    /// The buffers hold fewer bytes than the header plus the frame.
    #[error("rx chain holds {room} bytes, the frame needs {need}")]
    TooSmall {
        /// Bytes the chain holds.
        room: u64,
        /// Header plus frame.
        need: usize,
    },
    /// A buffer outside guest memory.
    #[error("rx buffer at {0:#x} is not in guest memory")]
    Memory(u64),
}

/// Reads the chain's bytes into `buf` (cleared first; never longer than
/// [`MAX_TX_CHAIN_BYTES`]).
pub fn read_tx_chain(
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<&GuestMemoryMmap>,
    buf: &mut Vec<u8>,
) -> Result<(), TxChainError> {
    buf.clear();
    for desc in chain {
        if desc.is_write_only() {
            return Err(TxChainError::Writable);
        }
        let start = buf.len();
        let end = usize::try_from(desc.len())
            .ok()
            .and_then(|l| start.checked_add(l))
            .filter(|&e| e <= MAX_TX_CHAIN_BYTES)
            .ok_or(TxChainError::TooLong)?;
        buf.resize(end, 0);
        mem.read_slice(&mut buf[start..end], desc.addr())
            .map_err(|_| TxChainError::Memory(desc.addr().0))?;
    }
    Ok(())
}

/// Writes `hdr` then `frame` across the chain's buffers; returns the bytes
/// written (the used length). Direction and room are checked for the whole
/// chain before anything is written; a buffer outside guest memory ends the
/// write with an error (the frame is dropped).
pub fn write_rx_chain(
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<&GuestMemoryMmap>,
    hdr: &[u8],
    frame: &[u8],
) -> Result<u32, RxChainError> {
    let mut bufs: Vec<(GuestAddress, u32)> = Vec::new();
    let mut room: u64 = 0;
    for desc in chain {
        if !desc.is_write_only() {
            return Err(RxChainError::ReadOnly);
        }
        if bufs.len() == MAX_CHAIN_DESCRIPTORS {
            return Err(RxChainError::TooManyDescriptors);
        }
        bufs.push((desc.addr(), desc.len()));
        room += u64::from(desc.len());
    }
    let need = hdr.len() + frame.len();
    if room < need as u64 {
        return Err(RxChainError::TooSmall { room, need });
    }
    let mut src = hdr.iter().chain(frame.iter()).copied();
    let mut chunk = [0u8; 4096];
    let mut written: usize = 0;
    for (addr, len) in bufs {
        let mut left = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .min(need - written);
        let mut at = addr;
        while left > 0 {
            let n = left.min(chunk.len());
            for b in &mut chunk[..n] {
                *b = src.next().unwrap_or(0);
            }
            mem.write_slice(&chunk[..n], at)
                .map_err(|_| RxChainError::Memory(at.0))?;
            written += n;
            left -= n;
            at = GuestAddress(
                at.0.checked_add(n as u64)
                    .ok_or(RxChainError::Memory(at.0))?,
            );
        }
        if written == need {
            break;
        }
    }
    // `need` is at most a header plus MAX_FRAME_BYTES.
    Ok(u32::try_from(written).expect("a frame and header fit in u32"))
}

/// The header put before every received frame: no checksum or GSO work,
/// `num_buffers` 1 (only present in the VERSION_1 layout).
pub fn rx_header(hdr_bytes: usize) -> [u8; HDR_V1_BYTES] {
    let mut h = [0u8; HDR_V1_BYTES];
    if hdr_bytes == HDR_V1_BYTES {
        h[10] = 1;
    }
    h
}

/// An activated device's queues and the port they exchange frames with.
pub struct NetQueues {
    mem: GuestMemoryMmap,
    rxq: Queue,
    txq: Queue,
    port: Arc<Port>,
    /// The negotiated header length (12 with VERSION_1, else 10).
    hdr_bytes: usize,
    /// A frame taken from the port while no RX chain was available: at most
    /// one, so the device holds at most one frame of its own.
    pending_rx: Option<Vec<u8>>,
    /// Reused for every TX chain (at most MAX_TX_CHAIN_BYTES).
    tx_buf: Vec<u8>,
    metrics: Arc<NetMetrics>,
}

impl NetQueues {
    /// Queues over `mem` exchanging frames with `port`.
    pub fn new(
        mem: GuestMemoryMmap,
        rxq: Queue,
        txq: Queue,
        port: Arc<Port>,
        hdr_bytes: usize,
        metrics: Arc<NetMetrics>,
    ) -> NetQueues {
        NetQueues {
            mem,
            rxq,
            txq,
            port,
            hdr_bytes,
            pending_rx: None,
            tx_buf: Vec::new(),
            metrics,
        }
    }

    /// Sends every available TX chain's frame; true when any chain was
    /// returned to the guest.
    pub fn process_tx(&mut self) -> bool {
        let mut used = false;
        while let Some(chain) = self.txq.pop_descriptor_chain(&self.mem) {
            let head = chain.head_index();
            let frame = read_tx_chain(&self.mem, chain, &mut self.tx_buf).and_then(|()| {
                self.tx_buf
                    .get(self.hdr_bytes..)
                    .ok_or(TxChainError::TooShort(self.tx_buf.len()))
            });
            match frame {
                Ok(f) => match self.port.send(f) {
                    Ok(()) => NetMetrics::bump(&self.metrics.tx_frames),
                    Err(_) => NetMetrics::bump(&self.metrics.tx_dropped),
                },
                Err(_) => NetMetrics::bump(&self.metrics.tx_bad_chains),
            }
            // add_used only fails for a head out of range, which a popped
            // chain cannot have.
            used |= self.txq.add_used(&self.mem, head, 0).is_ok();
        }
        used
    }

    /// Delivers frames from the port while RX chains are available; true
    /// when any chain was returned to the guest.
    pub fn process_rx(&mut self) -> bool {
        let mut used = false;
        let hdr = rx_header(self.hdr_bytes);
        while let Some(frame) = self.pending_rx.take().or_else(|| self.port.try_recv()) {
            let Some(chain) = self.rxq.pop_descriptor_chain(&self.mem) else {
                self.pending_rx = Some(frame);
                break;
            };
            let head = chain.head_index();
            let len = match write_rx_chain(&self.mem, chain, &hdr[..self.hdr_bytes], &frame) {
                Ok(n) => {
                    NetMetrics::bump(&self.metrics.rx_frames);
                    n
                }
                Err(e) => {
                    if !matches!(e, RxChainError::TooSmall { .. }) {
                        NetMetrics::bump(&self.metrics.rx_bad_chains);
                    }
                    NetMetrics::bump(&self.metrics.rx_dropped);
                    0
                }
            };
            used |= self.rxq.add_used(&self.mem, head, len).is_ok();
        }
        used
    }

    /// One round: TX first (the guest's frames may be for itself), then RX.
    /// True when the guest should get a used-buffer interrupt.
    pub fn run_once(&mut self) -> bool {
        let tx = self.process_tx();
        let rx = self.process_rx();
        (tx && self.txq.needs_notification(&self.mem).unwrap_or(true))
            || (rx && self.rxq.needs_notification(&self.mem).unwrap_or(true))
    }

    /// Whether a frame waits inside the device for an RX chain.
    pub fn has_pending_rx(&self) -> bool {
        self.pending_rx.is_some()
    }

    /// The frame waiting for an RX chain (snapshots).
    pub fn pending_rx(&self) -> Option<&[u8]> {
        self.pending_rx.as_deref()
    }

    /// Puts back a frame from a snapshot (validated by the caller).
    pub fn set_pending_rx(&mut self, frame: Option<Vec<u8>>) {
        self.pending_rx = frame;
    }

    /// The receive queue (snapshots).
    pub fn rxq(&self) -> &Queue {
        &self.rxq
    }

    /// The transmit queue (snapshots).
    pub fn txq(&self) -> &Queue {
        &self.txq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::net::defs::{HDR_LEGACY_BYTES, MAX_FRAME_BYTES};
    use crate::devices::virtio::test_utils::guest_memory;
    use provium_netsetup::{MacAddr, Switch, SwitchConfig};
    use std::time::Duration;
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::Address;

    const W: u16 = VRING_DESC_F_WRITE as u16;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const RXQ_GPA: u64 = 0;
    const TXQ_GPA: u64 = 0x1_0000;

    fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    fn frame(dst: MacAddr, src: MacAddr, len: usize, tag: u8) -> Vec<u8> {
        let mut f = Vec::with_capacity(len);
        f.extend_from_slice(&dst.0);
        f.extend_from_slice(&src.0);
        f.extend_from_slice(&[0x88, 0xb5]);
        f.resize(len, tag);
        f
    }

    struct Rig<'a> {
        mem: &'a GuestMemoryMmap,
        rx: MockSplitQueue<'a, GuestMemoryMmap>,
        tx: MockSplitQueue<'a, GuestMemoryMmap>,
        q: NetQueues,
        metrics: Arc<NetMetrics>,
        /// The guest's port ("vm") and a peer on the same switch.
        peer: provium_netsetup::Port,
        _sw: Switch,
    }

    const GUEST: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
    const PEER: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);

    fn rig(mem: &GuestMemoryMmap, hdr_bytes: usize) -> Rig<'_> {
        let sw = Switch::new("lan", SwitchConfig::default());
        let port = Arc::new(sw.attach("vm", GUEST).expect("attach vm"));
        let peer = sw.attach("peer", PEER).expect("attach peer");
        let rx = MockSplitQueue::create(mem, GuestAddress(RXQ_GPA), 16);
        let tx = MockSplitQueue::create(mem, GuestAddress(TXQ_GPA), 16);
        let metrics = Arc::new(NetMetrics::default());
        let q = NetQueues::new(
            mem.clone(),
            rx.create_queue().expect("rx queue"),
            tx.create_queue().expect("tx queue"),
            port,
            hdr_bytes,
            metrics.clone(),
        );
        Rig {
            mem,
            rx,
            tx,
            q,
            metrics,
            peer,
            _sw: sw,
        }
    }

    fn used(mem: &GuestMemoryMmap, q: &MockSplitQueue<'_, GuestMemoryMmap>, i: u64) -> (u32, u32) {
        let base = q.used_addr().unchecked_add(4 + 8 * i);
        (
            mem.read_obj(base).expect("id"),
            mem.read_obj(base.unchecked_add(4)).expect("len"),
        )
    }

    fn used_idx(mem: &GuestMemoryMmap, q: &MockSplitQueue<'_, GuestMemoryMmap>) -> u16 {
        mem.read_obj(q.used_addr().unchecked_add(2)).expect("idx")
    }

    /// Writes a 12-byte header plus `f` at `gpa` (what a guest driver does).
    fn put_tx(mem: &GuestMemoryMmap, gpa: u64, f: &[u8]) -> u32 {
        let mut b = vec![0u8; HDR_V1_BYTES];
        b.extend_from_slice(f);
        mem.write_slice(&b, GuestAddress(gpa)).expect("write");
        b.len() as u32
    }

    #[test]
    fn tx_frames_reach_the_switch_split_or_whole() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        let f1 = frame(MacAddr::BROADCAST, GUEST, 60, 1);
        let f2 = frame(PEER, GUEST, 1514, 2);
        let n1 = put_tx(&mem, 0x10_0000, &f1);
        let n2 = put_tx(&mem, 0x11_0000, &f2);
        r.tx.add_desc_chains(
            &[
                d(0x10_0000, n1, 0, 0),
                // Header in its own buffer, frame split in two: Linux's layout.
                d(0x11_0000, 12, NEXT, 2),
                d(0x11_000c, 100, NEXT, 3),
                d(0x11_0070, n2 - 112, 0, 0),
            ],
            0,
        )
        .expect("chains");
        assert!(r.q.run_once(), "used entries need an interrupt");
        assert_eq!(used_idx(r.mem, &r.tx), 2);
        assert_eq!(used(r.mem, &r.tx, 0), (0, 0));
        assert_eq!(used(r.mem, &r.tx, 1), (1, 0));
        assert_eq!(r.peer.recv_timeout(Duration::from_secs(5)), Some(f1));
        assert_eq!(r.peer.recv_timeout(Duration::from_secs(5)), Some(f2));
        assert_eq!(r.metrics.snapshot(), [2, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn rx_frames_land_with_a_header_and_wait_for_buffers() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        let f1 = frame(GUEST, PEER, 60, 7);
        let f2 = frame(MacAddr::BROADCAST, PEER, 200, 8);
        r.peer.send(&f1).expect("send");
        r.peer.send(&f2).expect("send");
        // No RX buffers yet: nothing delivered, one frame held, one queued.
        assert!(!r.q.run_once());
        assert!(r.q.has_pending_rx());
        r.rx.add_desc_chains(
            &[
                d(0x20_0000, 1526, W, 0),
                // Header buffer separate from the data buffer.
                d(0x21_0000, 12, W | NEXT, 2),
                d(0x21_1000, 1514, W, 0),
            ],
            0,
        )
        .expect("chains");
        assert!(r.q.run_once());
        assert!(!r.q.has_pending_rx());
        assert_eq!(used_idx(r.mem, &r.rx), 2);
        assert_eq!(used(r.mem, &r.rx, 0), (0, 12 + 60));
        assert_eq!(used(r.mem, &r.rx, 1), (1, 12 + 200));
        let mut got = vec![0u8; 72];
        mem.read_slice(&mut got, GuestAddress(0x20_0000))
            .expect("read");
        assert_eq!(
            &got[..12],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            "num_buffers 1"
        );
        assert_eq!(&got[12..], &f1[..]);
        let mut hdr = [0u8; 12];
        mem.read_slice(&mut hdr, GuestAddress(0x21_0000))
            .expect("read");
        assert_eq!(hdr[10], 1);
        let mut got2 = vec![0u8; 200];
        mem.read_slice(&mut got2, GuestAddress(0x21_1000))
            .expect("read");
        assert_eq!(got2, f2);
        assert_eq!(r.metrics.snapshot(), [0, 0, 0, 2, 0, 0]);
    }

    #[test]
    fn legacy_header_is_ten_bytes() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_LEGACY_BYTES);
        let f = frame(GUEST, PEER, 60, 3);
        r.peer.send(&f).expect("send");
        r.rx.add_desc_chains(&[d(0x20_0000, 2048, W, 0)], 0)
            .expect("chain");
        r.q.run_once();
        assert_eq!(used(r.mem, &r.rx, 0), (0, 70));
        let mut got = vec![0u8; 70];
        mem.read_slice(&mut got, GuestAddress(0x20_0000))
            .expect("read");
        assert_eq!(&got[..10], &[0; 10]);
        assert_eq!(&got[10..], &f[..]);
        // And TX strips 10 bytes.
        let mut b = vec![0u8; 10];
        let out = frame(PEER, GUEST, 60, 4);
        b.extend_from_slice(&out);
        mem.write_slice(&b, GuestAddress(0x10_0000)).expect("write");
        r.tx.add_desc_chains(&[d(0x10_0000, 70, 0, 0)], 0)
            .expect("chain");
        r.q.run_once();
        assert_eq!(r.peer.recv_timeout(Duration::from_secs(5)), Some(out));
    }

    #[test]
    fn hostile_tx_chains_are_returned_and_counted() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        let good = frame(MacAddr::BROADCAST, GUEST, 60, 9);
        let n = put_tx(&mem, 0x10_0000, &good);
        r.tx.add_desc_chains(
            &[
                // 0: a device-writable buffer.
                d(0x10_0000, n, W, 0),
                // 1: outside the 4 MiB of guest memory.
                d(0x3f_fff0, 4096, 0, 0),
                // 2: an absurd length (checked before anything is read).
                d(0x10_0000, u32::MAX, 0, 0),
                // 3-4: two buffers summing past a header plus the largest frame.
                d(0x10_0000, (MAX_TX_CHAIN_BYTES - 10) as u32, NEXT, 4),
                d(0x10_0000, 11, 0, 0),
                // 5: shorter than the header.
                d(0x10_0000, 5, 0, 0),
                // 6: a runt frame: the switch refuses it.
                d(0x10_0000, 12 + 5, 0, 0),
                // 7-8: a loop (virtio-queue stops it; the bytes read are a runt).
                d(0x10_0000, 1, NEXT, 8),
                d(0x10_0000, 1, NEXT, 7),
            ],
            0,
        )
        .expect("chains");
        // 9: a good frame afterwards still goes through.
        r.tx.add_desc_chains(&[d(0x10_0000, n, 0, 0)], 9)
            .expect("chain");
        r.q.run_once();
        assert_eq!(used_idx(r.mem, &r.tx), 8, "every chain is returned");
        for i in 0..8 {
            assert_eq!(used(r.mem, &r.tx, i).1, 0);
        }
        assert_eq!(r.peer.recv_timeout(Duration::from_secs(5)), Some(good));
        assert_eq!(r.peer.try_recv(), None);
        let [tx, dropped, bad, ..] = r.metrics.snapshot();
        assert_eq!(
            (tx, dropped, bad),
            (1, 2, 5),
            "loop+runt dropped by the switch"
        );
        assert!(r.q.tx_buf.capacity() <= MAX_TX_CHAIN_BYTES + 16);
    }

    #[test]
    fn hostile_rx_chains_drop_the_frame_not_the_host() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        for i in 0..5 {
            r.peer.send(&frame(GUEST, PEER, 100, i)).expect("send");
        }
        let big = frame(GUEST, PEER, MAX_FRAME_BYTES, 0xee);
        r.peer.send(&big).expect("send");
        r.rx.add_desc_chains(
            &[
                // 0: a device-readable buffer.
                d(0x20_0000, 2048, 0, 0),
                // 1: too small for header plus frame.
                d(0x20_0000, 50, W, 0),
                // 2: outside guest memory (room claimed, write fails).
                d(0x3f_ffc0, 4096, W, 0),
                // 3: an indirect table claiming 4096 descriptors: cut at
                //    MAX_CHAIN_DESCRIPTORS (all are 1-byte writable buffers).
                d(0x30_0000, 4096 * 16, VRING_DESC_F_INDIRECT as u16, 0),
                // 4: good.
                d(0x20_0000, 2048, W, 0),
                // 5: a 64 KiB frame into a chain of the right size.
                d(0x22_0000, (12 + MAX_FRAME_BYTES) as u32, W, 0),
            ],
            0,
        )
        .expect("chains");
        for i in 0..4096u64 {
            let raw = d(
                0x31_0000 + i,
                1,
                W | NEXT,
                u16::try_from(i + 1).unwrap_or(0),
            );
            mem.write_obj(raw, GuestAddress(0x30_0000 + 16 * i))
                .expect("desc");
        }
        r.q.run_once();
        assert_eq!(used_idx(r.mem, &r.rx), 6);
        for i in 0..4 {
            assert_eq!(used(r.mem, &r.rx, i).1, 0, "chain {i}");
        }
        assert_eq!(used(r.mem, &r.rx, 4).1, 112);
        assert_eq!(used(r.mem, &r.rx, 5).1, (12 + MAX_FRAME_BYTES) as u32);
        let mut got = vec![0u8; MAX_FRAME_BYTES];
        mem.read_slice(&mut got, GuestAddress(0x22_000c))
            .expect("read");
        assert_eq!(got, big);
        let [.., rx, rx_dropped, rx_bad] = r.metrics.snapshot();
        assert_eq!((rx, rx_dropped, rx_bad), (2, 4, 3));
    }
}
