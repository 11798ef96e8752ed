//! The boot GDT and the `kvm_segment`s loaded from it (Intel SDM vol. 3, 3.4.5).

use kvm_bindings::kvm_segment;

/// Encodes a segment descriptor from its flags (type/S/DPL/P in bits 0-7 and
/// AVL/L/D/G in bits 12-15), base and 20-bit limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let base = base as u64;
    let limit = limit as u64;
    let flags = flags as u64;
    ((base & 0xff00_0000) << (56 - 24))
        | ((flags & 0x0000_f0ff) << 40)
        | ((limit & 0x000f_0000) << (48 - 16))
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0x0000_ffff)
}

/// The boot GDT: null, 64-bit code, data, TSS.
pub const BOOT_GDT: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

/// Index of the code segment in `BOOT_GDT`.
pub const CODE_INDEX: u8 = 1;
/// Index of the data segment in `BOOT_GDT`.
pub const DATA_INDEX: u8 = 2;
/// Index of the TSS in `BOOT_GDT`.
pub const TSS_INDEX: u8 = 3;

fn bit(entry: u64, n: u32) -> u8 {
    u8::from((entry >> n) & 1 == 1)
}

/// The `kvm_segment` KVM needs for descriptor `entry` at `index` in the GDT.
pub fn kvm_segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let base = ((entry & 0xff00_0000_0000_0000) >> 32)
        | ((entry & 0x0000_00ff_0000_0000) >> 16)
        | ((entry & 0x0000_0000_ffff_0000) >> 16);
    let raw_limit = ((entry >> 32) & 0x000f_0000) | (entry & 0x0000_ffff);
    let g = bit(entry, 55);
    let limit = if g == 0 {
        raw_limit
    } else {
        (raw_limit << 12) | 0xfff
    };
    let present = bit(entry, 47);
    kvm_segment {
        base,
        limit: u32::try_from(limit).expect("a 20-bit limit scaled by 4 KiB fits in u32"),
        selector: u16::from(index) * 8,
        type_: u8::try_from((entry >> 40) & 0xf).expect("masked to 4 bits"),
        present,
        dpl: u8::try_from((entry >> 45) & 0x3).expect("masked to 2 bits"),
        db: bit(entry, 54),
        s: bit(entry, 44),
        l: bit(entry, 53),
        g,
        avl: bit(entry, 52),
        unusable: u8::from(present == 0),
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_segment_is_64_bit_ring0() {
        let s = kvm_segment_from_gdt(BOOT_GDT[1], CODE_INDEX);
        assert_eq!(s.selector, 8);
        assert_eq!(s.l, 1);
        assert_eq!(s.db, 0);
        assert_eq!(s.dpl, 0);
        assert_eq!(s.present, 1);
        assert_eq!(s.type_, 0xb);
        assert_eq!(s.limit, 0xffff_ffff);
        assert_eq!(s.base, 0);
    }

    #[test]
    fn data_and_tss_segments() {
        let d = kvm_segment_from_gdt(BOOT_GDT[2], DATA_INDEX);
        assert_eq!((d.selector, d.type_, d.db, d.s), (16, 3, 1, 1));
        let t = kvm_segment_from_gdt(BOOT_GDT[3], TSS_INDEX);
        assert_eq!((t.selector, t.type_, t.s), (24, 0xb, 0));
        let null = kvm_segment_from_gdt(BOOT_GDT[0], 0);
        assert_eq!(null.unusable, 1);
    }

    #[test]
    fn base_round_trips() {
        let e = gdt_entry(0x0093, 0x1234_5678, 0xabcde);
        let s = kvm_segment_from_gdt(e, 5);
        assert_eq!(s.base, 0x1234_5678);
        assert_eq!(s.limit, 0xabcde);
        assert_eq!(s.selector, 40);
    }
}
