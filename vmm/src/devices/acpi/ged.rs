//! The ACPI Generic Event Device (ACPI 6.5, 5.6.9, `ACPI0013`): one
//! interrupt and one 32-bit event register in an MMIO page. The VMM sets a
//! bit and raises the interrupt; the guest's GED driver runs the DSDT's
//! `_EVT`, which reads the register (the read clears it) and, for the power
//! button bit, does `Notify(\_SB.PWRB, 0x80)`. Linux's ACPI button driver
//! turns that into KEY_POWER on its "Power Button" input device.
//!
//! This is how a hardware-reduced platform (no fixed-feature PM1 event
//! block, so no fixed power button) signals a button press; Cloud
//! Hypervisor and Firecracker do the same.

use vm_superio::Trigger;

use crate::bus::BusDevice;

/// The GED's interrupt (GSI): the last IOAPIC pin, which the virtio-mmio
/// slots leave free (`device_manager::mmio::LAST_IRQ`).
pub const GED_IRQ: u32 = 23;
/// Offset of the event register: 32 bits, read-to-clear, read-only.
pub const GED_EVENT_OFFSET: u64 = 0;
/// Width of the event register.
pub const GED_EVENT_BYTES: usize = 4;
/// Event bit: the power button was pressed.
pub const GED_EVENT_POWER_BUTTON: u32 = 1;

/// The device. `T` raises its interrupt (an irqfd in the VMM).
pub struct Ged<T: Trigger> {
    irq: T,
    pending: u32,
    refused: u64,
}

/// An error raising the GED's interrupt.
#[derive(Debug, thiserror::Error)]
#[error("cannot raise the ACPI GED interrupt (GSI {GED_IRQ})")]
pub struct GedError(#[source] pub std::io::Error);

impl<T: Trigger<E = std::io::Error>> Ged<T> {
    /// A GED with no event pending, raising `irq`.
    pub fn new(irq: T) -> Ged<T> {
        Ged {
            irq,
            pending: 0,
            refused: 0,
        }
    }

    /// Sets the power-button event bit and raises the interrupt. Presses
    /// before the guest reads the register merge into one event.
    pub fn press_power_button(&mut self) -> Result<(), GedError> {
        self.pending |= GED_EVENT_POWER_BUTTON;
        self.irq.trigger().map_err(GedError)
    }

    /// Events set and not yet read by the guest.
    pub fn pending(&self) -> u32 {
        self.pending
    }

    /// Guest accesses refused so far (wrong offset or width, any write).
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

impl<T: Trigger<E = std::io::Error> + Send> BusDevice for Ged<T> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset != GED_EVENT_OFFSET || data.len() != GED_EVENT_BYTES {
            self.refused = self.refused.saturating_add(1);
            data.fill(0xff);
            return;
        }
        data.copy_from_slice(&self.pending.to_le_bytes());
        self.pending = 0;
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        // The register is read-only; nothing in the page takes a write.
        self.refused = self.refused.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Count(Arc<AtomicU32>);
    impl Trigger for Count {
        type E = std::io::Error;
        fn trigger(&self) -> std::io::Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn power_button_sets_the_bit_raises_the_irq_and_read_clears() {
        let irq = Count::default();
        let mut g = Ged::new(irq.clone());
        g.press_power_button().expect("trigger");
        assert_eq!(irq.0.load(Ordering::SeqCst), 1);
        let mut b = [0u8; 4];
        g.read(GED_EVENT_OFFSET, &mut b);
        assert_eq!(u32::from_le_bytes(b), GED_EVENT_POWER_BUTTON);
        g.read(GED_EVENT_OFFSET, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0, "the read cleared it");
        assert_eq!(g.refused(), 0);
    }

    #[test]
    fn hostile_accesses_are_refused_and_counted() {
        let mut g = Ged::new(Count::default());
        g.press_power_button().expect("trigger");
        let mut one = [0u8; 1];
        g.read(GED_EVENT_OFFSET, &mut one);
        assert_eq!(one, [0xff]);
        let mut four = [0u8; 4];
        g.read(2, &mut four);
        g.read(u64::MAX, &mut four);
        g.write(GED_EVENT_OFFSET, &[0; 4]);
        g.write(u64::MAX, &[0xff; 8]);
        assert_eq!(g.refused(), 5);
        assert_eq!(
            g.pending(),
            GED_EVENT_POWER_BUTTON,
            "refused reads clear nothing"
        );
    }
}
