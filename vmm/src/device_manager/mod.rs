//! Places devices on buses, wires their interrupts (irqfd) and, for virtio-mmio,
//! writes their `virtio_mmio.device=` command-line entries. The only module
//! besides `builder` that names concrete devices.

pub mod acpi;
pub mod legacy;
pub mod mmio;
pub mod pci;

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::devices::virtio::mmio::{MmioTransport, MmioTransportState};
use crate::devices::virtio::pci::{PciTransportState, VirtioPciDevice};

/// One virtio device's transport, as the machine keeps it (the buses hold
/// other references): what status queries and snapshots go through.
#[derive(Clone)]
pub enum VirtioSlot {
    /// A virtio-mmio window.
    Mmio(Arc<Mutex<MmioTransport>>),
    /// A virtio-pci function.
    Pci(Arc<Mutex<VirtioPciDevice>>),
}

/// A transport's saved state, tagged by transport.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VirtioTransportState {
    /// virtio-mmio.
    Mmio(MmioTransportState),
    /// virtio-pci.
    Pci(PciTransportState),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl VirtioSlot {
    /// The device status register (virtio 1.2, 2.1) as the driver last wrote it.
    pub fn status(&self) -> u32 {
        match self {
            VirtioSlot::Mmio(t) => lock(t).status(),
            VirtioSlot::Pci(t) => lock(t).status(),
        }
    }

    /// Saves the transport and its device (which stays quiesced until
    /// [`Self::resume_after_save`]).
    pub fn save(&self) -> VirtioTransportState {
        match self {
            VirtioSlot::Mmio(t) => VirtioTransportState::Mmio(lock(t).save()),
            VirtioSlot::Pci(t) => VirtioTransportState::Pci(lock(t).save()),
        }
    }

    /// After a restore, once the vCPUs (and their LAPICs) are restored:
    /// delivers the MSI-X interrupts the devices raised meanwhile, which KVM
    /// would have dropped. Nothing to do for virtio-mmio (its IOAPIC pin
    /// holds the interrupt).
    pub fn release_interrupts(&self) {
        if let VirtioSlot::Pci(t) = self {
            lock(t).release_interrupts();
        }
    }

    /// Restarts the device `save` quiesced.
    pub fn resume_after_save(&self) {
        match self {
            VirtioSlot::Mmio(t) => lock(t).resume_after_save(),
            VirtioSlot::Pci(t) => lock(t).resume_after_save(),
        }
    }
}
