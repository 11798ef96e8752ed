//! The Bridge userdata: one userspace L2 switch (`provium_netsetup::Switch`)
//! per bridge, its membership, partitions, impairments, isolation, captures
//! and uplink.
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
//! # Locking
//! The bridge's state lock may take a VM's state lock (its phase); VM code
//! never calls into a bridge while holding its own state lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use mlua::{Lua, Table, UserData, UserDataMethods, Value};
use provium_netsetup::impair::fnv1a;
use provium_netsetup::{
    disable_uplink, enable_uplink, Capture, MacAddr, PortCounters, Switch, SwitchConfig, Tap,
    TapPort, Uplink, UplinkEnv,
};

use super::capture::CaptureSource;
use super::nic::Nic;
use super::stream::{creation_site, Stream};
use super::vm::{Phase, Vm};
use super::{err, nic};
use crate::backend::Guest;
use crate::runner::{CloseKind, Closeable, FileEnv};
use provium_vmm::vmm_config::NetConfig;

/// The switch port name of a bridge's uplink (not a valid VM name on any
/// backend, so it never collides with a member).
pub const UPLINK_PORT: &str = "@uplink";
/// The uplink's default address (the guests' gateway).
pub const DEFAULT_UPLINK_ADDR: &str = "10.0.2.1/24";

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
struct BridgeState {
    members: BTreeMap<String, Member>,
    uplink: Option<UplinkLink>,
    closed: bool,
    /// `bridge:route` targets (bridge names, first-call order, no repeats):
    /// graph state only, as the reference's v1.
    routes: Vec<String>,
    /// The one-shot "routes are not realised" warning was printed.
    route_warned: bool,
}

struct Member {
    /// None for a bare-string attachment (graph-state only).
    vm: Option<Vm>,
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
}

struct UplinkLink {
    port: TapPort,
    uplink: Uplink,
}

/// A deterministic, locally administered unicast MAC for (vm, bridge),
/// salted until it differs from every MAC in `taken`.
pub fn nic_mac(vm: &str, bridge: &str, taken: &[MacAddr]) -> MacAddr {
    let mut salt: u32 = 0;
    loop {
        let h = fnv1a(&[
            b"provium-nic",
            vm.as_bytes(),
            b"\0",
            bridge.as_bytes(),
            &salt.to_le_bytes(),
        ])
        .to_le_bytes();
        let mac = MacAddr([0x02, h[0], h[1], h[2], h[3], h[4]]);
        if !taken.contains(&mac) {
            return mac;
        }
        salt += 1;
    }
}

/// A VM argument: a VM userdata, or a bare name (graph-state only).
pub fn vm_ref(v: &Value, what: &str) -> mlua::Result<(String, Option<Vm>)> {
    match v {
        Value::String(s) => {
            let name = s.to_str()?.to_string();
            if name.is_empty() {
                return Err(err(format!("{what}: the vm name must not be empty")));
            }
            Ok((name, None))
        }
        Value::UserData(ud) => match ud.borrow::<Vm>() {
            Ok(vm) => Ok((vm.name().to_string(), Some(vm.clone()))),
            Err(_) => Err(err(format!(
                "{what}: expected a VM or a vm name, got another userdata"
            ))),
        },
        other => Err(err(format!(
            "{what}: expected a VM or a vm name, got {}",
            other.type_name()
        ))),
    }
}

/// `{from = A, to = B, <key> = N}`: the two names and the number.
fn directional(t: &Table, key: Option<&str>, what: &str) -> mlua::Result<(String, String, f64)> {
    let mut allowed = vec!["from", "to"];
    allowed.extend(key);
    for pair in t.clone().pairs::<Value, Value>() {
        let (k, _) = pair?;
        let k = match &k {
            Value::String(s) => s.to_str()?.to_string(),
            other => format!("{other:?}"),
        };
        if !allowed.contains(&k.as_str()) {
            return Err(err(format!(
                "{what}: unknown key `{k}` (accepted: {})",
                allowed.join(", ")
            )));
        }
    }
    let (from, _) = vm_ref(&t.get::<Value>("from")?, &format!("{what}: from"))?;
    let (to, _) = vm_ref(&t.get::<Value>("to")?, &format!("{what}: to"))?;
    if from == to {
        return Err(err(format!("{what}: from and to are both `{from}`")));
    }
    let n = match key {
        None => 0.0,
        Some(k) => number(&t.get::<Value>(k)?, &format!("{what}: {k}"))?,
    };
    Ok((from, to, n))
}

fn number(v: &Value, what: &str) -> mlua::Result<f64> {
    let n = match v {
        Value::Integer(i) => *i as f64,
        Value::Number(n) => *n,
        other => {
            return Err(err(format!(
                "{what} must be a number, got {}",
                other.type_name()
            )))
        }
    };
    if !n.is_finite() || n < 0.0 {
        return Err(err(format!("{what} must be a finite number >= 0, got {n}")));
    }
    Ok(n)
}

fn latency_from_ms(ms: f64, what: &str) -> mlua::Result<Duration> {
    Duration::try_from_secs_f64(ms / 1000.0)
        .map_err(|_| err(format!("{what}: {ms} ms is out of range")))
}

fn bps_from(n: f64, what: &str) -> mlua::Result<u64> {
    if n.fract() != 0.0 || n > u64::MAX as f64 {
        return Err(err(format!(
            "{what}: bits per second must be a whole number, got {n}"
        )));
    }
    Ok(n as u64)
}

/// A u64 as a Lua integer when it fits, else as its decimal string.
fn u64_value(lua: &Lua, v: u64) -> mlua::Result<Value> {
    match i64::try_from(v) {
        Ok(i) => Ok(Value::Integer(i)),
        Err(_) => Ok(Value::String(lua.create_string(v.to_string())?)),
    }
}

pub fn counters_table(lua: &Lua, c: &PortCounters) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("rx_bytes", c.rx_bytes)?;
    t.set("tx_bytes", c.tx_bytes)?;
    t.set("rx_packets", c.rx_packets)?;
    t.set("tx_packets", c.tx_packets)?;
    t.set("rx_dropped", c.rx_dropped)?;
    t.set("tx_dropped", c.tx_dropped)?;
    t.set("errors", c.errors)?;
    Ok(t)
}

impl Closeable for Bridge {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        Ok(self.close()?)
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
        let switch = Switch::new(
            name,
            SwitchConfig {
                run_seed: env.run_seed,
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

    pub fn downgrade(&self) -> WeakBridge {
        WeakBridge(Arc::downgrade(&self.0))
    }

    pub fn ptr_eq(&self, other: &Bridge) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    fn lock(&self) -> MutexGuard<'_, BridgeState> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open_state(&self, method: &str) -> mlua::Result<MutexGuard<'_, BridgeState>> {
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
    ) -> Result<(), String> {
        let to_imp = |i: &provium_snapshot::LabImpairment| provium_netsetup::Impairment {
            latency: i.latency_ns.map(std::time::Duration::from_nanos),
            drop_pct: i.drop_pct,
            bandwidth_bps: i.bandwidth_bps,
        };
        let missing: Vec<(String, Option<Vm>)> = {
            let st = self
                .open_state("restore")
                .map_err(|e| super::error_message(&e))?;
            rec.members
                .iter()
                .filter(|m| !st.members.contains_key(*m) && !vm_names.contains(m))
                .map(|m| (m.clone(), None))
                .collect()
        };
        if !missing.is_empty() {
            self.attach_all(missing)
                .map_err(|e| super::error_message(&e))?;
        }
        let sw = &self.0.switch;
        // reset(): no impairment, no partition (isolation is kept).
        sw.reset();
        let whole = to_imp(&rec.impairment);
        sw.set_latency(whole.latency.unwrap_or_default());
        sw.set_drop_rate(whole.drop_pct.unwrap_or(0.0))
            .map_err(|e| format!("drop rate: {e}"))?;
        sw.set_bandwidth(whole.bandwidth_bps.unwrap_or(0));
        for p in &rec.pair_impairments {
            let i = to_imp(&p.impairment);
            if let Some(l) = i.latency {
                sw.set_pair_latency(&p.from, &p.to, l);
            }
            if let Some(d) = i.drop_pct {
                sw.set_pair_drop_rate(&p.from, &p.to, d)
                    .map_err(|e| format!("drop rate {} -> {}: {e}", p.from, p.to))?;
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
    pub fn attach_vm(&self, vm: &Vm) -> Result<(), String> {
        if self.has_vm(vm) {
            return Ok(());
        }
        self.attach_all(vec![(vm.name().to_string(), Some(vm.clone()))])
            .map_err(|e| super::error_message(&e))
    }

    /// Attaches every item, or none: all are validated and recorded first,
    /// then booted VMs are realised; any failure undoes the whole call.
    fn attach_all(&self, items: Vec<(String, Option<Vm>)>) -> mlua::Result<()> {
        let mut added: Vec<(String, Option<Vm>)> = Vec::new();
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
            if let Err(e) = nic::realise_on(vm, self) {
                for (n, _) in &added {
                    self.detach_name(n);
                }
                return Err(err(format!(
                    "bridge:attach: bridge `{}`: vm `{name}`: {e}; nothing was attached",
                    self.0.name
                )));
            }
        }
        Ok(())
    }

    /// Removes a member (its NIC disappears from the guest); false if absent.
    fn detach_name(&self, name: &str) -> bool {
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
    pub fn vm_gone(&self, vm: &Vm) {
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
    pub fn has_vm(&self, vm: &Vm) -> bool {
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
    pub fn realise(&self, vm: &Vm, machine: &dyn Guest, ifname: &str) -> Result<(), String> {
        let mut st = self.lock();
        if st.closed {
            return Err(format!("bridge `{}` is closed", self.0.name));
        }
        let name = vm.name();
        let Some(m) = st.members.get_mut(name) else {
            return Err(format!(
                "vm `{name}` is not attached to bridge `{}`",
                self.0.name
            ));
        };
        if m.nic.is_some() {
            return Ok(());
        }
        let end = if machine.capabilities().has_vmm_nics() && self.0.switch.port_mac(name).is_ok() {
            // The virtio-net device got its port before boot (`vmm_port`).
            NicEnd::Vmm
        } else {
            let fd = machine
                .open_nic(ifname, m.mac)
                .map_err(|e| crate::error_chain::flatten(&e))?;
            NicEnd::Tap {
                _port: TapPort::attach(&self.0.switch, name, m.mac, fd)
                    .map_err(|e| crate::error_chain::flatten(&e))?,
            }
        };
        if m.link_down {
            let _ = self.0.switch.disconnect(name);
        }
        m.nic = Some((ifname.to_owned(), end));
        Ok(())
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
        vm: &Vm,
        mac: MacAddr,
        connected: Option<bool>,
    ) -> Result<bool, String> {
        let name = vm.name();
        let mut st = self.lock();
        if st.closed {
            return Err(format!(
                "bridge `{}` is closed; create another with lab:bridge(name)",
                self.0.name
            ));
        }
        if let Some((other, _)) = st
            .members
            .iter()
            .find(|(n, m)| n.as_str() != name && m.mac == mac)
        {
            return Err(format!(
                "vm `{other}` on bridge `{}` already has MAC {mac}, the snapshot's NIC's; \
                 detach it (bridge:detach) or restore under another VM name",
                self.0.name
            ));
        }
        let mut replace = false;
        if let Some(m) = st.members.get_mut(name) {
            match &m.vm {
                Some(v) if v.same(vm) => {
                    if m.nic.is_some() {
                        return Err(format!(
                            "vm `{name}` already has a live NIC on bridge `{}`",
                            self.0.name
                        ));
                    }
                    m.mac = mac;
                    return Ok(false);
                }
                Some(v) if matches!(v.phase(), Phase::Shutdown | Phase::Dead) => replace = true,
                _ => {
                    return Err(format!(
                        "a vm named `{name}` is already attached to bridge `{}`; detach it first",
                        self.0.name
                    ))
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
    pub fn vmm_port(&self, vm: &Vm) -> Result<NetConfig, String> {
        let st = self.lock();
        if st.closed {
            return Err(format!("bridge `{}` is closed", self.0.name));
        }
        let name = vm.name();
        let m = st
            .members
            .get(name)
            .ok_or_else(|| format!("vm `{name}` is not attached to bridge `{}`", self.0.name))?;
        let port = self
            .0
            .switch
            .attach(name, m.mac)
            .map_err(|e| crate::error_chain::flatten(&e))?;
        if m.link_down {
            let _ = self.0.switch.disconnect(name);
        }
        Ok(NetConfig::on_port(Arc::new(port)))
    }

    /// Both ends attached and realised (the directional forms' rule).
    fn check_realised(&self, method: &str, names: &[&str]) -> mlua::Result<()> {
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

    /// Counters of `vm_name`'s NIC (guest's perspective); zeros when not
    /// realised.
    pub fn counters(&self, vm_name: &str) -> PortCounters {
        let realised = self
            .lock()
            .members
            .get(vm_name)
            .is_some_and(|m| m.nic.is_some());
        if !realised {
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
            r.map_err(|e| err(format!("nic:{method}: {e}")))?;
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
        let realised = self
            .lock()
            .members
            .get(vm_name)
            .is_some_and(|m| m.nic.is_some());
        if !realised {
            return Err(err(format!(
                "nic:capture: vm `{vm_name}` has no TAP on bridge `{}` (not booted?). Call lab:boot() / vm:boot() first.",
                self.0.name
            )));
        }
        self.0
            .switch
            .capture_port(vm_name, label)
            .map_err(|e| err(format!("nic:capture: {e}")))
    }

    /// Labels (creation sites) of live captures on this bridge.
    pub fn live_captures(&self) -> Vec<String> {
        self.0.switch.live_captures()
    }

    // ---- uplink ----

    fn enable_uplink(&self, addr: &str) -> mlua::Result<()> {
        let mut st = self.open_state("enable_uplink")?;
        if st.uplink.is_some() {
            return Ok(());
        }
        let tap_name = format!(
            "pvup{:08x}",
            fnv1a(&[self.0.name.as_bytes(), &std::process::id().to_le_bytes()]) as u32
        );
        let fail = |what: String| {
            err(format!(
                "bridge:enable_uplink: bridge `{}`: {what}",
                self.0.name
            ))
        };
        let tap = Tap::open(&tap_name).map_err(|e| fail(crate::error_chain::flatten(&e)))?;
        let mac = nic_mac(UPLINK_PORT, &self.0.name, &[]);
        let port = TapPort::attach(&self.0.switch, UPLINK_PORT, mac, tap.into_fd())
            .map_err(|e| fail(crate::error_chain::flatten(&e)))?;
        let uplink = enable_uplink(&self.0.name, port.fd(), addr, &UplinkEnv::from_process())
            .map_err(|e| fail(crate::error_chain::flatten(&e)))?;
        st.uplink = Some(UplinkLink { port, uplink });
        Ok(())
    }

    fn disable_uplink(&self) -> Result<(), String> {
        let up = self.lock().uplink.take();
        let Some(UplinkLink { port, uplink }) = up else {
            return Ok(());
        };
        let r = disable_uplink(uplink).map_err(|e| {
            format!(
                "bridge:disable_uplink: bridge `{}`: {}",
                self.0.name,
                crate::error_chain::flatten(&e)
            )
        });
        drop(port);
        r
    }

    // ---- lifetime ----

    /// Removes every NIC and the uplink; idempotent. Partitions and
    /// impairments stay declared (there is nothing left to apply them to).
    pub fn close(&self) -> Result<(), String> {
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

    fn capture_stream(&self, lua: &Lua) -> mlua::Result<Stream> {
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
        let mut caps = self.0.captures.lock().unwrap();
        caps.retain(Stream::is_open);
        caps.push(s.clone());
        Ok(s)
    }

    /// This bridge's open `bridge:capture()` streams, as
    /// [`Vm::live_streams`] names them (they count as live streams of every
    /// VM on the bridge).
    pub fn live_capture_streams(&self) -> Vec<Stream> {
        let mut caps = self.0.captures.lock().unwrap();
        caps.retain(Stream::is_open);
        caps.clone()
    }
}

fn attach_arg(v: &Value) -> mlua::Result<Vec<(String, Option<Vm>)>> {
    match v {
        Value::Table(t) => {
            let mut out = Vec::new();
            for (i, item) in t.clone().sequence_values::<Value>().enumerate() {
                out.push(vm_ref(
                    &item?,
                    &format!("bridge:attach: element {}", i + 1),
                )?);
            }
            if out.is_empty() {
                return Err(err("bridge:attach: the list is empty"));
            }
            Ok(out)
        }
        other => Ok(vec![vm_ref(other, "bridge:attach")?]),
    }
}

impl UserData for Bridge {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("name", |_, this, ()| Ok(this.0.name.clone()));
        m.add_method("attach", |_, this, v: Value| {
            this.attach_all(attach_arg(&v)?)
        });
        m.add_method("detach", |_, this, v: Value| {
            let (name, _) = vm_ref(&v, "bridge:detach")?;
            this.detach_name(&name);
            Ok(())
        });
        m.add_method("members", |_, this, ()| Ok(this.members_sorted()));

        // ---- partitions ----
        m.add_method("partition", |_, this, (a, b): (Value, Value)| {
            let sw = &this.0.switch;
            match (&a, &b) {
                (Value::Table(t), Value::Nil) => {
                    let (from, to, _) = directional(t, None, "bridge:partition")?;
                    this.check_realised("partition", &[&from, &to])?;
                    sw.partition_directional(&from, &to)
                        .map_err(|e| err(format!("bridge:partition: {e}")))
                }
                _ => {
                    let (a, _) = vm_ref(&a, "bridge:partition: first vm")?;
                    let (b, _) = vm_ref(&b, "bridge:partition: second vm")?;
                    if a == b {
                        return Err(err(format!("bridge:partition: both ends are `{a}`")));
                    }
                    sw.partition(&a, &b);
                    Ok(())
                }
            }
        });
        m.add_method("unpartition", |_, this, (a, b): (Value, Value)| {
            let sw = &this.0.switch;
            match (&a, &b) {
                (Value::Table(t), Value::Nil) => {
                    let (from, to, _) = directional(t, None, "bridge:unpartition")?;
                    sw.unpartition_directional(&from, &to);
                }
                _ => {
                    let (a, _) = vm_ref(&a, "bridge:unpartition: first vm")?;
                    let (b, _) = vm_ref(&b, "bridge:unpartition: second vm")?;
                    sw.unpartition(&a, &b);
                }
            }
            Ok(())
        });
        m.add_method("partition_all", |_, this, ()| {
            let names = this.members_sorted();
            for (i, a) in names.iter().enumerate() {
                for b in &names[i + 1..] {
                    this.0.switch.partition(a, b);
                }
            }
            Ok(())
        });
        m.add_method("restore_all", |_, this, ()| {
            this.0.switch.restore_all();
            Ok(())
        });
        m.add_method("is_partitioned", |_, this, (a, b): (Value, Value)| {
            let (a, _) = vm_ref(&a, "bridge:is_partitioned: first vm")?;
            let (b, _) = vm_ref(&b, "bridge:is_partitioned: second vm")?;
            Ok(this.0.switch.is_partitioned(&a, &b))
        });
        m.add_method("partitions", |lua, this, ()| {
            let out = lua.create_table()?;
            for (from, to) in this.0.switch.partitions() {
                let p = lua.create_table()?;
                p.set("from", from)?;
                p.set("to", to)?;
                out.push(p)?;
            }
            Ok(out)
        });

        // ---- impairments ----
        m.add_method("add_latency", |_, this, v: Value| this.latency(&v, false));
        m.add_method("add_directional_latency", |_, this, v: Value| {
            this.latency(&v, true)
        });
        m.add_method("drop_rate", |_, this, v: Value| this.drop_rate(&v, false));
        m.add_method("directional_drop_rate", |_, this, v: Value| {
            this.drop_rate(&v, true)
        });
        m.add_method("bandwidth_limit", |_, this, v: Value| this.bandwidth(&v));
        m.add_method("reset", |_, this, ()| {
            this.0.switch.reset();
            Ok(())
        });
        m.add_method("latency_ms", |_, this, ()| {
            Ok(this
                .0
                .switch
                .latency()
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0))
        });
        m.add_method("drop_rate_pct", |_, this, ()| {
            Ok(this.0.switch.drop_rate_pct().unwrap_or(0.0))
        });
        m.add_method("bandwidth_bps", |lua, this, ()| {
            u64_value(lua, this.0.switch.bandwidth_bps().unwrap_or(0))
        });
        m.add_method("pair_impairment", |lua, this, (a, b): (Value, Value)| {
            let (a, _) = vm_ref(&a, "bridge:pair_impairment: from")?;
            let (b, _) = vm_ref(&b, "bridge:pair_impairment: to")?;
            let imp = this.0.switch.pair_impairment(&a, &b);
            let t = lua.create_table()?;
            t.set("ms", imp.latency.map(|d| d.as_secs_f64() * 1000.0))?;
            t.set("p", imp.drop_pct)?;
            t.set(
                "bps",
                imp.bandwidth_bps.map(|b| u64_value(lua, b)).transpose()?,
            )?;
            Ok(t)
        });
        m.add_method("stats", |lua, this, ()| {
            let s = this.0.switch.stats();
            let t = lua.create_table()?;
            t.set("frames_in", s.frames_in)?;
            t.set("flooded", s.flooded)?;
            t.set("delivered", s.delivered)?;
            t.set("delayed", s.delayed)?;
            t.set("dropped_invalid", s.dropped_invalid)?;
            t.set("dropped_link_down", s.dropped_link_down)?;
            t.set("dropped_isolated", s.dropped_isolated)?;
            t.set("dropped_partition", s.dropped_partition)?;
            t.set("dropped_impairment", s.dropped_impairment)?;
            t.set("dropped_rx_queue_full", s.dropped_rx_queue_full)?;
            t.set("dropped_delay_queue_full", s.dropped_delay_queue_full)?;
            t.set("dropped_hairpin", s.dropped_hairpin)?;
            Ok(t)
        });
        m.add_method("seed", |lua, this, ()| u64_value(lua, this.seeds().0));
        m.add_method("bridge_seed", |lua, this, ()| {
            u64_value(lua, this.seeds().1)
        });

        // ---- isolation ----
        m.add_method("isolate", |_, this, v: Value| {
            let (n, _) = vm_ref(&v, "bridge:isolate")?;
            this.0.switch.isolate(&n);
            Ok(())
        });
        m.add_method("unisolate", |_, this, v: Value| {
            let (n, _) = vm_ref(&v, "bridge:unisolate")?;
            this.0.switch.unisolate(&n);
            Ok(())
        });
        m.add_method("is_isolated", |_, this, v: Value| {
            let (n, _) = vm_ref(&v, "bridge:is_isolated")?;
            Ok(this.0.switch.is_isolated(&n))
        });
        m.add_method("isolated", |_, this, ()| Ok(this.0.switch.isolated()));

        // ---- L3 routing (preview) ----
        m.add_method("route", |_, this, v: Value| this.route(&v));
        m.add_method("routes", |_, this, ()| {
            Ok(this.0.state.lock().unwrap().routes.clone())
        });

        // ---- uplink ----
        m.add_method("enable_uplink", |_, this, opts: Option<Table>| {
            let mut addr = DEFAULT_UPLINK_ADDR.to_string();
            if let Some(o) = opts {
                for pair in o.pairs::<String, Value>() {
                    let (k, v) = pair?;
                    match (k.as_str(), v) {
                        ("addr", Value::String(s)) => addr = s.to_str()?.to_string(),
                        (k, _) => {
                            return Err(err(format!(
                                "bridge:enable_uplink: unknown or mistyped option `{k}` (accepted: addr = \"a.b.c.d/len\")"
                            )))
                        }
                    }
                }
            }
            this.enable_uplink(&addr)
        });
        m.add_method("disable_uplink", |_, this, ()| {
            this.disable_uplink().map_err(err)
        });
        m.add_method("uplink_enabled", |_, this, ()| {
            Ok(this.lock().uplink.is_some())
        });

        // ---- NICs and capture ----
        m.add_method("nic", |_, this, v: Value| {
            let (name, vm) = vm_ref(&v, "bridge:nic")?;
            if !this.is_member(&name) {
                return Err(err(format!(
                    "bridge:nic: vm `{name}` is not attached to bridge `{}`; call bridge:attach first",
                    this.0.name
                )));
            }
            Ok(Nic::new(this.clone(), name, vm))
        });
        m.add_method("capture", |lua, this, ()| this.capture_stream(lua));
        m.add_method("live_captures", |_, this, ()| Ok(this.live_captures()));
        m.add_method("close", |_, this, ()| this.close().map_err(err));
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Bridge({})", this.0.name))
        });
        m.add_meta_method(mlua::MetaMethod::Eq, |_, this, other: mlua::AnyUserData| {
            Ok(other
                .borrow::<Bridge>()
                .map(|o| o.ptr_eq(this))
                .unwrap_or(false))
        });
    }
}

impl Bridge {
    /// `bridge:route(other_or_list)`: records the intent (a bridge, its
    /// name, or an array of either) and, at the first call on this bridge,
    /// warns on stderr that no traffic is routed (the reference's v1).
    fn route(&self, v: &Value) -> mlua::Result<()> {
        let one = |v: &Value| -> mlua::Result<String> {
            match v {
                Value::String(s) => Ok(s.to_str()?.to_string()),
                Value::UserData(ud) => ud.borrow::<Bridge>().map(|b| b.0.name.clone()).map_err(|_| {
                    err("bridge:route: expected a Bridge, a bridge name or an array of them, got another userdata")
                }),
                other => Err(err(format!(
                    "bridge:route: expected a Bridge, a bridge name or an array of them, got {}",
                    other.type_name()
                ))),
            }
        };
        let targets = match v {
            Value::Table(t) => t
                .sequence_values::<Value>()
                .map(|x| x.and_then(|x| one(&x)))
                .collect::<mlua::Result<Vec<_>>>()?,
            v => vec![one(v)?],
        };
        if let Some(t) = targets.iter().find(|t| **t == self.0.name) {
            return Err(err(format!(
                "bridge:route: bridge `{t}` cannot route to itself; route to another bridge"
            )));
        }
        let mut st = self.0.state.lock().unwrap();
        for t in targets {
            if !st.routes.contains(&t) {
                st.routes.push(t);
            }
        }
        if !std::mem::replace(&mut st.route_warned, true) {
            eprintln!(
                "provium: warning: {}: bridge:route on `{}` records the route only; L3 routing is a \
                 preview and no traffic flows between bridges yet (attach a router VM to both bridges)",
                self.0.env.rel_path, self.0.name
            );
        }
        Ok(())
    }

    fn latency(&self, v: &Value, directional_only: bool) -> mlua::Result<()> {
        let sw = &self.0.switch;
        match v {
            Value::Table(t) => {
                let what = "bridge:add_latency";
                let (from, to, ms) = directional(t, Some("ms"), what)?;
                self.check_realised("add_latency", &[&from, &to])?;
                sw.set_pair_latency(&from, &to, latency_from_ms(ms, what)?);
                Ok(())
            }
            _ if directional_only => Err(err(
                "bridge:add_directional_latency: expected {from = vm, to = vm, ms = N}",
            )),
            other => {
                let ms = number(other, "bridge:add_latency: ms")?;
                sw.set_latency(latency_from_ms(ms, "bridge:add_latency")?);
                Ok(())
            }
        }
    }

    fn drop_rate(&self, v: &Value, directional_only: bool) -> mlua::Result<()> {
        let sw = &self.0.switch;
        let r = match v {
            Value::Table(t) => {
                let (from, to, p) = directional(t, Some("p"), "bridge:drop_rate")?;
                self.check_realised("drop_rate", &[&from, &to])?;
                sw.set_pair_drop_rate(&from, &to, p)
            }
            _ if directional_only => {
                return Err(err(
                    "bridge:directional_drop_rate: expected {from = vm, to = vm, p = N}",
                ))
            }
            other => sw.set_drop_rate(number(other, "bridge:drop_rate: percent")?),
        };
        r.map_err(|e| {
            err(format!(
                "bridge:drop_rate: {}",
                crate::error_chain::flatten(&e)
            ))
        })
    }

    fn bandwidth(&self, v: &Value) -> mlua::Result<()> {
        let sw = &self.0.switch;
        let what = "bridge:bandwidth_limit";
        match v {
            Value::Table(t) => {
                let (from, to, bps) = directional(t, Some("bps"), what)?;
                self.check_realised("bandwidth_limit", &[&from, &to])?;
                sw.set_pair_bandwidth(&from, &to, bps_from(bps, what)?);
            }
            other => sw.set_bandwidth(bps_from(number(other, what)?, what)?),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::events::EventSender;
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
        assert_eq!(b.restore_member(&v, mac, Some(false)), Ok(true));
        assert!(b.has_vm(&v) && v.bridges().iter().any(|x| x.ptr_eq(&b)));
        assert_eq!(b.mac_of("v"), Some(mac));
        assert!(!b.is_connected("v"), "the snapshot's NIC was disconnected");
        // Already this VM: takes the MAC, keeps its link state.
        let mac2: MacAddr = "02:00:00:00:00:43".parse().unwrap();
        assert_eq!(b.restore_member(&v, mac2, Some(true)), Ok(false));
        assert_eq!(b.mac_of("v"), Some(mac2));
        assert!(!b.is_connected("v"));
        // Another member has the MAC.
        let w = vm(&env, "w");
        let e = b.restore_member(&w, mac2, None).unwrap_err();
        assert!(
            e.starts_with("vm `v` on bridge `lan` already has MAC 02:00:00:00:00:43"),
            "{e}"
        );
        assert!(!b.is_member("w"));
        // A live VM of that name is attached: refused; a shut-down one is replaced.
        let v2 = vm(&env, "v");
        let e = b.restore_member(&v2, mac, None).unwrap_err();
        assert!(e.contains("a vm named `v` is already attached"), "{e}");
        v.shutdown().unwrap();
        assert!(!b.is_member("v"), "shutdown leaves the bridge");
        b.attach_all(vec![("v".into(), Some(v.clone()))]).unwrap();
        assert_eq!(v.phase(), Phase::Shutdown);
        assert_eq!(b.restore_member(&v2, mac, None), Ok(true));
        assert!(b.has_vm(&v2) && !b.has_vm(&v));
        assert!(
            !v.bridges().iter().any(|x| x.ptr_eq(&b)),
            "the old VM forgets it"
        );
        assert_eq!(v2.phase(), Phase::Created);
        b.close().unwrap();
        let e = b.restore_member(&w, mac, None).unwrap_err();
        assert!(e.contains("bridge `lan` is closed"), "{e}");
    }

    #[test]
    fn macs_are_deterministic_local_unicast_and_distinct() {
        let a = nic_mac("a", "lan", &[]);
        assert_eq!(a, nic_mac("a", "lan", &[]));
        assert_eq!(a.0[0], 0x02, "locally administered, unicast");
        assert_ne!(a, nic_mac("b", "lan", &[]));
        assert_ne!(a, nic_mac("a", "wan", &[]));
        let salted = nic_mac("a", "lan", &[a]);
        assert_ne!(salted, a);
        assert_eq!(salted.0[0], 0x02);
    }

    #[test]
    fn numbers_are_checked() {
        assert!(number(&Value::Integer(5), "x").is_ok());
        assert!(number(&Value::Number(-1.0), "x").is_err());
        assert!(number(&Value::Number(f64::NAN), "x").is_err());
        assert!(number(&Value::Boolean(true), "x").is_err());
        assert!(bps_from(1.5, "x").is_err());
        assert_eq!(bps_from(1e6, "x").unwrap(), 1_000_000);
        assert_eq!(
            latency_from_ms(250.0, "x").unwrap(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn directional_tables_are_strict() {
        let lua = Lua::new();
        let t: Table = lua
            .load("return {from = 'a', to = 'b', ms = 5}")
            .eval()
            .unwrap();
        assert_eq!(
            directional(&t, Some("ms"), "x").unwrap(),
            ("a".into(), "b".into(), 5.0)
        );
        let bad: Table = lua
            .load("return {from = 'a', to = 'b', msec = 5}")
            .eval()
            .unwrap();
        let e = directional(&bad, Some("ms"), "x").unwrap_err().to_string();
        assert!(e.contains("unknown key `msec`"), "{e}");
        let same: Table = lua.load("return {from = 'a', to = 'a'}").eval().unwrap();
        assert!(directional(&same, None, "x").is_err());
    }
}
