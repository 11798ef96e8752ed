//! The zero page (`struct boot_params`) for the Linux boot protocol
//! (Documentation/arch/x86/boot.rst and zero-page.rst): the kernel's setup
//! header as loaded, loader identity, command line pointer, initrd and the
//! e820 map.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use super::layout::{ACPI_AREA_END, ACPI_RSDP_ADDR, EBDA_START, HIMEM_START, MMIO_GAP_START};

/// `HdrS`
pub const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
/// The boot sector signature.
pub const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// "Undefined" boot loader id (boot.rst: 0xFF).
pub const KERNEL_LOADER_OTHER: u8 = 0xff;
/// Default kernel alignment when the image does not give one (16 MiB).
pub const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x100_0000;
/// e820 type: usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type: reserved.
pub const E820_RESERVED: u32 = 2;
/// Linux's `initrd_addr_max` for protocols before 2.03.
pub const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;

/// What goes into the zero page.
#[derive(Clone, Copy, Debug)]
pub struct ZeroPageSpec {
    /// The setup header read from a bzImage (`None` for an ELF vmlinux).
    pub setup_header: Option<setup_header>,
    /// Guest-physical address of the NUL-terminated command line.
    pub cmdline_gpa: u64,
    /// Length of the command line without the NUL.
    pub cmdline_len_bytes: u32,
    /// Initrd placement: (gpa, size in bytes).
    pub initrd: Option<(u64, u32)>,
    /// The ACPI RSDP's address (`acpi_rsdp_addr`, boot protocol 2.14), when
    /// the VMM wrote ACPI tables.
    pub acpi_rsdp: Option<u64>,
}

/// An error building the zero page.
#[derive(Debug, thiserror::Error)]
pub enum BootParamsError {
    /// Too many RAM ranges for the zero page's e820 table.
    #[error("{0} e820 entries do not fit the zero page's table of 128")]
    TooManyE820Entries(usize),
}

/// The e820 map for the given RAM ranges (gpa, len): low RAM stops at the
/// EBDA, the 640 KiB-1 MiB legacy hole is left out but for the BIOS area
/// from the ACPI RSDP to 1 MiB (where the ACPI tables are), which is
/// reserved, the rest is RAM.
pub fn e820_map(ram: &[(u64, u64)]) -> Vec<boot_e820_entry> {
    let mut out = Vec::new();
    for &(start, len) in ram {
        let end = start.saturating_add(len);
        if start == 0 {
            out.push(boot_e820_entry {
                addr: 0,
                size: EBDA_START.min(end),
                r#type: E820_RAM,
            });
            if end >= ACPI_AREA_END {
                out.push(boot_e820_entry {
                    addr: ACPI_RSDP_ADDR,
                    size: ACPI_AREA_END - ACPI_RSDP_ADDR,
                    r#type: E820_RESERVED,
                });
            }
            if end > HIMEM_START {
                out.push(boot_e820_entry {
                    addr: HIMEM_START,
                    size: end - HIMEM_START,
                    r#type: E820_RAM,
                });
            }
        } else {
            out.push(boot_e820_entry {
                addr: start,
                size: len,
                r#type: E820_RAM,
            });
        }
    }
    out
}

/// Builds the zero page.
pub fn build_zero_page(
    spec: &ZeroPageSpec,
    ram: &[(u64, u64)],
) -> Result<boot_params, BootParamsError> {
    let mut p = boot_params::default();
    if let Some(hdr) = spec.setup_header {
        p.hdr = hdr;
    }
    p.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    p.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    p.hdr.header = KERNEL_HDR_MAGIC;
    if p.hdr.kernel_alignment == 0 {
        p.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
    }
    p.hdr.cmd_line_ptr =
        u32::try_from(spec.cmdline_gpa).expect("the command line lives in low memory");
    p.hdr.cmdline_size = spec.cmdline_len_bytes;
    if let Some((gpa, size)) = spec.initrd {
        p.hdr.ramdisk_image = u32::try_from(gpa).expect("initrd placed below 4 GiB");
        p.hdr.ramdisk_size = size;
    }
    if let Some(rsdp) = spec.acpi_rsdp {
        p.acpi_rsdp_addr = rsdp;
    }
    let map = e820_map(ram);
    if map.len() > p.e820_table.len() {
        return Err(BootParamsError::TooManyE820Entries(map.len()));
    }
    for (slot, e) in p.e820_table.iter_mut().zip(&map) {
        *slot = *e;
    }
    p.e820_entries = u8::try_from(map.len()).expect("at most 128 entries");
    Ok(p)
}

/// Where an initrd of `size` bytes goes: the highest page-aligned address that
/// ends below both the end of low RAM and `addr_max`, and starts above
/// `kernel_end`. `None` if it does not fit.
pub fn initrd_gpa(ram: &[(u64, u64)], kernel_end: u64, size: u64, addr_max: u64) -> Option<u64> {
    let low_end = ram
        .iter()
        .find(|r| r.0 == 0)
        .map(|r| r.1.min(MMIO_GAP_START))?;
    let limit = low_end.min(addr_max.saturating_add(1));
    let start = limit.checked_sub(size)? & !0xfff;
    (start >= kernel_end).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_leaves_out_the_legacy_hole() {
        let m = e820_map(&[(0, 128 << 20)]);
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].addr, m[0].size), (0, EBDA_START));
        assert_eq!(
            (m[1].addr, m[1].size, m[1].r#type),
            (0xe_0000, 0x2_0000, E820_RESERVED),
            "the ACPI tables' BIOS area"
        );
        assert_eq!(
            (m[2].addr, m[2].size),
            (HIMEM_START, (128 << 20) - HIMEM_START)
        );
    }

    #[test]
    fn e820_covers_high_ram() {
        let m = e820_map(&[(0, MMIO_GAP_START), (1 << 32, 1 << 30)]);
        assert_eq!(m.len(), 4);
        assert_eq!((m[3].addr, m[3].size), (1 << 32, 1 << 30));
    }

    #[test]
    fn zero_page_fields() {
        let spec = ZeroPageSpec {
            setup_header: None,
            cmdline_gpa: 0x20000,
            cmdline_len_bytes: 11,
            initrd: Some((0x700_0000, 4096)),
            acpi_rsdp: Some(0xe_0000),
        };
        let p = build_zero_page(&spec, &[(0, 128 << 20)]).expect("fits");
        assert_eq!({ p.acpi_rsdp_addr }, 0xe_0000);
        assert_eq!({ p.hdr.header }, KERNEL_HDR_MAGIC);
        assert_eq!({ p.hdr.cmd_line_ptr }, 0x20000);
        assert_eq!({ p.hdr.ramdisk_image }, 0x700_0000);
        assert_eq!(p.e820_entries, 3);
        assert_eq!(p.hdr.type_of_loader, 0xff);
    }

    #[test]
    fn initrd_goes_high_and_aligned() {
        let ram = [(0, 128 << 20)];
        let a = initrd_gpa(&ram, 0x20_0000, 5000, DEFAULT_INITRD_ADDR_MAX).expect("fits");
        assert_eq!(a % 4096, 0);
        assert!(a + 5000 <= 128 << 20);
        assert!(initrd_gpa(&ram, 0x20_0000, 200 << 20, DEFAULT_INITRD_ADDR_MAX).is_none());
        assert!(initrd_gpa(&ram, 127 << 20, 2 << 20, DEFAULT_INITRD_ADDR_MAX).is_none());
    }
}
