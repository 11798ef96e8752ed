//! A PCI root complex for virtio-pci: one bus (bus 0) with a host bridge at
//! 00:00.0 and one single-function device per slot.
//!
//! Why: a stock kernel (Debian, Ubuntu, `defconfig + kvm_guest.config`)
//! finds virtio devices on PCI, not on the virtio-mmio command line. The
//! guest reaches configuration space two ways, both served by [`PciRoot`]:
//! the ECAM window (`arch::layout::PCI_ECAM_BASE`, announced by the ACPI
//! MCFG) and legacy configuration mechanism #1 (ports 0xCF8/0xCFC), which
//! Linux uses with no ACPI at all ("PCI: Probing PCI hardware"). BARs are
//! 32-bit memory BARs handed out at build time from the window at
//! `arch::layout::PCI_MMIO32_BASE`; the whole window is one MMIO bus range
//! that the root dispatches by the BARs' current values, so a guest that
//! moves a BAR (or turns memory decoding off) is followed without touching
//! the bus.
//!
//! - `config.rs`: one function's configuration space (masks, BAR sizing,
//!   capability list);
//! - `msix.rs`: the MSI-X table, PBA and irqfd delivery;
//! - `root.rs`: the bus, the host bridge and the three bus views.

pub mod config;
pub mod msix;
pub mod root;

pub use crate::msi::{MsiMessage, MsiRouter};
pub use config::{AccessRefused, PciConfig, PciConfigError, PciConfigState, PciHeader};
pub use msix::MsixVectors;
pub use root::{PciBarWindow, PciConfigIo, PciEcam, PciRoot, PciRootError};

/// A function on the root bus. It owns its configuration space; the root
/// checks every access's width and alignment before calling it.
pub trait PciDevice: Send {
    /// The configuration space.
    fn config(&self) -> &PciConfig;
    /// Writes configuration space (checked by the root): the default goes
    /// through the masks only; a device with capabilities it acts on (MSI-X
    /// control) overrides this and looks at what changed.
    fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), AccessRefused>;
    /// A read inside BAR `bar` at `offset` (any width: the device checks).
    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    /// A write inside BAR `bar` at `offset`.
    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]);
}
