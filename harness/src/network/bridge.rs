//! The bridge: one switch of the file's virtual network, its members (VMs
//! or bare names) and their NICs, its routes; and a VM's side of the
//! attachment ([`NetMember`], [`VmLinks`]). The two hold each other (a
//! bridge its members, a VM weakly its bridges), so they share this module.
//! Joining a bridge is [`super::membership`], making a member's NIC
//! [`super::realise`], closing [`super::lifetime`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use provium_netsetup::{
    Capture, MacAddr, PortCounters, Switch, SwitchConfig, TapPoller, TapPort, Uplink,
};

use super::capture::{LiveCapture, LiveCaptures};
use super::error::NetworkError;
use super::member::MemberVm;
use super::BridgeOpts;
use crate::backend::Guest;
use crate::lock::Locked;
use crate::runner::{CloseKind, FileEnv};

/// A bridge handle; clones share the bridge.
#[derive(Clone)]
pub struct Bridge(pub(super) Arc<BridgeInner>);

/// A bridge reference that does not keep it alive (held by VMs, so a VM and
/// its bridges never form a cycle).
#[derive(Clone)]
pub struct WeakBridge(Weak<BridgeInner>);

pub(super) struct BridgeInner {
    pub(super) name: String,
    pub(super) env: Arc<FileEnv>,
    pub(super) switch: Switch,
    pub(super) state: Mutex<BridgeState>,
    /// Open `bridge:capture()` streams. They block snapshots of every VM on
    /// this bridge, as a `nic:capture()` stream blocks its VM's.
    pub(super) captures: LiveCaptures,
}

#[derive(Default)]
pub(super) struct BridgeState {
    pub(super) members: BTreeMap<String, Member>,
    pub(super) uplink: Option<UplinkLink>,
    pub(super) closed: bool,
    /// `bridge:route` targets (bridge names, first-call order, no repeats):
    /// graph state only, as the reference's v1.
    routes: Vec<String>,
    /// The one-shot "routes are not realised" warning was printed.
    route_warned: bool,
    /// The one thread that reads every TAP on this bridge (sandbox NICs and
    /// the uplink), started with the first.
    pub(super) taps: Option<TapPoller>,
    /// The one-shot "a NIC gets no kernel path" warning was printed.
    pub(super) kernel_path_warned: bool,
}

/// The bridge's TAP poller in `taps`, started on first use. A function of
/// the one field, not of the whole state, so a caller can hold a member of
/// `BridgeState::members` while it gets the poller.
pub(super) fn tap_poller(
    taps: &mut Option<TapPoller>,
    bridge: &str,
) -> Result<TapPoller, provium_netsetup::TapError> {
    if let Some(p) = taps {
        return Ok(p.clone());
    }
    let poller = TapPoller::new(bridge).map_err(provium_netsetup::TapError::Spawn)?;
    *taps = Some(poller.clone());
    Ok(poller)
}

pub(super) struct Member {
    /// None for a bare-string attachment (graph-state only).
    pub(super) vm: Option<NetMember>,
    pub(super) mac: MacAddr,
    /// The realised NIC: the guest-side interface name and the host end.
    pub(super) nic: Option<(String, NicEnd)>,
    /// `nic:disconnect()` before the NIC was realised: realise it link-down.
    pub(super) link_down: bool,
}

/// The host end of a realised NIC.
pub(super) enum NicEnd {
    /// Local sandbox: the switch port holding the TAP (a detach or a
    /// closing bridge parks it: the interface stays, link down, see
    /// [`Bridge::detach_name`]).
    Tap {
        /// Held for its drop or its park.
        port: TapPort,
    },
    /// kvm: the port is held by the VM's virtio-net device (attached before
    /// boot by [`Bridge::vmm_port`]); the switch detaches it by name.
    Vmm,
    /// kvm, joined after boot: a NIC slot of the machine plugged into this
    /// switch (`Guest::add_nic`); dropping the lease parks the slot again
    /// (link down in the guest) and its port leaves the switch.
    Slot {
        /// Which NIC slot (what a snapshot records).
        slot: usize,
        /// Held for its drop.
        _lease: crate::backend::DeviceLease,
    },
}

impl NicEnd {
    /// Lets go of the host side, leaving the guest's NIC there with its
    /// link down: a sandbox's TAP is parked ([`TapPort::park`]), a kvm NIC
    /// slot's lease parks the slot as it drops; a kvm NIC from boot holds
    /// nothing here.
    pub(super) fn let_go(self) {
        match self {
            NicEnd::Tap { port } => port.park(),
            other => drop(other),
        }
    }
}

pub(super) struct UplinkLink {
    pub(super) port: TapPort,
    pub(super) uplink: Uplink,
}

impl WeakBridge {
    pub fn upgrade(&self) -> Option<Bridge> {
        self.0.upgrade().map(Bridge)
    }

    pub fn is(&self, b: &Bridge) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(&b.0))
    }
}

impl Bridge {
    /// A new bridge (its switch seeded with the run seed), auto-closed at the
    /// end of the current scope.
    pub fn create(env: &Arc<FileEnv>, name: &str) -> Bridge {
        Bridge::create_with(env, name, BridgeOpts::default())
    }

    /// [`Bridge::create`] with `opts`.
    pub fn create_with(env: &Arc<FileEnv>, name: &str, opts: BridgeOpts) -> Bridge {
        let switch = Switch::new(
            name,
            SwitchConfig {
                run_seed: env.run_seed,
                kernel_path: opts.kernel_path,
                wire_numbers: env.wire_numbers.clone(),
                ..SwitchConfig::default()
            },
        );
        let b = Bridge(Arc::new(BridgeInner {
            name: name.to_owned(),
            env: env.clone(),
            switch,
            state: Mutex::new(BridgeState::default()),
            captures: LiveCaptures::default(),
        }));
        env.register_closeable(CloseKind::Bridge, Arc::new(b.clone()));
        b
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn env(&self) -> &Arc<FileEnv> {
        &self.0.env
    }

    /// The bridge's switch (partitions, impairments, isolation, stats:
    /// the `bridge` userdata calls it directly).
    pub fn switch(&self) -> &Switch {
        &self.0.switch
    }

    pub fn downgrade(&self) -> WeakBridge {
        WeakBridge(Arc::downgrade(&self.0))
    }

    pub fn ptr_eq(&self, other: &Bridge) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, BridgeState> {
        self.0.state.locked()
    }

    /// The state of a bridge that is not closed; `bridge:{method}` is
    /// refused on a closed one.
    pub(super) fn open_state(
        &self,
        method: &'static str,
    ) -> Result<MutexGuard<'_, BridgeState>, NetworkError> {
        let st = self.lock();
        if st.closed {
            return Err(NetworkError::refused(
                method,
                NetworkError::ClosedRefuses {
                    bridge: self.0.name.clone(),
                },
            ));
        }
        Ok(st)
    }

    /// Refuses `bridge:{method}` on a closed bridge.
    pub fn check_open(&self, method: &'static str) -> Result<(), NetworkError> {
        self.open_state(method).map(drop)
    }

    /// The run seed and the bridge seed derived from it.
    pub fn seeds(&self) -> (u64, u64) {
        (self.0.switch.run_seed(), self.0.switch.seed())
    }

    // ---- routes ----

    /// Records `bridge:route` targets (bridge names; repeats are kept
    /// once) and, at the first call on this bridge, warns on stderr that
    /// no traffic is routed (the reference's v1).
    pub fn add_routes(&self, targets: Vec<String>) {
        let mut st = self.lock();
        for t in targets {
            if !st.routes.contains(&t) {
                st.routes.push(t);
            }
        }
        if !std::mem::replace(&mut st.route_warned, true) {
            eprintln!(
                "provium: warning: {}: bridge:route on `{}` records the route only; L3 routing is a \
                 preview and no traffic flows between bridges yet (attach a router VM to both bridges)",
                self.env().rel_path, self.name()
            );
        }
    }

    /// The recorded `bridge:route` targets, in first-call order.
    pub fn routes(&self) -> Vec<String> {
        self.lock().routes.clone()
    }

    /// Sets the recorded routes (a lab restore).
    pub(super) fn set_routes(&self, routes: Vec<String>) {
        self.lock().routes = routes;
    }

    // ---- membership ----

    /// Removes a member; false if absent. Its NIC stays in the guest with
    /// its link down, as the reference's QMP `set_link(false)` left it: a
    /// kvm guest keeps its virtio-net device (no hot-unplug) and is told
    /// link down; a sandbox's TAP is parked (carrier off, the interface and
    /// its name stay until the sandbox ends or a later attach replaces it
    /// with a fresh one, see [`provium_netsetup::TapPort::park`]).
    pub fn detach_name(&self, name: &str) -> bool {
        let removed = self.lock().members.remove(name);
        let Some(m) = removed else { return false };
        if let Some((_, end)) = m.nic {
            // A kvm NIC from boot is held by its device, not by us: the
            // guest is told link down here.
            if matches!(end, NicEnd::Vmm) {
                let _ = self.0.switch.disconnect(name);
            }
            end.let_go();
        }
        let _ = self.0.switch.detach(name);
        if let Some(vm) = m.vm {
            vm.unlink_bridge(self);
        }
        true
    }

    /// Called by `vm:shutdown()`: the VM's NIC and membership go.
    pub fn vm_gone(&self, vm: &NetMember) {
        if self.has_vm(vm) {
            self.detach_name(vm.name());
        }
    }

    /// True when `vm` (this very VM) is a member.
    pub fn has_vm(&self, vm: &NetMember) -> bool {
        self.lock()
            .members
            .get(vm.name())
            .is_some_and(|m| m.vm.as_ref().is_some_and(|v| v.same(vm)))
    }

    pub fn is_member(&self, vm_name: &str) -> bool {
        self.lock().members.contains_key(vm_name)
    }

    pub fn members_sorted(&self) -> Vec<String> {
        self.lock().members.keys().cloned().collect()
    }

    /// Whether `close` ran (a closed bridge takes no member).
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    // ---- NICs ----

    pub(super) fn not_attached(&self, vm: &str) -> NetworkError {
        NetworkError::NotAttached {
            vm: vm.to_owned(),
            bridge: self.0.name.clone(),
        }
    }

    /// Whether `vm_name`'s NIC exists (its VM is booted and attached).
    pub(super) fn is_realised(&self, vm_name: &str) -> bool {
        self.lock()
            .members
            .get(vm_name)
            .is_some_and(|m| m.nic.is_some())
    }

    /// Both ends attached and realised (the directional forms' rule).
    pub fn check_realised(&self, names: &[&str]) -> Result<(), NetworkError> {
        let st = self.lock();
        for n in names {
            match st.members.get(*n) {
                Some(m) if m.nic.is_some() => {}
                Some(_) => {
                    return Err(NetworkError::EndNotBooted {
                        vm: (*n).to_owned(),
                        bridge: self.0.name.clone(),
                    })
                }
                None => {
                    return Err(NetworkError::EndNotAttached {
                        vm: (*n).to_owned(),
                        bridge: self.0.name.clone(),
                    })
                }
            }
        }
        Ok(())
    }

    /// The guest-side interface name of `vm_name`'s realised NIC.
    pub fn ifname_of(&self, vm_name: &str) -> Option<String> {
        self.lock()
            .members
            .get(vm_name)
            .and_then(|m| m.nic.as_ref().map(|(n, _)| n.clone()))
    }

    pub fn mac_of(&self, vm_name: &str) -> Option<MacAddr> {
        self.lock().members.get(vm_name).map(|m| m.mac)
    }

    /// Counters of `vm_name`'s NIC (guest's perspective); zeros when not
    /// realised.
    pub fn counters(&self, vm_name: &str) -> PortCounters {
        if !self.is_realised(vm_name) {
            return PortCounters::default();
        }
        self.0.switch.counters(vm_name).unwrap_or_default()
    }

    /// Link down (`up == false`) or up for `vm_name`'s NIC; recorded for a
    /// NIC not realised yet.
    pub fn set_link(&self, vm_name: &str, up: bool) -> Result<(), NetworkError> {
        let mut st = self.lock();
        let Some(m) = st.members.get_mut(vm_name) else {
            return Err(self.not_attached(vm_name));
        };
        m.link_down = !up;
        if m.nic.is_some() {
            if up {
                self.0.switch.reconnect(vm_name)?;
            } else {
                self.0.switch.disconnect(vm_name)?;
            }
        }
        Ok(())
    }

    pub fn is_connected(&self, vm_name: &str) -> bool {
        let st = self.lock();
        match st.members.get(vm_name) {
            Some(m) if m.nic.is_some() => self.0.switch.is_connected(vm_name).unwrap_or(false),
            Some(m) => !m.link_down,
            None => false,
        }
    }

    // ---- captures ----

    /// A capture of `vm_name`'s NIC; errors when it is not realised.
    pub fn capture_nic(&self, vm_name: &str, label: &str) -> Result<Capture, NetworkError> {
        if !self.is_realised(vm_name) {
            return Err(NetworkError::NoTap {
                vm: vm_name.to_owned(),
                bridge: self.name().to_owned(),
            });
        }
        Ok(self.switch().capture_port(vm_name, label)?)
    }

    /// Labels (creation sites) of live captures on this bridge.
    pub fn live_captures(&self) -> Vec<String> {
        self.switch().live_captures()
    }

    /// Keeps an open `bridge:capture()` stream, so each VM on this bridge
    /// counts it as its own ([`Bridge::live_capture_labels`]).
    pub fn add_live_capture(&self, c: Arc<dyn LiveCapture>) {
        self.0.captures.add(c);
    }

    /// This bridge's open `bridge:capture()` streams, as a VM's open
    /// streams list them (they count as live streams of every VM on the
    /// bridge).
    pub fn live_capture_labels(&self) -> Vec<String> {
        self.0.captures.labels()
    }
}

/// The bridges one VM is attached to and those it was on when it last shut
/// down (weak: bridges hold their members, so a VM and its bridges never
/// form a cycle).
#[derive(Default)]
pub struct VmLinks {
    on: Mutex<Vec<WeakBridge>>,
    /// A restore from a snapshot with NICs on them joins them again.
    left: Mutex<Vec<WeakBridge>>,
}

/// A VM as its bridges see it: the VM and its attachment records.
#[derive(Clone)]
pub struct NetMember {
    vm: Arc<dyn MemberVm>,
    links: Arc<VmLinks>,
}

impl NetMember {
    pub fn new(vm: Arc<dyn MemberVm>, links: Arc<VmLinks>) -> NetMember {
        NetMember { vm, links }
    }

    pub fn name(&self) -> &str {
        self.vm.name()
    }

    pub fn is_booted(&self) -> bool {
        self.vm.is_booted()
    }

    pub fn is_gone(&self) -> bool {
        self.vm.is_gone()
    }

    pub fn running_machine(&self) -> Option<Arc<dyn Guest>> {
        self.vm.running_machine()
    }

    /// True when both are the same VM.
    pub fn same(&self, other: &NetMember) -> bool {
        self.vm.same_vm(other.vm.as_ref())
    }

    /// Records that this VM is attached to `b` (called by the bridge).
    pub(super) fn link_bridge(&self, b: &Bridge) {
        let mut bs = self.links.on.locked();
        bs.retain(|w| w.upgrade().is_some());
        if !bs.iter().any(|w| w.is(b)) {
            bs.push(b.downgrade());
        }
    }

    /// Forgets the attachment to `b` (called by the bridge).
    pub(super) fn unlink_bridge(&self, b: &Bridge) {
        self.links.on.locked().retain(|w| !w.is(b));
    }

    /// The live bridges this VM is attached to.
    pub fn bridges(&self) -> Vec<Bridge> {
        let bs = self.links.on.locked().clone();
        bs.iter().filter_map(WeakBridge::upgrade).collect()
    }

    /// The live bridges this VM was on when it last shut down (until a
    /// restore puts it back).
    pub fn left_bridges(&self) -> Vec<Bridge> {
        let bs = self.links.left.locked().clone();
        bs.iter().filter_map(WeakBridge::upgrade).collect()
    }

    /// Called by `vm:shutdown()`: remembers the bridges it is on as the
    /// ones it left, then leaves every one.
    pub fn leave_all(&self) {
        let on: Vec<WeakBridge> = self.bridges().iter().map(Bridge::downgrade).collect();
        if !on.is_empty() {
            *self.links.left.locked() = on;
        }
        for b in self.bridges() {
            b.vm_gone(self);
        }
    }

    /// A restore put the VM back: it has left nothing.
    pub fn forget_left(&self) {
        self.links.left.locked().clear();
    }
}

/// `vm`'s live bridges, sorted by name (the guest-name order).
pub fn sorted_bridges(vm: &NetMember) -> Vec<Bridge> {
    let mut bs: Vec<Bridge> = vm.bridges().into_iter().filter(|b| b.has_vm(vm)).collect();
    bs.sort_by(|a, b| a.name().cmp(b.name()));
    bs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::test_env::env;

    #[test]
    fn the_run_seed_reaches_the_switch() {
        let b = Bridge::create(&env(99), "lan");
        assert_eq!(
            b.seeds(),
            (99, provium_netsetup::impair::bridge_seed(99, "lan"))
        );
    }
}
