//! The Lua edge of the file's virtual networks. The model (bridges, their
//! members and NICs, naming, kvm ports) is Lua-free, in [`crate::network`];
//! this module joins it to the Lua layer: the VM context is the model's
//! [`MemberVm`], a `bridge:capture()` stream its [`LiveCapture`], and a
//! [`NetworkError`] reaches Lua with its chain flattened once. The `bridge`
//! and `nic` userdata (`lua::bridge`, `lua::nic`) call the model directly.

use std::any::Any;
use std::sync::Arc;

use super::phase::Phase;
use super::rust_err;
use super::stream::Stream;
use super::vm_ctx::VmCtx;
use crate::backend::Guest;
use crate::network::{LiveCapture, MemberVm, NetMember, NetworkError, VmmNics};

/// A network error raised into Lua, its chain flattened.
impl From<NetworkError> for mlua::Error {
    fn from(e: NetworkError) -> Self {
        super::err(crate::error_chain::flatten(&e))
    }
}

/// A VM as its bridges see it: its per-VM context.
impl MemberVm for VmCtx {
    fn name(&self) -> &str {
        VmCtx::name(self)
    }

    fn is_booted(&self) -> bool {
        self.phase() == Phase::Booted
    }

    fn is_gone(&self) -> bool {
        matches!(self.phase(), Phase::Shutdown | Phase::Dead)
    }

    fn running_machine(&self) -> Option<Arc<dyn Guest>> {
        VmCtx::running_machine(self)
    }

    fn same_vm(&self, other: &dyn MemberVm) -> bool {
        other
            .as_any()
            .downcast_ref::<VmCtx>()
            .is_some_and(|o| self.same(o))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A `bridge:capture()` stream, as the bridge keeps it.
impl LiveCapture for Stream {
    fn is_open(&self) -> bool {
        Stream::is_open(self)
    }

    fn live_label(&self) -> String {
        self.described_at()
    }
}

/// `vm:boot()`'s error for a NIC it could not make.
fn boot_nic_error(vm: &NetMember, e: NetworkError) -> mlua::Error {
    rust_err(&format!("vm:boot: vm `{}`", vm.name()), &e)
}

/// Called by `vm:boot()` once the guest is up: one NIC per attached bridge,
/// `eth0`, `eth1`, … in bridge-name order ([`crate::network::realise_all`]).
pub fn realise_all(vm: &NetMember) -> mlua::Result<()> {
    crate::network::realise_all(vm).map_err(|e| boot_nic_error(vm, e))
}

/// For a kvm boot: one virtio-net port per attached bridge
/// ([`crate::network::vmm_ports`]).
pub fn vmm_ports(vm: &NetMember) -> mlua::Result<VmmNics> {
    crate::network::vmm_ports(vm).map_err(|e| boot_nic_error(vm, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::test_env::{env, vm};
    use crate::network::Bridge;

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
