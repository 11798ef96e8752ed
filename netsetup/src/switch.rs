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
//! # Threading: no lock shared by all ports on the forwarding path
//! Forwarding runs synchronously in the sender's thread. It reads an
//! immutable [`Topology`] snapshot (ports, partitions, isolation, declared
//! impairments, captures, the MAC table) that every control-plane change
//! (attach, detach, partition, impair, link, capture, a newly learned MAC)
//! rebuilds under the control mutex and publishes with a generation number.
//! Each [`Port`] caches the snapshot in its own sender state, together with
//! its pairs' runtime (drop streams, token buckets) and its segmentation
//! scratch, so a steady-state frame takes only its own port's sender lock and
//! its destination's receive-queue lock; it touches the shared publication
//! lock only once after each control change. Counters are atomics. Refreshing
//! a known MAC is an atomic store; only a new or moved MAC takes the control
//! mutex. Two things are still switch-wide, and only for the traffic that
//! asks for them: the delay queue (frames of pairs with latency or a
//! bandwidth backlog) and a bridge-wide capture's buffer.
//!
//! Callbacks (RX wakers, link watchers) run after the locks are released.
//! With [`Timer::Thread`] one thread sleeps on a condition variable until the
//! earliest release time.
//!
//! # Counters
//! Per-port counters are from the guest's perspective: `tx_*` is what the
//! guest sent into the switch, `rx_*` what the switch queued for the guest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use crate::port::{DirectWriter, LinkWatcher, RxQueue, RxWaker};

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

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// A struct of atomics mirroring a plain counter struct field for field,
/// with `read()` giving the plain one.
macro_rules! counter_cells {
    ($(#[$doc:meta])* $cells:ident => $plain:ident { $($field:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Default)]
        struct $cells {
            $($field: AtomicU64,)*
        }

        impl $cells {
            fn read(&self) -> $plain {
                $plain {
                    $($field: load(&self.$field),)*
                }
            }
        }
    };
}

counter_cells!(
    /// [`PortCounters`] as atomics, so that senders on different ports count
    /// into a shared destination without a lock.
    PortCounterCells => PortCounters {
        rx_packets, rx_bytes, tx_packets, tx_bytes, rx_dropped, tx_dropped, errors,
        offload_errors,
    }
);

counter_cells!(
    /// [`SwitchStats`] as atomics.
    SwitchStatCells => SwitchStats {
        frames_in, flooded, delivered, delayed, dropped_invalid, dropped_link_down,
        dropped_isolated, dropped_partition, dropped_impairment, dropped_rx_queue_full,
        dropped_delay_queue_full, dropped_hairpin, mac_evictions, segmented, segments,
        offloaded,
    }
);

/// What the forwarding path needs of one port and may change without a
/// new snapshot: its link state, counters and receive queue.
struct PortShared {
    name: String,
    link_up: AtomicBool,
    counters: PortCounterCells,
    rx: Arc<RxQueue>,
}

/// One port as a snapshot sees it.
struct PortView {
    shared: Arc<PortShared>,
    isolated: bool,
    /// What this port takes without software segmentation.
    offloads: Offloads,
    /// A capture of this port (live or not yet pruned) exists, so offloaded
    /// frames reach it as wire packets.
    captured: bool,
}

struct MacEntry {
    port: PortId,
    /// Nanoseconds on the switch clock; refreshed by the owning port's
    /// frames without a lock.
    last_seen_ns: AtomicU64,
}

impl MacEntry {
    fn new(port: PortId, now: Duration) -> Arc<MacEntry> {
        Arc::new(MacEntry {
            port,
            last_seen_ns: AtomicU64::new(duration_ns(now)),
        })
    }

    fn fresh(&self, now: Duration, ageing: Duration) -> bool {
        let seen = Duration::from_nanos(self.last_seen_ns.load(Ordering::Relaxed));
        now.saturating_sub(seen) < ageing
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// An immutable view of everything the forwarding decision reads; rebuilt
/// and republished by every control-plane change.
struct Topology {
    generation: u64,
    /// Bumped by [`Switch::reset`]: pairs restart their drop streams.
    reset_epoch: u64,
    closed: bool,
    ports: BTreeMap<PortId, PortView>,
    /// Partitions resolved to attached port ids.
    blocked: HashSet<(PortId, PortId)>,
    bridge_imp: Impairment,
    pair_imp: BTreeMap<(String, String), Impairment>,
    any_impairment: bool,
    captures: Vec<Arc<CaptureShared>>,
    macs: HashMap<MacAddr, Arc<MacEntry>>,
}

/// A port as the control plane keeps it.
struct ControlSlot {
    shared: Arc<PortShared>,
    mac: MacAddr,
    offloads: Offloads,
    link_watcher: Option<LinkWatcher>,
    /// MACs learned on this port, oldest first.
    learned: VecDeque<MacAddr>,
}

/// Declared state and membership; only control operations (and the
/// learning of a new MAC) lock it.
struct Control {
    ports: BTreeMap<PortId, ControlSlot>,
    by_name: HashMap<String, PortId>,
    next_id: PortId,
    macs: HashMap<MacAddr, Arc<MacEntry>>,
    bridge_imp: Impairment,
    pair_imp: BTreeMap<(String, String), Impairment>,
    partitions: BTreeSet<(String, String)>,
    isolated: BTreeSet<String>,
    captures: Vec<Arc<CaptureShared>>,
    generation: u64,
    reset_epoch: u64,
    closed: bool,
}

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
struct Sender {
    topo: Arc<Topology>,
    pairs: HashMap<PortId, PairRuntime>,
    wire: Segments,
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

/// Frames held for latency or a bandwidth backlog, whole switch (bounded by
/// [`SwitchConfig::delay_queue_bytes`]).
#[derive(Default)]
struct DelayQueue {
    heap: BinaryHeap<Reverse<Delayed>>,
    bytes: usize,
    seq: u64,
    closed: bool,
}

impl DelayQueue {
    fn pop_due(&mut self, now: Duration) -> Option<Delayed> {
        if self.heap.peek().is_none_or(|d| d.0.release > now) {
            return None;
        }
        let Reverse(d) = self.heap.pop()?;
        self.bytes -= d.frame.len();
        Some(d)
    }
}

/// Receive queues woken after a send without allocating: a unicast or a
/// flood to a few ports.
const WAKE_INLINE: usize = 8;

/// Work to do after the locks are released.
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

pub(crate) struct Inner {
    name: String,
    run_seed: u64,
    seed: u64,
    config: SwitchConfig,
    clock: Arc<dyn Clock>,
    control: Mutex<Control>,
    /// The latest snapshot; read by a port only when `generation` moved.
    published: Mutex<Arc<Topology>>,
    generation: AtomicU64,
    stats: SwitchStatCells,
    delay: Mutex<DelayQueue>,
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
        let control = Control {
            ports: BTreeMap::new(),
            by_name: HashMap::new(),
            next_id: 1,
            macs: HashMap::new(),
            bridge_imp: Impairment::default(),
            pair_imp: BTreeMap::new(),
            partitions: BTreeSet::new(),
            isolated: BTreeSet::new(),
            captures: Vec::new(),
            generation: 0,
            reset_epoch: 0,
            closed: false,
        };
        let first = Arc::new(control.snapshot());
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            run_seed: config.run_seed,
            seed: bridge_seed(config.run_seed, name),
            config,
            clock,
            control: Mutex::new(control),
            published: Mutex::new(first),
            generation: AtomicU64::new(0),
            stats: SwitchStatCells::default(),
            delay: Mutex::new(DelayQueue::default()),
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
        let id = inner.update(|c| {
            if c.by_name.contains_key(name) {
                return Err(SwitchError::NameTaken {
                    bridge: inner.name.clone(),
                    port: name.to_owned(),
                });
            }
            let id = c.next_id;
            c.next_id += 1;
            let shared = Arc::new(PortShared {
                name: name.to_owned(),
                link_up: AtomicBool::new(!c.closed),
                counters: PortCounterCells::default(),
                rx: Arc::clone(&rx),
            });
            c.ports.insert(
                id,
                ControlSlot {
                    shared,
                    mac,
                    offloads: Offloads::default(),
                    link_watcher: None,
                    learned: VecDeque::new(),
                },
            );
            c.by_name.insert(name.to_owned(), id);
            Ok(id)
        })?;
        Ok(Port {
            inner: Arc::clone(inner),
            id,
            name: name.to_owned(),
            mac,
            rx,
            sender: Mutex::new(Sender {
                topo: inner.snapshot(),
                pairs: HashMap::new(),
                wire: Segments::new(),
            }),
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
            .map(|p| p.shared.name.clone())
            .collect()
    }

    /// The MAC a port was attached with.
    pub fn port_mac(&self, name: &str) -> Result<MacAddr, SwitchError> {
        let c = self.inner.lock();
        c.slot(name)
            .map(|p| p.mac)
            .ok_or_else(|| self.inner.no_port(name))
    }

    /// The port currently learned for `mac`, if any and not aged out.
    pub fn lookup_mac(&self, mac: MacAddr) -> Option<String> {
        let now = self.inner.clock.now();
        let c = self.inner.lock();
        let e = c.macs.get(&mac)?;
        if !e.fresh(now, self.inner.config.mac_ageing) {
            return None;
        }
        c.ports.get(&e.port).map(|p| p.shared.name.clone())
    }

    // ---- partitions ----

    /// Symmetric partition: drops a→b and b→a. Names need not be attached yet.
    pub fn partition(&self, a: &str, b: &str) {
        self.inner.update(|c| {
            c.partitions.insert((a.to_owned(), b.to_owned()));
            c.partitions.insert((b.to_owned(), a.to_owned()));
        });
    }

    /// Directional partition: drops only from→to. Both ports must be
    /// attached (otherwise the rule would silently wait for them).
    pub fn partition_directional(&self, from: &str, to: &str) -> Result<(), SwitchError> {
        self.inner.port_id(from)?;
        self.inner.port_id(to)?;
        self.inner.update(|c| {
            c.partitions.insert((from.to_owned(), to.to_owned()));
        });
        Ok(())
    }

    /// Lifts a→b and b→a (a no-op for pairs not partitioned).
    pub fn unpartition(&self, a: &str, b: &str) {
        self.inner.update(|c| {
            c.partitions.remove(&(a.to_owned(), b.to_owned()));
            c.partitions.remove(&(b.to_owned(), a.to_owned()));
        });
    }

    /// Lifts only from→to; a no-op when absent or the ports are gone.
    pub fn unpartition_directional(&self, from: &str, to: &str) {
        self.inner.update(|c| {
            c.partitions.remove(&(from.to_owned(), to.to_owned()));
        });
    }

    /// Partitions every ordered pair of currently attached ports.
    pub fn partition_all(&self) {
        self.inner.update(|c| {
            let names: Vec<String> = c.ports.values().map(|p| p.shared.name.clone()).collect();
            for a in &names {
                for b in &names {
                    if a != b {
                        c.partitions.insert((a.clone(), b.clone()));
                    }
                }
            }
        });
    }

    /// Lifts every partition.
    pub fn restore_all(&self) {
        self.inner.update(|c| c.partitions.clear());
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
        self.inner.update(|c| {
            c.isolated.insert(name.to_owned());
        });
    }

    /// Lifts isolation of `name`.
    pub fn unisolate(&self, name: &str) {
        self.inner.update(|c| {
            c.isolated.remove(name);
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
            .update(|c| c.bridge_imp.latency = Some(latency).filter(|d| !d.is_zero()));
    }

    /// Whole-bridge drop rate in percent (0 clears).
    pub fn set_drop_rate(&self, pct: f64) -> Result<(), SwitchError> {
        let pct = check_drop_pct(pct).map_err(|e| self.inner.imp_err(e))?;
        self.inner
            .update(|c| c.bridge_imp.drop_pct = Some(pct).filter(|p| *p > 0.0));
        Ok(())
    }

    /// Whole-bridge bandwidth in bits per second (0 clears).
    pub fn set_bandwidth(&self, bps: u64) {
        self.inner
            .update(|c| c.bridge_imp.bandwidth_bps = Some(bps).filter(|b| *b > 0));
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
        self.inner.update(|c| {
            c.bridge_imp = Impairment::default();
            c.pair_imp.clear();
            c.partitions.clear();
            // Every pair's drop stream and bucket start over.
            c.reset_epoch += 1;
        });
        let held: Vec<Delayed> = {
            let mut q = self.inner.delay_lock();
            q.bytes = 0;
            // Sorted ascending by `Reverse`, so latest release first.
            std::mem::take(&mut q.heap).into_sorted_vec()
        }
        .into_iter()
        .rev()
        .map(|Reverse(d)| d)
        .collect();
        let topo = self.inner.snapshot();
        let mut after = After::default();
        for d in held {
            self.inner.deliver(
                &topo,
                d.to,
                VnetHdr::default(),
                &d.frame,
                now,
                Direct::Never,
                &mut after,
            );
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
        let c = self.inner.lock();
        c.slot(name)
            .map(|p| p.shared.link_up.load(Ordering::Acquire))
            .ok_or_else(|| self.inner.no_port(name))
    }

    /// `name`'s counters (guest's perspective).
    pub fn counters(&self, name: &str) -> Result<PortCounters, SwitchError> {
        let c = self.inner.lock();
        c.slot(name)
            .map(|p| p.shared.counters.read())
            .ok_or_else(|| self.inner.no_port(name))
    }

    /// Switch-wide counters.
    pub fn stats(&self) -> SwitchStats {
        self.inner.stats.read()
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
        self.inner.update(|c| {
            c.captures.retain(|cap| !cap.is_closed());
            c.captures
                .iter()
                .map(|cap| cap.label().to_owned())
                .collect()
        })
    }

    // ---- the delay queue ----

    /// Delivers every delayed frame whose release time has come; returns how
    /// many were handed over (delivered or dropped at the destination).
    pub fn release_due(&self) -> usize {
        let now = self.inner.clock.now();
        let mut after = After::default();
        let n = self.inner.release_due(now, &mut after);
        after.run();
        n
    }

    /// The earliest pending release time, if any frame is delayed.
    pub fn next_release(&self) -> Option<Duration> {
        self.inner.delay_lock().heap.peek().map(|d| d.0.release)
    }

    /// Frames waiting in the delay queue.
    pub fn delayed_frames(&self) -> usize {
        self.inner.delay_lock().heap.len()
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.inner.update(|c| {
            c.closed = true;
            for p in c.ports.values() {
                p.shared.rx.close();
            }
        });
        // Under the delay lock, so the timer cannot miss it between its
        // check and its wait.
        self.inner.delay_lock().closed = true;
        self.inner.timer_cv.notify_all();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

/// Whether a delivery may write straight into the destination (see
/// [`RxQueue::push_or_write`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direct {
    /// An unimpaired pair on the forwarding path: order is the queue's.
    IfIdle,
    /// Released by the timer or a reset: always queued.
    Never,
}

impl Control {
    fn slot(&self, name: &str) -> Option<&ControlSlot> {
        self.by_name.get(name).and_then(|id| self.ports.get(id))
    }

    /// The snapshot the forwarding path reads, built from declared state.
    fn snapshot(&self) -> Topology {
        let captured = |name: &str| {
            self.captures
                .iter()
                .any(|c| matches!(c.scope(), CaptureScope::Port(p) if p == name))
        };
        let ports = self
            .ports
            .iter()
            .map(|(id, s)| {
                let view = PortView {
                    shared: Arc::clone(&s.shared),
                    isolated: self.isolated.contains(&s.shared.name),
                    offloads: s.offloads,
                    captured: captured(&s.shared.name),
                };
                (*id, view)
            })
            .collect();
        let blocked = self
            .partitions
            .iter()
            .filter_map(|(a, b)| Some((*self.by_name.get(a)?, *self.by_name.get(b)?)))
            .collect();
        Topology {
            generation: self.generation,
            reset_epoch: self.reset_epoch,
            closed: self.closed,
            ports,
            blocked,
            bridge_imp: self.bridge_imp,
            pair_imp: self.pair_imp.clone(),
            any_impairment: !self.bridge_imp.is_clear() || !self.pair_imp.is_empty(),
            captures: self.captures.clone(),
            macs: self.macs.clone(),
        }
    }

    /// Forgets `mac` if `port` owns it.
    fn forget_mac(&mut self, mac: &MacAddr, port: PortId) {
        if self.macs.get(mac).is_some_and(|e| e.port == port) {
            self.macs.remove(mac);
        }
    }

    /// Learns `mac` on `port` (new, or moved from another port), evicting
    /// the port's oldest entries beyond `cap`; returns the evictions.
    fn learn(&mut self, mac: MacAddr, port: PortId, now: Duration, cap: usize) -> u64 {
        if let Some(e) = self.macs.get(&mac) {
            if e.port == port {
                e.last_seen_ns.store(duration_ns(now), Ordering::Relaxed);
                return 0;
            }
            let old = e.port;
            if let Some(o) = self.ports.get_mut(&old) {
                o.learned.retain(|m| *m != mac);
            }
        }
        self.macs.insert(mac, MacEntry::new(port, now));
        let mut evicted = Vec::new();
        if let Some(slot) = self.ports.get_mut(&port) {
            slot.learned.push_back(mac);
            while slot.learned.len() > cap {
                if let Some(m) = slot.learned.pop_front() {
                    evicted.push(m);
                }
            }
        }
        for m in &evicted {
            self.forget_mac(m, port);
        }
        evicted.len() as u64
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Control> {
        // Control state stays consistent between statements; recover from a
        // poisoned lock rather than take the whole run down.
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn delay_lock(&self) -> MutexGuard<'_, DelayQueue> {
        self.delay.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest published snapshot.
    fn snapshot(&self) -> Arc<Topology> {
        Arc::clone(&self.published.lock().unwrap_or_else(|e| e.into_inner()))
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

    /// Applies a control-plane change and publishes the new snapshot before
    /// returning, so the caller's next frame sees it.
    fn update<R>(&self, f: impl FnOnce(&mut Control) -> R) -> R {
        let mut c = self.lock();
        let r = f(&mut c);
        self.publish(&mut c);
        r
    }

    fn publish(&self, c: &mut Control) {
        c.generation += 1;
        let topo = Arc::new(c.snapshot());
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = topo;
        self.generation.store(c.generation, Ordering::Release);
    }

    fn update_pair(&self, from: &str, to: &str, f: impl FnOnce(&mut Impairment)) {
        self.update(|c| {
            let key = (from.to_owned(), to.to_owned());
            let e = c.pair_imp.entry(key.clone()).or_default();
            f(e);
            if e.is_clear() {
                c.pair_imp.remove(&key);
            }
        });
    }

    pub(crate) fn detach_id(&self, id: PortId) {
        self.update(|c| {
            if let Some(slot) = c.ports.remove(&id) {
                slot.shared.rx.close();
                c.by_name.remove(&slot.shared.name);
                for m in &slot.learned {
                    c.forget_mac(m, id);
                }
            }
        });
    }

    fn set_link(&self, name: &str, up: bool) -> Result<(), SwitchError> {
        let mut after = After::default();
        self.update(|c| {
            let id = *c.by_name.get(name).ok_or_else(|| self.no_port(name))?;
            let Some(slot) = c.ports.get_mut(&id) else {
                return Err(self.no_port(name));
            };
            if slot.shared.link_up.swap(up, Ordering::AcqRel) != up {
                let mut forget = VecDeque::new();
                if !up {
                    let n = slot.shared.rx.clear();
                    add(&slot.shared.counters.rx_dropped, n as u64);
                    forget = std::mem::take(&mut slot.learned);
                }
                if let Some(w) = &slot.link_watcher {
                    after.link.push((Arc::clone(w), up));
                }
                for m in &forget {
                    c.forget_mac(m, id);
                }
            }
            Ok(())
        })?;
        after.run();
        Ok(())
    }

    fn add_capture(&self, label: &str, scope: CaptureScope) -> Capture {
        let cap = Capture::new(label.to_owned(), scope, self.config.capture_buffer_bytes);
        self.update(|c| {
            c.captures.retain(|c| !c.is_closed());
            c.captures.push(cap.shared());
        });
        cap
    }

    /// Forwards frames from port `from` in its sender's thread; each
    /// destination is woken once for the batch.
    fn send_batch<'a>(
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
            Some(to) => self.egress(topo, &mut s.pairs, from, to, &mut pkt, now, after),
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
        let evicted = self.update(|c| {
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
        // wire packets: the port takes the offload, the pair is unimpaired
        // (drops and bandwidth act per wire packet) and no capture of the
        // port is open (captures show wire packets).
        let whole = !impaired && t.offloads.accepts(meta.work) && !t.captured;
        if whole {
            bump(&self.stats.offloaded);
            self.deliver(topo, to, meta.hdr, pkt.frame, now, Direct::IfIdle, after);
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
        let release = depart + rt.eff.latency;
        if release <= now {
            let hdr = VnetHdr::default();
            self.deliver(topo, to, hdr, frame, now, Direct::Never, after);
            return;
        }
        let mut q = self.delay_lock();
        if q.bytes.saturating_add(frame.len()) > self.config.delay_queue_bytes {
            bump(&self.stats.dropped_delay_queue_full);
            return;
        }
        q.bytes += frame.len();
        q.seq += 1;
        bump(&self.stats.delayed);
        let was_first = q.heap.peek().is_none_or(|d| release < d.0.release);
        let seq = q.seq;
        q.heap.push(Reverse(Delayed {
            release,
            seq,
            to,
            frame: frame.to_vec(),
        }));
        drop(q);
        if was_first {
            self.timer_cv.notify_all();
        }
    }

    /// Hands `frame` (with `hdr`, the offload it still carries) to `to`,
    /// timestamped `at` in captures: written straight into the destination
    /// when `direct` allows and it is idle, else queued (a copy).
    #[allow(clippy::too_many_arguments)]
    fn deliver(
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

    /// Delivers every delayed frame due at `now`, in release order.
    fn release_due(&self, now: Duration, after: &mut After) -> usize {
        let mut topo: Option<Arc<Topology>> = None;
        let mut n = 0;
        loop {
            let Some(d) = self.delay_lock().pop_due(now) else {
                break;
            };
            let t = topo.get_or_insert_with(|| self.snapshot());
            let hdr = VnetHdr::default();
            self.deliver(t, d.to, hdr, &d.frame, d.release, Direct::Never, after);
            n += 1;
        }
        n
    }

    fn timer_loop(&self) {
        let mut q = self.delay_lock();
        loop {
            if q.closed {
                return;
            }
            let now = self.clock.now();
            if q.heap.peek().is_some_and(|d| d.0.release <= now) {
                drop(q);
                let mut after = After::default();
                self.release_due(now, &mut after);
                after.run();
                q = self.delay_lock();
                continue;
            }
            q = match q.heap.peek().map(|d| d.0.release) {
                Some(release) => {
                    self.timer_cv
                        .wait_timeout(q, release.saturating_sub(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.timer_cv.wait(q).unwrap_or_else(|e| e.into_inner()),
            };
        }
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
    /// This port's sending side; only its own senders lock it.
    sender: Mutex<Sender>,
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
        self.send_offload(VnetHdr::default(), frame)
    }

    /// Hands over a frame with its virtio-net offload header (a guest NIC
    /// with CSUM/HOST_TSO negotiated, a TAP with `IFF_VNET_HDR`). The header
    /// is untrusted: an invalid one refuses the frame
    /// ([`SendError::BadOffload`], counted in `offload_errors`).
    pub fn send_offload(&self, hdr: VnetHdr, frame: &[u8]) -> Result<(), SendError> {
        match self
            .inner
            .send_batch(self.id, &self.sender, std::iter::once((hdr, frame)))
        {
            (_, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Hands over several frames at once; each destination is woken once
    /// for the batch. Returns how many were accepted (refusals are counted
    /// as for [`Port::send`]).
    pub fn send_batch<'a>(&self, frames: impl IntoIterator<Item = (VnetHdr, &'a [u8])>) -> usize {
        self.inner.send_batch(self.id, &self.sender, frames).0
    }

    /// Declares what this port takes whole (a guest's negotiated features,
    /// a TAP's offloads). Frames it cannot take reach it as wire packets,
    /// checksums filled. Ports start with none.
    pub fn set_offloads(&self, offloads: Offloads) {
        self.inner.update(|c| {
            if let Some(slot) = c.ports.get_mut(&self.id) {
                slot.offloads = offloads;
            }
        });
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

    /// Installs (or removes) the writer the switch hands this port's
    /// unimpaired frames to, in the sender's thread, while its receive
    /// queue is idle (see [`DirectWriter`]). A consumer of such a port pops
    /// with [`Port::try_recv_or_idle`] once it has written what it popped.
    pub fn set_direct_writer(&self, writer: Option<DirectWriter>) {
        self.rx.set_direct(writer);
    }

    /// The next frame; when there is none, marks this port's consumer idle
    /// so that the direct path may write again.
    pub fn try_recv_or_idle(&self) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.pop_or_idle()
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
            .is_some_and(|p| p.shared.link_up.load(Ordering::Acquire))
    }

    /// This port's counters (zeros once detached).
    pub fn counters(&self) -> PortCounters {
        self.inner
            .lock()
            .ports
            .get(&self.id)
            .map(|p| p.shared.counters.read())
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

    #[test]
    fn forwarding_proceeds_while_the_control_plane_is_held() {
        let (sw, _) = manual();
        let a = Arc::new(sw.attach("a", MacAddr::local(1)).unwrap());
        let b = sw.attach("b", MacAddr::local(2)).unwrap();
        let _c = sw.attach("c", MacAddr::local(3)).unwrap();
        sw.set_pair_drop_rate("c", "a", 50.0).unwrap();
        // Both MACs learned and both senders' snapshots current.
        b.send(&frame(MacAddr::BROADCAST, MacAddr::local(2), 0))
            .unwrap();
        a.send(&frame(MacAddr::local(2), MacAddr::local(1), 0))
            .unwrap();
        while b.try_recv().is_some() {}
        // A third party holds every switch-wide lock the control plane
        // uses; a unicast a -> b must still cross.
        let control = sw.inner.lock();
        let published = sw.inner.published.lock().unwrap();
        let delay = sw.inner.delay_lock();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let sender = {
            let a = Arc::clone(&a);
            std::thread::spawn(move || {
                for tag in 1..=3 {
                    a.send(&frame(MacAddr::local(2), MacAddr::local(1), tag))
                        .unwrap();
                }
                done_tx.send(()).unwrap();
            })
        };
        let crossed = done_rx.recv_timeout(Duration::from_secs(30)).is_ok();
        let tags: Vec<u8> = std::iter::from_fn(|| b.try_recv()).map(|f| f[20]).collect();
        drop((control, published, delay));
        sender.join().unwrap();
        assert!(crossed, "a send blocked on a switch-wide lock");
        assert_eq!(tags, [1, 2, 3]);
        assert_eq!(b.counters().rx_packets, 4);
    }

    #[test]
    fn control_changes_reach_a_sender_with_a_cached_snapshot() {
        let (sw, _) = manual();
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        let b = sw.attach("b", MacAddr::local(2)).unwrap();
        let f = frame(MacAddr::BROADCAST, MacAddr::local(1), 0);
        a.send(&f).unwrap();
        sw.partition_directional("a", "b").unwrap();
        a.send(&f).unwrap();
        sw.unpartition_directional("a", "b");
        a.send(&f).unwrap();
        assert_eq!(b.pending(), 2);
        assert_eq!(sw.stats().dropped_partition, 1);
    }
}
