//! The userspace L2 switch: one per bridge.
//!
//! # Forwarding
//! A frame handed in by a port ([`Port::send`]) is validated (at least an
//! Ethernet header, at most [`MAX_FRAME_BYTES`], a unicast non-zero source),
//! recorded by bridge-wide captures, and its source MAC is learned for the
//! sending port. Group (multicast/broadcast) and unknown unicast destinations
//! flood to every other port; known unicast goes to the learned port (a frame
//! whose destination sits behind its own ingress port is dropped, as a real
//! bridge does). Learned entries age out after [`SwitchConfig::mac_ageing`];
//! each port may own at most [`SwitchConfig::mac_entries_per_port`] entries
//! (oldest evicted), so a guest inventing source MACs cannot grow the table
//! or push out other ports' entries.
//!
//! # Impairments, per destination
//! For each (from, to) a frame is offered to, in this order: isolation of
//! either end, a directed partition from→to, the destination's link state, then
//! the pair's effective impairment ([`crate::impair`]): a seeded drop draw, the
//! pair's token bucket, the latency. A frame whose release time is in the future
//! waits in the delay queue (a min-heap by release time, bounded by
//! [`SwitchConfig::delay_queue_bytes`]); a timer thread (or, with a manual
//! clock, [`Switch::release_due`]) hands it over when due. Nothing sleeps in the
//! forwarding path.
//!
//! # Threading
//! Forwarding runs synchronously in the sender's thread under one switch lock;
//! frames land in the destination's bounded [`RxQueue`]. Callbacks (RX wakers,
//! link watchers) run after the lock is released. With [`Timer::Thread`] one
//! thread sleeps on a condition variable until the earliest release time.
//!
//! # Counters
//! Per-port counters are from the guest's perspective: `tx_*` is what the
//! guest sent into the switch, `rx_*` what the switch queued for the guest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::impair::{
    bridge_seed, check_drop_pct, DropRng, Effective, ImpairError, Impairment, TokenBucket,
};
use crate::mac::{dst_mac, src_mac, MacAddr, ETH_HEADER_BYTES, MAX_FRAME_BYTES};
use crate::offload::{segment, OffloadError, OffloadMeta, Offloads, Segments, VnetHdr};
use crate::pcap::{Capture, CaptureScope, CaptureShared};
use crate::port::{LinkWatcher, RxQueue, RxWaker};

/// Errors from switch control operations.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SwitchError {
    /// `attach` with a name already on the bridge.
    #[error("port `{port}` is already attached to bridge `{bridge}` (detach it first, or pick another name)")]
    NameTaken {
        /// The bridge.
        bridge: String,
        /// The duplicate port name.
        port: String,
    },
    /// An operation named a port that is not attached.
    #[error("no port `{port}` on bridge `{bridge}` (call attach first)")]
    NoSuchPort {
        /// The bridge.
        bridge: String,
        /// The missing port name.
        port: String,
    },
    /// A rejected impairment value.
    #[error("bad impairment on bridge `{bridge}`")]
    Impairment {
        /// The bridge.
        bridge: String,
        /// What was wrong.
        #[source]
        source: ImpairError,
    },
}

/// Why [`Port::send`] did not accept a frame. Each is also counted on the port
/// (`tx_dropped`, and `errors` for malformed frames).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// The port was detached or the switch shut down.
    #[error("port is detached from its bridge")]
    Detached,
    /// The port's link is down ([`Switch::disconnect`]).
    #[error("link is down (the nic was disconnected)")]
    LinkDown,
    /// Shorter than an Ethernet header.
    #[error("frame of {0} bytes is shorter than an ethernet header (14 bytes)")]
    Runt(usize),
    /// Longer than [`MAX_FRAME_BYTES`].
    #[error("frame of {0} bytes exceeds the 65549-byte limit")]
    Oversized(usize),
    /// Multicast or all-zero source MAC.
    #[error("frame has invalid source mac {0}")]
    BadSource(MacAddr),
    /// The frame's virtio-net offload header is invalid.
    #[error("frame's offload header was refused")]
    BadOffload(#[source] OffloadError),
}

/// Limits and the run seed. Every bound exists because guests are untrusted.
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    /// The run seed; drop patterns derive from it and the bridge name.
    pub run_seed: u64,
    /// Frames a port's receive queue holds before further frames are dropped.
    pub rx_queue_frames: usize,
    /// Bytes a port's receive queue holds before further frames are dropped.
    pub rx_queue_bytes: usize,
    /// Bytes the delay queue (latency and bandwidth backlog) holds in all.
    pub delay_queue_bytes: usize,
    /// Bytes a capture buffers for a slow consumer before dropping records.
    pub capture_buffer_bytes: usize,
    /// Learned MAC entries one port may own.
    pub mac_entries_per_port: usize,
    /// Age after which an unrefreshed MAC entry is forgotten.
    pub mac_ageing: Duration,
    /// Token-bucket burst, in bits; `None` uses
    /// [`TokenBucket::default_burst_bits`] of the rate.
    pub bandwidth_burst_bits: Option<u64>,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            run_seed: 0,
            rx_queue_frames: 1024,
            rx_queue_bytes: 4 << 20,
            delay_queue_bytes: 32 << 20,
            capture_buffer_bytes: 8 << 20,
            mac_entries_per_port: 256,
            mac_ageing: Duration::from_secs(300),
            bandwidth_burst_bits: None,
        }
    }
}

/// How the delay queue is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// A thread releases due frames (production; pair it with a real clock).
    Thread,
    /// The caller calls [`Switch::release_due`] (tests with a manual clock).
    Manual,
}

/// Per-port counters, from the guest's perspective.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames queued to the guest.
    pub rx_packets: u64,
    /// Bytes queued to the guest.
    pub rx_bytes: u64,
    /// Frames the guest sent that the switch accepted.
    pub tx_packets: u64,
    /// Bytes the guest sent that the switch accepted.
    pub tx_bytes: u64,
    /// Frames for the guest dropped at this port: receive queue full or link down.
    pub rx_dropped: u64,
    /// Frames from the guest refused: link down, malformed or oversized.
    pub tx_dropped: u64,
    /// Malformed frames from the guest (runt, oversized, bad source MAC,
    /// bad offload header).
    pub errors: u64,
    /// Frames from the guest refused for their offload header (bogus
    /// gso_type, gso_size 0, hdr_len or checksum offsets outside the
    /// frame, headers that do not match the GSO type); also in `errors`.
    pub offload_errors: u64,
}

/// Switch-wide counters; each frame offered to a destination ends in exactly
/// one of `delivered` or a `dropped_*` bucket (or is still delayed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Frames accepted from ports.
    pub frames_in: u64,
    /// Frames flooded (group or unknown destination).
    pub flooded: u64,
    /// Frames queued to a destination port.
    pub delivered: u64,
    /// Frames that waited in the delay queue.
    pub delayed: u64,
    /// Frames refused at ingress as malformed.
    pub dropped_invalid: u64,
    /// Dropped because the sender's or receiver's link was down.
    pub dropped_link_down: u64,
    /// Dropped because either end was isolated.
    pub dropped_isolated: u64,
    /// Dropped by a partition.
    pub dropped_partition: u64,
    /// Dropped by a drop-rate impairment.
    pub dropped_impairment: u64,
    /// Dropped because the destination's receive queue was full.
    pub dropped_rx_queue_full: u64,
    /// Dropped because the delay queue was full.
    pub dropped_delay_queue_full: u64,
    /// Unicast to a destination behind the ingress port itself.
    pub dropped_hairpin: u64,
    /// Learned MAC entries evicted by the per-port bound.
    pub mac_evictions: u64,
    /// Offloaded frames (GSO or checksum-pending) finished in software for
    /// a destination or capture that could not take them as they were.
    pub segmented: u64,
    /// Wire packets those frames became.
    pub segments: u64,
    /// Offloaded frames handed to a destination whole (both ends offload).
    pub offloaded: u64,
}

type PortId = u64;

struct PortSlot {
    name: String,
    mac: MacAddr,
    link_up: bool,
    isolated: bool,
    counters: PortCounters,
    rx: Arc<RxQueue>,
    link_watcher: Option<LinkWatcher>,
    /// MACs learned on this port, oldest first.
    learned: VecDeque<MacAddr>,
    /// What this port takes without software segmentation.
    offloads: Offloads,
}

struct MacEntry {
    port: PortId,
    last_seen: Duration,
}

struct PairRuntime {
    generation: u64,
    eff: Effective,
    bucket: Option<TokenBucket>,
    rng: DropRng,
}

struct Delayed {
    release: Duration,
    seq: u64,
    to: PortId,
    frame: Vec<u8>,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.release, self.seq) == (o.release, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.release, self.seq).cmp(&(o.release, o.seq))
    }
}

/// Receive queues woken after a send without allocating: a unicast or a
/// flood to a few ports.
const WAKE_INLINE: usize = 8;

/// Work to do after the lock is released.
#[derive(Default)]
struct After {
    /// Queues to wake, each once; the first [`WAKE_INLINE`] need no heap.
    wake_inline: [Option<Arc<RxQueue>>; WAKE_INLINE],
    wake_more: Vec<Arc<RxQueue>>,
    link: Vec<(LinkWatcher, bool)>,
}

impl After {
    fn wake_once(&mut self, q: &Arc<RxQueue>) {
        let queued = |x: &Arc<RxQueue>| Arc::ptr_eq(x, q);
        if self.wake_inline.iter().flatten().any(queued) || self.wake_more.iter().any(queued) {
            return;
        }
        match self.wake_inline.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(Arc::clone(q)),
            None => self.wake_more.push(Arc::clone(q)),
        }
    }

    fn has_work(&self) -> bool {
        self.wake_inline[0].is_some() || !self.link.is_empty()
    }

    fn run(self) {
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

struct State {
    ports: BTreeMap<PortId, PortSlot>,
    by_name: HashMap<String, PortId>,
    next_id: PortId,
    macs: HashMap<MacAddr, MacEntry>,
    bridge_imp: Impairment,
    pair_imp: BTreeMap<(String, String), Impairment>,
    partitions: BTreeSet<(String, String)>,
    isolated: BTreeSet<String>,
    /// Partitions resolved to attached port ids.
    blocked: HashSet<(PortId, PortId)>,
    any_impairment: bool,
    generation: u64,
    runtime: HashMap<(PortId, PortId), PairRuntime>,
    delay: BinaryHeap<Reverse<Delayed>>,
    delay_bytes: usize,
    seq: u64,
    captures: Vec<Arc<CaptureShared>>,
    stats: SwitchStats,
    closed: bool,
    /// The wire packets of the frame being forwarded, reused frame to frame.
    wire: Segments,
}

pub(crate) struct Inner {
    name: String,
    run_seed: u64,
    seed: u64,
    config: SwitchConfig,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    timer_cv: Condvar,
}

/// One bridge's switch. Dropping it stops the timer thread and closes every
/// port's receive queue; port handles then report [`SendError::Detached`].
pub struct Switch {
    inner: Arc<Inner>,
    timer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switch")
            .field("name", &self.inner.name)
            .field("seed", &self.inner.seed)
            .finish()
    }
}

impl Switch {
    /// A switch on the system clock with a timer thread.
    pub fn new(name: &str, config: SwitchConfig) -> Switch {
        Switch::with_clock(name, config, Arc::new(SystemClock::new()), Timer::Thread)
    }

    /// A switch on `clock`. With [`Timer::Manual`] nothing runs in the
    /// background: call [`Switch::release_due`] after moving the clock.
    pub fn with_clock(
        name: &str,
        config: SwitchConfig,
        clock: Arc<dyn Clock>,
        timer: Timer,
    ) -> Switch {
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            run_seed: config.run_seed,
            seed: bridge_seed(config.run_seed, name),
            config,
            clock,
            state: Mutex::new(State {
                ports: BTreeMap::new(),
                by_name: HashMap::new(),
                next_id: 1,
                macs: HashMap::new(),
                bridge_imp: Impairment::default(),
                pair_imp: BTreeMap::new(),
                partitions: BTreeSet::new(),
                isolated: BTreeSet::new(),
                blocked: HashSet::new(),
                any_impairment: false,
                generation: 0,
                runtime: HashMap::new(),
                delay: BinaryHeap::new(),
                delay_bytes: 0,
                seq: 0,
                captures: Vec::new(),
                stats: SwitchStats::default(),
                closed: false,
                wire: Segments::new(),
            }),
            timer_cv: Condvar::new(),
        });
        let timer = match timer {
            Timer::Manual => None,
            Timer::Thread => {
                let inner = Arc::clone(&inner);
                Some(
                    std::thread::Builder::new()
                        .name(format!("switch-{}", inner.name))
                        .spawn(move || inner.timer_loop())
                        .expect("spawning the switch timer thread"),
                )
            }
        };
        Switch { inner, timer }
    }

    /// The bridge name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The run seed this switch was configured with.
    pub fn run_seed(&self) -> u64 {
        self.inner.run_seed
    }

    /// The bridge seed (derived from the run seed and the name) that every
    /// pair's drop stream derives from.
    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// Attaches an in-process port named `name` (the VM name) with `mac`.
    pub fn attach(&self, name: &str, mac: MacAddr) -> Result<Port, SwitchError> {
        let inner = &self.inner;
        let rx = Arc::new(RxQueue::new(
            inner.config.rx_queue_frames,
            inner.config.rx_queue_bytes,
        ));
        let mut st = inner.lock();
        if st.by_name.contains_key(name) {
            return Err(SwitchError::NameTaken {
                bridge: inner.name.clone(),
                port: name.to_owned(),
            });
        }
        let id = st.next_id;
        st.next_id += 1;
        let link_up = !st.closed;
        st.ports.insert(
            id,
            PortSlot {
                name: name.to_owned(),
                mac,
                link_up,
                isolated: false,
                counters: PortCounters::default(),
                rx: Arc::clone(&rx),
                link_watcher: None,
                learned: VecDeque::new(),
                offloads: Offloads::default(),
            },
        );
        st.by_name.insert(name.to_owned(), id);
        st.recompute();
        Ok(Port {
            inner: Arc::clone(inner),
            id,
            name: name.to_owned(),
            mac,
            rx,
        })
    }

    /// Detaches the port named `name` (its handle then reports
    /// [`SendError::Detached`]). Declared partitions and impairments that
    /// name it stay declared, so a re-attached port gets them again.
    pub fn detach(&self, name: &str) -> Result<(), SwitchError> {
        let id = self.inner.port_id(name)?;
        self.inner.detach_id(id);
        Ok(())
    }

    /// Attached port names, in attach order.
    pub fn members(&self) -> Vec<String> {
        self.inner
            .lock()
            .ports
            .values()
            .map(|p| p.name.clone())
            .collect()
    }

    /// The MAC a port was attached with.
    pub fn port_mac(&self, name: &str) -> Result<MacAddr, SwitchError> {
        let st = self.inner.lock();
        st.by_name
            .get(name)
            .and_then(|id| st.ports.get(id))
            .map(|p| p.mac)
            .ok_or_else(|| self.inner.no_port(name))
    }

    /// The port currently learned for `mac`, if any and not aged out.
    pub fn lookup_mac(&self, mac: MacAddr) -> Option<String> {
        let now = self.inner.clock.now();
        let st = self.inner.lock();
        let e = st.macs.get(&mac)?;
        if now.saturating_sub(e.last_seen) >= self.inner.config.mac_ageing {
            return None;
        }
        st.ports.get(&e.port).map(|p| p.name.clone())
    }

    // ---- partitions ----

    /// Symmetric partition: drops a→b and b→a. Names need not be attached yet.
    pub fn partition(&self, a: &str, b: &str) {
        self.inner.update(|st| {
            st.partitions.insert((a.to_owned(), b.to_owned()));
            st.partitions.insert((b.to_owned(), a.to_owned()));
        });
    }

    /// Directional partition: drops only from→to. Both ports must be
    /// attached (otherwise the rule would silently wait for them).
    pub fn partition_directional(&self, from: &str, to: &str) -> Result<(), SwitchError> {
        self.inner.port_id(from)?;
        self.inner.port_id(to)?;
        self.inner.update(|st| {
            st.partitions.insert((from.to_owned(), to.to_owned()));
        });
        Ok(())
    }

    /// Lifts a→b and b→a (a no-op for pairs not partitioned).
    pub fn unpartition(&self, a: &str, b: &str) {
        self.inner.update(|st| {
            st.partitions.remove(&(a.to_owned(), b.to_owned()));
            st.partitions.remove(&(b.to_owned(), a.to_owned()));
        });
    }

    /// Lifts only from→to; a no-op when absent or the ports are gone.
    pub fn unpartition_directional(&self, from: &str, to: &str) {
        self.inner.update(|st| {
            st.partitions.remove(&(from.to_owned(), to.to_owned()));
        });
    }

    /// Partitions every ordered pair of currently attached ports.
    pub fn partition_all(&self) {
        self.inner.update(|st| {
            let names: Vec<String> = st.ports.values().map(|p| p.name.clone()).collect();
            for a in &names {
                for b in &names {
                    if a != b {
                        st.partitions.insert((a.clone(), b.clone()));
                    }
                }
            }
        });
    }

    /// Lifts every partition.
    pub fn restore_all(&self) {
        self.inner.update(|st| st.partitions.clear());
    }

    /// True when frames from `a` to `b` are partitioned (symmetric, or
    /// directional from a to b).
    pub fn is_partitioned(&self, a: &str, b: &str) -> bool {
        self.inner
            .lock()
            .partitions
            .contains(&(a.to_owned(), b.to_owned()))
    }

    /// Every partitioned (from, to) pair, sorted.
    pub fn partitions(&self) -> Vec<(String, String)> {
        self.inner.lock().partitions.iter().cloned().collect()
    }

    // ---- isolation ----

    /// Isolates `name`: it reaches nobody and nobody reaches it. Survives
    /// [`Switch::reset`]. Names need not be attached yet.
    pub fn isolate(&self, name: &str) {
        self.inner.update(|st| {
            st.isolated.insert(name.to_owned());
        });
    }

    /// Lifts isolation of `name`.
    pub fn unisolate(&self, name: &str) {
        self.inner.update(|st| {
            st.isolated.remove(name);
        });
    }

    /// True when `name` is isolated.
    pub fn is_isolated(&self, name: &str) -> bool {
        self.inner.lock().isolated.contains(name)
    }

    /// Isolated names, sorted.
    pub fn isolated(&self) -> Vec<String> {
        self.inner.lock().isolated.iter().cloned().collect()
    }

    // ---- impairments ----

    /// Whole-bridge one-way latency (zero clears).
    pub fn set_latency(&self, latency: Duration) {
        self.inner
            .update(|st| st.bridge_imp.latency = Some(latency).filter(|d| !d.is_zero()));
    }

    /// Whole-bridge drop rate in percent (0 clears).
    pub fn set_drop_rate(&self, pct: f64) -> Result<(), SwitchError> {
        let pct = check_drop_pct(pct).map_err(|e| self.inner.imp_err(e))?;
        self.inner
            .update(|st| st.bridge_imp.drop_pct = Some(pct).filter(|p| *p > 0.0));
        Ok(())
    }

    /// Whole-bridge bandwidth in bits per second (0 clears).
    pub fn set_bandwidth(&self, bps: u64) {
        self.inner
            .update(|st| st.bridge_imp.bandwidth_bps = Some(bps).filter(|b| *b > 0));
    }

    /// Latency for frames from→to only (zero clears).
    pub fn set_pair_latency(&self, from: &str, to: &str, latency: Duration) {
        self.inner.update_pair(from, to, |i| {
            i.latency = Some(latency).filter(|d| !d.is_zero())
        });
    }

    /// Drop rate in percent for frames from→to only (0 clears).
    pub fn set_pair_drop_rate(&self, from: &str, to: &str, pct: f64) -> Result<(), SwitchError> {
        let pct = check_drop_pct(pct).map_err(|e| self.inner.imp_err(e))?;
        self.inner
            .update_pair(from, to, |i| i.drop_pct = Some(pct).filter(|p| *p > 0.0));
        Ok(())
    }

    /// Bandwidth in bits per second for frames from→to only (0 clears).
    pub fn set_pair_bandwidth(&self, from: &str, to: &str, bps: u64) {
        self.inner
            .update_pair(from, to, |i| i.bandwidth_bps = Some(bps).filter(|b| *b > 0));
    }

    /// The whole-bridge latency, if set.
    pub fn latency(&self) -> Option<Duration> {
        self.inner.lock().bridge_imp.latency
    }

    /// The whole-bridge drop rate in percent, if set.
    pub fn drop_rate_pct(&self) -> Option<f64> {
        self.inner.lock().bridge_imp.drop_pct
    }

    /// The whole-bridge bandwidth cap in bits per second, if set.
    pub fn bandwidth_bps(&self) -> Option<u64> {
        self.inner.lock().bridge_imp.bandwidth_bps
    }

    /// What is declared for from→to (not combined with the whole bridge).
    pub fn pair_impairment(&self, from: &str, to: &str) -> Impairment {
        self.inner
            .lock()
            .pair_imp
            .get(&(from.to_owned(), to.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// Every declared pair impairment, sorted by (from, to).
    pub fn pair_impairments(&self) -> Vec<((String, String), Impairment)> {
        self.inner
            .lock()
            .pair_imp
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Lifts every impairment (whole-bridge and per pair) and every
    /// partition; keeps isolation, ports and links. Frames waiting in the
    /// delay queue are delivered now, in release order.
    pub fn reset(&self) {
        let now = self.inner.clock.now();
        let mut after = After::default();
        {
            let mut st = self.inner.lock();
            st.bridge_imp = Impairment::default();
            st.pair_imp.clear();
            st.partitions.clear();
            st.runtime.clear();
            st.recompute();
            while let Some(Reverse(d)) = st.delay.pop() {
                st.delay_bytes -= d.frame.len();
                st.deliver(
                    &self.inner,
                    d.to,
                    VnetHdr::default(),
                    &d.frame,
                    now,
                    &mut after,
                );
            }
        }
        after.run();
    }

    // ---- links and counters ----

    /// Takes `name`'s link down: frames from and to it are dropped (and
    /// counted on the port), its queued frames and learned MACs are
    /// discarded, and its link watcher is told `false`.
    pub fn disconnect(&self, name: &str) -> Result<(), SwitchError> {
        self.inner.set_link(name, false)
    }

    /// Brings `name`'s link back up and tells its link watcher `true`.
    pub fn reconnect(&self, name: &str) -> Result<(), SwitchError> {
        self.inner.set_link(name, true)
    }

    /// True when `name`'s link is up.
    pub fn is_connected(&self, name: &str) -> Result<bool, SwitchError> {
        let st = self.inner.lock();
        st.by_name
            .get(name)
            .and_then(|id| st.ports.get(id))
            .map(|p| p.link_up)
            .ok_or_else(|| self.inner.no_port(name))
    }

    /// `name`'s counters (guest's perspective).
    pub fn counters(&self, name: &str) -> Result<PortCounters, SwitchError> {
        let st = self.inner.lock();
        st.by_name
            .get(name)
            .and_then(|id| st.ports.get(id))
            .map(|p| p.counters)
            .ok_or_else(|| self.inner.no_port(name))
    }

    /// Switch-wide counters.
    pub fn stats(&self) -> SwitchStats {
        self.inner.lock().stats
    }

    // ---- captures ----

    /// A bridge-wide capture labelled `label` (e.g. the test's call site).
    pub fn capture(&self, label: &str) -> Capture {
        self.inner.add_capture(label, CaptureScope::Bridge)
    }

    /// A capture of one port's traffic, both directions.
    pub fn capture_port(&self, name: &str, label: &str) -> Result<Capture, SwitchError> {
        self.inner.port_id(name)?;
        Ok(self
            .inner
            .add_capture(label, CaptureScope::Port(name.to_owned())))
    }

    /// Labels of live captures; a snapshot must refuse while this is non-empty.
    pub fn live_captures(&self) -> Vec<String> {
        let mut st = self.inner.lock();
        st.captures.retain(|c| !c.is_closed());
        st.captures.iter().map(|c| c.label().to_owned()).collect()
    }

    // ---- the delay queue ----

    /// Delivers every delayed frame whose release time has come; returns how
    /// many were handed over (delivered or dropped at the destination).
    pub fn release_due(&self) -> usize {
        let now = self.inner.clock.now();
        let mut after = After::default();
        let n = self.inner.lock().release_due(&self.inner, now, &mut after);
        after.run();
        n
    }

    /// The earliest pending release time, if any frame is delayed.
    pub fn next_release(&self) -> Option<Duration> {
        self.inner.lock().delay.peek().map(|d| d.0.release)
    }

    /// Frames waiting in the delay queue.
    pub fn delayed_frames(&self) -> usize {
        self.inner.lock().delay.len()
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        {
            let mut st = self.inner.lock();
            st.closed = true;
            for p in st.ports.values() {
                p.rx.close();
            }
        }
        self.inner.timer_cv.notify_all();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // State stays consistent between statements; recover from a poisoned
        // lock rather than take the whole run down.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn no_port(&self, name: &str) -> SwitchError {
        SwitchError::NoSuchPort {
            bridge: self.name.clone(),
            port: name.to_owned(),
        }
    }

    fn imp_err(&self, source: ImpairError) -> SwitchError {
        SwitchError::Impairment {
            bridge: self.name.clone(),
            source,
        }
    }

    fn port_id(&self, name: &str) -> Result<PortId, SwitchError> {
        self.lock()
            .by_name
            .get(name)
            .copied()
            .ok_or_else(|| self.no_port(name))
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut st = self.lock();
        f(&mut st);
        st.recompute();
    }

    fn update_pair(&self, from: &str, to: &str, f: impl FnOnce(&mut Impairment)) {
        self.update(|st| {
            let key = (from.to_owned(), to.to_owned());
            let e = st.pair_imp.entry(key.clone()).or_default();
            f(e);
            if e.is_clear() {
                st.pair_imp.remove(&key);
            }
        });
    }

    pub(crate) fn detach_id(&self, id: PortId) {
        let mut st = self.lock();
        if let Some(slot) = st.ports.remove(&id) {
            slot.rx.close();
            st.by_name.remove(&slot.name);
            for m in &slot.learned {
                if st.macs.get(m).is_some_and(|e| e.port == id) {
                    st.macs.remove(m);
                }
            }
            st.runtime.retain(|(a, b), _| *a != id && *b != id);
            st.recompute();
        }
    }

    fn set_link(&self, name: &str, up: bool) -> Result<(), SwitchError> {
        let mut after = After::default();
        {
            let mut st = self.lock();
            let id = *st.by_name.get(name).ok_or_else(|| self.no_port(name))?;
            let st = &mut *st;
            let Some(slot) = st.ports.get_mut(&id) else {
                return Err(self.no_port(name));
            };
            if slot.link_up != up {
                slot.link_up = up;
                if !up {
                    let n = slot.rx.clear();
                    slot.counters.rx_dropped += n as u64;
                    for m in std::mem::take(&mut slot.learned) {
                        if st.macs.get(&m).is_some_and(|e| e.port == id) {
                            st.macs.remove(&m);
                        }
                    }
                }
                if let Some(w) = &slot.link_watcher {
                    after.link.push((Arc::clone(w), up));
                }
            }
        }
        after.run();
        Ok(())
    }

    fn add_capture(&self, label: &str, scope: CaptureScope) -> Capture {
        let cap = Capture::new(label.to_owned(), scope, self.config.capture_buffer_bytes);
        let mut st = self.lock();
        st.captures.retain(|c| !c.is_closed());
        st.captures.push(cap.shared());
        cap
    }

    fn send(&self, id: PortId, hdr: VnetHdr, frame: &[u8]) -> Result<(), SendError> {
        let now = self.clock.now();
        let mut after = After::default();
        let r = self.lock().forward(self, id, hdr, frame, now, &mut after);
        after.run();
        r
    }

    /// Forwards a batch under one lock, waking each destination once.
    fn send_batch<'a>(
        &self,
        id: PortId,
        frames: impl IntoIterator<Item = (VnetHdr, &'a [u8])>,
    ) -> usize {
        let now = self.clock.now();
        let mut after = After::default();
        let mut ok = 0;
        {
            let mut st = self.lock();
            for (hdr, frame) in frames {
                if st.forward(self, id, hdr, frame, now, &mut after).is_ok() {
                    ok += 1;
                }
            }
        }
        after.run();
        ok
    }

    fn timer_loop(&self) {
        let mut st = self.lock();
        loop {
            if st.closed {
                return;
            }
            let now = self.clock.now();
            let mut after = After::default();
            st.release_due(self, now, &mut after);
            if after.has_work() {
                drop(st);
                after.run();
                st = self.lock();
                continue;
            }
            st = match st.delay.peek().map(|d| d.0.release) {
                Some(release) => {
                    self.timer_cv
                        .wait_timeout(st, release.saturating_sub(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.timer_cv.wait(st).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

impl State {
    /// Re-derives caches (isolation flags, partitions by id) after any
    /// change to declared state or membership.
    fn recompute(&mut self) {
        for p in self.ports.values_mut() {
            p.isolated = self.isolated.contains(&p.name);
        }
        self.blocked.clear();
        for (a, b) in &self.partitions {
            if let (Some(x), Some(y)) = (self.by_name.get(a), self.by_name.get(b)) {
                self.blocked.insert((*x, *y));
            }
        }
        self.any_impairment = !self.bridge_imp.is_clear() || !self.pair_imp.is_empty();
        self.generation += 1;
    }

    fn forward(
        &mut self,
        inner: &Inner,
        from: PortId,
        hdr: VnetHdr,
        frame: &[u8],
        now: Duration,
        after: &mut After,
    ) -> Result<(), SendError> {
        if self.closed {
            return Err(SendError::Detached);
        }
        let Some(slot) = self.ports.get_mut(&from) else {
            return Err(SendError::Detached);
        };
        if !slot.link_up {
            slot.counters.tx_dropped += 1;
            self.stats.dropped_link_down += 1;
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
        let err = err.or_else(|| match OffloadMeta::parse(hdr, frame) {
            Ok(_) => None,
            Err(e) => {
                slot.counters.offload_errors += 1;
                Some(SendError::BadOffload(e))
            }
        });
        if let Some(e) = err {
            slot.counters.tx_dropped += 1;
            slot.counters.errors += 1;
            self.stats.dropped_invalid += 1;
            return Err(e);
        }
        let meta = OffloadMeta::parse(hdr, frame).unwrap_or(OffloadMeta::NONE);
        let (Some(src), Some(dst)) = (src_mac(frame), dst_mac(frame)) else {
            return Err(SendError::Runt(frame.len()));
        };
        slot.counters.tx_packets += 1;
        slot.counters.tx_bytes += frame.len() as u64;
        self.stats.frames_in += 1;
        // The wire packets, cut at most once per frame and only when some
        // capture or destination needs them.
        let mut wire = std::mem::take(&mut self.wire);
        let mut cut = false;
        if !self.captures.is_empty() {
            let ts = inner.clock.unix_origin() + now;
            let name = &slot.name;
            for c in &self.captures {
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
                if !cut {
                    segment(&meta, frame, &mut wire);
                    cut = true;
                }
                for seg in wire.iter() {
                    c.record(ts, seg);
                }
            }
        }
        self.learn(inner, src, from, now);

        let target = if dst.is_multicast() {
            None
        } else {
            match self.macs.get(&dst) {
                Some(e) if now.saturating_sub(e.last_seen) < inner.config.mac_ageing => {
                    Some(e.port)
                }
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
            Some(to) if to == from => self.stats.dropped_hairpin += 1,
            Some(to) => self.egress(inner, from, to, &mut pkt, now, after),
            None => {
                self.stats.flooded += 1;
                // The other ports in id order, without collecting them.
                let mut prev = 0;
                while let Some(to) = self
                    .ports
                    .range(prev + 1..)
                    .map(|(k, _)| *k)
                    .find(|k| *k != from)
                {
                    self.egress(inner, from, to, &mut pkt, now, after);
                    prev = to;
                }
            }
        }
        if pkt.cut && meta.needs_work() {
            self.stats.segmented += 1;
            self.stats.segments += pkt.wire.len() as u64;
        }
        self.wire = wire;
        Ok(())
    }

    fn learn(&mut self, inner: &Inner, mac: MacAddr, port: PortId, now: Duration) {
        let prev = match self.macs.get_mut(&mac) {
            Some(e) if e.port == port => {
                e.last_seen = now;
                return;
            }
            Some(e) => {
                let old = e.port;
                e.port = port;
                e.last_seen = now;
                Some(old)
            }
            None => {
                self.macs.insert(
                    mac,
                    MacEntry {
                        port,
                        last_seen: now,
                    },
                );
                None
            }
        };
        if let Some(old) = prev.and_then(|o| self.ports.get_mut(&o)) {
            old.learned.retain(|m| *m != mac);
        }
        let cap = inner.config.mac_entries_per_port.max(1);
        let Some(slot) = self.ports.get_mut(&port) else {
            return;
        };
        slot.learned.push_back(mac);
        while slot.learned.len() > cap {
            if let Some(evicted) = slot.learned.pop_front() {
                if self.macs.get(&evicted).is_some_and(|e| e.port == port) {
                    self.macs.remove(&evicted);
                }
                self.stats.mac_evictions += 1;
            }
        }
    }

    fn egress(
        &mut self,
        inner: &Inner,
        from: PortId,
        to: PortId,
        pkt: &mut Packet<'_>,
        now: Duration,
        after: &mut After,
    ) {
        let (Some(f), Some(t)) = (self.ports.get(&from), self.ports.get(&to)) else {
            return;
        };
        if f.isolated || t.isolated {
            self.stats.dropped_isolated += 1;
            return;
        }
        if self.blocked.contains(&(from, to)) {
            self.stats.dropped_partition += 1;
            return;
        }
        if !t.link_up {
            self.stats.dropped_link_down += 1;
            if let Some(t) = self.ports.get_mut(&to) {
                t.counters.rx_dropped += 1;
            }
            return;
        }
        let t_offloads = t.offloads;
        let t_captured = self
            .captures
            .iter()
            .any(|c| matches!(c.scope(), CaptureScope::Port(p) if *p == t.name));
        let impaired = self.any_impairment && self.refresh_pair(inner, from, to, now);
        let meta = pkt.meta;
        if !meta.needs_work() {
            if impaired {
                self.impair(inner, from, to, pkt.frame, now, after);
            } else {
                self.deliver(inner, to, meta.hdr, pkt.frame, now, after);
            }
            return;
        }
        // An offloaded frame goes whole only where nothing needs to see its
        // wire packets: the port takes the offload, the pair is unimpaired
        // (drops and bandwidth act per wire packet) and no capture of the
        // port is open (captures show wire packets).
        let whole = !impaired && t_offloads.accepts(meta.work) && !t_captured;
        if whole {
            self.stats.offloaded += 1;
            self.deliver(inner, to, meta.hdr, pkt.frame, now, after);
            return;
        }
        if !pkt.cut {
            segment(meta, pkt.frame, pkt.wire);
            pkt.cut = true;
        }
        for seg in pkt.wire.iter() {
            if impaired {
                self.impair(inner, from, to, seg, now, after);
            } else {
                self.deliver(inner, to, VnetHdr::default(), seg, now, after);
            }
        }
    }

    /// Brings the pair's runtime (drop stream, token bucket) up to date with
    /// the declared impairments; true when the pair is impaired.
    fn refresh_pair(&mut self, inner: &Inner, from: PortId, to: PortId, now: Duration) -> bool {
        let generation = self.generation;
        let needs = self
            .runtime
            .get(&(from, to))
            .is_none_or(|r| r.generation != generation);
        if needs {
            let (Some(f), Some(t)) = (self.ports.get(&from), self.ports.get(&to)) else {
                return false;
            };
            let key = (f.name.clone(), t.name.clone());
            let eff = Effective::combine(&self.bridge_imp, self.pair_imp.get(&key));
            let burst = |bps: u64| {
                inner
                    .config
                    .bandwidth_burst_bits
                    .unwrap_or_else(|| TokenBucket::default_burst_bits(bps))
            };
            let rt = self
                .runtime
                .entry((from, to))
                .or_insert_with(|| PairRuntime {
                    generation,
                    eff,
                    bucket: None,
                    rng: DropRng::for_pair(inner.seed, &key.0, &key.1),
                });
            rt.generation = generation;
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
        self.runtime
            .get(&(from, to))
            .is_some_and(|rt| !rt.eff.is_clear())
    }

    /// One wire packet over an impaired pair: the seeded drop draw, the
    /// token bucket (charged the packet's bytes, headers included), then the
    /// latency.
    fn impair(
        &mut self,
        inner: &Inner,
        from: PortId,
        to: PortId,
        frame: &[u8],
        now: Duration,
        after: &mut After,
    ) {
        let Some(rt) = self.runtime.get_mut(&(from, to)) else {
            return;
        };
        if rt.rng.drop_frame(&rt.eff) {
            self.stats.dropped_impairment += 1;
            return;
        }
        let depart = match &mut rt.bucket {
            Some(b) => b.schedule(now, frame.len()),
            None => now,
        };
        let release = depart + rt.eff.latency;
        if release <= now {
            self.deliver(inner, to, VnetHdr::default(), frame, now, after);
            return;
        }
        if self.delay_bytes.saturating_add(frame.len()) > inner.config.delay_queue_bytes {
            self.stats.dropped_delay_queue_full += 1;
            return;
        }
        self.delay_bytes += frame.len();
        self.seq += 1;
        self.stats.delayed += 1;
        let was_first = self.delay.peek().is_none_or(|d| release < d.0.release);
        self.delay.push(Reverse(Delayed {
            release,
            seq: self.seq,
            to,
            frame: frame.to_vec(),
        }));
        if was_first {
            inner.timer_cv.notify_all();
        }
    }

    /// Queues a copy of `frame` (with `hdr`, the offload it still carries)
    /// for `to`, timestamped `at` in captures.
    fn deliver(
        &mut self,
        inner: &Inner,
        to: PortId,
        hdr: VnetHdr,
        frame: &[u8],
        at: Duration,
        after: &mut After,
    ) {
        let Some(slot) = self.ports.get_mut(&to) else {
            return;
        };
        if !slot.link_up {
            slot.counters.rx_dropped += 1;
            self.stats.dropped_link_down += 1;
            return;
        }
        if !self.captures.is_empty() {
            let ts = inner.clock.unix_origin() + at;
            for c in &self.captures {
                if matches!(c.scope(), CaptureScope::Port(p) if *p == slot.name) {
                    c.record(ts, frame);
                }
            }
        }
        let len = frame.len() as u64;
        if slot.rx.push(hdr, frame) {
            slot.counters.rx_packets += 1;
            slot.counters.rx_bytes += len;
            self.stats.delivered += 1;
            after.wake_once(&slot.rx);
        } else {
            slot.counters.rx_dropped += 1;
            self.stats.dropped_rx_queue_full += 1;
        }
    }

    fn release_due(&mut self, inner: &Inner, now: Duration, after: &mut After) -> usize {
        let mut n = 0;
        while self.delay.peek().is_some_and(|d| d.0.release <= now) {
            let Some(Reverse(d)) = self.delay.pop() else {
                break;
            };
            self.delay_bytes -= d.frame.len();
            self.deliver(inner, d.to, VnetHdr::default(), &d.frame, d.release, after);
            n += 1;
        }
        n
    }
}

/// An in-process switch port: the VMM's virtio-net backend, or a test's
/// endpoint. Dropping it detaches it.
pub struct Port {
    inner: Arc<Inner>,
    id: PortId,
    name: String,
    mac: MacAddr,
    rx: Arc<RxQueue>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("bridge", &self.inner.name)
            .field("name", &self.name)
            .field("mac", &self.mac)
            .finish()
    }
}

impl Port {
    /// The port's name (the VM name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The MAC the port was attached with (the guest NIC's address).
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// The bridge this port is on.
    pub fn bridge(&self) -> &str {
        &self.inner.name
    }

    /// Hands a frame the guest transmitted to the switch. The frame is
    /// untrusted: malformed or oversized frames are refused and counted, and
    /// nothing the guest sends allocates beyond the switch's bounds.
    pub fn send(&self, frame: &[u8]) -> Result<(), SendError> {
        self.inner.send(self.id, VnetHdr::default(), frame)
    }

    /// Hands over a frame with its virtio-net offload header (a guest NIC
    /// with CSUM/HOST_TSO negotiated, a TAP with `IFF_VNET_HDR`). The header
    /// is untrusted: an invalid one refuses the frame
    /// ([`SendError::BadOffload`], counted in `offload_errors`).
    pub fn send_offload(&self, hdr: VnetHdr, frame: &[u8]) -> Result<(), SendError> {
        self.inner.send(self.id, hdr, frame)
    }

    /// Hands over several frames under one switch lock; each destination is
    /// woken once for the batch. Returns how many were accepted (refusals
    /// are counted as for [`Port::send`]).
    pub fn send_batch<'a>(&self, frames: impl IntoIterator<Item = (VnetHdr, &'a [u8])>) -> usize {
        self.inner.send_batch(self.id, frames)
    }

    /// Declares what this port takes whole (a guest's negotiated features,
    /// a TAP's offloads). Frames it cannot take reach it as wire packets,
    /// checksums filled. Ports start with none.
    pub fn set_offloads(&self, offloads: Offloads) {
        if let Some(slot) = self.inner.lock().ports.get_mut(&self.id) {
            slot.offloads = offloads;
        }
    }

    /// What this port takes whole ([`Port::set_offloads`]).
    pub fn offloads(&self) -> Offloads {
        self.inner
            .lock()
            .ports
            .get(&self.id)
            .map(|p| p.offloads)
            .unwrap_or_default()
    }

    /// The next frame for the guest, without waiting. A port with offloads
    /// set reads with [`Port::try_recv_offload`] instead, or loses headers.
    pub fn try_recv(&self) -> Option<Vec<u8>> {
        self.rx.try_pop().map(|f| f.1)
    }

    /// The next frame with the offload header it still carries (all zero
    /// unless [`Port::set_offloads`] allowed it), without waiting.
    pub fn try_recv_offload(&self) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.try_pop()
    }

    /// The next frame for the guest, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Vec<u8>> {
        self.rx.pop_timeout(timeout).map(|f| f.1)
    }

    /// [`Port::recv_timeout`] with the offload header.
    pub fn recv_offload_timeout(&self, timeout: Duration) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.pop_timeout(timeout)
    }

    /// The next frame, waiting as long as it takes; `None` once the port is
    /// detached (or the switch dropped) and its queue drained.
    pub fn recv(&self) -> Option<Vec<u8>> {
        self.rx.pop_until(None).map(|f| f.1)
    }

    /// [`Port::recv`] with the offload header.
    pub fn recv_offload(&self) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.pop_until(None)
    }

    /// Gives a received frame's buffer back for reuse, so that steady-state
    /// forwarding allocates nothing.
    pub fn recycle(&self, buf: Vec<u8>) {
        self.rx.recycle(buf);
    }

    /// Frames waiting for the guest.
    pub fn pending(&self) -> usize {
        self.rx.len()
    }

    /// Installs the callback run after frames are queued for this port.
    pub fn set_rx_waker(&self, waker: Option<RxWaker>) {
        self.rx.set_waker(waker);
    }

    /// Installs the callback told about link changes ([`Switch::disconnect`]).
    pub fn set_link_watcher(&self, watcher: Option<LinkWatcher>) {
        if let Some(slot) = self.inner.lock().ports.get_mut(&self.id) {
            slot.link_watcher = watcher;
        }
    }

    /// True while the port is attached and its link is up.
    pub fn is_link_up(&self) -> bool {
        self.inner
            .lock()
            .ports
            .get(&self.id)
            .is_some_and(|p| p.link_up)
    }

    /// This port's counters (zeros once detached).
    pub fn counters(&self) -> PortCounters {
        self.inner
            .lock()
            .ports
            .get(&self.id)
            .map(|p| p.counters)
            .unwrap_or_default()
    }

    /// Detaches now (idempotent; drop does the same).
    pub fn detach(&self) {
        self.inner.detach_id(self.id);
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.inner.detach_id(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn frame(dst: MacAddr, src: MacAddr, tag: u8) -> Vec<u8> {
        let mut f = Vec::with_capacity(60);
        f.extend_from_slice(&dst.0);
        f.extend_from_slice(&src.0);
        f.extend_from_slice(&[0x88, 0xb5]);
        f.resize(60, tag);
        f
    }

    fn manual() -> (Switch, Arc<ManualClock>) {
        let c = Arc::new(ManualClock::new());
        (
            Switch::with_clock("lan", SwitchConfig::default(), c.clone(), Timer::Manual),
            c,
        )
    }

    #[test]
    fn attach_names_are_unique_and_members_ordered() {
        let (sw, _) = manual();
        let _b = sw.attach("b", MacAddr::local(2)).unwrap();
        let _a = sw.attach("a", MacAddr::local(1)).unwrap();
        assert_eq!(sw.members(), ["b", "a"]);
        assert!(matches!(
            sw.attach("a", MacAddr::local(3)),
            Err(SwitchError::NameTaken { .. })
        ));
        assert_eq!(sw.port_mac("a").unwrap(), MacAddr::local(1));
    }

    #[test]
    fn drop_of_port_detaches() {
        let (sw, _) = manual();
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        drop(a);
        assert!(sw.members().is_empty());
        assert!(sw.attach("a", MacAddr::local(1)).is_ok());
    }

    #[test]
    fn hairpin_unicast_dropped() {
        let (sw, _) = manual();
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        let b = sw.attach("b", MacAddr::local(2)).unwrap();
        a.send(&frame(MacAddr::BROADCAST, MacAddr::local(1), 0))
            .unwrap();
        a.send(&frame(MacAddr::local(1), MacAddr::local(1), 1))
            .unwrap();
        assert_eq!(sw.stats().dropped_hairpin, 1);
        assert_eq!(b.pending(), 1);
    }

    #[test]
    fn switch_drop_closes_ports() {
        let (sw, _) = manual();
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        drop(sw);
        assert_eq!(a.recv(), None);
        assert_eq!(
            a.send(&frame(MacAddr::BROADCAST, MacAddr::local(1), 0)),
            Err(SendError::Detached)
        );
    }
}
