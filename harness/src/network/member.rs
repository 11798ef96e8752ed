//! What a bridge needs of a VM ([`MemberVm`]). The VM layer above
//! implements it (`lua::vm_ctx::VmCtx`, in `lua::network`), so the network
//! model holds no Lua type.

use std::any::Any;
use std::sync::Arc;

use crate::backend::Guest;

/// What a bridge asks of one of its VMs. The VM layer above implements it
/// (`lua::vm_ctx::VmCtx`), so the network model holds no Lua type.
pub trait MemberVm: Send + Sync {
    /// The VM's name: its member and switch port name on every bridge.
    fn name(&self) -> &str;
    /// The VM is booted (its NICs are realised when it joins).
    fn is_booted(&self) -> bool;
    /// The VM is shut down or dead: another VM may take its name.
    fn is_gone(&self) -> bool;
    /// The machine of a booted VM (what its NICs are made on).
    fn running_machine(&self) -> Option<Arc<dyn Guest>>;
    /// True when `other` is this very VM (not one of the same name).
    fn same_vm(&self, other: &dyn MemberVm) -> bool;
    /// For [`MemberVm::same_vm`]: the implementor, to compare with its own.
    fn as_any(&self) -> &dyn Any;
}
