//! Which directions the kernel forwards ([`crate::kernel_path`]), kept in
//! step with the declared state after every control-plane change.
//!
//! A direction from -> to between two ports with kernel NICs is *plain*
//! when the switch would only forward its unicast: the switch is open, no
//! live capture exists, neither end is isolated or link-down, from -> to
//! is not partitioned, and neither the whole bridge nor the pair carries
//! an impairment. Exactly the plain directions of the pairs that have a
//! wire are enabled. Disabling runs before the control call that made a
//! direction non-plain returns, so every frame sent after it is impaired,
//! dropped or captured by the switch as declared. Enabling may fail (no
//! iproute2, an old kernel): the first error is printed once and the
//! bridge stays on the switch, which is always correct, only slower.
//!
//! Wires are built lazily: a pair gets one when the switch first forwards
//! a unicast frame between the two (the forwarding path only notes the
//! pair, [`Inner::want_wire`]), built by the switch's wire builder thread
//! without the control lock, and enabled under it. So a bridge of n
//! sandboxes costs work for the pairs that talk, not n(n-1)/2 wires at
//! attach; reading counters or the enabled directions first settles what
//! was asked for, so what they say includes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use super::counters::add;
use super::topology::Control;
use super::{Inner, PortId};
use crate::kernel_path::{KernelNic, KernelPathError, Wire, WireCount};

/// The wires of one switch, keyed by (lower, higher) port id; side 0 of a
/// wire is the lower id.
#[derive(Default)]
pub(super) struct KernelPaths {
    wires: BTreeMap<(PortId, PortId), Wire>,
    /// Pairs the switch forwarded unicast between: the pairs that get a
    /// wire while a direction of theirs is plain.
    wanted: BTreeSet<(PortId, PortId)>,
    /// The first error: no further wire is built or enabled.
    broken: bool,
}

/// Pairs the forwarding path asked a wire for, and the builder thread
/// that builds them.
#[derive(Default)]
pub(super) struct WireRequests {
    state: Mutex<Requests>,
    ready: Condvar,
    builder: Mutex<Option<JoinHandle<()>>>,
    /// Serialises settling (the builder and readers that settle first),
    /// so a pair is built once.
    settling: Mutex<()>,
}

#[derive(Default)]
struct Requests {
    pairs: Vec<(PortId, PortId)>,
    /// Wanted pairs may lack a wire (a control change made one plain):
    /// the builder looks.
    recheck: bool,
    closed: bool,
}

impl WireRequests {
    fn lock(&self) -> MutexGuard<'_, Requests> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> Vec<(PortId, PortId)> {
        let mut r = self.lock();
        r.recheck = false;
        std::mem::take(&mut r.pairs)
    }

    fn kick(&self) {
        self.lock().recheck = true;
        self.ready.notify_one();
    }

    /// Starts the builder thread once (a port's kernel NIC needs it).
    pub(super) fn start(&self, inner: &Arc<Inner>) {
        let mut b = self.builder.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_some() || self.lock().closed {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(inner);
        let spawned = std::thread::Builder::new()
            .name(format!("wires-{}", inner.name))
            .spawn(move || builder_loop(&weak));
        // Without the thread, wires are built when counters are read or
        // the control plane next changes; still correct.
        *b = spawned.ok();
    }

    /// Stops the builder (the switch is dropped) and waits for it.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
        let handle = self
            .builder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn builder_loop(weak: &Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        {
            let mut r = inner.requests.lock();
            while r.pairs.is_empty() && !r.recheck && !r.closed {
                r = inner
                    .requests
                    .ready
                    .wait(r)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if r.closed {
                return;
            }
        }
        inner.settle_kernel();
    }
}

/// The bridge-wide conditions for any plain direction.
fn bridge_plain(c: &Control) -> bool {
    !c.closed && c.bridge_imp.is_clear() && c.captures.iter().all(|cap| cap.is_closed())
}

/// Whether from -> to is plain, given [`bridge_plain`].
fn plain(c: &Control, from: PortId, to: PortId) -> bool {
    let ready = |id: PortId| {
        c.ports.get(&id).filter(|s| {
            s.kernel_nic.is_some()
                && s.shared.link_up.load(Ordering::Acquire)
                && !c.isolated.contains(&s.shared.name)
        })
    };
    let (Some(f), Some(t)) = (ready(from), ready(to)) else {
        return false;
    };
    let key = (f.shared.name.clone(), t.shared.name.clone());
    from != to && !c.partitions.contains(&key) && c.pair_imp.get(&key).is_none_or(|i| i.is_clear())
}

/// The side of wire `key` that `from` is.
fn side(key: (PortId, PortId), from: PortId) -> usize {
    usize::from(from != key.0)
}

/// Whether both ports of `key` are attached with a kernel NIC.
fn both_here(c: &Control, key: (PortId, PortId)) -> bool {
    !c.closed
        && [key.0, key.1]
            .iter()
            .all(|id| c.ports.get(id).is_some_and(|s| s.kernel_nic.is_some()))
}

impl Inner {
    fn kernel_lock(&self) -> MutexGuard<'_, KernelPaths> {
        self.kernel.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The forwarding path saw unicast between `a` and `b`: their wire is
    /// to be built (by the builder thread; this never waits for `ip`).
    pub(super) fn want_wire(&self, a: PortId, b: PortId) {
        if !self.config.kernel_path {
            return;
        }
        self.requests.lock().pairs.push((a.min(b), a.max(b)));
        self.requests.ready.notify_one();
    }

    /// Builds the wires asked for whose pair has a plain direction, then
    /// enables them under the control lock. The builds run without it, so
    /// neither control calls nor the forwarding path wait for them.
    pub(super) fn settle_kernel(&self) {
        if !self.config.kernel_path {
            return;
        }
        let _one = self
            .requests
            .settling
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let todo: Vec<((PortId, PortId), [KernelNic; 2])> = {
            let c = self.lock();
            let mut k = self.kernel_lock();
            k.wanted.extend(self.requests.take());
            if k.broken || !bridge_plain(&c) {
                return;
            }
            k.wanted
                .iter()
                .filter(|key| !k.wires.contains_key(key))
                .filter(|key| plain(&c, key.0, key.1) || plain(&c, key.1, key.0))
                .filter_map(|key| {
                    let nic = |id| c.ports.get(&id)?.kernel_nic.clone();
                    Some((*key, [nic(key.0)?, nic(key.1)?]))
                })
                .collect()
        };
        if todo.is_empty() {
            // Nothing to build; the directions an enable left for us when
            // a control call came (see `reconcile_kernel`) are enabled now.
            self.reconcile_kernel(&self.lock());
            return;
        }
        let mut built = Vec::new();
        let mut failed = Vec::new();
        for (key, [a, b]) in todo {
            // A closing bridge or a detach may come while the batch is
            // built (each wire is several requests): a pair whose port
            // left is skipped rather than built, and deleted again alone.
            if !both_here(&self.lock(), key) {
                continue;
            }
            match Wire::create(&a, &b, &self.config.wire_numbers) {
                Ok(w) => built.push((key, w)),
                Err(e) => failed.push((key, [a, b], e)),
            }
        }
        let c = self.lock();
        {
            let mut k = self.kernel_lock();
            k.wires.extend(built);
            for (key, nics, e) in failed {
                // A port that left (or got another NIC) while its wire was
                // being built took its TAP along: that is no failure of
                // the kernel path.
                let still = [key.0, key.1].iter().zip(&nics).all(|(id, nic)| {
                    c.ports
                        .get(id)
                        .and_then(|s| s.kernel_nic.as_ref())
                        .is_some_and(|now| now.same(nic))
                });
                if still && !c.closed {
                    self.kernel_failed(&mut k.broken, "build a kernel path", e);
                }
            }
        }
        // Enables the new wires' plain directions; takes down those whose
        // ports left meanwhile.
        self.reconcile_kernel(&c);
    }

    /// Brings the wires in step with `c` (see the module docs): disables
    /// what is no longer plain, takes down the wires of ports gone (in
    /// one batch), and enables the plain directions of the wires there.
    /// Wires still to build are the builder's.
    pub(super) fn reconcile_kernel(&self, c: &Control) {
        if !self.config.kernel_path {
            return;
        }
        let mut k = self.kernel_lock();
        k.wanted.extend(self.requests.take());
        if k.wires.is_empty() && k.wanted.is_empty() {
            return;
        }
        k.wanted.retain(|key| both_here(c, *key));
        let bridge = bridge_plain(c);
        let gone: Vec<(PortId, PortId)> = k
            .wires
            .keys()
            .copied()
            .filter(|key| !both_here(c, *key))
            .collect();
        let gone: Vec<((PortId, PortId), Wire)> = gone
            .into_iter()
            .filter_map(|key| Some((key, k.wires.remove(&key)?)))
            .collect();
        let KernelPaths {
            wires,
            wanted,
            broken,
        } = &mut *k;
        for (key, wire) in wires.iter_mut() {
            for (from, to) in [(key.0, key.1), (key.1, key.0)] {
                if (bridge && plain(c, from, to)) || !wire.is_enabled(side(*key, from)) {
                    continue;
                }
                if let Err(e) = wire.disable(side(*key, from)) {
                    self.kernel_failed(broken, "disable a kernel path", e);
                }
            }
        }
        if !gone.is_empty() {
            let (keys, gone): (Vec<_>, Vec<_>) = gone.into_iter().unzip();
            let counts = Wire::take_down(gone);
            for (key, n) in keys.into_iter().zip(counts) {
                for (from, to) in [(key.0, key.1), (key.1, key.0)] {
                    self.fold_kernel_count(c, from, to, n[side(key, from)]);
                }
            }
        }
        if *broken || !bridge {
            return;
        }
        for (key, wire) in wires.iter_mut() {
            for (from, to) in [(key.0, key.1), (key.1, key.0)] {
                if !plain(c, from, to) || wire.is_enabled(side(*key, from)) {
                    continue;
                }
                // Enabling is a speed-up, each one a thread entering the
                // TAP's namespace and four rtnetlink round trips under the
                // control lock: a caller waiting for the lock goes first,
                // and the builder enables the rest after it. Until then
                // those directions cross the switch, which is always right.
                if self.control_wanted() {
                    self.requests.kick();
                    return;
                }
                if let Err(e) = wire.enable(side(*key, from)) {
                    return self.kernel_failed(broken, "enable a kernel path", e);
                }
            }
        }
        // A wanted pair without a wire that a change made plain: the
        // builder builds it.
        if wanted.iter().any(|key| {
            !wires.contains_key(key) && (plain(c, key.0, key.1) || plain(c, key.1, key.0))
        }) {
            self.requests.kick();
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
        self.settle_kernel();
        let k = self.kernel_lock();
        let mine: Vec<_> = k
            .wires
            .iter()
            .filter(|(key, _)| key.0 == port || key.1 == port)
            .collect();
        let counts = Wire::counts(&mine.iter().map(|(_, w)| *w).collect::<Vec<_>>());
        let (mut sent, mut received) = (WireCount::default(), WireCount::default());
        for ((key, _), n) in mine.iter().zip(counts) {
            let s = side(**key, port);
            sent.packets += n[s].packets;
            sent.bytes += n[s].bytes;
            received.packets += n[1 - s].packets;
            received.bytes += n[1 - s].bytes;
        }
        (sent, received)
    }

    /// What the current wires forwarded over their lives, in wire packets.
    pub(super) fn kernel_packets(&self) -> u64 {
        self.settle_kernel();
        let k = self.kernel_lock();
        let wires: Vec<&Wire> = k.wires.values().collect();
        Wire::counts(&wires)
            .iter()
            .map(|n| n[0].packets + n[1].packets)
            .sum()
    }

    /// Directions the kernel forwards now, as (from, to) port names.
    pub(super) fn kernel_directions(&self, c: &Control) -> Vec<(String, String)> {
        let k = self.kernel_lock();
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
