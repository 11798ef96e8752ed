//! The FADT (ACPI 6.5, 5.2.9): a hardware-reduced platform (no PM1 event
//! blocks, GPEs, PM timer or SCI), so the guest drives only what the DSDT
//! and the sleep registers give it. The power button is a control-method
//! device (`PWR_BUTTON` set: no fixed-feature button), there is no sleep
//! button, and the IA-PC boot flags say the i8042 and legacy devices are
//! present (without the 8042 flag Linux marks the controller absent and
//! never probes it), there is no VGA and no CMOS RTC.

use acpi_tables::fadt::{FADTBuilder, Flags, PmProfile};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::Aml;

use super::{OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::devices::acpi::sleep::{SLEEP_CONTROL_PORT, SLEEP_STATUS_PORT};

/// IAPC_BOOT_ARCH: LEGACY_DEVICES.
pub const IAPC_LEGACY_DEVICES: u16 = 1 << 0;
/// IAPC_BOOT_ARCH: 8042.
pub const IAPC_8042: u16 = 1 << 1;
/// IAPC_BOOT_ARCH: VGA Not Present.
pub const IAPC_NO_VGA: u16 = 1 << 2;
/// IAPC_BOOT_ARCH: CMOS RTC Not Present.
pub const IAPC_NO_CMOS_RTC: u16 = 1 << 5;

/// An 8-bit I/O port register.
fn io_byte(port: u64) -> GAS {
    GAS::new(AddressSpace::SystemIo, 8, 0, AccessSize::ByteAccess, port)
}

/// The FADT's bytes, pointing at the DSDT at `dsdt_gpa`.
pub fn build(dsdt_gpa: u64) -> Vec<u8> {
    let mut b = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt_gpa)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .preferred_pm_profile(PmProfile::Unspecified);
    b.iapc_boot_arch = (IAPC_LEGACY_DEVICES | IAPC_8042 | IAPC_NO_VGA | IAPC_NO_CMOS_RTC).into();
    b.sleep_control_reg = io_byte(SLEEP_CONTROL_PORT);
    b.sleep_status_reg = io_byte(SLEEP_STATUS_PORT);
    b.hypervisor_vendor_identity = u64::from_le_bytes(*b"PROVIUM\0").into();
    let mut v = Vec::new();
    b.finalize().to_aml_bytes(&mut v);
    v
}
