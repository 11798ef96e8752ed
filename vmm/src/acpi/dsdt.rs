//! The DSDT (ACPI 6.5, 5.2.11.1): every device the VMM emulates, under
//! `\_SB`, and the `_S5_` sleep package.
//!
//! - `VRnn`, one per virtio-mmio window: `LNRO0005` (the ID Linux's
//!   virtio_mmio driver matches in its ACPI table) with `Memory32Fixed` for
//!   the 4 KiB window and an edge, active-high `Interrupt` for its GSI, the
//!   wiring the MP table and the irqfd give it. Left out when the command
//!   line announces the windows (`vmm_config::DeviceDiscovery::Cmdline`).
//! - `COM1` (`PNP0501`): the 8250 at 0x3f8, IRQ 4.
//! - `PS2K` (`PNP0303`): the i8042 at 0x60/0x64, IRQ 1.
//! - `GED_` (`ACPI0013`): the Generic Event Device (`devices::acpi::ged`);
//!   its `_EVT` reads the event register and notifies `PWRB` (`PNP0C0C`,
//!   the power button) with 0x80 when the power-button bit is set.
//! - `MBRD` (`PNP0C02`, motherboard resources): the I/O ports and MMIO that
//!   no other device claims (sleep registers, the legacy PM1a control port,
//!   the GED page and, with PCI, the ECAM window, which Linux wants
//!   reserved here before it uses MMCONFIG).
//! - `PCI0` with PCI (`super::pci`).

use acpi_tables::aml::{
    And, Device, EISAName, Field, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule, If,
    Interrupt, Local, Memory32Fixed, Method, Name, Notify, OpRegion, OpRegionSpace, Package, Path,
    ResourceTemplate, Scope, Store, IO, ZERO,
};
use acpi_tables::sdt::Sdt;
use acpi_tables::Aml;

use super::{AcpiError, AcpiMachine, OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::arch::layout::{ACPI_GED_MMIO_BASE, ACPI_GED_MMIO_BYTES};
use crate::device_manager::mmio::MmioSlot;
use crate::devices::acpi::ged::{GED_EVENT_BYTES, GED_EVENT_POWER_BUTTON, GED_IRQ};
use crate::devices::acpi::sleep::{S5_SLP_TYP, SLEEP_CONTROL_PORT, SLEEP_PORTS_LEN};
use crate::devices::legacy::i8042::I8042_KBD_IRQ;
use crate::devices::legacy::pm_control::{PM1A_CNT_LEN, PM1A_CNT_PORT};
use crate::devices::legacy::serial::{COM1_IRQ, COM1_PORT, UART_PORT_COUNT};
use crate::devices::virtio::mmio::MMIO_WINDOW_BYTES;

/// The DSDT's revision: 2 and above make AML integers 64-bit.
const DSDT_REVISION: u8 = 2;
/// Notify value for a button press (ACPI 6.5, 5.6.6: "device-specific").
const NOTIFY_BUTTON_PRESSED: u8 = 0x80;

fn bytes(t: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}

/// An edge-triggered, active-high, exclusive interrupt the device consumes.
fn edge_irq(gsi: u32) -> Interrupt {
    Interrupt::new(true, true, false, false, gsi)
}

fn port16(port: u64) -> u16 {
    u16::try_from(port).expect("legacy ports are 16-bit constants")
}

fn len8(len: u64) -> u8 {
    u8::try_from(len).expect("legacy port ranges are short constants")
}

fn gpa32(gpa: u64) -> u32 {
    u32::try_from(gpa).expect("fixed device addresses are below 4 GiB")
}

fn virtio_device(index: usize, slot: &MmioSlot) -> Result<Vec<u8>, AcpiError> {
    let base = u32::try_from(slot.base)
        .ok()
        .filter(|b| b.checked_add(MMIO_WINDOW_BYTES as u32).is_some())
        .ok_or(AcpiError::VirtioWindow { base: slot.base })?;
    let uid = u32::try_from(index).expect("at most 19 virtio-mmio slots");
    let name = format!("VR{:02X}", index & 0xff);
    let hid = Name::new("_HID".into(), &"LNRO0005");
    let uid = Name::new("_UID".into(), &uid);
    let mem = Memory32Fixed::new(true, base, MMIO_WINDOW_BYTES as u32);
    let irq = edge_irq(slot.irq);
    let crs = Name::new("_CRS".into(), &ResourceTemplate::new(vec![&mem, &irq]));
    Ok(bytes(&Device::new(
        name.as_str().into(),
        vec![&hid, &uid, &crs],
    )))
}

fn serial() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0501"));
    let uid = Name::new("_UID".into(), &ZERO);
    let ports = IO::new(
        port16(COM1_PORT),
        port16(COM1_PORT),
        1,
        len8(UART_PORT_COUNT),
    );
    let irq = edge_irq(COM1_IRQ);
    let crs = Name::new("_CRS".into(), &ResourceTemplate::new(vec![&ports, &irq]));
    bytes(&Device::new("COM1".into(), vec![&hid, &uid, &crs]))
}

fn i8042() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0303"));
    let uid = Name::new("_UID".into(), &ZERO);
    let data = IO::new(0x60, 0x60, 1, 1);
    let cmd = IO::new(0x64, 0x64, 1, 1);
    let irq = edge_irq(I8042_KBD_IRQ);
    let crs = Name::new(
        "_CRS".into(),
        &ResourceTemplate::new(vec![&data, &cmd, &irq]),
    );
    bytes(&Device::new("PS2K".into(), vec![&hid, &uid, &crs]))
}

fn power_button() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0C0C"));
    let uid = Name::new("_UID".into(), &ZERO);
    bytes(&Device::new("PWRB".into(), vec![&hid, &uid]))
}

fn ged() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &"ACPI0013");
    let uid = Name::new("_UID".into(), &ZERO);
    let irq = edge_irq(GED_IRQ);
    let crs = Name::new("_CRS".into(), &ResourceTemplate::new(vec![&irq]));
    let base = gpa32(ACPI_GED_MMIO_BASE);
    let len = u8::try_from(GED_EVENT_BYTES).expect("4");
    let region = OpRegion::new("GDST".into(), OpRegionSpace::SystemMemory, &base, &len);
    let field = Field::new(
        "GDST".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::Preserve,
        vec![FieldEntry::Named(*b"GDAT", GED_EVENT_BYTES * 8)],
    );
    // _EVT(Arg0 = the GSI): Local0 = GDAT (the read clears it); if the
    // power-button bit is set, Notify(\_SB.PWRB, 0x80).
    let gdat = Path::new("GDAT");
    let read = Store::new(&Local(0), &gdat);
    let test = And::new(&ZERO, &Local(0), &GED_EVENT_POWER_BUTTON);
    let pwrb = Path::new("\\_SB_.PWRB");
    let notify = Notify::new(&pwrb, &NOTIFY_BUTTON_PRESSED);
    let if_pwrb = If::new(&test, vec![&notify]);
    let evt = Method::new("_EVT".into(), 1, true, vec![&read, &if_pwrb]);
    bytes(&Device::new(
        "GED_".into(),
        vec![&hid, &uid, &crs, &region, &field, &evt],
    ))
}

fn motherboard(m: &AcpiMachine) -> Result<Vec<u8>, AcpiError> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0C02"));
    let uid = Name::new("_UID".into(), &ZERO);
    let sleep = IO::new(
        port16(SLEEP_CONTROL_PORT),
        port16(SLEEP_CONTROL_PORT),
        1,
        len8(SLEEP_PORTS_LEN),
    );
    let pm = IO::new(
        port16(PM1A_CNT_PORT),
        port16(PM1A_CNT_PORT),
        1,
        len8(PM1A_CNT_LEN),
    );
    let ged = Memory32Fixed::new(true, gpa32(ACPI_GED_MMIO_BASE), gpa32(ACPI_GED_MMIO_BYTES));
    let ecam = m
        .pci
        .as_ref()
        .map(super::pci::ecam_reservation)
        .transpose()?;
    let mut res: Vec<&dyn Aml> = vec![&sleep, &pm, &ged];
    if let Some(e) = &ecam {
        res.push(e);
    }
    let crs = Name::new("_CRS".into(), &ResourceTemplate::new(res));
    Ok(bytes(&Device::new("MBRD".into(), vec![&hid, &uid, &crs])))
}

/// The DSDT's bytes for `m`.
pub fn build(m: &AcpiMachine) -> Result<Vec<u8>, AcpiError> {
    let mut sb = Vec::new();
    sb.extend(serial());
    sb.extend(i8042());
    sb.extend(power_button());
    sb.extend(ged());
    sb.extend(motherboard(m)?);
    for (i, slot) in m.virtio_mmio.iter().enumerate() {
        sb.extend(virtio_device(i, slot)?);
    }
    if let Some(pci) = &m.pci {
        sb.extend(super::pci::host_bridge(pci)?);
    }
    let mut dsdt = Sdt::new(
        *b"DSDT",
        36,
        DSDT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    dsdt.append_slice(&Scope::raw("\\_SB_".into(), sb));
    // \_S5_: SLP_TYPa, SLP_TYPb (unused on a hardware-reduced platform),
    // two reserved.
    let s5 = Package::new(vec![&S5_SLP_TYP, &ZERO, &ZERO, &ZERO]);
    dsdt.append_slice(&bytes(&Name::new("_S5_".into(), &s5)));
    Ok(dsdt.as_slice().to_vec())
}
