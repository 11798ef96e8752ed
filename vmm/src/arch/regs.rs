//! Boot-time vCPU state for the Linux 64-bit boot protocol
//! (Documentation/arch/x86/boot.rst, "64-bit Boot Protocol"): long mode with
//! paging on, an identity map covering the kernel, boot_params, command line,
//! a flat 64-bit CS, `__BOOT_DS` data segments, RSI = zero page, IF clear.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError};

use super::gdt::{kvm_segment_from_gdt, BOOT_GDT, CODE_INDEX, DATA_INDEX, TSS_INDEX};
use super::layout::{
    BOOT_STACK_POINTER, GDT_ADDR, IDT_ADDR, PDPT_ADDR, PD_ADDR, PD_COUNT, PML4_ADDR, ZERO_PAGE_ADDR,
};

const X86_CR0_PE: u64 = 0x1;
const X86_CR0_ET: u64 = 0x10;
const X86_CR0_PG: u64 = 0x8000_0000;
const X86_CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;
/// Present | writable.
const PTE_PW: u64 = 0x3;
/// Present | writable | page size (2 MiB).
const PDE_PW_PS: u64 = 0x83;

/// Writes the GDT, a null IDT entry and identity-mapping page tables for the
/// first 4 GiB (2 MiB pages; the MMIO gap included, so a guest's first code can
/// reach device windows) into guest memory.
pub fn write_boot_tables<M: Bytes<GuestAddress, E = GuestMemoryError>>(
    mem: &M,
) -> Result<(), GuestMemoryError> {
    for (i, entry) in BOOT_GDT.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(GDT_ADDR + 8 * i as u64))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))?;
    mem.write_obj(PDPT_ADDR | PTE_PW, GuestAddress(PML4_ADDR))?;
    for gib in 0..PD_COUNT {
        let pd = PD_ADDR + gib * 0x1000;
        mem.write_obj(pd | PTE_PW, GuestAddress(PDPT_ADDR + gib * 8))?;
        for i in 0..512u64 {
            let page = (gib << 30) | (i << 21);
            mem.write_obj(page | PDE_PW_PS, GuestAddress(pd + i * 8))?;
        }
    }
    Ok(())
}

/// Sets the boot segments, descriptor tables and paging/long-mode bits on
/// `sregs` (read from the vCPU first, so KVM's defaults for the rest stay).
pub fn boot_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = kvm_segment_from_gdt(BOOT_GDT[usize::from(CODE_INDEX)], CODE_INDEX);
    let data = kvm_segment_from_gdt(BOOT_GDT[usize::from(DATA_INDEX)], DATA_INDEX);
    let tss = kvm_segment_from_gdt(BOOT_GDT[usize::from(TSS_INDEX)], TSS_INDEX);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = u16::try_from(BOOT_GDT.len() * 8 - 1).expect("4-entry GDT");
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 |= X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// General-purpose registers at the 64-bit entry point `entry_gpa`.
pub fn boot_regs(entry_gpa: u64) -> kvm_regs {
    kvm_regs {
        rflags: 0x2,
        rip: entry_gpa,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_ADDR,
        ..Default::default()
    }
}

/// x87/SSE state at reset: FCW 0x37f, MXCSR 0x1f80 (SDM vol. 1, 8.1.5, 10.2.3).
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn page_tables_identity_map_four_gib() {
        let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)])
            .expect("anonymous test memory");
        write_boot_tables(&mem).expect("tables fit in low memory");
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_ADDR)).expect("mapped");
        assert_eq!(pml4, PDPT_ADDR | 3);
        let pdpt: u64 = mem.read_obj(GuestAddress(PDPT_ADDR)).expect("mapped");
        assert_eq!(pdpt, PD_ADDR | 3);
        let last: u64 = mem
            .read_obj(GuestAddress(PD_ADDR + 511 * 8))
            .expect("mapped");
        assert_eq!(last, (511 << 21) | 0x83);
        let code: u64 = mem.read_obj(GuestAddress(GDT_ADDR + 8)).expect("mapped");
        assert_eq!(code, BOOT_GDT[1]);
    }

    #[test]
    fn sregs_enter_long_mode() {
        let s = boot_sregs(kvm_sregs::default());
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_ne!(s.cr0 & X86_CR0_PG, 0);
        assert_ne!(s.cr4 & X86_CR4_PAE, 0);
        assert_eq!(s.cr3, PML4_ADDR);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.ss.selector, 16);
    }

    #[test]
    fn regs_point_at_zero_page() {
        let r = boot_regs(0x10_0200);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x10_0200, ZERO_PAGE_ADDR, 2));
    }
}
