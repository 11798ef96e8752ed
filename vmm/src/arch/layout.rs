//! Guest physical memory layout (the same low-memory map Firecracker uses).
//!
//! ```text
//! 0x0000_0500  GDT (4 entries)          0x0000_0520  IDT (one null entry)
//! 0x0000_7000  zero page (boot_params)  0x0000_8ff0  boot stack top (grows down)
//! 0x0000_9000  PML4  0x0000_a000 PDPT   0x0000_b000  4 PDs (2 MiB pages, first 4 GiB)
//! 0x0002_0000  kernel command line      0x0009_fc00  EBDA start (end of low RAM)
//! 0x000e_0000  ACPI RSDP, then tables   (BIOS area, e820-reserved, to 1 MiB)
//! 0x0010_0000  kernel (HIMEM_START)     0xc000_0000  MMIO gap (devices) .. 4 GiB
//! 0xfeb0_0000  ACPI GED event register  (the power button's MMIO page)
//! ```

/// Global descriptor table.
pub const GDT_ADDR: u64 = 0x500;
/// Interrupt descriptor table (a single null entry: the guest installs its own).
pub const IDT_ADDR: u64 = 0x520;
/// The zero page: `struct boot_params`.
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial RSP/RBP of the boot vCPU.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity-mapping page tables for the 64-bit entry.
pub const PML4_ADDR: u64 = 0x9000;
/// Page-directory-pointer table.
pub const PDPT_ADDR: u64 = 0xa000;
/// First of `PD_COUNT` consecutive page directories (2 MiB pages).
pub const PD_ADDR: u64 = 0xb000;
/// Page directories, one per identity-mapped GiB.
pub const PD_COUNT: u64 = 4;
/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Upper bound on the command line we write, NUL included (Linux's
/// COMMAND_LINE_SIZE on x86); a kernel advertising a smaller `cmdline_size`
/// lowers it.
pub const CMDLINE_MAX_BYTES: usize = 2048;
/// Start of the extended BIOS data area: low RAM ends here in the e820 map.
pub const EBDA_START: u64 = 0x9fc00;
/// Where the kernel is loaded; also the start of the second e820 RAM range.
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO hole (devices live here, not RAM).
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO hole: RAM beyond `MMIO_GAP_START` continues here.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// The PCI root complex's 32-bit BAR window (virtio-pci BARs are allocated
/// here): the bottom of the MMIO gap, up to the virtio-mmio windows at
/// `device_manager::mmio::MMIO_BASE` (0xd000_0000).
pub const PCI_MMIO32_BASE: u64 = MMIO_GAP_START;
/// Size of the 32-bit BAR window.
pub const PCI_MMIO32_BYTES: u64 = 0x1000_0000;
/// PCI Express enhanced configuration space (ECAM), announced in the ACPI
/// MCFG table; bus 0 only (32 devices x 8 functions x 4 KiB = 1 MiB).
pub const PCI_ECAM_BASE: u64 = 0xe000_0000;
/// Size of the ECAM window (bus 0).
pub const PCI_ECAM_BYTES: u64 = 1 << 20;
/// The ACPI RSDP, the first byte of the BIOS read-only area that Linux scans
/// for it (0xE0000-0xFFFFF, `acpi_find_root_pointer`); the other tables
/// follow it up to [`ACPI_AREA_END`]. The zero page's `acpi_rsdp_addr`
/// points here too.
pub const ACPI_RSDP_ADDR: u64 = 0xe_0000;
/// End (exclusive) of the area the ACPI tables live in: 1 MiB.
pub const ACPI_AREA_END: u64 = HIMEM_START;
/// The ACPI Generic Event Device's register page (`devices::acpi::ged`), in
/// the MMIO gap below the IOAPIC, clear of the PCI and virtio windows.
pub const ACPI_GED_MMIO_BASE: u64 = 0xfeb0_0000;
/// Size of the GED's register window.
pub const ACPI_GED_MMIO_BYTES: u64 = 0x1000;
/// KVM's TSS region (three pages just below the BIOS area at the top of 4 GiB).
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;

/// Guest RAM ranges for `mem_bytes` of memory: below the MMIO gap, then above 4 GiB.
pub fn ram_ranges(mem_bytes: u64) -> Vec<(u64, u64)> {
    if mem_bytes <= MMIO_GAP_START {
        vec![(0, mem_bytes)]
    } else {
        vec![
            (0, MMIO_GAP_START),
            (MMIO_GAP_END, mem_bytes - MMIO_GAP_START),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_guest_is_one_range() {
        assert_eq!(ram_ranges(256 << 20), vec![(0, 256 << 20)]);
    }

    #[test]
    fn large_guest_skips_the_mmio_gap() {
        let r = ram_ranges(4 << 30);
        assert_eq!(r, vec![(0, MMIO_GAP_START), (MMIO_GAP_END, 1 << 30)]);
        assert_eq!(r.iter().map(|x| x.1).sum::<u64>(), 4 << 30);
    }

    #[test]
    fn fixed_structures_do_not_overlap() {
        let spans = [
            (GDT_ADDR, 4 * 8),
            (IDT_ADDR, 8),
            (ZERO_PAGE_ADDR, 4096),
            (
                ZERO_PAGE_ADDR + 4096,
                BOOT_STACK_POINTER - (ZERO_PAGE_ADDR + 4096),
            ),
            (PML4_ADDR, 4096),
            (PDPT_ADDR, 4096),
            (PD_ADDR, 4096 * PD_COUNT),
            (CMDLINE_ADDR, CMDLINE_MAX_BYTES as u64),
        ];
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
            assert!(a.0 + a.1 <= EBDA_START);
        }
    }
}
