//! Which directions the kernel forwards ([`crate::kernel_path`]), kept in
//! step with the declared state after every control-plane change.
//!
//! A direction from -> to between two ports with kernel NICs is *plain*
//! when the switch would only forward its unicast: the switch is open, no
//! live capture exists, neither end is isolated or link-down, from -> to
//! is not partitioned, and neither the whole bridge nor the pair carries
//! an impairment. Exactly the plain directions are enabled. Disabling
//! runs before the control call that made a direction non-plain returns,
//! so every frame sent after it is impaired, dropped or captured by the
//! switch as declared. Enabling may fail (no iproute2, an old kernel): the
//! first error is printed once and the bridge stays on the switch, which
//! is always correct, only slower.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use super::counters::add;
use super::topology::Control;
use super::{Inner, PortId};
use crate::kernel_path::{KernelPathError, Wire, WireCount};

/// The wires of one switch, keyed by (lower, higher) port id; side 0 of a
/// wire is the lower id.
#[derive(Default)]
pub(super) struct KernelPaths {
    wires: BTreeMap<(PortId, PortId), Wire>,
    /// The first error: no further wire is built or enabled.
    broken: bool,
}

/// The plain directions among ports with a kernel NIC.
pub(super) fn plain_directions(c: &Control) -> BTreeSet<(PortId, PortId)> {
    let mut out = BTreeSet::new();
    if c.closed || !c.bridge_imp.is_clear() || c.captures.iter().any(|cap| !cap.is_closed()) {
        return out;
    }
    let ready: Vec<(PortId, &str)> = c
        .ports
        .iter()
        .filter(|(_, s)| {
            s.kernel_nic.is_some()
                && s.shared.link_up.load(Ordering::Acquire)
                && !c.isolated.contains(&s.shared.name)
        })
        .map(|(id, s)| (*id, s.shared.name.as_str()))
        .collect();
    for &(from, from_name) in &ready {
        for &(to, to_name) in &ready {
            let key = (from_name.to_owned(), to_name.to_owned());
            if from != to
                && !c.partitions.contains(&key)
                && c.pair_imp.get(&key).is_none_or(|i| i.is_clear())
            {
                out.insert((from, to));
            }
        }
    }
    out
}

/// The side of wire `key` that `from` is.
fn side(key: (PortId, PortId), from: PortId) -> usize {
    usize::from(from != key.0)
}

impl Inner {
    /// Brings the wires in step with `c` (see the module docs).
    pub(super) fn reconcile_kernel(&self, c: &Control) {
        if !self.config.kernel_path {
            return;
        }
        let mut k = self.kernel.lock().unwrap_or_else(|e| e.into_inner());
        if k.wires.is_empty() && c.ports.values().filter(|s| s.kernel_nic.is_some()).count() < 2 {
            return;
        }
        let plain = plain_directions(c);
        let keys: Vec<_> = k.wires.keys().copied().collect();
        for key in keys {
            let both_here = !c.closed
                && [key.0, key.1]
                    .iter()
                    .all(|id| c.ports.get(id).is_some_and(|s| s.kernel_nic.is_some()));
            for (from, to) in [(key.0, key.1), (key.1, key.0)] {
                if both_here && plain.contains(&(from, to)) {
                    continue;
                }
                let Some(wire) = k.wires.get_mut(&key) else {
                    continue;
                };
                if !wire.is_enabled(side(key, from)) {
                    continue;
                }
                if let Err(e) = wire.disable(side(key, from)) {
                    self.kernel_failed(&mut k.broken, "disable a kernel path", e);
                }
            }
            if !both_here {
                if let Some(wire) = k.wires.remove(&key) {
                    for (from, to) in [(key.0, key.1), (key.1, key.0)] {
                        let n = wire.count(side(key, from)).unwrap_or_default();
                        self.fold_kernel_count(c, from, to, n);
                    }
                }
            }
        }
        if k.broken {
            return;
        }
        let KernelPaths { wires, broken } = &mut *k;
        for &(from, to) in &plain {
            let key = (from.min(to), from.max(to));
            let wire = match wires.entry(key) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    let nics = [key.0, key.1]
                        .map(|id| c.ports.get(&id).and_then(|s| s.kernel_nic.as_ref()));
                    let [Some(a), Some(b)] = nics else { continue };
                    match Wire::create(a, b, &self.config.wire_numbers) {
                        Ok(w) => v.insert(w),
                        Err(e) => return self.kernel_failed(broken, "build a kernel path", e),
                    }
                }
            };
            if let Err(e) = wire.enable(side(key, from)) {
                return self.kernel_failed(broken, "enable a kernel path", e);
            }
        }
    }

    /// What the kernel forwarded from -> to, now in the switch's counters
    /// (the wire is going, and its counts with it).
    fn fold_kernel_count(&self, c: &Control, from: PortId, to: PortId, n: WireCount) {
        if let Some(s) = c.ports.get(&from) {
            add(&s.shared.counters.tx_packets, n.packets);
            add(&s.shared.counters.tx_bytes, n.bytes);
        }
        if let Some(s) = c.ports.get(&to) {
            add(&s.shared.counters.rx_packets, n.packets);
            add(&s.shared.counters.rx_bytes, n.bytes);
        }
        add(&self.stats.frames_in, n.packets);
        add(&self.stats.delivered, n.packets);
        add(&self.stats.kernel_path, n.packets);
    }

    fn kernel_failed(&self, broken: &mut bool, what: &str, e: KernelPathError) {
        if !*broken {
            eprintln!(
                "provium: warning: bridge `{}`: cannot {what}; no further kernel path is \
                 built on this bridge, whose traffic goes through the userspace switch: {}",
                self.name,
                chain(&e)
            );
        }
        *broken = true;
    }

    /// What the kernel forwarded from or to `port` over its current wires'
    /// lives (enabled now or not), as (sent by it, received by it); wires
    /// already gone were folded into the counters.
    pub(super) fn kernel_counts(&self, port: PortId) -> (WireCount, WireCount) {
        let k = self.kernel.lock().unwrap_or_else(|e| e.into_inner());
        let (mut sent, mut received) = (WireCount::default(), WireCount::default());
        for (key, wire) in &k.wires {
            if key.0 != port && key.1 != port {
                continue;
            }
            let mine = side(*key, port);
            let out = wire.count(mine).unwrap_or_default();
            let inn = wire.count(1 - mine).unwrap_or_default();
            sent.packets += out.packets;
            sent.bytes += out.bytes;
            received.packets += inn.packets;
            received.bytes += inn.bytes;
        }
        (sent, received)
    }

    /// What the current wires forwarded over their lives, in wire packets.
    pub(super) fn kernel_packets(&self) -> u64 {
        let k = self.kernel.lock().unwrap_or_else(|e| e.into_inner());
        k.wires
            .values()
            .map(|w| {
                (0..2)
                    .map(|s| w.count(s).unwrap_or_default().packets)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Directions the kernel forwards now, as (from, to) port names.
    pub(super) fn kernel_directions(&self, c: &Control) -> Vec<(String, String)> {
        let k = self.kernel.lock().unwrap_or_else(|e| e.into_inner());
        let name = |id: &PortId| c.ports.get(id).map(|s| s.shared.name.clone());
        let mut out = Vec::new();
        for (key, wire) in &k.wires {
            for (from, to) in [(key.0, key.1), (key.1, key.0)] {
                if wire.is_enabled(side(*key, from)) {
                    if let (Some(f), Some(t)) = (name(&from), name(&to)) {
                        out.push((f, t));
                    }
                }
            }
        }
        out.sort();
        out
    }
}

/// `e` and its sources, joined by ": ".
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
