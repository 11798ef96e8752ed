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

    /// Parses a profile's name (`mmio` or `pci`).
    pub fn from_name(s: &str) -> Option<VirtioTransportKind> {
        match s {
            "mmio" => Some(VirtioTransportKind::Mmio),
            "pci" => Some(VirtioTransportKind::Pci),
            _ => None,
        }
    }
}
