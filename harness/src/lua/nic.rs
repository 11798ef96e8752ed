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

use mlua::{Lua, UserData, UserDataMethods};

use super::bridge::{counters_table, Bridge};
use super::capture::CaptureSource;
use super::err;
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
    bridge.realise(vm, &machine, &ifname)
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

/// For a kvm boot: one virtio-net device per attached bridge, in bridge-name
/// order, so the guest kernel (which numbers NICs in probe order, i.e. the
/// order of `virtio_mmio.device=` entries) names them eth0, eth1, … exactly
/// like the local backend's TAPs. Each port is attached to its bridge's
/// switch now; dropping the list (a failed boot) detaches them again.
pub fn vmm_ports(vm: &Vm) -> mlua::Result<Vec<provium_vmm::vmm_config::NetConfig>> {
    sorted_bridges(vm)
        .iter()
        .map(|b| {
            b.vmm_port(vm).map_err(|e| {
                err(format!(
                    "vm:boot: vm `{}`: cannot create its NIC on bridge `{}`: {e}",
                    vm.name(),
                    b.name()
                ))
            })
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
