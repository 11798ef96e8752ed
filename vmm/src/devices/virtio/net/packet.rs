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
//!
//! With offloads negotiated ([`NetFeatures`]), the TX header is handed to the
//! switch with the frame (`Port::send_offload`, which validates it: a bogus
//! one drops the frame and is counted on the port), a GSO type the guest did
//! not negotiate is refused here, and the RX header carries what the switch
//! left to do (checksum, GSO) for a guest that negotiated it. With
//! MRG_RXBUF a frame spreads over as many RX chains as it needs and
//! `num_buffers` says how many; the chains are taken only once there are
//! enough, otherwise the frame waits and the ring is rewound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use provium_netsetup::offload::{GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6, VNET_HDR_BYTES};
use provium_netsetup::{Port, VnetHdr};
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::defs::{HDR_V1_BYTES, MAX_TX_CHAIN_BYTES, QUEUE_SIZE};
use super::plug::PortPlug;
use crate::guest_memory::GuestMemoryMmap;

/// TX chains read per batch handed to the switch under one lock.
pub const TX_BATCH: usize = 16;

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
    /// TX frames whose virtio-net header asked for an offload the guest did
    /// not negotiate (also in `tx_dropped`; invalid headers are counted by
    /// the switch port's `offload_errors`).
    pub tx_bad_offload: AtomicU64,
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

/// Appends the chain's buffers to `bufs`; returns the room they hold.
/// Direction and count ([`MAX_CHAIN_DESCRIPTORS`] per chain) are checked.
fn list_rx_chain(
    chain: DescriptorChain<&GuestMemoryMmap>,
    bufs: &mut Vec<(GuestAddress, u32)>,
) -> Result<u64, RxChainError> {
    let first = bufs.len();
    let mut room: u64 = 0;
    for desc in chain {
        if !desc.is_write_only() {
            return Err(RxChainError::ReadOnly);
        }
        if bufs.len() - first == MAX_CHAIN_DESCRIPTORS {
            return Err(RxChainError::TooManyDescriptors);
        }
        bufs.push((desc.addr(), desc.len()));
        room += u64::from(desc.len());
    }
    Ok(room)
}

/// Writes `hdr` then `frame` across `bufs` in order, at most `need` bytes;
/// returns the bytes written into each buffer's chain via `per_buf`.
fn write_bufs(
    mem: &GuestMemoryMmap,
    bufs: &[(GuestAddress, u32)],
    hdr: &[u8],
    frame: &[u8],
    mut per_buf: impl FnMut(usize, usize),
) -> Result<(), RxChainError> {
    let need = hdr.len() + frame.len();
    let mut written: usize = 0;
    for (i, &(addr, len)) in bufs.iter().enumerate() {
        let n = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .min(need - written);
        // The bytes [written, written + n) of header-then-frame.
        let mut at = addr;
        let mut pos = written;
        while pos < written + n {
            let (src, off) = if pos < hdr.len() {
                (hdr, pos)
            } else {
                (frame, pos - hdr.len())
            };
            let take = (src.len() - off).min(written + n - pos);
            mem.write_slice(&src[off..off + take], at)
                .map_err(|_| RxChainError::Memory(at.0))?;
            pos += take;
            at = GuestAddress(
                at.0.checked_add(take as u64)
                    .ok_or(RxChainError::Memory(at.0))?,
            );
        }
        written += n;
        per_buf(i, n);
        if written == need {
            break;
        }
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
    let room = list_rx_chain(chain, &mut bufs)?;
    let need = hdr.len() + frame.len();
    if room < need as u64 {
        return Err(RxChainError::TooSmall { room, need });
    }
    let mut written = 0usize;
    write_bufs(mem, &bufs, hdr, frame, |_, n| written += n)?;
    // `need` is at most a header plus MAX_FRAME_BYTES.
    Ok(u32::try_from(written).expect("a frame and header fit in u32"))
}

/// The header put before every received frame: the offload work the switch
/// left (none unless the guest negotiated it), `num_buffers` 1 (only
/// present in the VERSION_1 layout; MRG_RXBUF sets the real count).
pub fn rx_header(hdr_bytes: usize, vnet: &VnetHdr) -> [u8; HDR_V1_BYTES] {
    let mut h = [0u8; HDR_V1_BYTES];
    h[..VNET_HDR_BYTES].copy_from_slice(&vnet.to_bytes());
    if hdr_bytes == HDR_V1_BYTES {
        h[10] = 1;
    }
    h
}

/// The offload features the driver negotiated that the queues act on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetFeatures {
    /// CSUM: TX headers may ask for a checksum; read them.
    pub csum: bool,
    /// HOST_TSO4: TX may be TCPv4 super-frames.
    pub host_tso4: bool,
    /// HOST_TSO6: TX may be TCPv6 super-frames.
    pub host_tso6: bool,
    /// MRG_RXBUF: one frame may span several RX chains.
    pub mrg_rxbuf: bool,
}

impl NetFeatures {
    fn tx_headers(&self) -> bool {
        self.csum || self.host_tso4 || self.host_tso6
    }

    /// Whether the guest negotiated the GSO type in `hdr`.
    fn allows(&self, hdr: &VnetHdr) -> bool {
        match hdr.gso_type & !GSO_ECN {
            GSO_NONE => true,
            GSO_TCPV4 => self.host_tso4,
            GSO_TCPV6 => self.host_tso6,
            // Anything else is refused by the switch, and counted there.
            _ => true,
        }
    }
}

/// An activated device's queues and the port they exchange frames with.
pub struct NetQueues {
    mem: GuestMemoryMmap,
    rxq: Queue,
    txq: Queue,
    port: Arc<Port>,
    /// Where `port` comes from when the NIC is a slot, and the plug
    /// generation `port` was taken at.
    plug: Option<(Arc<PortPlug>, u64)>,
    /// The negotiated header length (12 with VERSION_1, else 10).
    hdr_bytes: usize,
    /// A frame taken from the port while no RX chain was available: at most
    /// one, so the device holds at most one frame of its own.
    pending_rx: Option<(VnetHdr, Vec<u8>)>,
    /// Reused TX buffers, one per frame of a batch (each at most
    /// MAX_TX_CHAIN_BYTES).
    tx_bufs: Vec<Vec<u8>>,
    features: NetFeatures,
    /// Reused by MRG_RXBUF: the buffers of the chains one frame takes, and
    /// each chain's (head, first buffer, used length).
    mrg_bufs: Vec<(GuestAddress, u32)>,
    mrg_heads: Vec<(u16, usize, u32)>,
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
            plug: None,
            hdr_bytes,
            pending_rx: None,
            tx_bufs: Vec::new(),
            features: NetFeatures::default(),
            mrg_bufs: Vec::new(),
            mrg_heads: Vec::new(),
            metrics,
        }
    }

    /// Queues exchanging frames with whatever port `plug` holds.
    pub fn on_plug(
        mem: GuestMemoryMmap,
        rxq: Queue,
        txq: Queue,
        plug: Arc<PortPlug>,
        hdr_bytes: usize,
        metrics: Arc<NetMetrics>,
    ) -> NetQueues {
        let generation = plug.generation();
        let mut q = NetQueues::new(mem, rxq, txq, plug.port(), hdr_bytes, metrics);
        q.plug = Some((plug, generation));
        q
    }

    /// Takes the plug's port when it changed since the last run. A frame
    /// held from the old port (waiting for an RX chain) is dropped: it came
    /// from the network the NIC left.
    fn follow_plug(&mut self) {
        let Some((plug, seen)) = &mut self.plug else {
            return;
        };
        let now = plug.generation();
        if now == *seen {
            return;
        }
        *seen = now;
        self.port = plug.port();
        self.pending_rx = None;
    }

    /// Acts on the negotiated offloads from now on.
    pub fn set_features(&mut self, features: NetFeatures) {
        self.features = features;
    }

    /// Sends every available TX chain's frame; true when any chain was
    /// returned to the guest.
    pub fn process_tx(&mut self) -> bool {
        let mut used = false;
        if self.tx_bufs.len() < TX_BATCH {
            self.tx_bufs.resize_with(TX_BATCH, Vec::new);
        }
        let features = self.features;
        let hdr_bytes = self.hdr_bytes;
        let mut hdrs = [VnetHdr::default(); TX_BATCH];
        let mut ok = [false; TX_BATCH];
        let mut heads = [0u16; TX_BATCH];
        loop {
            let mut n = 0;
            while n < TX_BATCH {
                let Some(chain) = self.txq.pop_descriptor_chain(&self.mem) else {
                    break;
                };
                let head = chain.head_index();
                let buf = &mut self.tx_bufs[n];
                ok[n] = false;
                let read = read_tx_chain(&self.mem, chain, buf).and_then(|()| {
                    let len = buf.len();
                    (len >= hdr_bytes)
                        .then_some(())
                        .ok_or(TxChainError::TooShort(len))
                });
                match read {
                    Err(_) => NetMetrics::bump(&self.metrics.tx_bad_chains),
                    Ok(()) => {
                        let hdr = if features.tx_headers() {
                            VnetHdr::from_bytes(buf).unwrap_or_default()
                        } else {
                            VnetHdr::default()
                        };
                        if features.allows(&hdr) {
                            hdrs[n] = hdr;
                            ok[n] = true;
                        } else {
                            NetMetrics::bump(&self.metrics.tx_bad_offload);
                            NetMetrics::bump(&self.metrics.tx_dropped);
                        }
                    }
                }
                heads[n] = head;
                n += 1;
            }
            if n == 0 {
                break;
            }
            // One switch lock and one wake-up per destination for the batch.
            let tried = ok[..n].iter().filter(|o| **o).count();
            let bufs = &self.tx_bufs;
            let sent = self.port.send_batch(
                (0..n)
                    .filter(|&i| ok[i])
                    .map(|i| (hdrs[i], &bufs[i][hdr_bytes..])),
            );
            self.metrics
                .tx_frames
                .fetch_add(sent as u64, Ordering::Relaxed);
            self.metrics
                .tx_dropped
                .fetch_add((tried - sent) as u64, Ordering::Relaxed);
            // Returned after they are forwarded and counted. add_used only
            // fails for a head out of range, which a popped chain cannot have.
            for &head in &heads[..n] {
                used |= self.txq.add_used(&self.mem, head, 0).is_ok();
            }
            if n < TX_BATCH {
                break;
            }
        }
        used
    }

    /// Delivers frames from the port while RX chains are available; true
    /// when any chain was returned to the guest.
    pub fn process_rx(&mut self) -> bool {
        let mut used = false;
        while let Some((vnet, frame)) = self
            .pending_rx
            .take()
            .or_else(|| self.port.try_recv_offload())
        {
            let hdr = rx_header(self.hdr_bytes, &vnet);
            let hdr = &hdr[..self.hdr_bytes];
            let done = if self.features.mrg_rxbuf && self.hdr_bytes == HDR_V1_BYTES {
                self.deliver_mergeable(hdr, &frame)
            } else {
                self.deliver_one(hdr, &frame)
            };
            match done {
                Some(u) => used |= u,
                None => {
                    self.pending_rx = Some((vnet, frame));
                    break;
                }
            }
            self.port.recycle(frame);
        }
        used
    }

    /// One frame into one chain; `None` when no chain is available.
    fn deliver_one(&mut self, hdr: &[u8], frame: &[u8]) -> Option<bool> {
        let chain = self.rxq.pop_descriptor_chain(&self.mem)?;
        let head = chain.head_index();
        let len = match write_rx_chain(&self.mem, chain, hdr, frame) {
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
        Some(self.rxq.add_used(&self.mem, head, len).is_ok())
    }

    /// One frame over as many chains as it needs (MRG_RXBUF); `None` (ring
    /// rewound, nothing written as used) when the available chains do not
    /// hold it yet. A bad chain drops the frame; every chain taken for it is
    /// returned with length 0.
    fn deliver_mergeable(&mut self, hdr: &[u8], frame: &[u8]) -> Option<bool> {
        let start = self.rxq.next_avail();
        let need = (hdr.len() + frame.len()) as u64;
        self.mrg_bufs.clear();
        self.mrg_heads.clear();
        let mut room: u64 = 0;
        let mut bad = false;
        while room < need {
            let Some(chain) = self.rxq.pop_descriptor_chain(&self.mem) else {
                self.rxq.set_next_avail(start);
                return None;
            };
            let head = chain.head_index();
            let first = self.mrg_bufs.len();
            self.mrg_heads.push((head, first, 0));
            // A whole ring of chains too small for the frame: it never fits.
            if self.mrg_heads.len() >= usize::from(self.rxq.size()) && room < need {
                bad = true;
            }
            match list_rx_chain(chain, &mut self.mrg_bufs) {
                Ok(r) => room += r,
                Err(_) => bad = true,
            }
            if bad {
                break;
            }
        }
        let mut hdr12 = [0u8; HDR_V1_BYTES];
        hdr12.copy_from_slice(hdr);
        let count = u16::try_from(self.mrg_heads.len()).unwrap_or(u16::MAX);
        hdr12[10..12].copy_from_slice(&count.to_le_bytes());
        if !bad {
            let heads = &mut self.mrg_heads;
            let r = write_bufs(&self.mem, &self.mrg_bufs, &hdr12, frame, |i, n| {
                // The chain owning buffer i is the last whose first <= i.
                if let Some(h) = heads.iter_mut().rev().find(|h| h.1 <= i) {
                    h.2 += n as u32;
                }
            });
            bad = r.is_err();
        }
        if bad {
            NetMetrics::bump(&self.metrics.rx_bad_chains);
            NetMetrics::bump(&self.metrics.rx_dropped);
        } else {
            NetMetrics::bump(&self.metrics.rx_frames);
        }
        let mut used = false;
        for &(head, _, len) in &self.mrg_heads {
            let len = if bad { 0 } else { len };
            used |= self.rxq.add_used(&self.mem, head, len).is_ok();
        }
        Some(used)
    }

    /// One round: TX first (the guest's frames may be for itself), then RX.
    /// True when the guest should get a used-buffer interrupt.
    pub fn run_once(&mut self) -> bool {
        let (rx, tx) = self.run_once_by_queue();
        rx || tx
    }

    /// `run_once`, saying which queue needs the interrupt: (RX, TX). A
    /// transport with a vector per queue (virtio-pci's MSI-X) raises each.
    pub fn run_once_by_queue(&mut self) -> (bool, bool) {
        self.follow_plug();
        let tx = self.process_tx();
        let rx = self.process_rx();
        (
            rx && self.rxq.needs_notification(&self.mem).unwrap_or(true),
            tx && self.txq.needs_notification(&self.mem).unwrap_or(true),
        )
    }

    /// Whether a frame waits inside the device for an RX chain.
    pub fn has_pending_rx(&self) -> bool {
        self.pending_rx.is_some()
    }

    /// The frame waiting for an RX chain, with its offload header
    /// (snapshots).
    pub fn pending_rx(&self) -> Option<(&VnetHdr, &[u8])> {
        self.pending_rx.as_ref().map(|(h, f)| (h, &f[..]))
    }

    /// Puts back a frame from a snapshot (validated by the caller).
    pub fn set_pending_rx(&mut self, frame: Option<(VnetHdr, Vec<u8>)>) {
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
    use std::sync::atomic::Ordering;
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
        assert!(r
            .q
            .tx_bufs
            .iter()
            .all(|b| b.capacity() <= MAX_TX_CHAIN_BYTES + 16));
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

    /// A TCPv4 super-frame of `payload` bytes from GUEST to PEER (headers as
    /// the switch checks them; checksums are the switch's to fill).
    fn tso4(payload: usize) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&PEER.0);
        f.extend_from_slice(&GUEST.0);
        f.extend_from_slice(&[0x08, 0x00]);
        let total = u16::try_from(20 + 20 + payload).expect("fits");
        f.extend_from_slice(&[
            0x45, 0, 0, 0, 0, 1, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[
            0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff,
        ]);
        f.extend_from_slice(&[0, 0, 0, 0]);
        f.extend((0..payload).map(|i| (i % 251) as u8));
        f
    }

    const TSO4_HDR: VnetHdr = VnetHdr {
        flags: provium_netsetup::offload::F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 54,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
    };

    #[test]
    fn tx_offload_headers_go_to_the_switch_and_bad_ones_are_counted() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        r.q.set_features(NetFeatures {
            csum: true,
            host_tso4: true,
            host_tso6: false,
            mrg_rxbuf: false,
        });
        r.peer.set_offloads(provium_netsetup::Offloads::ALL);
        let f = tso4(10_000);
        let mut hdr_bytes = TSO4_HDR.to_bytes().to_vec();
        hdr_bytes.extend_from_slice(&[0, 0]);
        let put = |gpa: u64, h: &[u8]| {
            let mut b = h.to_vec();
            b.extend_from_slice(&f);
            mem.write_slice(&b, GuestAddress(gpa)).expect("write");
            b.len() as u32
        };
        let n = put(0x10_0000, &hdr_bytes);
        // gso_size 0: refused by the switch.
        let mut zero = hdr_bytes.clone();
        zero[4..6].fill(0);
        put(0x12_0000, &zero);
        // TCPv6 GSO was not negotiated: refused here.
        let mut v6 = hdr_bytes.clone();
        v6[1] = GSO_TCPV6;
        put(0x14_0000, &v6);
        r.tx.add_desc_chains(
            &[
                d(0x10_0000, n, 0, 0),
                d(0x12_0000, n, 0, 0),
                d(0x14_0000, n, 0, 0),
            ],
            0,
        )
        .expect("chains");
        r.q.run_once();
        assert_eq!(used_idx(r.mem, &r.tx), 3);
        let got = r.peer.recv_offload_timeout(Duration::from_secs(5));
        assert_eq!(
            got,
            Some((TSO4_HDR, f.clone())),
            "one super-frame, header kept"
        );
        assert_eq!(r.peer.try_recv(), None);
        let [tx, dropped, bad, ..] = r.metrics.snapshot();
        assert_eq!((tx, dropped, bad), (1, 2, 0));
        assert_eq!(r.metrics.tx_bad_offload.load(Ordering::Relaxed), 1);
        assert_eq!(r.q.port.counters().offload_errors, 1);
    }

    #[test]
    fn tx_headers_are_ignored_without_offload_features() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        // A header asking for GSO from a guest that negotiated nothing: the
        // header is not read, the frame goes as it is.
        let f = frame(PEER, GUEST, 100, 5);
        let mut b = vec![1, GSO_TCPV4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&f);
        mem.write_slice(&b, GuestAddress(0x10_0000)).expect("write");
        r.tx.add_desc_chains(&[d(0x10_0000, b.len() as u32, 0, 0)], 0)
            .expect("chain");
        r.q.run_once();
        assert_eq!(r.peer.recv_timeout(Duration::from_secs(5)), Some(f));
    }

    #[test]
    fn mergeable_rx_spreads_a_super_frame_once_the_chains_hold_it() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        r.q.set_features(NetFeatures {
            mrg_rxbuf: true,
            ..NetFeatures::default()
        });
        r.q.port.set_offloads(provium_netsetup::Offloads::ALL);
        let mut f = tso4(10_000);
        // From PEER to GUEST this time.
        f[..6].copy_from_slice(&GUEST.0);
        f[6..12].copy_from_slice(&PEER.0);
        r.peer.send_offload(TSO4_HDR, &f).expect("send");
        // Two 4 KiB buffers do not hold 12 + 10054 bytes: nothing is used.
        r.rx.add_desc_chains(&[d(0x20_0000, 4096, W, 0), d(0x21_0000, 4096, W, 0)], 0)
            .expect("chains");
        assert!(!r.q.run_once());
        assert_eq!(used_idx(r.mem, &r.rx), 0);
        assert!(r.q.has_pending_rx());
        r.rx.add_desc_chains(&[d(0x22_0000, 4096, W, 0), d(0x23_0000, 4096, W, 0)], 2)
            .expect("chains");
        assert!(r.q.run_once());
        assert_eq!(
            used_idx(r.mem, &r.rx),
            3,
            "three buffers taken, the fourth left"
        );
        assert_eq!(used(r.mem, &r.rx, 0), (0, 4096));
        assert_eq!(used(r.mem, &r.rx, 1), (1, 4096));
        assert_eq!(used(r.mem, &r.rx, 2), (2, (12 + f.len() - 8192) as u32));
        let mut got = vec![0u8; 12 + f.len()];
        for (i, gpa) in [0x20_0000u64, 0x21_0000, 0x22_0000].iter().enumerate() {
            let end = ((i + 1) * 4096).min(got.len());
            mem.read_slice(&mut got[i * 4096..end], GuestAddress(*gpa))
                .expect("read");
        }
        let mut want = TSO4_HDR.to_bytes().to_vec();
        want.extend_from_slice(&3u16.to_le_bytes());
        assert_eq!(
            &got[..12],
            &want[..],
            "the offload header and num_buffers 3"
        );
        assert_eq!(&got[12..], &f[..]);
        assert_eq!(r.metrics.snapshot()[3], 1);
    }

    #[test]
    fn a_frame_no_ring_of_mergeable_buffers_can_hold_is_dropped() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        r.q.set_features(NetFeatures {
            mrg_rxbuf: true,
            ..NetFeatures::default()
        });
        r.peer.send(&frame(GUEST, PEER, 1514, 1)).expect("send");
        r.peer.send(&frame(GUEST, PEER, 60, 2)).expect("send");
        // Sixteen 64-byte buffers (the whole ring) hold 1024 bytes.
        let chains: Vec<RawDescriptor> = (0..16)
            .map(|i| d(0x20_0000 + 0x100 * i, 64, W, 0))
            .collect();
        r.rx.add_desc_chains(&chains, 0).expect("chains");
        r.q.run_once();
        assert_eq!(used_idx(r.mem, &r.rx), 16, "every buffer returned");
        assert_eq!(used(r.mem, &r.rx, 0).1, 0);
        let [.., rx, rx_dropped, rx_bad] = r.metrics.snapshot();
        assert_eq!((rx, rx_dropped, rx_bad), (0, 1, 1));
        assert!(r.q.has_pending_rx(), "the next frame waits for buffers");
    }

    #[test]
    fn a_tx_batch_wakes_the_receiver_once() {
        let mem = guest_memory();
        let mut r = rig(&mem, HDR_V1_BYTES);
        let wakes = Arc::new(AtomicU64::new(0));
        let w = wakes.clone();
        r.peer.set_rx_waker(Some(Arc::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        })));
        // Eight: the mock queue's used ring overlaps its avail ring past that.
        let frames: Vec<Vec<u8>> = (0..8u8).map(|i| frame(PEER, GUEST, 100, i)).collect();
        let descs: Vec<RawDescriptor> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let gpa = 0x10_0000 + 0x1000 * i as u64;
                d(gpa, put_tx(&mem, gpa, f), 0, 0)
            })
            .collect();
        r.tx.add_desc_chains(&descs, 0).expect("chains");
        r.q.run_once();
        assert_eq!(used_idx(r.mem, &r.tx), 8);
        let got: Vec<u8> = std::iter::from_fn(|| r.peer.try_recv())
            .map(|f| f[20])
            .collect();
        assert_eq!(got, (0..8).collect::<Vec<u8>>(), "every frame, in order");
        assert_eq!(wakes.load(Ordering::SeqCst), 1, "8 frames, one wake-up");
        assert_eq!(r.metrics.snapshot()[0], 8);
    }
}
