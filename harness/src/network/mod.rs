//! The file's virtual networks, with no Lua in them: a bridge's switch and
//! members ([`Bridge`]), each VM's attachment records ([`VmLinks`], seen by
//! a bridge as a [`NetMember`]), and the VM side of networking: which guest
//! interface a bridge gets, realising NICs when a VM runs, and the
//! virtio-net ports of a kvm boot or restore. The `bridge` and `nic`
//! userdata (`lua::bridge`, `lua::nic`, with the glue in `lua::network`)
//! are thin Lua faces over this module: they parse arguments, call it and
//! turn its [`NetworkError`]s into Lua errors.
//!
//! One module per concern, each using only those above it:
//! - [`naming`]: a NIC's MAC, guest interface names, the uplink TAP's name.
//! - [`error`]: [`NetworkError`]. [`member`]: what a bridge needs of a VM
//!   ([`MemberVm`]). [`capture`]: the open whole-bridge captures a bridge
//!   keeps ([`LiveCapture`]).
//! - [`bridge`]: the bridge (switch, members and their NICs' state, routes,
//!   captures) and a VM's attachment records ([`NetMember`], [`VmLinks`]).
//! - [`realise`]: making a member's NIC when its VM runs (local TAP, kvm
//!   port or NIC slot).
//! - [`membership`]: joining a bridge (`bridge:attach`, a restore's
//!   member).
//! - [`uplink`], then [`lifetime`]: the bridge's uplink, and closing it.
//! - [`record`]: a bridge as a lab snapshot records it, and putting it back.
//! - [`ports`]: the virtio-net ports of a kvm boot or restore, and what a
//!   snapshot records of them ([`NicDecl`]); the plan itself
//!   (`backend::plan_nics`) is the kvm backend's.
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
//! A VM attached before boot gets exactly the rule names ([`naming`]); one
//! attached while booted gets its rule name if free, else the lowest free
//! `ethN`; `nic:ifname()` tells the real name. `vm:nic("eth1")` always
//! follows the rule (the Nth bridge by name); prefer
//! `vm:nic("bridge_name")`.
//!
//! # Locking
//! The bridge's state lock may take a VM's state lock (its phase); VM code
//! never calls into a bridge while holding its own state lock.

pub mod bridge;
pub mod capture;
pub mod error;
pub mod lifetime;
pub mod member;
pub mod membership;
pub mod naming;
pub mod ports;
pub mod realise;
pub mod record;
#[cfg(test)]
pub(crate) mod test_env;
pub mod uplink;

pub use bridge::{sorted_bridges, Bridge, NetMember, VmLinks, WeakBridge};
pub use capture::LiveCapture;
pub use error::{NetworkError, NicMacError};
pub use member::MemberVm;
pub use naming::{ifname_for, nic_mac, uplink_tap_name};
pub use ports::{
    nic_decls, restore_ports, restore_slot_ports, slot_nic_decls, vmm_ports, MachineNic, NicDecl,
    SlotNicDecl, VmmNics,
};
pub use realise::{realise_all, realise_on};

/// The switch port name of a bridge's uplink (not a valid VM name on any
/// backend, so it never collides with a member).
pub const UPLINK_PORT: &str = "@uplink";
/// The uplink's default address (the guests' gateway).
pub const DEFAULT_UPLINK_ADDR: &str = "10.0.2.1/24";

/// What `provium:bridge(name, opts)` may set on a bridge it creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BridgeOpts {
    /// Let the kernel forward the plain directions between sandbox NICs
    /// (docs/networking.md, "The kernel path"); `{kernel_path = false}`
    /// sends every frame through the switch.
    pub kernel_path: bool,
}

impl Default for BridgeOpts {
    fn default() -> Self {
        BridgeOpts { kernel_path: true }
    }
}
