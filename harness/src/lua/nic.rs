//! The Nic userdata: one (bridge, vm) attachment's counters, link state
//! and per-NIC capture, and `vm:nic(name)`. The bridge and the VM's
//! attachments live in the Lua-free `network` model (guest interface names
//! are described there); a NIC reaches its VM only through the VM's
//! context.

use mlua::{Lua, Table, UserData, UserDataMethods, Value};
use provium_netsetup::PortCounters;

use super::capture::CaptureSource;
use super::stream::{creation_site, Stream};
use super::vm_ctx::VmCtx;
use super::{err, rust_err};
use crate::network::{sorted_bridges, Bridge, NetMember};

/// A (bridge, vm) handle. `vm` is None for the bare-string form.
#[derive(Clone)]
pub struct Nic {
    bridge: Bridge,
    vm_name: String,
    vm: Option<VmCtx>,
}

impl Nic {
    pub fn new(bridge: Bridge, vm_name: String, vm: Option<VmCtx>) -> Nic {
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
        let cap = self
            .bridge
            .capture_nic(&self.vm_name, &label)
            .map_err(|e| rust_err("nic:capture", &e))?;
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

impl Nic {
    /// `nic:{method}`: link up or down (recorded for a NIC not made yet).
    fn set_link(&self, method: &str, up: bool) -> mlua::Result<()> {
        self.bridge
            .set_link(&self.vm_name, up)
            .map_err(|e| rust_err(&format!("nic:{method}"), &e))
    }
}

impl UserData for Nic {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("counters", |lua, this, ()| {
            counters_table(lua, &this.bridge.counters(&this.vm_name))
        });
        m.add_method("capture", |lua, this, ()| this.capture(lua));
        m.add_method("disconnect", |_, this, ()| {
            this.set_link("disconnect", false)
        });
        m.add_method("reconnect", |_, this, ()| this.set_link("reconnect", true));
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

/// `ethN` for a guest-name index, from `eth<N>`, `enp0s<N>` or `ens<N>`.
pub fn guest_index(name: &str) -> Option<usize> {
    ["eth", "enp0s", "ens"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .filter(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
}

/// A u64 as a Lua integer when it fits, else as its decimal string.
pub fn u64_value(lua: &Lua, v: u64) -> mlua::Result<Value> {
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

/// `vm:nic(name)`: by bridge name, or by guest name (`eth<N>`: the Nth
/// bridge sorted by name). `ctx` is `vm`'s context (what the NIC's
/// captures count against).
pub fn vm_nic(vm: &NetMember, ctx: &VmCtx, name: &str) -> mlua::Result<Nic> {
    let bridges = sorted_bridges(vm);
    let found = bridges
        .iter()
        .find(|b| b.name() == name)
        .or_else(|| guest_index(name).and_then(|i| bridges.get(i)));
    match found {
        Some(b) => Ok(Nic::new(
            b.clone(),
            vm.name().to_string(),
            Some(ctx.clone()),
        )),
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
