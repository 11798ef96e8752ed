//! The forwarding path: runs in the sender's thread, reads its cached
//! [`Topology`] snapshot and takes only its own sender lock and the
//! destinations' queue locks.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::counters::{add, bump};
use super::topology::Topology;
use super::{Inner, PortId, SendError};
use crate::clock::duration_ns;
use crate::impair::{DropRng, Effective, TokenBucket};
use crate::mac::{dst_mac, src_mac, MacAddr, ETH_HEADER_BYTES, MAX_FRAME_BYTES};
use crate::offload::{segment, OffloadMeta, Segments, VnetHdr};
use crate::pcap::CaptureScope;
use crate::port::{LinkWatcher, RxQueue};

/// One pair's impairment state; it lives in the sending port's
/// [`Sender`], so only that pair's traffic touches it.
struct PairRuntime {
    generation: u64,
    reset_epoch: u64,
    eff: Effective,
    bucket: Option<TokenBucket>,
    rng: DropRng,
}

/// A port's sending side: the cached snapshot, its pairs' runtime keyed by
/// destination, and the wire packets of the frame being forwarded (reused
/// frame to frame). Behind the port's own lock.
pub(super) struct Sender {
    topo: Arc<Topology>,
    pairs: HashMap<PortId, PairRuntime>,
    wire: Segments,
    /// Destinations a kernel-path wire was asked for (ids are never
    /// reused, so once is enough).
    asked: HashSet<PortId>,
}

impl Sender {
    /// A sender starting from `topo`, with no pair runtime yet.
    pub(super) fn new(topo: Arc<Topology>) -> Sender {
        Sender {
            topo,
            pairs: HashMap::new(),
            wire: Segments::new(),
            asked: HashSet::new(),
        }
    }
}

/// Receive queues woken after a send without allocating: a unicast or a
/// flood to a few ports.
const WAKE_INLINE: usize = 8;

/// Work to do after the locks are released.
#[derive(Default)]
pub(super) struct After {
    /// Queues to wake, each once; the first [`WAKE_INLINE`] need no heap.
    wake_inline: [Option<Arc<RxQueue>>; WAKE_INLINE],
    wake_more: Vec<Arc<RxQueue>>,
    pub(super) link: Vec<(LinkWatcher, bool)>,
}

impl After {
    pub(super) fn wake_once(&mut self, q: &Arc<RxQueue>) {
        let queued = |x: &Arc<RxQueue>| Arc::ptr_eq(x, q);
        if self.wake_inline.iter().flatten().any(queued) || self.wake_more.iter().any(queued) {
            return;
        }
        match self.wake_inline.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(Arc::clone(q)),
            None => self.wake_more.push(Arc::clone(q)),
        }
    }

    pub(super) fn run(self) {
        for q in self.wake_inline.into_iter().flatten().chain(self.wake_more) {
            q.wake();
        }
        for (w, up) in self.link {
            w(up);
        }
    }
}

/// The frame being forwarded and, once cut, its wire packets.
struct Packet<'a> {
    meta: &'a OffloadMeta,
    frame: &'a [u8],
    wire: &'a mut Segments,
    cut: bool,
}

/// Whether a delivery may write straight into the destination (see
/// [`RxQueue::push_or_write`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direct {
    /// An unimpaired pair on the forwarding path: order is the queue's.
    IfIdle,
    /// Released by the timer or a reset: always queued.
    Never,
}

impl Inner {
    pub(super) fn send_batch<'a>(
        &self,
        from: PortId,
        sender: &Mutex<Sender>,
        frames: impl IntoIterator<Item = (VnetHdr, &'a [u8])>,
    ) -> (usize, Option<SendError>) {
        let now = self.clock.now();
        let mut after = After::default();
        let mut ok = 0;
        let mut last_err = None;
        {
            let mut s = sender.lock().unwrap_or_else(|e| e.into_inner());
            for (hdr, frame) in frames {
                match self.forward(&mut s, from, hdr, frame, now, &mut after) {
                    Ok(()) => ok += 1,
                    Err(e) => last_err = Some(e),
                }
            }
        }
        after.run();
        (ok, last_err)
    }

    /// Brings the sender's snapshot up to date; the shared publication lock
    /// is taken only when a control change happened since the last frame.
    fn refresh(&self, s: &mut Sender) {
        if self.generation.load(Ordering::Acquire) == s.topo.generation {
            return;
        }
        s.topo = self.snapshot();
        let topo = &s.topo;
        // Runtime of pairs whose destination left goes with it (ids are
        // never reused).
        s.pairs.retain(|to, _| topo.ports.contains_key(to));
        s.asked.retain(|to| topo.ports.contains_key(to));
    }

    fn forward(
        &self,
        s: &mut Sender,
        from: PortId,
        hdr: VnetHdr,
        frame: &[u8],
        now: Duration,
        after: &mut After,
    ) -> Result<(), SendError> {
        self.refresh(s);
        let (src, dst, meta) = {
            let topo = &*s.topo;
            if topo.closed {
                return Err(SendError::Detached);
            }
            let Some(slot) = topo.ports.get(&from) else {
                return Err(SendError::Detached);
            };
            let port = &slot.shared;
            if !port.link_up.load(Ordering::Acquire) {
                bump(&port.counters.tx_dropped);
                bump(&self.stats.dropped_link_down);
                return Err(SendError::LinkDown);
            }
            let err = if frame.len() < ETH_HEADER_BYTES {
                Some(SendError::Runt(frame.len()))
            } else if frame.len() > MAX_FRAME_BYTES {
                Some(SendError::Oversized(frame.len()))
            } else {
                match src_mac(frame) {
                    Some(s) if s.is_multicast() || s.is_zero() => Some(SendError::BadSource(s)),
                    _ => None,
                }
            };
            let parsed = match err {
                Some(e) => Err(e),
                None => OffloadMeta::parse(hdr, frame).map_err(|e| {
                    bump(&port.counters.offload_errors);
                    SendError::BadOffload(e)
                }),
            };
            let meta = match parsed {
                Ok(m) => m,
                Err(e) => {
                    bump(&port.counters.tx_dropped);
                    bump(&port.counters.errors);
                    bump(&self.stats.dropped_invalid);
                    return Err(e);
                }
            };
            let (Some(src), Some(dst)) = (src_mac(frame), dst_mac(frame)) else {
                return Err(SendError::Runt(frame.len()));
            };
            bump(&port.counters.tx_packets);
            add(&port.counters.tx_bytes, frame.len() as u64);
            bump(&self.stats.frames_in);
            (src, dst, meta)
        };
        // The wire packets, cut at most once per frame and only when some
        // capture or destination needs them.
        let mut wire = std::mem::take(&mut s.wire);
        let mut cut = false;
        self.record_ingress(&s.topo, from, &meta, frame, now, &mut wire, &mut cut);
        self.learn(s, src, from, now);

        let topo = &*s.topo;
        let target = if dst.is_multicast() {
            None
        } else {
            match topo.macs.get(&dst) {
                Some(e) if e.fresh(now, self.config.mac_ageing) => Some(e.port),
                _ => None,
            }
        };
        let mut pkt = Packet {
            meta: &meta,
            frame,
            wire: &mut wire,
            cut,
        };
        match target {
            Some(to) if to == from => bump(&self.stats.dropped_hairpin),
            Some(to) => {
                // The first unicast between two kernel NICs asks for
                // their wire; this frame and any before the wire is up
                // take the switch.
                let kernel = |id| topo.ports.get(&id).is_some_and(|p| p.kernel);
                if self.config.kernel_path && kernel(from) && kernel(to) && s.asked.insert(to) {
                    self.want_wire(from, to);
                }
                self.egress(topo, &mut s.pairs, from, to, &mut pkt, now, after)
            }
            None => {
                bump(&self.stats.flooded);
                for to in topo.ports.keys().copied().filter(|k| *k != from) {
                    self.egress(topo, &mut s.pairs, from, to, &mut pkt, now, after);
                }
            }
        }
        if pkt.cut && meta.needs_work() {
            bump(&self.stats.segmented);
            add(&self.stats.segments, pkt.wire.len() as u64);
        }
        s.wire = wire;
        Ok(())
    }

    /// Records the frame in bridge-wide captures and the sender's own.
    #[allow(clippy::too_many_arguments)]
    fn record_ingress(
        &self,
        topo: &Topology,
        from: PortId,
        meta: &OffloadMeta,
        frame: &[u8],
        now: Duration,
        wire: &mut Segments,
        cut: &mut bool,
    ) {
        if topo.captures.is_empty() {
            return;
        }
        let Some(name) = topo.ports.get(&from).map(|p| &p.shared.name) else {
            return;
        };
        let ts = self.clock.unix_origin() + now;
        for c in &topo.captures {
            let hit = match c.scope() {
                CaptureScope::Bridge => true,
                CaptureScope::Port(p) => p == name,
            };
            if !hit {
                continue;
            }
            if !meta.needs_work() {
                c.record(ts, frame);
                continue;
            }
            if !*cut {
                segment(meta, frame, wire);
                *cut = true;
            }
            for seg in wire.iter() {
                c.record(ts, seg);
            }
        }
    }

    /// Refreshes a known MAC with an atomic store; a new or moved one goes
    /// through the control plane (and a new snapshot).
    fn learn(&self, s: &mut Sender, mac: MacAddr, port: PortId, now: Duration) {
        if let Some(e) = s.topo.macs.get(&mac) {
            if e.port == port {
                e.last_seen_ns.store(duration_ns(now), Ordering::Relaxed);
                return;
            }
        }
        let cap = self.config.mac_entries_per_port.max(1);
        let evicted = self.update_learned(|c| {
            // Detached meanwhile: nothing to learn it for.
            if c.ports.contains_key(&port) {
                c.learn(mac, port, now, cap)
            } else {
                0
            }
        });
        add(&self.stats.mac_evictions, evicted);
        self.refresh(s);
    }

    #[allow(clippy::too_many_arguments)]
    fn egress(
        &self,
        topo: &Topology,
        pairs: &mut HashMap<PortId, PairRuntime>,
        from: PortId,
        to: PortId,
        pkt: &mut Packet<'_>,
        now: Duration,
        after: &mut After,
    ) {
        let (Some(f), Some(t)) = (topo.ports.get(&from), topo.ports.get(&to)) else {
            return;
        };
        if f.isolated || t.isolated {
            bump(&self.stats.dropped_isolated);
            return;
        }
        if topo.blocked.contains(&(from, to)) {
            bump(&self.stats.dropped_partition);
            return;
        }
        if !t.shared.link_up.load(Ordering::Acquire) {
            bump(&self.stats.dropped_link_down);
            bump(&t.shared.counters.rx_dropped);
            return;
        }
        let impaired = topo.any_impairment && self.refresh_pair(topo, pairs, from, to, now);
        let meta = pkt.meta;
        if !meta.needs_work() {
            if impaired {
                self.impair(topo, pairs, to, pkt.frame, now, after);
            } else {
                self.deliver(topo, to, meta.hdr, pkt.frame, now, Direct::IfIdle, after);
            }
            return;
        }
        // An offloaded frame goes whole only where nothing needs to see its
        // wire packets: the port takes the offload, no capture of the port
        // is open (captures show wire packets) and the pair is unimpaired,
        // or impaired without a bandwidth cap (the bucket paces each wire
        // packet): a latency or a drop rate acts per wire packet without
        // cutting the frame (see `impair_whole`).
        let takes_it = t.offloads.accepts(meta.work) && !t.captured;
        if takes_it && !impaired {
            bump(&self.stats.offloaded);
            self.deliver(topo, to, meta.hdr, pkt.frame, now, Direct::IfIdle, after);
            return;
        }
        if takes_it && pairs.get(&to).is_some_and(|rt| rt.bucket.is_none()) {
            self.impair_whole(topo, pairs, to, pkt, now, after);
            return;
        }
        if !pkt.cut {
            segment(meta, pkt.frame, pkt.wire);
            pkt.cut = true;
        }
        for seg in pkt.wire.iter() {
            if impaired {
                self.impair(topo, pairs, to, seg, now, after);
            } else {
                let hdr = VnetHdr::default();
                self.deliver(topo, to, hdr, seg, now, Direct::IfIdle, after);
            }
        }
    }

    /// Brings the pair's runtime (drop stream, token bucket) up to date with
    /// the declared impairments; true when the pair is impaired.
    fn refresh_pair(
        &self,
        topo: &Topology,
        pairs: &mut HashMap<PortId, PairRuntime>,
        from: PortId,
        to: PortId,
        now: Duration,
    ) -> bool {
        let current = pairs
            .get(&to)
            .is_some_and(|r| r.generation == topo.generation);
        if !current {
            let (Some(f), Some(t)) = (topo.ports.get(&from), topo.ports.get(&to)) else {
                return false;
            };
            let (fname, tname) = (&f.shared.name, &t.shared.name);
            let pair = topo
                .pair_imp
                .iter()
                .find(|((a, b), _)| a == fname && b == tname)
                .map(|(_, i)| i);
            let eff = Effective::combine(&topo.bridge_imp, pair);
            let burst = |bps: u64| {
                self.config
                    .bandwidth_burst_bits
                    .unwrap_or_else(|| TokenBucket::default_burst_bits(bps))
            };
            let fresh_rng = || DropRng::for_pair(self.seed, fname, tname);
            let rt = pairs.entry(to).or_insert_with(|| PairRuntime {
                generation: topo.generation,
                reset_epoch: topo.reset_epoch,
                eff,
                bucket: None,
                rng: fresh_rng(),
            });
            if rt.reset_epoch != topo.reset_epoch {
                // A reset forgets the stream and the bucket.
                rt.reset_epoch = topo.reset_epoch;
                rt.rng = fresh_rng();
                rt.bucket = None;
            }
            rt.generation = topo.generation;
            rt.eff = eff;
            rt.bucket = match (eff.bandwidth_bps, rt.bucket.take()) {
                (None, _) => None,
                (Some(bps), Some(mut b)) => {
                    b.set_rate(bps, burst(bps));
                    Some(b)
                }
                (Some(bps), None) => Some(TokenBucket::new(bps, burst(bps), now)),
            };
        }
        pairs.get(&to).is_some_and(|rt| !rt.eff.is_clear())
    }

    /// One wire packet over an impaired pair: the seeded drop draw, the
    /// token bucket (charged the packet's bytes, headers included), then the
    /// latency.
    fn impair(
        &self,
        topo: &Topology,
        pairs: &mut HashMap<PortId, PairRuntime>,
        to: PortId,
        frame: &[u8],
        now: Duration,
        after: &mut After,
    ) {
        let Some(rt) = pairs.get_mut(&to) else {
            return;
        };
        if rt.rng.drop_frame(&rt.eff) {
            bump(&self.stats.dropped_impairment);
            return;
        }
        let depart = match &mut rt.bucket {
            Some(b) => b.schedule(now, frame.len()),
            None => now,
        };
        // Saturating, as the combined latency: a latency near Duration::MAX
        // holds the frame until a reset instead of panicking.
        let release = depart.saturating_add(rt.eff.latency);
        self.release_at(topo, to, VnetHdr::default(), frame, release, now, after);
    }

    /// A super-frame over a pair impaired by a latency or a drop rate (no
    /// bandwidth cap), toward a port that takes its offload: one seeded
    /// draw per wire packet, in wire order, as `impair` makes for the cut
    /// frame, so the pair's drop stream and every drop fall exactly as
    /// they would. While no draw drops, nothing is cut and the frame is
    /// released whole, the pair's latency after `now`; at the first drop
    /// the frame is cut, the packets before it go on alone and the rest
    /// are drawn and released one by one. Saves the receiving TAP one
    /// write per wire packet (a 64 KiB TSO frame is ~45), which the
    /// profile showed as the impaired path's cost.
    fn impair_whole(
        &self,
        topo: &Topology,
        pairs: &mut HashMap<PortId, PairRuntime>,
        to: PortId,
        pkt: &mut Packet<'_>,
        now: Duration,
        after: &mut After,
    ) {
        let Some(rt) = pairs.get_mut(&to) else {
            return;
        };
        let release = now.saturating_add(rt.eff.latency);
        let n = pkt.meta.wire_packets();
        let Some(first_drop) = (0..n).find(|_| rt.rng.drop_frame(&rt.eff)) else {
            bump(&self.stats.offloaded);
            let hdr = pkt.meta.hdr;
            self.release_at(topo, to, hdr, pkt.frame, release, now, after);
            return;
        };
        if !pkt.cut {
            segment(pkt.meta, pkt.frame, pkt.wire);
            pkt.cut = true;
        }
        for (i, seg) in pkt.wire.iter().enumerate() {
            let dropped = match i.cmp(&first_drop) {
                // Drawn above, and kept.
                std::cmp::Ordering::Less => false,
                std::cmp::Ordering::Equal => true,
                std::cmp::Ordering::Greater => rt.rng.drop_frame(&rt.eff),
            };
            if dropped {
                bump(&self.stats.dropped_impairment);
                continue;
            }
            self.release_at(topo, to, VnetHdr::default(), seg, release, now, after);
        }
    }

    /// Delivers an impaired frame now if `release` has come, else holds it
    /// (queued either way: never the direct path, so the pair's order is
    /// the delay queue's).
    #[allow(clippy::too_many_arguments)]
    fn release_at(
        &self,
        topo: &Topology,
        to: PortId,
        hdr: VnetHdr,
        frame: &[u8],
        release: Duration,
        now: Duration,
        after: &mut After,
    ) {
        if release <= now {
            self.deliver(topo, to, hdr, frame, now, Direct::Never, after);
            return;
        }
        if let Some(view) = topo.ports.get(&to) {
            self.hold(&view.shared, release, hdr, frame);
        }
    }

    /// Hands `frame` (with `hdr`, the offload it still carries) to `to`,
    /// timestamped `at` in captures: written straight into the destination
    /// when `direct` allows and it is idle, else queued (a copy).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver(
        &self,
        topo: &Topology,
        to: PortId,
        hdr: VnetHdr,
        frame: &[u8],
        at: Duration,
        direct: Direct,
        after: &mut After,
    ) {
        let Some(view) = topo.ports.get(&to) else {
            // Detached meanwhile.
            bump(&self.stats.dropped_link_down);
            return;
        };
        let port = &view.shared;
        if !port.link_up.load(Ordering::Acquire) {
            bump(&port.counters.rx_dropped);
            bump(&self.stats.dropped_link_down);
            return;
        }
        if view.captured {
            let ts = self.clock.unix_origin() + at;
            for c in &topo.captures {
                if matches!(c.scope(), CaptureScope::Port(p) if *p == port.name) {
                    c.record(ts, frame);
                }
            }
        }
        let len = frame.len() as u64;
        let pushed = match direct {
            Direct::IfIdle => port.rx.push_or_write(hdr, frame),
            Direct::Never => port.rx.push(hdr, frame).then_some(true),
        };
        match pushed {
            Some(queued) => {
                bump(&port.counters.rx_packets);
                add(&port.counters.rx_bytes, len);
                bump(&self.stats.delivered);
                if queued {
                    after.wake_once(&port.rx);
                }
            }
            None => {
                bump(&port.counters.rx_dropped);
                bump(&self.stats.dropped_rx_queue_full);
            }
        }
    }
}
