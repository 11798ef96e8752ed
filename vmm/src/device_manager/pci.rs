//! virtio-pci placement: the root complex on the buses (ECAM and the BAR
//! window on MMIO, 0xCF8/0xCFC on PIO), and each virtio device in the next
//! slot with a BAR from the window and one irqfd + GSI per MSI-X vector
//! (GSIs from `vstate::vm::IOAPIC_PINS` up, routed as the guest programs the
//! table). Nothing goes on the command line: the guest scans the bus.

use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::EventFd;

use crate::arch::layout::{PCI_ECAM_BASE, PCI_ECAM_BYTES, PCI_MMIO32_BASE, PCI_MMIO32_BYTES};
use crate::bus::{Bus, BusError};
use crate::devices::pci::root::{CONFIG_IO_BYTES, CONFIG_IO_PORT};
use crate::devices::pci::{
    MsixVectors, PciBarWindow, PciConfigError, PciConfigIo, PciEcam, PciRoot, PciRootError,
};
use crate::devices::virtio::pci::{vectors_needed, PciTransportState, VirtioPciDevice, BAR_BYTES};
use crate::devices::virtio::{VirtioDevice, VirtioPersistError};
use crate::guest_memory::GuestMemoryMmap;
use crate::vstate::vm::{KvmVm, KvmVmError, IOAPIC_PINS};

/// The most GSIs MSI-X vectors take (KVM allows 4096 routes; a few devices
/// need a handful each).
const MAX_MSI_GSIS: u32 = 1024;

/// An error placing the root complex or a virtio-pci device.
#[derive(Debug, thiserror::Error)]
pub enum PciDevicesError {
    /// A bus range clashed.
    #[error("cannot place the PCI root complex on the buses")]
    Bus(#[source] BusError),
    /// The bus or BAR window is full.
    #[error("cannot place a virtio-pci device")]
    Root(#[source] PciRootError),
    /// The function could not be built (a VMM bug).
    #[error("cannot build the virtio-pci function")]
    Config(#[source] PciConfigError),
    /// Out of GSIs for MSI-X vectors.
    #[error("too many MSI-X vectors: at most {MAX_MSI_GSIS} (fewer virtio devices)")]
    TooManyVectors,
    /// eventfd creation failed.
    #[error("cannot create an MSI-X irqfd")]
    EventFd(#[source] std::io::Error),
    /// irqfd registration failed.
    #[error("cannot register the irqfd of GSI {gsi}")]
    Irqfd {
        /// The GSI.
        gsi: u32,
        /// Cause.
        #[source]
        source: KvmVmError,
    },
    /// The snapshot's state for this slot was refused.
    #[error("cannot restore the virtio-pci device in slot {slot}")]
    Restore {
        /// PCI slot (device number on bus 0).
        slot: u8,
        /// Why.
        #[source]
        source: VirtioPersistError,
    },
}

/// The root complex and the allocation state of its GSIs.
pub struct PciDevices {
    /// Bus 0 (also on the buses through its three views).
    pub root: Arc<Mutex<PciRoot>>,
    next_gsi: u32,
}

impl PciDevices {
    /// Builds bus 0 and puts its views on `pio` and `mmio`.
    pub fn new(pio: &mut Bus, mmio: &mut Bus) -> Result<PciDevices, PciDevicesError> {
        let root = Arc::new(Mutex::new(PciRoot::new(
            (PCI_ECAM_BASE, PCI_ECAM_BYTES),
            (PCI_MMIO32_BASE, PCI_MMIO32_BYTES),
        )));
        pio.insert(
            CONFIG_IO_PORT,
            CONFIG_IO_BYTES,
            Arc::new(Mutex::new(PciConfigIo(root.clone()))),
        )
        .map_err(PciDevicesError::Bus)?;
        mmio.insert(
            PCI_ECAM_BASE,
            PCI_ECAM_BYTES,
            Arc::new(Mutex::new(PciEcam(root.clone()))),
        )
        .map_err(PciDevicesError::Bus)?;
        mmio.insert(
            PCI_MMIO32_BASE,
            PCI_MMIO32_BYTES,
            Arc::new(Mutex::new(PciBarWindow(root.clone()))),
        )
        .map_err(PciDevicesError::Bus)?;
        Ok(PciDevices {
            root,
            next_gsi: IOAPIC_PINS,
        })
    }

    /// Puts `device` in the next slot, fresh or (with `state`) restored
    /// from a snapshot.
    pub fn attach(
        &mut self,
        vm: &KvmVm,
        mem: &GuestMemoryMmap,
        device: Box<dyn VirtioDevice>,
        state: Option<&PciTransportState>,
    ) -> Result<Arc<Mutex<VirtioPciDevice>>, PciDevicesError> {
        let mut root = self.root.lock().unwrap_or_else(|e| e.into_inner());
        let slot = root.next_slot().map_err(PciDevicesError::Root)?;
        let bar = root
            .allocate_bar(BAR_BYTES)
            .map_err(PciDevicesError::Root)?;
        let n = u32::from(vectors_needed(device.as_ref()));
        let end = self
            .next_gsi
            .checked_add(n)
            .filter(|&e| e <= IOAPIC_PINS + MAX_MSI_GSIS)
            .ok_or(PciDevicesError::TooManyVectors)?;
        let gsis: Vec<u32> = (self.next_gsi..end).collect();
        let mut fds = Vec::with_capacity(gsis.len());
        for &gsi in &gsis {
            let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(PciDevicesError::EventFd)?;
            vm.register_irqfd(&fd, gsi)
                .map_err(|source| PciDevicesError::Irqfd { gsi, source })?;
            fds.push(fd);
        }
        self.next_gsi = end;
        let msix = Arc::new(MsixVectors::new(fds, gsis, vm.gsi_router()));
        if state.is_some() {
            // Until the restored vCPUs exist: `VirtioSlot::release_interrupts`.
            msix.hold();
        }
        let dev = match state {
            None => VirtioPciDevice::new(device, mem.clone(), bar, msix)
                .map_err(PciDevicesError::Config)?,
            Some(st) => VirtioPciDevice::restore(device, mem.clone(), bar, msix, st)
                .map_err(|source| PciDevicesError::Restore { slot, source })?,
        };
        let dev = Arc::new(Mutex::new(dev));
        root.insert(slot, dev.clone())
            .map_err(PciDevicesError::Root)?;
        Ok(dev)
    }
}
