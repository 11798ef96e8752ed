//! ACPI tables for the guest, built with rust-vmm's `acpi_tables` (AML
//! included): RSDP, XSDT, a hardware-reduced FADT (`fadt`), the MADT
//! (`madt`), a DSDT describing every device the VMM emulates (`dsdt`) and,
//! when the machine has a PCI root complex, its `\_SB.PCI0` and the MCFG
//! (`pci`).
//!
//! Why: a stock distribution kernel finds devices only through firmware
//! tables (ACPI on x86); the `virtio_mmio.device=` command-line words need
//! `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES`, which almost no kernel has. ACPI
//! also gives the guest a real power button (the GED, `devices::acpi::ged`)
//! and a way to power itself off (`devices::acpi::sleep`).
//!
//! Where: the RSDP at [`ACPI_RSDP_ADDR`] (0xE0000, the start of the BIOS
//! area Linux scans), the other tables after it up to 1 MiB; the zero
//! page's `acpi_rsdp_addr` (boot protocol 2.14) points at the RSDP too and
//! the e820 map marks the area reserved (`arch::boot_params`). The tables
//! live in guest RAM, so a snapshot carries them and a restore needs
//! nothing of its own: they are written once per cold boot or reset.
//!
//! docs/vmm.md, "ACPI", has what a guest sees and the limits.

mod dsdt;
mod fadt;
mod madt;
mod pci;

use acpi_tables::rsdp::Rsdp;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError};

use crate::arch::layout::{ACPI_AREA_END, ACPI_RSDP_ADDR};
use crate::device_manager::mmio::MmioSlot;

/// OEM ID in every table header.
pub const OEM_ID: [u8; 6] = *b"PRVIUM";
/// OEM table ID in every table header.
pub const OEM_TABLE_ID: [u8; 8] = *b"PROVIUM ";
/// OEM revision in every table header.
pub const OEM_REVISION: u32 = 1;
/// Tables start on this alignment.
const TABLE_ALIGN: u64 = 16;

/// The PCI host bridge to describe: `\_SB.PCI0` in the DSDT and its ECAM in
/// the MCFG. The PCI transport fills this in when PCI is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciHostAcpi {
    /// ECAM base (segment 0, bus 0).
    pub ecam_base: u64,
    /// ECAM size in bytes (1 MiB per bus).
    pub ecam_bytes: u64,
    /// Last bus number (the first is 0).
    pub bus_end: u8,
    /// Base of the 32-bit BAR window.
    pub mmio32_base: u64,
    /// Size of the 32-bit BAR window.
    pub mmio32_bytes: u64,
}

impl PciHostAcpi {
    /// The root complex as the tables describe it: bus 0 only.
    pub fn of_root(root: &crate::devices::pci::PciRoot) -> PciHostAcpi {
        let (ecam_base, ecam_bytes) = root.ecam_window();
        let (mmio32_base, mmio32_bytes) = root.bar_window();
        PciHostAcpi {
            ecam_base,
            ecam_bytes,
            bus_end: 0,
            mmio32_base,
            mmio32_bytes,
        }
    }
}

/// What the tables describe.
#[derive(Clone, Debug, Default)]
pub struct AcpiMachine {
    /// vCPUs: one local APIC each (APIC IDs 0..count).
    pub vcpu_count: u8,
    /// virtio-mmio windows to list in the DSDT (empty when the command
    /// line announces them instead: `vmm_config::DeviceDiscovery`).
    pub virtio_mmio: Vec<MmioSlot>,
    /// The PCI host bridge, when there is one.
    pub pci: Option<PciHostAcpi>,
}

/// An error building or placing the tables.
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    /// The tables outgrew the BIOS area.
    #[error(
        "the ACPI tables need {needed_bytes} bytes from {start:#x}, past the end of the BIOS \
         area at {end:#x} (describe fewer devices)"
    )]
    TooLarge {
        /// Bytes needed from the RSDP on.
        needed_bytes: u64,
        /// The RSDP's address.
        start: u64,
        /// The area's end.
        end: u64,
    },
    /// A PCI window that does not fit 32 bits.
    #[error(
        "the PCI {what} window {base:#x}+{bytes:#x} does not fit below 4 GiB \
         (the DSDT describes it with 32-bit descriptors)"
    )]
    PciWindow {
        /// "mmio32" or "ECAM".
        what: &'static str,
        /// Its base.
        base: u64,
        /// Its size.
        bytes: u64,
    },
    /// A virtio-mmio window that does not fit 32 bits.
    #[error("the virtio-mmio window at {base:#x} does not fit below 4 GiB")]
    VirtioWindow {
        /// Its base.
        base: u64,
    },
    /// Writing to guest memory failed.
    #[error("cannot write the ACPI table {signature} at {gpa:#x} to guest memory")]
    Write {
        /// The table.
        signature: String,
        /// Where.
        gpa: u64,
        /// Cause.
        #[source]
        source: GuestMemoryError,
    },
}

/// One table, placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedTable {
    /// Its signature ("RSD PTR " is shortened to "RSDP").
    pub signature: String,
    /// Guest-physical address.
    pub gpa: u64,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The tables of one machine, placed from [`ACPI_RSDP_ADDR`] up.
#[derive(Clone, Debug)]
pub struct AcpiTables {
    /// RSDP first, then the XSDT, then the tables it lists.
    pub tables: Vec<PlacedTable>,
}

impl AcpiTables {
    /// The RSDP's address (the zero page's `acpi_rsdp_addr`).
    pub fn rsdp_gpa(&self) -> u64 {
        ACPI_RSDP_ADDR
    }

    /// The table with `signature`.
    pub fn get(&self, signature: &str) -> Option<&PlacedTable> {
        self.tables.iter().find(|t| t.signature == signature)
    }

    /// Writes every table into guest memory.
    pub fn write<M: Bytes<GuestAddress, E = GuestMemoryError>>(
        &self,
        mem: &M,
    ) -> Result<(), AcpiError> {
        for t in &self.tables {
            mem.write_slice(&t.bytes, GuestAddress(t.gpa))
                .map_err(|source| AcpiError::Write {
                    signature: t.signature.clone(),
                    gpa: t.gpa,
                    source,
                })?;
        }
        Ok(())
    }
}

fn aml_bytes(t: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(TABLE_ALIGN) * TABLE_ALIGN
}

/// Builds the tables for `m` and places them: RSDP, XSDT, FADT, DSDT, MADT,
/// then MCFG when there is PCI.
pub fn build(m: &AcpiMachine) -> Result<AcpiTables, AcpiError> {
    let dsdt = dsdt::build(m)?;
    let madt = madt::build(m.vcpu_count);
    let mcfg = m.pci.as_ref().map(pci::mcfg);

    // Fixed order: RSDP, XSDT (its size depends only on how many tables it
    // lists), then the rest. Addresses are known before the bytes.
    let rsdp_len = u64::try_from(Rsdp::len()).expect("36 bytes");
    let listed = 2 + usize::from(mcfg.is_some()); // FADT, MADT, MCFG
    let xsdt_gpa = align_up(ACPI_RSDP_ADDR + rsdp_len);
    let xsdt_len = 36 + 8 * listed as u64;
    let fadt_gpa = align_up(xsdt_gpa + xsdt_len);
    let fadt_len = u64::try_from(acpi_tables::fadt::FADT::len()).expect("small");
    let dsdt_gpa = align_up(fadt_gpa + fadt_len);
    let madt_gpa = align_up(dsdt_gpa + dsdt.len() as u64);
    let mcfg_gpa = align_up(madt_gpa + madt.len() as u64);
    let end = mcfg_gpa + mcfg.as_ref().map_or(0, |b| b.len() as u64);
    if end > ACPI_AREA_END {
        return Err(AcpiError::TooLarge {
            needed_bytes: end - ACPI_RSDP_ADDR,
            start: ACPI_RSDP_ADDR,
            end: ACPI_AREA_END,
        });
    }

    let fadt = fadt::build(dsdt_gpa);
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt_gpa);
    xsdt.add_entry(madt_gpa);
    if mcfg.is_some() {
        xsdt.add_entry(mcfg_gpa);
    }
    let xsdt = aml_bytes(&xsdt);
    debug_assert_eq!(xsdt.len() as u64, xsdt_len);
    let rsdp = aml_bytes(&Rsdp::new(OEM_ID, xsdt_gpa));

    let mut tables = vec![
        PlacedTable {
            signature: "RSDP".into(),
            gpa: ACPI_RSDP_ADDR,
            bytes: rsdp,
        },
        PlacedTable {
            signature: "XSDT".into(),
            gpa: xsdt_gpa,
            bytes: xsdt,
        },
        PlacedTable {
            signature: "FACP".into(),
            gpa: fadt_gpa,
            bytes: fadt,
        },
        PlacedTable {
            signature: "DSDT".into(),
            gpa: dsdt_gpa,
            bytes: dsdt,
        },
        PlacedTable {
            signature: "APIC".into(),
            gpa: madt_gpa,
            bytes: madt,
        },
    ];
    if let Some(bytes) = mcfg {
        tables.push(PlacedTable {
            signature: "MCFG".into(),
            gpa: mcfg_gpa,
            bytes,
        });
    }
    Ok(AcpiTables { tables })
}

#[cfg(test)]
pub(crate) mod tests;
