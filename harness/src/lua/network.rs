//! The file's virtual networks below the Lua API: a bridge's switch and
//! members ([`Bridge`]), each VM's attachment records ([`VmLinks`], seen by
//! a bridge as a [`NetMember`]), and the VM side of networking: which guest
//! interface a bridge gets, realising NICs at boot, and the virtio-net
//! ports of a kvm boot or restore. The `bridge` and `nic` userdata are thin
//! Lua faces over this module; neither imports the other's internals.
//!
//! # Declared vs realised
//! `bridge:attach(vm)` records a member (the graph). A member is *realised*
//! when its VM is booted: the backend creates the guest's NIC (local: a TAP
//! inside the sandbox's network namespace, see
//! `backend::local::net`) and the switch holds its fd as a port named after
//! the VM. A VM attached before boot is realised by `vm:boot()`; one attached
//! while booted is realised at once. Shutting a VM down removes its member.
//!
//! Partitions, isolation and impairments live in the switch, keyed by VM
//! name, so symmetric partitions and isolation can be declared before a VM
//! is realised. Directional forms need both ends realised, as the reference
//! says (the rule would otherwise wait for a port that may never come).
//!
//! # Guest interface names
//! The naming and MAC rules are Lua-free, in [`crate::network`]. A VM
//! attached before boot gets exactly the rule names; one attached while
//! booted gets its rule name if free, else the lowest free `ethN`;
//! `nic:ifname()` tells the real name. `vm:nic("eth1")` always follows the
//! rule (the Nth bridge by name); prefer `vm:nic("bridge_name")`.
//!
//! # Locking
//! The bridge's state lock may take a VM's state lock (its phase); VM code
//! never calls into a bridge while holding its own state lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use mlua::Lua;
use provium_netsetup::{
    disable_uplink, enable_uplink, Capture, MacAddr, PortCounters, Switch, SwitchConfig, Tap,
    TapPoller, TapPort, Uplink, UplinkEnv,
};

use super::capture::CaptureSource;
use super::phase::Phase;
use super::snapshot::{NicDecl, SlotNicDecl};
use super::stream::{creation_site, Stream};
use super::vm_ctx::VmCtx;
use super::{err, rust_err};
use crate::backend::{lone_port, plan_nics, BackendError, Guest, NicSource, NicSpec};
use crate::lock::Locked;
pub use crate::network::{nic_mac, BridgeOpts, DEFAULT_UPLINK_ADDR, UPLINK_PORT};
use crate::runner::{CloseKind, Closeable, FileEnv};

/// Why a bridge or a VM's attachment refused, each naming the bridge or VM
/// and the fix. The layers below (switch, TAP, uplink, backend) come as
/// sources, or transparently where their message is the whole story.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("bridge `{bridge}` is closed")]
    Closed { bridge: String },
    /// A restore wants a member on a closed bridge.
    #[error("bridge `{bridge}` is closed; create another with lab:bridge(name)")]
    ClosedForRestore { bridge: String },
    #[error("vm `{vm}` is not attached to bridge `{bridge}`")]
    NotAttached { vm: String, bridge: String },
    #[error("vm `{vm}` has no running machine")]
    NoMachine { vm: String },
    #[error(
        "vm `{other}` on bridge `{bridge}` already has MAC {mac}, the snapshot's NIC's; \
         detach it (bridge:detach) or restore under another VM name"
    )]
    MacTaken {
        other: String,
        bridge: String,
        mac: MacAddr,
    },
    #[error("vm `{vm}` already has a live NIC on bridge `{bridge}`")]
    LiveNic { vm: String, bridge: String },
    #[error("a vm named `{vm}` is already attached to bridge `{bridge}`; detach it first")]
    NameTaken { vm: String, bridge: String },
    /// A Lua-facing refusal of `bridge:attach` (the Lua error, typed).
    #[error(transparent)]
    Refused(crate::script_error::ScriptError),
    #[error("drop rate")]
    DropRate(#[source] provium_netsetup::SwitchError),
    #[error("drop rate {from} -> {to}")]
    PairDropRate {
        from: String,
        to: String,
        #[source]
        source: provium_netsetup::SwitchError,
    },
    /// The snapshot's NICs do not fit the VM's bridges (its text is the
    /// whole story).
    #[error(transparent)]
    Plan(#[from] crate::backend::NicPlanError),
    #[error("cannot create its NIC on bridge `{bridge}`")]
    CreateNic {
        bridge: String,
        #[source]
        source: Box<NetworkError>,
    },
    #[error("bridge:disable_uplink: bridge `{bridge}`")]
    DisableUplink {
        bridge: String,
        #[source]
        source: provium_netsetup::UplinkError,
    },
    #[error(transparent)]
    Mac(#[from] super::snapshot::DeclError),
    #[error(transparent)]
    Guest(#[from] BackendError),
    #[error(transparent)]
    Switch(#[from] provium_netsetup::SwitchError),
    #[error(transparent)]
    Tap(#[from] provium_netsetup::TapError),
}

/// A network error raised into Lua, its chain flattened.
impl From<NetworkError> for mlua::Error {
    fn from(e: NetworkError) -> Self {
        err(crate::error_chain::flatten(&e))
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

/// A VM as its bridges see it: its context and its attachment records.
#[derive(Clone)]
pub struct NetMember {
    ctx: VmCtx,
    links: Arc<VmLinks>,
}

impl NetMember {
    pub fn new(ctx: VmCtx, links: Arc<VmLinks>) -> NetMember {
        NetMember { ctx, links }
    }

    pub fn ctx(&self) -> &VmCtx {
        &self.ctx
    }

    pub fn name(&self) -> &str {
        self.ctx.name()
    }

    pub fn phase(&self) -> Phase {
        self.ctx.phase()
    }

    /// True when both are the same VM.
    pub fn same(&self, other: &NetMember) -> bool {
        self.ctx.same(&other.ctx)
    }

    /// Records that this VM is attached to `b` (called by the bridge).
    fn link_bridge(&self, b: &Bridge) {
        let mut bs = self.links.on.locked();
        bs.retain(|w| w.upgrade().is_some());
        if !bs.iter().any(|w| w.is(b)) {
            bs.push(b.downgrade());
        }
    }

    /// Forgets the attachment to `b` (called by the bridge).
    fn unlink_bridge(&self, b: &Bridge) {
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

/// A bridge handle; clones share the bridge.
#[derive(Clone)]
pub struct Bridge(Arc<BridgeInner>);

/// A bridge reference that does not keep it alive (held by VMs, so a VM and
/// its bridges never form a cycle).
#[derive(Clone)]
pub struct WeakBridge(Weak<BridgeInner>);

struct BridgeInner {
    name: String,
    env: Arc<FileEnv>,
    switch: Switch,
    state: Mutex<BridgeState>,
    /// Open `bridge:capture()` streams. They block snapshots of every VM on
    /// this bridge, as a `nic:capture()` stream blocks its VM's. A lock of
    /// its own: a VM reads it while holding its state lock.
    captures: Mutex<Vec<Stream>>,
}

#[derive(Default)]
pub(super) struct BridgeState {
    members: BTreeMap<String, Member>,
    uplink: Option<UplinkLink>,
    closed: bool,
    /// `bridge:route` targets (bridge names, first-call order, no repeats):
    /// graph state only, as the reference's v1.
    pub(super) routes: Vec<String>,
    /// The one-shot "routes are not realised" warning was printed.
    pub(super) route_warned: bool,
    /// The one thread that reads every TAP on this bridge (sandbox NICs and
    /// the uplink), started with the first.
    taps: Option<TapPoller>,
    /// The one-shot "a NIC gets no kernel path" warning was printed.
    kernel_path_warned: bool,
}

/// The bridge's TAP poller in `taps`, started on first use. A function of
/// the one field, not of the whole state, so a caller can hold a member of
/// `BridgeState::members` while it gets the poller.
fn tap_poller(
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

struct Member {
    /// None for a bare-string attachment (graph-state only).
    vm: Option<NetMember>,
    mac: MacAddr,
    /// The realised NIC: the guest-side interface name and the host end.
    nic: Option<(String, NicEnd)>,
    /// `nic:disconnect()` before the NIC was realised: realise it link-down.
    link_down: bool,
}

/// The host end of a realised NIC.
enum NicEnd {
    /// Local sandbox: the switch port holding the TAP (dropping it detaches
    /// the port and removes the interface from the guest).
    Tap {
        /// Held for its drop.
        _port: TapPort,
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

struct UplinkLink {
    port: TapPort,
    uplink: Uplink,
}

impl Closeable for Bridge {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        self.close()
            .map_err(|e| crate::error_chain::flatten(&e).into())
    }
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
            captures: Mutex::new(Vec::new()),
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

    /// Whether the uplink is enabled.
    pub(super) fn has_uplink(&self) -> bool {
        self.lock().uplink.is_some()
    }

    /// The bridge's switch (for the `bridge` userdata's methods).
    pub(super) fn switch(&self) -> &Switch {
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

    pub(super) fn open_state(&self, method: &str) -> mlua::Result<MutexGuard<'_, BridgeState>> {
        let st = self.lock();
        if st.closed {
            return Err(err(format!(
                "bridge:{method}: bridge `{}` is closed; create another with lab:bridge(name)",
                self.0.name
            )));
        }
        Ok(st)
    }

    /// The run seed and the bridge seed derived from it.
    pub fn seeds(&self) -> (u64, u64) {
        (self.0.switch.run_seed(), self.0.switch.seed())
    }

    // ---- lab snapshots ----

    /// This bridge as a lab snapshot records it (`lab_path`: where it sits
    /// below the snapshotted lab): attachments, partitions, isolation,
    /// impairments and routes.
    pub fn record(&self, lab_path: &[String]) -> provium_snapshot::LabBridge {
        use provium_snapshot::{LabImpairment, LabPairImpairment};
        let sw = &self.0.switch;
        let imp = |i: &provium_netsetup::Impairment| LabImpairment {
            latency_ns: i
                .latency
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            drop_pct: i.drop_pct,
            bandwidth_bps: i.bandwidth_bps,
        };
        let whole = provium_netsetup::Impairment {
            latency: sw.latency(),
            drop_pct: sw.drop_rate_pct(),
            bandwidth_bps: sw.bandwidth_bps(),
        };
        let st = self.lock();
        provium_snapshot::LabBridge {
            lab_path: lab_path.to_vec(),
            name: self.0.name.clone(),
            members: st.members.keys().cloned().collect(),
            partitions: sw.partitions(),
            isolated: sw.isolated(),
            impairment: imp(&whole),
            pair_impairments: sw
                .pair_impairments()
                .into_iter()
                .map(|((from, to), i)| LabPairImpairment {
                    from,
                    to,
                    impairment: imp(&i),
                })
                .collect(),
            routes: st.routes.clone(),
        }
    }

    /// Puts a recorded bridge's graph state back: recorded attachments this
    /// bridge lacks come back as bare names (a recorded VM joins through
    /// its own restore), and partitions, isolation, impairments and routes
    /// become exactly the recorded ones.
    pub fn apply_record(
        &self,
        rec: &provium_snapshot::LabBridge,
        vm_names: &[String],
    ) -> Result<(), NetworkError> {
        let to_imp = |i: &provium_snapshot::LabImpairment| provium_netsetup::Impairment {
            latency: i.latency_ns.map(std::time::Duration::from_nanos),
            drop_pct: i.drop_pct,
            bandwidth_bps: i.bandwidth_bps,
        };
        let missing: Vec<(String, Option<NetMember>)> = {
            let st = self
                .open_state("restore")
                .map_err(|e| NetworkError::Refused(crate::script_error::ScriptError(e)))?;
            rec.members
                .iter()
                .filter(|m| !st.members.contains_key(*m) && !vm_names.contains(m))
                .map(|m| (m.clone(), None))
                .collect()
        };
        if !missing.is_empty() {
            self.attach_all(missing)
                .map_err(|e| NetworkError::Refused(crate::script_error::ScriptError(e)))?;
        }
        let sw = &self.0.switch;
        // reset(): no impairment, no partition (isolation is kept).
        sw.reset();
        let whole = to_imp(&rec.impairment);
        sw.set_latency(whole.latency.unwrap_or_default());
        sw.set_drop_rate(whole.drop_pct.unwrap_or(0.0))
            .map_err(NetworkError::DropRate)?;
        sw.set_bandwidth(whole.bandwidth_bps.unwrap_or(0));
        for p in &rec.pair_impairments {
            let i = to_imp(&p.impairment);
            if let Some(l) = i.latency {
                sw.set_pair_latency(&p.from, &p.to, l);
            }
            if let Some(d) = i.drop_pct {
                sw.set_pair_drop_rate(&p.from, &p.to, d).map_err(|source| {
                    NetworkError::PairDropRate {
                        from: p.from.clone(),
                        to: p.to.clone(),
                        source,
                    }
                })?;
            }
            if let Some(b) = i.bandwidth_bps {
                sw.set_pair_bandwidth(&p.from, &p.to, b);
            }
        }
        // Symmetric inserts need no attached ports; then drop the reverse
        // directions that were not recorded.
        for (a, b) in &rec.partitions {
            sw.partition(a, b);
        }
        for (a, b) in &rec.partitions {
            if !rec.partitions.contains(&(b.clone(), a.clone())) {
                sw.unpartition_directional(b, a);
            }
        }
        for n in sw.isolated() {
            if !rec.isolated.contains(&n) {
                sw.unisolate(&n);
            }
        }
        for n in &rec.isolated {
            sw.isolate(n);
        }
        self.lock().routes = rec.routes.clone();
        Ok(())
    }

    // ---- membership ----

    /// Attaches `vm` (a local restore re-joining the bridges its sandbox
    /// was on); a no-op when it is a member already.
    pub fn attach_vm(&self, vm: &NetMember) -> Result<(), NetworkError> {
        if self.has_vm(vm) {
            return Ok(());
        }
        self.attach_all(vec![(vm.name().to_string(), Some(vm.clone()))])
            .map_err(|e| NetworkError::Refused(crate::script_error::ScriptError(e)))
    }

    /// Attaches every item, or none: all are validated and recorded first,
    /// then booted VMs are realised; any failure undoes the whole call.
    pub(super) fn attach_all(&self, items: Vec<(String, Option<NetMember>)>) -> mlua::Result<()> {
        let mut added: Vec<(String, Option<NetMember>)> = Vec::new();
        {
            let mut st = self.open_state("attach")?;
            let mut seen: Vec<&str> = Vec::new();
            for (name, vm) in &items {
                if seen.contains(&name.as_str()) {
                    return Err(err(format!(
                        "bridge:attach: `{name}` appears twice in the list"
                    )));
                }
                seen.push(name);
                if let Some(m) = st.members.get(name) {
                    let same = match (&m.vm, vm) {
                        (Some(a), Some(b)) => a.same(b),
                        (None, None) => true,
                        _ => false,
                    };
                    let stale =
                        m.vm.as_ref()
                            .is_some_and(|v| matches!(v.phase(), Phase::Shutdown | Phase::Dead));
                    if !same && !stale {
                        return Err(err(format!(
                            "bridge:attach: a vm named `{name}` is already attached to bridge `{}`; detach it first",
                            self.0.name
                        )));
                    }
                }
            }
            for (name, vm) in items {
                if let Some(m) = st.members.get(&name) {
                    let same = match (&m.vm, &vm) {
                        (Some(a), Some(b)) => a.same(b),
                        (None, None) => true,
                        _ => false,
                    };
                    if same {
                        continue; // already attached: attach is idempotent
                    }
                    st.members.remove(&name);
                    let _ = self.0.switch.detach(&name);
                }
                let taken: Vec<MacAddr> = st.members.values().map(|m| m.mac).collect();
                let mac = nic_mac(&name, &self.0.name, &taken);
                st.members.insert(
                    name.clone(),
                    Member {
                        vm: vm.clone(),
                        mac,
                        nic: None,
                        link_down: false,
                    },
                );
                added.push((name, vm));
            }
        }
        for (_, vm) in &added {
            if let Some(vm) = vm {
                vm.link_bridge(self);
            }
        }
        for (name, vm) in &added {
            let Some(vm) = vm else { continue };
            if vm.phase() != Phase::Booted {
                continue;
            }
            if let Err(e) = realise_on(vm, self) {
                for (n, _) in &added {
                    self.detach_name(n);
                }
                return Err(err(format!(
                    "bridge:attach: bridge `{}`: vm `{name}`: {}; nothing was attached",
                    self.0.name,
                    crate::error_chain::flatten(&e)
                )));
            }
        }
        Ok(())
    }

    /// Removes a member (its NIC disappears from the guest); false if absent.
    pub(super) fn detach_name(&self, name: &str) -> bool {
        let removed = self.lock().members.remove(name);
        let Some(m) = removed else { return false };
        // Dropping the TAP port detaches it and closes the fd, which removes
        // the interface from the guest. A kvm guest keeps its virtio-net
        // device (no hot-unplug), so it is told link down first.
        if matches!(m.nic, Some((_, NicEnd::Vmm))) {
            let _ = self.0.switch.disconnect(name);
        }
        drop(m.nic);
        let _ = self.0.switch.detach(name);
        if let Some(vm) = m.vm {
            vm.unlink_bridge(self);
        }
        true
    }

    /// Called by `vm:shutdown()`: the VM's NIC and membership go.
    pub fn vm_gone(&self, vm: &NetMember) {
        let is_member = self
            .lock()
            .members
            .get(vm.name())
            .is_some_and(|m| m.vm.as_ref().is_some_and(|v| v.same(vm)));
        if is_member {
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

    pub fn is_member(&self, vm_name: &str) -> bool {
        self.lock().members.contains_key(vm_name)
    }

    /// Realises `vm`'s NIC as guest interface `ifname` on `machine`; a no-op
    /// when already realised.
    pub fn realise(
        &self,
        vm: &NetMember,
        machine: &dyn Guest,
        ifname: &str,
    ) -> Result<(), NetworkError> {
        let mut st = self.lock();
        if st.closed {
            return Err(NetworkError::Closed {
                bridge: self.0.name.clone(),
            });
        }
        let name = vm.name();
        let BridgeState {
            members,
            taps,
            kernel_path_warned,
            ..
        } = &mut *st;
        let Some(m) = members.get_mut(name) else {
            return Err(self.not_attached(name));
        };
        if m.nic.is_some() {
            return Ok(());
        }
        let mac = m.mac;
        let mut ifname = ifname.to_owned();
        let caps = machine.capabilities();
        let end = if caps.has_vmm_nics() && self.0.switch.port_mac(name).is_ok() {
            // The virtio-net device got its port before boot (`vmm_port`).
            NicEnd::Vmm
        } else if caps.has_vmm_nics() && caps.nics_after_boot.is_yes() {
            // A running kvm guest: one of its NIC slots (made at boot, with
            // its own MAC) gets a port on this switch.
            let switch = &self.0.switch;
            // The member keeps its own MAC (vm, bridge): the backend gives
            // the guest interface the port's.
            let added = machine.add_nic(&ifname, &mut |_slot_mac| {
                Ok(Arc::new(switch.attach(name, mac)?))
            })?;
            ifname = added.ifname.clone();
            NicEnd::Slot {
                slot: added.slot,
                _lease: added.lease,
            }
        } else {
            let poller = tap_poller(taps, &self.0.name)?;
            let fd = machine.open_nic(&ifname, mac)?;
            let port = TapPort::attach_on(&poller, &self.0.switch, name, mac, fd)?;
            // The kernel forwards this NIC's plain directions to the other
            // sandboxes' (docs/networking.md, "The kernel path"). Without
            // it traffic still flows, through the switch.
            if let Err(e) = port.offer_kernel_path() {
                if !std::mem::replace(kernel_path_warned, true) {
                    eprintln!(
                        "provium: warning: bridge `{}`: vm `{name}`'s NIC gets no kernel path, \
                         so its traffic goes through the userspace switch: {}",
                        self.0.name,
                        crate::error_chain::flatten(&e)
                    );
                }
            }
            NicEnd::Tap { _port: port }
        };
        if m.link_down {
            let _ = self.0.switch.disconnect(name);
        }
        m.nic = Some((ifname, end));
        Ok(())
    }

    /// For a restore: `vm`'s member takes the NIC slot the machine plugged
    /// back into this bridge's port ([`restore_slot_ports`]), as its
    /// realised NIC; the lease parks the slot when the member goes.
    pub fn adopt_slot_nic(&self, vm: &NetMember, added: crate::backend::AddedNic) {
        let mut st = self.lock();
        if let Some(m) = st.members.get_mut(vm.name()) {
            m.nic = Some((
                added.ifname,
                NicEnd::Slot {
                    slot: added.slot,
                    _lease: added.lease,
                },
            ));
        }
    }

    /// The NIC slot `vm`'s realised NIC on this bridge is in, if it joined
    /// after boot.
    fn slot_of(&self, vm: &NetMember) -> Option<usize> {
        match self.lock().members.get(vm.name())?.nic {
            Some((_, NicEnd::Slot { slot, .. })) => Some(slot),
            _ => None,
        }
    }

    /// Whether `close` ran (a closed bridge takes no member).
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// For a restore: makes `vm` a member with the snapshot's `mac` (the
    /// restored guest has it cached), link down when `connected` is
    /// `Some(false)`. A member that is already this VM keeps its link
    /// state and takes `mac`; a member of that name that is another VM
    /// which is shut down or dead is replaced. Errors (nothing changed)
    /// when the bridge is closed, a live VM of that name is attached, or
    /// another member has the MAC. Returns whether a member was added.
    /// The VM is not realised here: the restore does it.
    pub fn restore_member(
        &self,
        vm: &NetMember,
        mac: MacAddr,
        connected: Option<bool>,
    ) -> Result<bool, NetworkError> {
        let name = vm.name();
        let mut st = self.lock();
        if st.closed {
            return Err(NetworkError::ClosedForRestore {
                bridge: self.0.name.clone(),
            });
        }
        if let Some((other, _)) = st
            .members
            .iter()
            .find(|(n, m)| n.as_str() != name && m.mac == mac)
        {
            return Err(NetworkError::MacTaken {
                other: other.clone(),
                bridge: self.0.name.clone(),
                mac,
            });
        }
        let mut replace = false;
        if let Some(m) = st.members.get_mut(name) {
            match &m.vm {
                Some(v) if v.same(vm) => {
                    if m.nic.is_some() {
                        return Err(NetworkError::LiveNic {
                            vm: name.to_owned(),
                            bridge: self.0.name.clone(),
                        });
                    }
                    m.mac = mac;
                    return Ok(false);
                }
                Some(v) if matches!(v.phase(), Phase::Shutdown | Phase::Dead) => replace = true,
                _ => {
                    return Err(NetworkError::NameTaken {
                        vm: name.to_owned(),
                        bridge: self.0.name.clone(),
                    })
                }
            }
        }
        if replace {
            if let Some(old) = st.members.remove(name) {
                drop(old.nic);
                let _ = self.0.switch.detach(name);
                if let Some(v) = old.vm {
                    drop(st);
                    v.unlink_bridge(self);
                    st = self.lock();
                }
            }
        }
        st.members.insert(
            name.to_owned(),
            Member {
                vm: Some(vm.clone()),
                mac,
                nic: None,
                link_down: connected == Some(false),
            },
        );
        drop(st);
        vm.link_bridge(self);
        Ok(true)
    }

    /// For a kvm VM about to boot: attaches the switch port its virtio-net
    /// device will hold (named after the VM, with the member's MAC) and
    /// returns the device's config. A NIC disconnected before boot starts
    /// with its link down. `vm:boot()` realises the member afterwards.
    pub fn vmm_port(&self, vm: &NetMember) -> Result<NicSpec, NetworkError> {
        let st = self.lock();
        if st.closed {
            return Err(NetworkError::Closed {
                bridge: self.0.name.clone(),
            });
        }
        let name = vm.name();
        let m = st
            .members
            .get(name)
            .ok_or_else(|| self.not_attached(name))?;
        let port = self.0.switch.attach(name, m.mac)?;
        if m.link_down {
            let _ = self.0.switch.disconnect(name);
        }
        Ok(NicSpec::on_port(Arc::new(port)))
    }

    /// Both ends attached and realised (the directional forms' rule).
    pub(super) fn check_realised(&self, method: &str, names: &[&str]) -> mlua::Result<()> {
        let st = self.lock();
        for n in names {
            match st.members.get(*n) {
                Some(m) if m.nic.is_some() => {}
                Some(_) => {
                    return Err(err(format!(
                        "bridge:{method}: vm `{n}` is attached to bridge `{}` but not booted; \
                         directional rules need both ends booted (call vm:boot() first)",
                        self.0.name
                    )))
                }
                None => {
                    return Err(err(format!(
                        "bridge:{method}: vm `{n}` is not attached to bridge `{}`; call bridge:attach first",
                        self.0.name
                    )))
                }
            }
        }
        Ok(())
    }

    // ---- NICs ----

    fn not_attached(&self, vm: &str) -> NetworkError {
        NetworkError::NotAttached {
            vm: vm.to_owned(),
            bridge: self.0.name.clone(),
        }
    }

    /// Whether `vm_name`'s NIC exists (its VM is booted and attached).
    fn is_realised(&self, vm_name: &str) -> bool {
        self.lock()
            .members
            .get(vm_name)
            .is_some_and(|m| m.nic.is_some())
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
    pub fn set_link(&self, method: &str, vm_name: &str, up: bool) -> mlua::Result<()> {
        let mut st = self.lock();
        let Some(m) = st.members.get_mut(vm_name) else {
            return Err(err(format!(
                "nic:{method}: vm `{vm_name}` is not attached to bridge `{}`",
                self.0.name
            )));
        };
        m.link_down = !up;
        if m.nic.is_some() {
            let r = if up {
                self.0.switch.reconnect(vm_name)
            } else {
                self.0.switch.disconnect(vm_name)
            };
            r.map_err(|e| rust_err(&format!("nic:{method}"), &e))?;
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

    /// A capture of `vm_name`'s NIC; errors when it is not realised.
    pub fn capture_nic(&self, vm_name: &str, label: &str) -> mlua::Result<Capture> {
        if !self.is_realised(vm_name) {
            return Err(err(format!(
                "nic:capture: vm `{vm_name}` has no TAP on bridge `{}` (not booted?). Call lab:boot() / vm:boot() first.",
                self.0.name
            )));
        }
        self.0
            .switch
            .capture_port(vm_name, label)
            .map_err(|e| rust_err("nic:capture", &e))
    }

    /// Labels (creation sites) of live captures on this bridge.
    pub fn live_captures(&self) -> Vec<String> {
        self.0.switch.live_captures()
    }

    // ---- uplink ----

    pub(super) fn enable_uplink(&self, addr: &str) -> mlua::Result<()> {
        let mut st = self.open_state("enable_uplink")?;
        if st.uplink.is_some() {
            return Ok(());
        }
        let tap_name = crate::network::uplink_tap_name(&self.0.name, std::process::id());
        let fail = |what: String| {
            err(format!(
                "bridge:enable_uplink: bridge `{}`: {what}",
                self.0.name
            ))
        };
        let tap = Tap::open(&tap_name).map_err(|e| fail(crate::error_chain::flatten(&e)))?;
        let mac = nic_mac(UPLINK_PORT, &self.0.name, &[]);
        let poller = tap_poller(&mut st.taps, &self.0.name)
            .map_err(|e| fail(crate::error_chain::flatten(&e)))?;
        let port = TapPort::attach_on(&poller, &self.0.switch, UPLINK_PORT, mac, tap.into_fd())
            .map_err(|e| fail(crate::error_chain::flatten(&e)))?;
        // The PATH `Settings` read once, not the process's now.
        let tools = UplinkEnv::from_path(self.0.env.config.settings.path.clone());
        let uplink = enable_uplink(&self.0.name, port.fd(), addr, &tools)
            .map_err(|e| fail(crate::error_chain::flatten(&e)))?;
        st.uplink = Some(UplinkLink { port, uplink });
        Ok(())
    }

    pub(super) fn disable_uplink(&self) -> Result<(), NetworkError> {
        let up = self.lock().uplink.take();
        let Some(UplinkLink { port, uplink }) = up else {
            return Ok(());
        };
        let r = disable_uplink(uplink).map_err(|source| NetworkError::DisableUplink {
            bridge: self.0.name.clone(),
            source,
        });
        drop(port);
        r
    }

    // ---- lifetime ----

    /// Removes every NIC and the uplink; idempotent. Partitions and
    /// impairments stay declared (there is nothing left to apply them to).
    pub fn close(&self) -> Result<(), NetworkError> {
        let members = {
            let mut st = self.lock();
            if st.closed {
                return Ok(());
            }
            st.closed = true;
            std::mem::take(&mut st.members)
        };
        for (name, m) in members {
            drop(m.nic);
            let _ = self.0.switch.detach(&name);
            if let Some(vm) = m.vm {
                vm.unlink_bridge(self);
            }
        }
        self.disable_uplink()
    }

    pub(crate) fn members_sorted(&self) -> Vec<String> {
        self.lock().members.keys().cloned().collect()
    }

    pub(super) fn capture_stream(&self, lua: &Lua) -> mlua::Result<Stream> {
        drop(self.open_state("capture")?);
        let label = creation_site(lua).map_or_else(
            || format!("bridge:capture() on `{}`", self.0.name),
            |s| format!("{}:{}", s.file, s.line),
        );
        let cap = self.0.switch.capture(&label);
        let s = Stream::open(
            lua,
            self.0.env.clone(),
            Box::new(CaptureSource::new(cap)),
            "capture",
            format!("bridge {}", self.0.name),
            None,
        );
        let mut caps = self.0.captures.locked();
        caps.retain(Stream::is_open);
        caps.push(s.clone());
        Ok(s)
    }

    /// This bridge's open `bridge:capture()` streams, as
    /// `Vm::live_streams` names them (they count as live streams of every
    /// VM on the bridge).
    pub fn live_capture_streams(&self) -> Vec<Stream> {
        let mut caps = self.0.captures.locked();
        caps.retain(Stream::is_open);
        caps.clone()
    }
}

/// `vm`'s live bridges, sorted by name (the guest-name order).
pub fn sorted_bridges(vm: &NetMember) -> Vec<Bridge> {
    let mut bs: Vec<Bridge> = vm.bridges().into_iter().filter(|b| b.has_vm(vm)).collect();
    bs.sort_by(|a, b| a.name().cmp(b.name()));
    bs
}

/// The interface name for `bridge` on `vm`: its rule name (index among the
/// VM's bridges by name) if free, else the lowest free `ethN`.
fn choose_ifname(vm: &NetMember, bridge: &Bridge) -> String {
    let bridges = sorted_bridges(vm);
    let taken: Vec<String> = bridges
        .iter()
        .filter(|b| !b.ptr_eq(bridge))
        .filter_map(|b| b.ifname_of(vm.name()))
        .collect();
    let rule = bridges
        .iter()
        .position(|b| b.ptr_eq(bridge))
        .unwrap_or(bridges.len());
    crate::network::ifname_for(rule, &taken)
}

/// Realises `vm`'s NIC on `bridge` (the VM is booted).
pub fn realise_on(vm: &NetMember, bridge: &Bridge) -> Result<(), NetworkError> {
    let machine = vm
        .ctx()
        .running_machine()
        .ok_or_else(|| NetworkError::NoMachine {
            vm: vm.name().to_owned(),
        })?;
    let ifname = choose_ifname(vm, bridge);
    bridge.realise(vm, machine.as_ref(), &ifname)
}

/// `vm:boot()`'s error for a NIC it could not make on `bridge`.
fn boot_nic_error(vm: &NetMember, bridge: &Bridge, e: NetworkError) -> mlua::Error {
    let e = NetworkError::CreateNic {
        bridge: bridge.name().to_string(),
        source: Box::new(e),
    };
    rust_err(&format!("vm:boot: vm `{}`", vm.name()), &e)
}

/// Called by `vm:boot()` once the guest is up: one NIC per attached bridge,
/// `eth0`, `eth1`, … in bridge-name order.
pub fn realise_all(vm: &NetMember) -> mlua::Result<()> {
    for b in sorted_bridges(vm) {
        realise_on(vm, &b).map_err(|e| boot_nic_error(vm, &b, e))?;
    }
    Ok(())
}

/// One virtio-net device of a VM's kvm machine, in device order: what a
/// snapshot of it records ([`NicDecl`]).
#[derive(Clone)]
pub struct MachineNic {
    /// The bridge its port was on (weak: bridges hold their VMs). A NIC
    /// restored without a network (see [`NicDecl::attached`]) has none.
    pub bridge: Option<WeakBridge>,
    pub bridge_name: String,
    pub mac: MacAddr,
}

/// The virtio-net devices of a kvm machine about to be built.
#[derive(Default)]
pub struct VmmNics {
    /// For `MachineSpec::nics`, in device order.
    pub configs: Vec<NicSpec>,
    /// The same NICs as the VM records them.
    pub record: Vec<MachineNic>,
    /// Private switches of NICs restored without a network (their ports
    /// need them alive; see [`lone_port`]).
    pub lone: Vec<Switch>,
    /// Bridges a restore made the VM a member of (undone if it fails).
    pub added: Vec<Bridge>,
}

impl VmmNics {
    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    /// Undoes the memberships a failed restore added.
    pub fn undo(&self, vm: &NetMember) {
        for b in &self.added {
            b.vm_gone(vm);
        }
    }
}

/// For a kvm boot: one virtio-net device per attached bridge, in bridge-name
/// order, so the guest kernel (which numbers NICs in probe order, i.e. the
/// order of `virtio_mmio.device=` entries) names them eth0, eth1, … exactly
/// like the local backend's TAPs. Each port is attached to its bridge's
/// switch now; dropping the list (a failed boot) detaches them again.
pub fn vmm_ports(vm: &NetMember) -> mlua::Result<VmmNics> {
    let mut out = VmmNics::default();
    for b in sorted_bridges(vm) {
        let cfg = b.vmm_port(vm).map_err(|e| boot_nic_error(vm, &b, e))?;
        out.record.push(MachineNic {
            bridge: Some(b.downgrade()),
            bridge_name: b.name().to_string(),
            mac: cfg.mac(),
        });
        out.configs.push(cfg);
    }
    Ok(out)
}

/// For a kvm restore from a snapshot that recorded its NICs (`want`, in
/// device order): the ports, on the bridges [`plan_nics`] picks (`left`:
/// the bridges the VM left at shutdown, which it joins again with the
/// snapshot's MAC and link state). The memberships it adds are listed in
/// `added`; on an error they are undone here.
pub fn restore_ports(
    vm: &NetMember,
    want: &[NicDecl],
    left: &[Bridge],
    slot_bridges: &[String],
) -> Result<VmmNics, NetworkError> {
    // The bridges the snapshot's NIC slots go back on are theirs
    // ([`restore_slot_ports`]), not a boot NIC's.
    let theirs = |b: &Bridge| slot_bridges.iter().any(|n| n == b.name());
    let current: Vec<Bridge> = sorted_bridges(vm)
        .into_iter()
        .filter(|b| !theirs(b))
        .collect();
    let left: Vec<Bridge> = left
        .iter()
        .filter(|b| !b.is_closed() && !theirs(b) && !current.iter().any(|c| c.ptr_eq(b)))
        .cloned()
        .collect();
    let names = |bs: &[Bridge]| bs.iter().map(|b| b.name().to_string()).collect::<Vec<_>>();
    let wanted: Vec<(String, bool)> = want
        .iter()
        .map(|n| (n.bridge.clone(), n.attached))
        .collect();
    let plan = plan_nics(vm.name(), &wanted, &names(&current), &names(&left))?;
    let mut out = VmmNics::default();
    let r = (|| -> Result<(), NetworkError> {
        for (n, src) in want.iter().zip(plan) {
            let mac = n.mac_addr()?;
            let bridge = match src {
                NicSource::Lone => {
                    let (sw, cfg) = lone_port(&n.bridge, vm.name(), mac)?;
                    out.lone.push(sw);
                    out.record.push(MachineNic {
                        bridge: None,
                        bridge_name: n.bridge.clone(),
                        mac,
                    });
                    out.configs.push(cfg);
                    continue;
                }
                NicSource::Current(i) => current[i].clone(),
                NicSource::Rejoin(i) => left[i].clone(),
            };
            let connected = matches!(src, NicSource::Rejoin(_)).then_some(n.connected);
            if bridge.restore_member(vm, mac, connected)? {
                out.added.push(bridge.clone());
            }
            let cfg = bridge.vmm_port(vm).map_err(|e| NetworkError::CreateNic {
                bridge: bridge.name().to_string(),
                source: Box::new(e),
            })?;
            out.record.push(MachineNic {
                bridge: Some(bridge.downgrade()),
                bridge_name: bridge.name().to_string(),
                mac: cfg.mac(),
            });
            out.configs.push(cfg);
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            out.undo(vm);
            Err(e)
        }
    }
}

/// What a snapshot of `vm` records for its machine's NICs `nics`:
/// `bridge_lab` maps a bridge to its sub-lab path in the snapshotted lab.
pub fn nic_decls(
    vm: &NetMember,
    nics: &[MachineNic],
    bridge_lab: &dyn Fn(&Bridge) -> Option<Vec<String>>,
) -> Vec<NicDecl> {
    nics.iter()
        .map(|n| {
            let bridge = n.bridge.as_ref().and_then(WeakBridge::upgrade);
            let attached = bridge.as_ref().is_some_and(|b| b.has_vm(vm));
            NicDecl {
                bridge: n.bridge_name.clone(),
                mac: n.mac.to_string(),
                attached,
                connected: attached && bridge.as_ref().is_some_and(|b| b.is_connected(vm.name())),
                bridge_lab: bridge.as_ref().filter(|_| attached).and_then(bridge_lab),
            }
        })
        .collect()
}

/// What a snapshot of `vm` records of the NICs it was given after boot
/// (NIC slots plugged into the bridges it is on).
pub fn slot_nic_decls(
    vm: &NetMember,
    bridge_lab: &dyn Fn(&Bridge) -> Option<Vec<String>>,
) -> Vec<SlotNicDecl> {
    let mut out = Vec::new();
    for b in sorted_bridges(vm) {
        let (Some(slot), Some(mac)) = (b.slot_of(vm), b.mac_of(vm.name())) else {
            continue;
        };
        out.push(SlotNicDecl {
            slot,
            nic: NicDecl {
                bridge: b.name().to_string(),
                mac: mac.to_string(),
                attached: true,
                connected: b.is_connected(vm.name()),
                bridge_lab: bridge_lab(&b),
            },
        });
    }
    out
}

/// For a kvm restore from a snapshot whose VM had NICs in NIC slots
/// (`want`): each goes back on the bridge of its recorded name, one `vm` is
/// on (keeping its link state) or one it left at shutdown (joining again
/// with the recorded MAC and link state), on a port with the recorded MAC
/// that the machine's slot is plugged into from the start. A recorded
/// bridge `vm` has no way to (a fixture's copy in a file without it) leaves
/// its slot parked: the guest's interface is there with its link down.
/// Memberships added are returned with the ports; on an error they are
/// undone here.
pub fn restore_slot_ports(
    vm: &NetMember,
    want: &[SlotNicDecl],
    left: &[Bridge],
) -> Result<(Vec<crate::backend::SlotNic>, Vec<Bridge>), NetworkError> {
    let current = sorted_bridges(vm);
    let mut ports = Vec::new();
    let mut added: Vec<Bridge> = Vec::new();
    let r = (|| -> Result<(), NetworkError> {
        for w in want {
            let mac = w.nic.mac_addr()?;
            let (bridge, connected) =
                if let Some(b) = current.iter().find(|b| b.name() == w.nic.bridge) {
                    (b.clone(), None)
                } else if let Some(b) = left
                    .iter()
                    .find(|b| !b.is_closed() && b.name() == w.nic.bridge)
                {
                    (b.clone(), Some(w.nic.connected))
                } else {
                    continue;
                };
            if bridge.restore_member(vm, mac, connected)? {
                added.push(bridge.clone());
            }
            let cfg = bridge.vmm_port(vm)?;
            ports.push(crate::backend::SlotNic {
                slot: w.slot,
                bridge: bridge.name().to_string(),
                port: cfg.port,
            });
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok((ports, added)),
        Err(e) => {
            for b in &added {
                b.vm_gone(vm);
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::events::EventSender;
    use crate::lua::vm::Vm;
    use crate::runner::BackendKind;

    fn env(seed: u64) -> Arc<FileEnv> {
        Arc::new(
            FileEnv::new(
                "t.test.lua".into(),
                "/t.test.lua".into(),
                Vec::new(),
                Arc::new(Config::default()),
                crate::backend::for_kind(BackendKind::Local),
                EventSender::disabled(),
            )
            .with_run_seed(seed),
        )
    }

    #[test]
    fn the_run_seed_reaches_the_switch() {
        let b = Bridge::create(&env(99), "lan");
        assert_eq!(
            b.seeds(),
            (99, provium_netsetup::impair::bridge_seed(99, "lan"))
        );
    }

    #[test]
    fn close_drops_members_and_is_idempotent() {
        let b = Bridge::create(&env(1), "lan");
        b.attach_all(vec![("x".into(), None), ("y".into(), None)])
            .unwrap();
        assert_eq!(b.members_sorted(), vec!["x", "y"]);
        b.close().unwrap();
        b.close().unwrap();
        assert!(b.members_sorted().is_empty());
        assert!(b.attach_all(vec![("x".into(), None)]).is_err());
    }

    #[test]
    fn uplink_failure_carries_the_detail_and_leaves_nothing() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/net/tun").exists() {
            eprintln!("SKIP uplink_failure_carries_the_detail_and_leaves_nothing: needs root and /dev/net/tun");
            return;
        }
        // A fresh network namespace for this thread only: it has no default
        // route, so enable_uplink must fail, saying why.
        std::thread::spawn(|| {
            // SAFETY: unshare affects only this thread's network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            let b = Bridge::create(&env(1), "lan");
            let e = b
                .enable_uplink(DEFAULT_UPLINK_ADDR)
                .unwrap_err()
                .to_string();
            assert!(e.contains("bridge:enable_uplink: bridge `lan`: "), "{e}");
            assert!(
                e.contains("no default route") || e.contains("not found on PATH"),
                "the underlying detail is missing: {e}"
            );
            assert!(b.lock().uplink.is_none());
            assert!(
                !b.0.switch.members().iter().any(|m| m == UPLINK_PORT),
                "the uplink port was left on the switch"
            );
            b.disable_uplink().unwrap();
        })
        .join()
        .unwrap();
    }

    fn vm(env: &Arc<FileEnv>, name: &str) -> Vm {
        let sizing = crate::lua::vm::VmSizing {
            memory_bytes: 64 << 20,
            cpus: 1,
        };
        Vm::create(env.clone(), name.into(), "p".into(), sizing).unwrap()
    }

    #[test]
    fn a_restored_member_has_the_snapshots_mac_and_link() {
        let env = env(1);
        let b = Bridge::create(&env, "lan");
        let v = vm(&env, "v");
        let mac: MacAddr = "02:00:00:00:00:42".parse().unwrap();
        assert!(
            b.restore_member(&v.net(), mac, Some(false)).unwrap(),
            "a member was added"
        );
        assert!(b.has_vm(&v.net()) && v.bridges().iter().any(|x| x.ptr_eq(&b)));
        assert_eq!(b.mac_of("v"), Some(mac));
        assert!(!b.is_connected("v"), "the snapshot's NIC was disconnected");
        // Already this VM: takes the MAC, keeps its link state.
        let mac2: MacAddr = "02:00:00:00:00:43".parse().unwrap();
        assert!(
            !b.restore_member(&v.net(), mac2, Some(true)).unwrap(),
            "already a member"
        );
        assert_eq!(b.mac_of("v"), Some(mac2));
        assert!(!b.is_connected("v"));
        // Another member has the MAC.
        let w = vm(&env, "w");
        let e = b
            .restore_member(&w.net(), mac2, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("vm `v` on bridge `lan` already has MAC 02:00:00:00:00:43"),
            "{e}"
        );
        assert!(!b.is_member("w"));
        // A live VM of that name is attached: refused; a shut-down one is replaced.
        let v2 = vm(&env, "v");
        let e = b
            .restore_member(&v2.net(), mac, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a vm named `v` is already attached"), "{e}");
        v.shutdown().unwrap();
        assert!(!b.is_member("v"), "shutdown leaves the bridge");
        b.attach_all(vec![("v".into(), Some(v.net()))]).unwrap();
        assert_eq!(v.phase(), Phase::Shutdown);
        assert!(
            b.restore_member(&v2.net(), mac, None).unwrap(),
            "a member was added"
        );
        assert!(b.has_vm(&v2.net()) && !b.has_vm(&v.net()));
        assert!(
            !v.bridges().iter().any(|x| x.ptr_eq(&b)),
            "the old VM forgets it"
        );
        assert_eq!(v2.phase(), Phase::Created);
        b.close().unwrap();
        let e = b
            .restore_member(&w.net(), mac, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bridge `lan` is closed"), "{e}");
    }

    #[test]
    fn a_network_error_reaches_lua_with_its_chain_once() {
        let e = NetworkError::CreateNic {
            bridge: "lan".into(),
            source: Box::new(NetworkError::NotAttached {
                vm: "v".into(),
                bridge: "lan".into(),
            }),
        };
        assert_eq!(e.to_string(), "cannot create its NIC on bridge `lan`");
        let lua_err: mlua::Error = e.into();
        assert_eq!(
            crate::lua::error_message(&lua_err),
            "cannot create its NIC on bridge `lan`: vm `v` is not attached to bridge `lan`"
        );
        // A restore's ports on a bridge that is gone say so through the chain.
        let env = env(1);
        let b = Bridge::create(&env, "lan");
        let v = vm(&env, "v");
        b.close().unwrap();
        let e = b.vmm_port(&v.net()).unwrap_err();
        assert!(matches!(e, NetworkError::Closed { .. }), "{e:?}");
        assert_eq!(crate::error_chain::flatten(&e), "bridge `lan` is closed");
    }
}
