//! The userspace L2 switch: one per bridge.
//!
//! # Forwarding
//! A frame handed in by a port ([`Port::send`]) is validated (at least an
//! Ethernet header, at most [`MAX_FRAME_BYTES`](crate::mac::MAX_FRAME_BYTES), a unicast non-zero source),
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
//! waits in its destination port's delay queue (a min-heap by release time and
//! a switch-wide sequence number; all ports' queues together are bounded by
//! [`SwitchConfig::delay_queue_bytes`]); a timer thread (or, with a manual
//! clock, [`Switch::release_due`]) hands it over when due, in (release,
//! sequence) order across all ports. Nothing sleeps in the forwarding path.
//!
//! # Threading: no lock shared by all ports on the forwarding path
//! Forwarding runs synchronously in the sender's thread. It reads an
//! immutable `Topology` snapshot (ports, partitions, isolation, declared
//! impairments, captures, the MAC table) that every control-plane change
//! (attach, detach, partition, impair, link, capture, a newly learned MAC)
//! rebuilds under the control mutex and publishes with a generation number.
//! Each [`Port`] caches the snapshot in its own sender state, together with
//! its pairs' runtime (drop streams, token buckets) and its segmentation
//! scratch, so a steady-state frame takes only its own port's sender lock and
//! its destination's receive-queue lock (and, for a delayed frame, the
//! destination's delay-queue lock next to it); it touches the shared
//! publication lock only once after each control change. Counters, the delay
//! queues' sequence number and their byte bound are atomics. Refreshing a
//! known MAC is an atomic store; only a new or moved MAC takes the control
//! mutex. One thing is still switch-wide, and only for the traffic that asks
//! for it: a bridge-wide capture's buffer.
//!
//! Callbacks (RX wakers, link watchers) run after the locks are released.
//! With [`Timer::Thread`] one thread parks until the earliest release time
//! any port publishes; a sender whose frame is due earlier unparks it (the
//! protocol, and why it loses no wake-up, is in `delay`).
//!
//! # Counters
//! Per-port counters are from the guest's perspective: `tx_*` is what the
//! guest sent into the switch, `rx_*` what the switch queued for the guest.
//!
//! # Layout
//! This file holds the public [`Switch`] and its control operations, the
//! errors and the configuration. `topology` has the declared state
//! (`Control`) and the snapshot built from it (`Topology`); `forward` the
//! forwarding path that runs in the sender's thread; `delay` the per-port
//! delay queues and their timer; `counters` the counter structs and their
//! atomic mirrors; `handle` the public [`Port`].

mod counters;
mod delay;
mod forward;
mod handle;
mod kernel;
mod port_delay;
mod topology;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::impair::{bridge_seed, check_drop_pct, ImpairError, Impairment};
use crate::mac::MacAddr;
use crate::offload::{OffloadError, Offloads};
use crate::pcap::{Capture, CaptureScope};
use crate::port::RxQueue;

use counters::{add, PortCounterCells, SwitchStatCells};
use delay::DelayShared;
use forward::{After, Sender};
use kernel::{KernelPaths, WireRequests};
use port_delay::{PortDelay, Release};
use topology::{Control, ControlSlot, PortShared, Topology};

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
    /// Longer than [`MAX_FRAME_BYTES`](crate::mac::MAX_FRAME_BYTES).
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
    /// Bytes all ports' delay queues (latency and bandwidth backlog) hold
    /// together.
    pub delay_queue_bytes: usize,
    /// Bytes a capture buffers for a slow consumer before dropping records.
    pub capture_buffer_bytes: usize,
    /// Learned MAC entries one port may own.
    pub mac_entries_per_port: usize,
    /// Age after which an unrefreshed MAC entry is forgotten.
    pub mac_ageing: Duration,
    /// Token-bucket burst, in bits; `None` uses
    /// [`TokenBucket::default_burst_bits`](crate::impair::TokenBucket::default_burst_bits)
    /// of the rate.
    pub bandwidth_burst_bits: Option<u64>,
    /// Let the kernel forward the plain directions between ports with a
    /// kernel NIC ([`Port::set_kernel_nic`]; see [`crate::kernel_path`]).
    /// Off, every frame goes through the switch (the bench compares both).
    pub kernel_path: bool,
    /// Where this switch's kernel-path wires get their numbers (see
    /// [`crate::WireNumbers`]): share one among switches whose kernel NICs
    /// may share a network namespace. The default is a counter of its own.
    pub wire_numbers: crate::WireNumbers,
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
            kernel_path: true,
            wire_numbers: crate::WireNumbers::default(),
        }
    }
}

/// How the delay queues are driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// A thread releases due frames (production; pair it with a real clock:
    /// the thread sleeps in wall-clock time until the next release it
    /// computed from the switch clock, so with a manual clock an `advance`
    /// is seen only when that sleep ends).
    Thread,
    /// The caller calls [`Switch::release_due`] (tests with a manual clock).
    Manual,
}

pub use counters::{PortCounters, SwitchStats};
pub use handle::Port;

/// Ports are numbered from 1 in attach order; ids are never reused.
type PortId = u64;

pub(crate) struct Inner {
    name: String,
    run_seed: u64,
    seed: u64,
    config: SwitchConfig,
    clock: Arc<dyn Clock>,
    control: Mutex<Control>,
    /// Callers blocked on `control`: the kernel paths' enabling, a few
    /// rtnetlink requests a direction under the lock, stops for them and leaves the
    /// rest to the wire builder (`kernel.rs`), so a bridge's close or a
    /// partition never waits behind a batch of enables.
    control_waiters: AtomicUsize,
    /// The latest snapshot; read by a port only when `generation` moved.
    published: Mutex<Arc<Topology>>,
    generation: AtomicU64,
    stats: SwitchStatCells,
    /// What the ports' delay queues share (order, byte bound, timer).
    delay: DelayShared,
    /// The kernel paths between this switch's kernel NICs.
    kernel: Mutex<KernelPaths>,
    /// Pairs the forwarding path asked a wire for, and the thread that
    /// builds them (see `kernel`).
    requests: WireRequests,
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
        let delay_queue_bytes = config.delay_queue_bytes;
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            run_seed: config.run_seed,
            seed: bridge_seed(config.run_seed, name),
            config,
            clock,
            control: Mutex::new(control),
            control_waiters: AtomicUsize::new(0),
            published: Mutex::new(first),
            generation: AtomicU64::new(0),
            stats: SwitchStatCells::default(),
            delay: DelayShared::new(delay_queue_bytes),
            kernel: Mutex::new(KernelPaths::default()),
            requests: WireRequests::default(),
        });
        let timer = match timer {
            Timer::Manual => None,
            Timer::Thread => {
                let timer_inner = Arc::clone(&inner);
                let handle = std::thread::Builder::new()
                    .name(format!("switch-{}", inner.name))
                    .spawn(move || {
                        precise_timeouts();
                        timer_inner.timer_loop()
                    })
                    .expect("spawning the switch timer thread");
                // Before any port exists, so no sender misses it.
                inner.delay.set_timer(handle.thread().clone());
                Some(handle)
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
                delay: PortDelay::new(),
            });
            c.ports.insert(
                id,
                ControlSlot {
                    shared,
                    mac,
                    offloads: Offloads::default(),
                    link_watcher: None,
                    learned: VecDeque::new(),
                    kernel_nic: None,
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
            sender: Mutex::new(Sender::new(inner.snapshot())),
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

    /// Detaches every port named in `names` (names not attached are
    /// skipped) in one control change: a bridge closing takes all of its
    /// kernel-path wires down in one batch, a few rtnetlink requests per
    /// namespace, instead of a batch per port.
    pub fn detach_many<S: AsRef<str>>(&self, names: &[S]) {
        let ids: Vec<PortId> = {
            let c = self.inner.lock();
            names
                .iter()
                .filter_map(|n| c.by_name.get(n.as_ref()).copied())
                .collect()
        };
        self.inner.detach_ids(&ids);
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
    /// delay queues are delivered now, in release order across all ports.
    pub fn reset(&self) {
        let now = self.inner.clock.now();
        self.inner.update(|c| {
            c.bridge_imp = Impairment::default();
            c.pair_imp.clear();
            c.partitions.clear();
            // Every pair's drop stream and bucket start over.
            c.reset_epoch += 1;
        });
        let mut after = After::default();
        self.inner.release(Release::All { now }, &mut after);
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
        let id = *c
            .by_name
            .get(name)
            .ok_or_else(|| self.inner.no_port(name))?;
        drop(c);
        Ok(self.inner.port_counters(id))
    }

    /// Switch-wide counters.
    pub fn stats(&self) -> SwitchStats {
        let mut s = self.inner.stats.read();
        let kernel = self.inner.kernel_packets();
        s.frames_in += kernel;
        s.delivered += kernel;
        s.kernel_path += kernel;
        s
    }

    /// The directions the kernel forwards now, as sorted (from, to) names.
    pub fn kernel_directions(&self) -> Vec<(String, String)> {
        self.inner.settle_kernel();
        let c = self.inner.lock();
        self.inner.kernel_directions(&c)
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

    // ---- the delay queues ----

    /// Delivers every delayed frame whose release time has come; returns how
    /// many were handed over (delivered or dropped at the destination).
    pub fn release_due(&self) -> usize {
        let now = self.inner.clock.now();
        let mut after = After::default();
        let n = self.inner.release(Release::Due(now), &mut after);
        after.run();
        n
    }

    /// The earliest pending release time, if any frame is delayed (the
    /// minimum over all ports' delay queues).
    pub fn next_release(&self) -> Option<Duration> {
        self.inner.next_release()
    }

    /// Frames waiting in the delay queues, all ports together.
    pub fn delayed_frames(&self) -> usize {
        self.inner.delayed_frames()
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
        self.inner.requests.close();
        // Sets a flag and unparks the timer, which checks the flag between
        // its unpark token and its park (see `delay::DelayShared`).
        self.inner.delay.close();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

/// Lets the calling thread's timed waits end when asked rather than up to
/// Linux's default timer slack (50 µs) later: the timer thread releases
/// delayed frames from a `park_timeout`, and the slack showed as part of
/// the excess over a pair's latency: a 1 ms latency's RTT p50 went from
/// +107-140 µs over it to +34-59 µs (docs/networking.md, "The switch's own
/// path (issue 29)").
fn precise_timeouts() {
    // SAFETY: PR_SET_TIMERSLACK takes the slack in nanoseconds by value
    // and changes only the calling thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Control> {
        // Control state stays consistent between statements; recover from a
        // poisoned lock rather than take the whole run down.
        match self.control.try_lock() {
            Ok(c) => return c,
            Err(TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(TryLockError::WouldBlock) => {}
        }
        self.control_waiters.fetch_add(1, Ordering::AcqRel);
        let c = self.control.lock().unwrap_or_else(|e| e.into_inner());
        self.control_waiters.fetch_sub(1, Ordering::AcqRel);
        c
    }

    /// Whether a caller is blocked on the control lock (see
    /// `control_waiters`).
    fn control_wanted(&self) -> bool {
        self.control_waiters.load(Ordering::Acquire) > 0
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
        self.reconcile_kernel(&c);
        r
    }

    /// As [`Inner::update`] for a change no kernel path depends on (a
    /// learned MAC): the forwarding path makes it and must not wait for
    /// `tc`.
    fn update_learned<R>(&self, f: impl FnOnce(&mut Control) -> R) -> R {
        let mut c = self.lock();
        let r = f(&mut c);
        self.publish(&mut c);
        r
    }

    /// A port's counters, with what the kernel forwarded for it.
    fn port_counters(&self, id: PortId) -> PortCounters {
        let Some(mut n) = self.lock().ports.get(&id).map(|p| p.shared.counters.read()) else {
            return PortCounters::default();
        };
        let (sent, received) = self.kernel_counts(id);
        n.tx_packets += sent.packets;
        n.tx_bytes += sent.bytes;
        n.rx_packets += received.packets;
        n.rx_bytes += received.bytes;
        n
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
        self.detach_ids(&[id]);
    }

    /// Detaches `ids` in one control change, so their kernel-path wires go
    /// in one take-down batch. Ports already gone change nothing.
    fn detach_ids(&self, ids: &[PortId]) {
        {
            let c = self.lock();
            if !ids.iter().any(|id| c.ports.contains_key(id)) {
                return;
            }
        }
        self.update(|c| {
            for id in ids {
                let Some(slot) = c.ports.remove(id) else {
                    continue;
                };
                slot.shared.rx.close();
                // Its delayed frames go now (their bytes back to the bound),
                // and a sender with a stale snapshot can queue no more.
                self.drop_held(&slot.shared);
                c.by_name.remove(&slot.shared.name);
                for m in &slot.learned {
                    c.forget_mac(m, *id);
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
}
