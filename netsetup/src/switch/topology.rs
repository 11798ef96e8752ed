//! The topology: what the control plane declares ([`Control`]) and the
//! immutable snapshot of it the forwarding path reads ([`Topology`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::counters::PortCounterCells;
use super::port_delay::PortDelay;
use super::PortId;
use crate::clock::duration_ns;
use crate::impair::Impairment;
use crate::kernel_path::KernelNic;
use crate::mac::MacAddr;
use crate::offload::Offloads;
use crate::pcap::{CaptureScope, CaptureShared};
use crate::port::{LinkWatcher, RxQueue};

/// What the forwarding path needs of one port and may change without a
/// new snapshot: its link state, counters and receive queue.
pub(super) struct PortShared {
    pub(super) name: String,
    pub(super) link_up: AtomicBool,
    pub(super) counters: PortCounterCells,
    pub(super) rx: Arc<RxQueue>,
    /// Frames held for this port (latency, bandwidth backlog); locked by
    /// the same senders that lock `rx`, and by releasers.
    pub(super) delay: PortDelay,
}

/// One port as a snapshot sees it.
pub(super) struct PortView {
    pub(super) shared: Arc<PortShared>,
    pub(super) isolated: bool,
    /// What this port takes without software segmentation.
    pub(super) offloads: Offloads,
    /// A capture of this port (live or not yet pruned) exists, so offloaded
    /// frames reach it as wire packets.
    pub(super) captured: bool,
    /// It has a kernel NIC: unicast to another such port asks for a wire.
    pub(super) kernel: bool,
}

pub(super) struct MacEntry {
    pub(super) port: PortId,
    /// Nanoseconds on the switch clock; refreshed by the owning port's
    /// frames without a lock.
    pub(super) last_seen_ns: AtomicU64,
}

impl MacEntry {
    fn new(port: PortId, now: Duration) -> Arc<MacEntry> {
        Arc::new(MacEntry {
            port,
            last_seen_ns: AtomicU64::new(duration_ns(now)),
        })
    }

    pub(super) fn fresh(&self, now: Duration, ageing: Duration) -> bool {
        let seen = Duration::from_nanos(self.last_seen_ns.load(Ordering::Relaxed));
        now.saturating_sub(seen) < ageing
    }
}

/// An immutable view of everything the forwarding decision reads; rebuilt
/// and republished by every control-plane change.
pub(super) struct Topology {
    pub(super) generation: u64,
    /// Bumped by [`Switch::reset`](super::Switch::reset): pairs restart their drop streams.
    pub(super) reset_epoch: u64,
    pub(super) closed: bool,
    pub(super) ports: BTreeMap<PortId, PortView>,
    /// Partitions resolved to attached port ids.
    pub(super) blocked: HashSet<(PortId, PortId)>,
    pub(super) bridge_imp: Impairment,
    pub(super) pair_imp: BTreeMap<(String, String), Impairment>,
    pub(super) any_impairment: bool,
    pub(super) captures: Vec<Arc<CaptureShared>>,
    pub(super) macs: HashMap<MacAddr, Arc<MacEntry>>,
}

/// A port as the control plane keeps it.
pub(super) struct ControlSlot {
    pub(super) shared: Arc<PortShared>,
    pub(super) mac: MacAddr,
    pub(super) offloads: Offloads,
    pub(super) link_watcher: Option<LinkWatcher>,
    /// MACs learned on this port, oldest first.
    pub(super) learned: VecDeque<MacAddr>,
    /// The TAP NIC behind this port, for a kernel path.
    pub(super) kernel_nic: Option<KernelNic>,
}

/// Declared state and membership; only control operations (and the
/// learning of a new MAC) lock it.
pub(super) struct Control {
    pub(super) ports: BTreeMap<PortId, ControlSlot>,
    pub(super) by_name: HashMap<String, PortId>,
    pub(super) next_id: PortId,
    pub(super) macs: HashMap<MacAddr, Arc<MacEntry>>,
    pub(super) bridge_imp: Impairment,
    pub(super) pair_imp: BTreeMap<(String, String), Impairment>,
    pub(super) partitions: BTreeSet<(String, String)>,
    pub(super) isolated: BTreeSet<String>,
    pub(super) captures: Vec<Arc<CaptureShared>>,
    pub(super) generation: u64,
    pub(super) reset_epoch: u64,
    pub(super) closed: bool,
}

impl Control {
    pub(super) fn slot(&self, name: &str) -> Option<&ControlSlot> {
        self.by_name.get(name).and_then(|id| self.ports.get(id))
    }

    /// The snapshot the forwarding path reads, built from declared state.
    pub(super) fn snapshot(&self) -> Topology {
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
                    kernel: s.kernel_nic.is_some(),
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
    pub(super) fn forget_mac(&mut self, mac: &MacAddr, port: PortId) {
        if self.macs.get(mac).is_some_and(|e| e.port == port) {
            self.macs.remove(mac);
        }
    }

    /// Learns `mac` on `port` (new, or moved from another port), evicting
    /// the port's oldest entries beyond `cap`; returns the evictions.
    pub(super) fn learn(&mut self, mac: MacAddr, port: PortId, now: Duration, cap: usize) -> u64 {
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
