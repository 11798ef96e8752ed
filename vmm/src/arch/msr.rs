//! MSRs set on every vCPU before boot (the list Firecracker uses for Linux).

use kvm_bindings::kvm_msr_entry;

/// IA32_SYSENTER_CS
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
/// IA32_SYSENTER_ESP
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
/// IA32_SYSENTER_EIP
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
/// STAR
pub const MSR_STAR: u32 = 0xc000_0081;
/// LSTAR
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// CSTAR
pub const MSR_CSTAR: u32 = 0xc000_0083;
/// SYSCALL_MASK
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
/// KERNEL_GS_BASE
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// IA32_TSC
pub const MSR_IA32_TSC: u32 = 0x10;
/// IA32_MISC_ENABLE
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
/// IA32_MISC_ENABLE.FAST_STRING
pub const MSR_IA32_MISC_ENABLE_FAST_STRING: u64 = 0x1;
/// IA32_MTRR_DEF_TYPE
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// MTRRs enabled, default type write-back.
pub const MTRR_ENABLE_WB: u64 = (1 << 11) | 6;

fn entry(index: u32, data: u64) -> kvm_msr_entry {
    kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }
}

/// The boot MSR values: syscall MSRs cleared, TSC at 0, fast strings on,
/// MTRRs enabled with write-back default.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    vec![
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_TSC, 0),
        entry(MSR_IA32_MISC_ENABLE, MSR_IA32_MISC_ENABLE_FAST_STRING),
        entry(MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WB),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtrr_default_is_write_back_and_enabled() {
        let e = boot_msr_entries();
        let m = e
            .iter()
            .find(|e| e.index == MSR_MTRR_DEF_TYPE)
            .expect("listed");
        assert_eq!(m.data & 0xff, 6);
        assert_ne!(m.data & (1 << 11), 0);
        let mut idx: Vec<u32> = e.iter().map(|e| e.index).collect();
        idx.sort_unstable();
        idx.dedup();
        assert_eq!(idx.len(), e.len(), "no MSR listed twice");
    }
}
