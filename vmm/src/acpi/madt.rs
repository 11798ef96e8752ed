//! The MADT (ACPI 6.5, 5.2.12): the local APIC address, one enabled local
//! APIC per vCPU (processor UID = APIC ID = vCPU index, as the MP table and
//! the vCPUs' CPUID say) and KVM's in-kernel IOAPIC at 0xfec0_0000 with GSI
//! base 0, its ID after the processors' as in the MP table.
//!
//! No interrupt source overrides: the MP table routes ISA IRQ *n* to IOAPIC
//! pin *n* with bus-conforming polarity and trigger, which is what ACPI
//! assumes when there is no override. (An override for IRQ 0 would even be
//! wrong here: the hardware-reduced FADT's SCI_INT is 0, and Linux applies
//! an override of the SCI's IRQ as the SCI's, level and active low.)

use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::Aml;

use super::{OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::arch::mptable::{APIC_DEFAULT_PHYS_BASE, IO_APIC_DEFAULT_PHYS_BASE};

/// The IOAPIC's first GSI.
pub const IOAPIC_GSI_BASE: u32 = 0;

/// The MADT's bytes for `vcpus` processors.
pub fn build(vcpus: u8) -> Vec<u8> {
    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
        LocalInterruptController::Address(APIC_DEFAULT_PHYS_BASE),
    );
    for id in 0..vcpus {
        madt.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    // The IOAPIC's ID follows the processors' (crate::arch::mptable).
    madt.add_structure(IoApic::new(
        vcpus,
        IO_APIC_DEFAULT_PHYS_BASE,
        IOAPIC_GSI_BASE,
    ));
    let mut v = Vec::new();
    madt.to_aml_bytes(&mut v);
    v
}
