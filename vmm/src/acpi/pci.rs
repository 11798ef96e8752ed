//! The PCI host bridge in ACPI: `\_SB.PCI0` in the DSDT (`PNP0A08`, a PCI
//! Express root bridge, compatible with `PNP0A03`; segment 0, buses 0 to
//! `bus_end`; its `_CRS` gives the bus range, the 0xCF8-0xCFF configuration
//! ports and the 32-bit BAR window) and the MCFG with the ECAM window. The
//! PCI transport passes a `PciHostAcpi` when PCI is on; without it neither
//! appears.

use acpi_tables::aml::{
    AddressSpace, AddressSpaceCacheable, Device, EISAName, Memory32Fixed, Name, ResourceTemplate,
    IO, ZERO,
};
use acpi_tables::mcfg::MCFG;
use acpi_tables::Aml;

use super::{AcpiError, PciHostAcpi, OEM_ID, OEM_REVISION, OEM_TABLE_ID};

/// The legacy configuration ports (0xCF8 address, 0xCFC data).
pub const PCI_CONFIG_PORT: u16 = 0xcf8;
/// How many ports.
pub const PCI_CONFIG_PORTS: u8 = 8;

fn window32(what: &'static str, base: u64, bytes: u64) -> Result<(u32, u32), AcpiError> {
    let err = || AcpiError::PciWindow { what, base, bytes };
    let end = base
        .checked_add(bytes)
        .filter(|e| bytes > 0 && *e <= 1 << 32)
        .ok_or_else(err)?;
    let b = u32::try_from(base).map_err(|_| err())?;
    let last = u32::try_from(end - 1).map_err(|_| err())?;
    Ok((b, last))
}

/// The ECAM window as a motherboard resource (`PNP0C02`'s `_CRS`).
pub fn ecam_reservation(p: &PciHostAcpi) -> Result<Memory32Fixed, AcpiError> {
    let (base, last) = window32("ECAM", p.ecam_base, p.ecam_bytes)?;
    Ok(Memory32Fixed::new(false, base, last - base + 1))
}

/// `PCI0`'s AML, for the `\_SB` scope.
pub fn host_bridge(p: &PciHostAcpi) -> Result<Vec<u8>, AcpiError> {
    let (mmio_base, mmio_last) = window32("mmio32", p.mmio32_base, p.mmio32_bytes)?;
    window32("ECAM", p.ecam_base, p.ecam_bytes)?;
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0A08"));
    let cid = Name::new("_CID".into(), &EISAName::new("PNP0A03"));
    let adr = Name::new("_ADR".into(), &ZERO);
    let seg = Name::new("_SEG".into(), &ZERO);
    let uid = Name::new("_UID".into(), &ZERO);
    let bbn = Name::new("_BBN".into(), &ZERO);
    let buses = AddressSpace::<u16>::new_bus_number(0, u16::from(p.bus_end));
    let config = IO::new(PCI_CONFIG_PORT, PCI_CONFIG_PORT, 1, PCI_CONFIG_PORTS);
    let mmio = AddressSpace::<u32>::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        mmio_base,
        mmio_last,
        None,
    );
    let crs = Name::new(
        "_CRS".into(),
        &ResourceTemplate::new(vec![&buses, &config, &mmio]),
    );
    let mut v = Vec::new();
    Device::new(
        "PCI0".into(),
        vec![&hid, &cid, &adr, &seg, &uid, &bbn, &crs],
    )
    .to_aml_bytes(&mut v);
    Ok(v)
}

/// The MCFG's bytes: one ECAM allocation, segment 0, buses 0 to `bus_end`.
pub fn mcfg(p: &PciHostAcpi) -> Vec<u8> {
    let mut t = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    t.add_ecam(p.ecam_base, 0, 0, p.bus_end);
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}
