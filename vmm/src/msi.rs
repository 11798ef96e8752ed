//! MSI messages and the router that turns one into a KVM route.
//!
//! The PCI device models (`devices/pci/msix.rs`) produce messages and call a
//! router; `vstate/vm.rs` implements the router with KVM's GSI routing
//! table. Both name these types, so they live below both folders.

use serde::{Deserialize, Serialize};

/// An MSI message: where the guest wants the write and what it writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsiMessage {
    /// Message address (LAPIC range on x86).
    pub address: u64,
    /// Message data (vector, delivery mode).
    pub data: u32,
}

/// Installs or removes the KVM route of one GSI.
pub trait MsiRouter: Send + Sync {
    /// Routes `gsi` to `msg`, or removes its route (`None`).
    fn route(&self, gsi: u32, msg: Option<MsiMessage>) -> std::io::Result<()>;
}
