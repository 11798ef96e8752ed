//! The Nic userdata (one (bridge, vm) attachment: counters, link state,
//! per-NIC capture) and the VM side of networking: which guest interface a
//! bridge gets, realising NICs at boot, and `vm:nic(name)`.
//!
//! # Guest interface names
//! A VM's bridges, sorted by bridge name, are `eth0`, `eth1`, … (the
//! reference's rule). A VM attached before boot gets exactly these names.
//! Attaching a booted VM to another bridge creates the new interface under
//! its rule name if that is free, else under the lowest free `ethN` (an
//! existing interface is never renamed under a running guest);
//! `nic:ifname()` tells the real name. `vm:nic("eth1")` always follows the
//! rule (the Nth bridge by name); prefer `vm:nic("bridge_name")`.

use std::sync::Arc;

use mlua::{Lua, UserData, UserDataMethods};
use provium_netsetup::{MacAddr, Switch, SwitchConfig};
use provium_vmm::vmm_config::NetConfig;

use super::bridge::{counters_table, Bridge, WeakBridge};
use super::capture::CaptureSource;
use super::err;
use super::snapshot::NicDecl;
use super::stream::{creation_site, Stream};
use super::vm::Vm;

/// A (bridge, vm) handle. `vm` is None for the bare-string form.
#[derive(Clone)]
pub struct Nic {
    bridge: Bridge,
    vm_name: String,
    vm: Option<Vm>,
}

impl Nic {
    pub fn new(bridge: Bridge, vm_name: String, vm: Option<Vm>) -> Nic {
        Nic {
            bridge,
            vm_name,
            vm,
        }
    }

    fn capture(&self, lua: &Lua) -> mlua::Result<Stream> {
        let label = creation_site(lua).map_or_else(
            || {
                format!(
                    "nic:capture() on `{}`/`{}`",
                    self.bridge.name(),
                    self.vm_name
                )
            },
            |s| format!("{}:{}", s.file, s.line),
        );
        let cap = self.bridge.capture_nic(&self.vm_name, &label)?;
        let source = Box::new(CaptureSource::new(cap));
        let detail = format!("nic {}/{}", self.bridge.name(), self.vm_name);
        Ok(match &self.vm {
            // Counts toward the VM's open_stream_count (a live capture).
            Some(vm) => vm.open_stream(lua, source, "capture", detail),
            None => Stream::open(
                lua,
                self.bridge.env().clone(),
                source,
                "capture",
                detail,
                None,
            ),
        })
    }
}

impl UserData for Nic {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("counters", |lua, this, ()| {
            counters_table(lua, &this.bridge.counters(&this.vm_name))
        });
        m.add_method("capture", |lua, this, ()| this.capture(lua));
        m.add_method("disconnect", |_, this, ()| {
            this.bridge.set_link("disconnect", &this.vm_name, false)
        });
        m.add_method("reconnect", |_, this, ()| {
            this.bridge.set_link("reconnect", &this.vm_name, true)
        });
        m.add_method("is_connected", |_, this, ()| {
            Ok(this.bridge.is_connected(&this.vm_name))
        });
        m.add_method("vm_name", |_, this, ()| Ok(this.vm_name.clone()));
        m.add_method("bridge", |_, this, ()| Ok(this.bridge.name().to_string()));
        m.add_method("mac", |_, this, ()| {
            Ok(this.bridge.mac_of(&this.vm_name).map(|m| m.to_string()))
        });
        m.add_method("ifname", |_, this, ()| {
            Ok(this.bridge.ifname_of(&this.vm_name))
        });
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Nic({}/{})", this.bridge.name(), this.vm_name))
        });
    }
}

/// `vm`'s live bridges, sorted by name (the guest-name order).
fn sorted_bridges(vm: &Vm) -> Vec<Bridge> {
    let mut bs: Vec<Bridge> = vm.bridges().into_iter().filter(|b| b.has_vm(vm)).collect();
    bs.sort_by(|a, b| a.name().cmp(b.name()));
    bs
}

/// `ethN` for a guest-name index, from `eth<N>`, `enp0s<N>` or `ens<N>`.
pub fn guest_index(name: &str) -> Option<usize> {
    ["eth", "enp0s", "ens"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .filter(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
}

/// The interface name for `bridge` on `vm`: its rule name (index among the
/// VM's bridges by name) if free, else the lowest free `ethN`.
fn choose_ifname(vm: &Vm, bridge: &Bridge) -> String {
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
    let rule_name = format!("eth{rule}");
    if !taken.contains(&rule_name) {
        return rule_name;
    }
    (0..)
        .map(|i| format!("eth{i}"))
        .find(|n| !taken.contains(n))
        .expect("an unbounded range always has a free name")
}

/// Realises `vm`'s NIC on `bridge` (the VM is booted).
pub fn realise_on(vm: &Vm, bridge: &Bridge) -> Result<(), String> {
    let machine = vm
        .running_machine()
        .ok_or_else(|| format!("vm `{}` has no running machine", vm.name()))?;
    let ifname = choose_ifname(vm, bridge);
    bridge.realise(vm, machine.as_ref(), &ifname)
}

/// Called by `vm:boot()` once the guest is up: one NIC per attached bridge,
/// `eth0`, `eth1`, … in bridge-name order.
pub fn realise_all(vm: &Vm) -> mlua::Result<()> {
    for b in sorted_bridges(vm) {
        realise_on(vm, &b).map_err(|e| {
            err(format!(
                "vm:boot: vm `{}`: cannot create its NIC on bridge `{}`: {e}",
                vm.name(),
                b.name()
            ))
        })?;
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
    pub configs: Vec<NetConfig>,
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
    pub fn undo(&self, vm: &Vm) {
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
pub fn vmm_ports(vm: &Vm) -> mlua::Result<VmmNics> {
    let mut out = VmmNics::default();
    for b in sorted_bridges(vm) {
        let cfg = b.vmm_port(vm).map_err(|e| {
            err(format!(
                "vm:boot: vm `{}`: cannot create its NIC on bridge `{}`: {e}",
                vm.name(),
                b.name()
            ))
        })?;
        out.record.push(MachineNic {
            bridge: Some(b.downgrade()),
            bridge_name: b.name().to_string(),
            mac: cfg.mac,
        });
        out.configs.push(cfg);
    }
    Ok(out)
}

/// Where a restored NIC's port comes from (see [`plan_nics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicSource {
    /// The bridge at this index of the VM's current bridges.
    Current(usize),
    /// The bridge at this index of the bridges the VM left at shutdown:
    /// the VM joins it again.
    Rejoin(usize),
    /// A port on a switch of its own, link down (the snapshot's VM had been
    /// detached from that bridge).
    Lone,
}

/// Matches the snapshot's NICs `want` (bridge name, attached) against the
/// bridges the VM is attached to now (`current`, by name) and those it left
/// when it shut down (`left`): each wanted NIC takes a current bridge of
/// its name, else a left one (each bridge once). Errors, as a configuration
/// mismatch, when a wanted bridge is in neither, or when the VM is attached
/// to a bridge the snapshot's VM was not on (the restored machine would
/// have another device list).
pub fn plan_nics(
    vm_name: &str,
    want: &[(String, bool)],
    current: &[String],
    left: &[String],
) -> Result<Vec<NicSource>, String> {
    let mut cur_used = vec![false; current.len()];
    let mut left_used = vec![false; left.len()];
    let mut out = Vec::with_capacity(want.len());
    let snap_names = || {
        let names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    for (name, attached) in want {
        if !attached {
            out.push(NicSource::Lone);
            continue;
        }
        let pick = |names: &[String], used: &mut [bool]| {
            let i = names
                .iter()
                .enumerate()
                .position(|(i, n)| n == name && !used[i])?;
            used[i] = true;
            Some(i)
        };
        if let Some(i) = pick(current, &mut cur_used) {
            out.push(NicSource::Current(i));
        } else if let Some(i) = pick(left, &mut left_used) {
            out.push(NicSource::Rejoin(i));
        } else {
            return Err(format!(
                "the snapshot's VM had a NIC on bridge `{name}` (its NICs: {}), and vm `{vm_name}` is not \
                 attached to a bridge of that name; attach it (lab:bridge(\"{name}\"):attach(vm)) before \
                 vm:restore",
                snap_names()
            ));
        }
    }
    let extra: Vec<&str> = current
        .iter()
        .zip(&cur_used)
        .filter(|(_, used)| !**used)
        .map(|(n, _)| n.as_str())
        .collect();
    if !extra.is_empty() {
        return Err(format!(
            "vm `{vm_name}` is attached to bridge(s) {} but the snapshot's VM had no NIC there (its \
             NICs: {}); a kvm machine's NICs are fixed when it is built, so detach it \
             (bridge:detach(vm)) before vm:restore",
            extra.join(", "),
            snap_names()
        ));
    }
    Ok(out)
}

/// A port for a restored NIC whose VM had been detached from `bridge_name`:
/// on a switch of its own (no other member), link down, as the detached
/// NIC was. Keep the switch alive as long as the machine.
pub fn lone_port(
    bridge_name: &str,
    vm_name: &str,
    mac: MacAddr,
) -> Result<(Switch, NetConfig), String> {
    let sw = Switch::new(&format!("{bridge_name}-detached"), SwitchConfig::default());
    let port = sw
        .attach(vm_name, mac)
        .map_err(|e| crate::error_chain::flatten(&e))?;
    sw.disconnect(vm_name)
        .map_err(|e| crate::error_chain::flatten(&e))?;
    Ok((sw, NetConfig::on_port(Arc::new(port))))
}

/// For a kvm restore from a snapshot that recorded its NICs (`want`, in
/// device order): the ports, on the bridges [`plan_nics`] picks (`left`:
/// the bridges the VM left at shutdown, which it joins again with the
/// snapshot's MAC and link state). The memberships it adds are listed in
/// `added`; on an error they are undone here.
pub fn restore_ports(vm: &Vm, want: &[NicDecl], left: &[Bridge]) -> Result<VmmNics, String> {
    let current = sorted_bridges(vm);
    let left: Vec<Bridge> = left
        .iter()
        .filter(|b| !b.is_closed() && !current.iter().any(|c| c.ptr_eq(b)))
        .cloned()
        .collect();
    let names = |bs: &[Bridge]| bs.iter().map(|b| b.name().to_string()).collect::<Vec<_>>();
    let wanted: Vec<(String, bool)> = want
        .iter()
        .map(|n| (n.bridge.clone(), n.attached))
        .collect();
    let plan = plan_nics(vm.name(), &wanted, &names(&current), &names(&left))?;
    let mut out = VmmNics::default();
    let r = (|| -> Result<(), String> {
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
            let cfg = bridge
                .vmm_port(vm)
                .map_err(|e| format!("cannot create its NIC on bridge `{}`: {e}", bridge.name()))?;
            out.record.push(MachineNic {
                bridge: Some(bridge.downgrade()),
                bridge_name: bridge.name().to_string(),
                mac: cfg.mac,
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
    vm: &Vm,
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

/// Called by `vm:shutdown()`: the VM leaves every bridge.
pub fn vm_gone(vm: &Vm) {
    for b in vm.bridges() {
        b.vm_gone(vm);
    }
}

/// `vm:nic(name)`: by bridge name, or by guest name (`eth<N>`: the Nth
/// bridge sorted by name).
pub fn vm_nic(vm: &Vm, name: &str) -> mlua::Result<Nic> {
    let bridges = sorted_bridges(vm);
    let found = bridges
        .iter()
        .find(|b| b.name() == name)
        .or_else(|| guest_index(name).and_then(|i| bridges.get(i)));
    match found {
        Some(b) => Ok(Nic::new(b.clone(), vm.name().to_string(), Some(vm.clone()))),
        None => {
            let names: Vec<&str> = bridges.iter().map(|b| b.name()).collect();
            Err(err(format!(
                "vm:nic(\"{name}\"): vm `{}` has no such attachment (bridges: {}); \
                 attach it with bridge:attach(vm), and name the bridge or eth<N>",
                vm.name(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(list: &[(&str, bool)]) -> Vec<(String, bool)> {
        list.iter().map(|(n, a)| (n.to_string(), *a)).collect()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn restored_nics_take_current_bridges_then_the_ones_left_at_shutdown() {
        use NicSource::{Current, Lone, Rejoin};
        // Attached now: as at boot.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("lan", true), ("wan", true)]),
                &names(&["lan", "wan"]),
                &[]
            ),
            Ok(vec![Current(0), Current(1)])
        );
        // `vm:shutdown(); vm:restore(s)`: the VM left its bridges.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("lan", true), ("wan", true)]),
                &[],
                &names(&["wan", "lan"])
            ),
            Ok(vec![Rejoin(1), Rejoin(0)])
        );
        // Mixed, and a NIC that had been detached from its bridge.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("a", true), ("b", false), ("c", true)]),
                &names(&["c"]),
                &names(&["a", "c"])
            ),
            Ok(vec![Rejoin(0), Lone, Current(0)])
        );
        // Two NICs on bridges of one name (different labs): each once.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("lan", true), ("lan", true)]),
                &names(&["lan"]),
                &names(&["lan"])
            ),
            Ok(vec![Current(0), Rejoin(0)])
        );
        assert_eq!(plan_nics("v", &[], &[], &names(&["lan"])), Ok(vec![]));
    }

    #[test]
    fn a_nic_mismatch_names_the_bridge_and_the_fix() {
        let e = plan_nics("v", &want(&[("lan", true)]), &[], &[]).unwrap_err();
        assert_eq!(
            e,
            "the snapshot's VM had a NIC on bridge `lan` (its NICs: lan), and vm `v` is not attached to a \
             bridge of that name; attach it (lab:bridge(\"lan\"):attach(vm)) before vm:restore"
        );
        let e = plan_nics("v", &want(&[("lan", true)]), &names(&["lan", "wan"]), &[]).unwrap_err();
        assert!(
            e.starts_with("vm `v` is attached to bridge(s) wan but the snapshot's VM had no NIC there (its NICs: lan)"),
            "{e}"
        );
        let e = plan_nics("v", &[], &names(&["wan"]), &[]).unwrap_err();
        assert!(
            e.contains("(its NICs: none)") && e.contains("bridge:detach(vm)"),
            "{e}"
        );
    }

    #[test]
    fn a_lone_port_is_link_down_with_the_snapshot_mac() {
        let mac: MacAddr = "02:00:00:00:00:07".parse().unwrap();
        let (sw, cfg) = lone_port("lan", "v", mac).unwrap();
        assert_eq!(cfg.mac, mac);
        assert_eq!(sw.is_connected("v").ok(), Some(false));
        assert_eq!(sw.members(), ["v"]);
    }

    #[test]
    fn guest_names() {
        assert_eq!(guest_index("eth0"), Some(0));
        assert_eq!(guest_index("eth12"), Some(12));
        assert_eq!(guest_index("enp0s3"), Some(3));
        assert_eq!(guest_index("ens1"), Some(1));
        assert_eq!(guest_index("eth"), None);
        assert_eq!(guest_index("eth-1"), None);
        assert_eq!(guest_index("lan"), None);
    }
}
