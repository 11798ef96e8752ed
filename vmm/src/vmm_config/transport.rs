//! Which transport carries the virtio devices (blk, net, vsock, rng): all
//! of them on one.

/// The virtio transport of a VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VirtioTransportKind {
    /// virtio-mmio windows announced with `virtio_mmio.device=` on the
    /// command line (needs CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES).
    #[default]
    Mmio,
    /// virtio-pci functions on a PCI root bus the guest scans (needs
    /// CONFIG_PCI, CONFIG_PCI_MSI and CONFIG_VIRTIO_PCI).
    Pci,
}

impl VirtioTransportKind {
    /// The name a profile uses.
    pub fn name(self) -> &'static str {
        match self {
            VirtioTransportKind::Mmio => "mmio",
            VirtioTransportKind::Pci => "pci",
        }
    }

    /// How many virtio devices fit on this transport: on virtio-mmio one
    /// per IOAPIC pin from `FIRST_IRQ` to `LAST_IRQ` (pin 23 is the ACPI
    /// GED's); on virtio-pci one per device number of bus 0 but the host
    /// bridge's (MSI-X needs no pin). The builder refuses more
    /// (`MmioDevicesError::TooManyDevices`, `PciRootError::BusFull`); the
    /// harness checks first, naming the profile keys.
    pub fn max_devices(self) -> usize {
        use crate::device_manager::mmio::{FIRST_IRQ, LAST_IRQ};
        match self {
            VirtioTransportKind::Mmio => (LAST_IRQ - FIRST_IRQ + 1) as usize,
            VirtioTransportKind::Pci => crate::devices::pci::root::SLOTS - 1,
        }
    }

    /// Parses a profile's name (`mmio` or `pci`).
    pub fn from_name(s: &str) -> Option<VirtioTransportKind> {
        match s {
            "mmio" => Some(VirtioTransportKind::Mmio),
            "pci" => Some(VirtioTransportKind::Pci),
            _ => None,
        }
    }
}
