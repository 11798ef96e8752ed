//! LAPIC local vector table setup: LINT0 as ExtINT (the in-kernel PIC's output
//! reaches the CPU through it) and LINT1 as NMI, as on a PC (Intel MP spec 5.1,
//! Firecracker `arch/x86_64/interrupts.rs`).

use kvm_bindings::kvm_lapic_state;

/// Offset of LVT LINT0 in the LAPIC register page.
pub const APIC_LVT0: usize = 0x350;
/// Offset of LVT LINT1.
pub const APIC_LVT1: usize = 0x360;
/// Delivery mode ExtINT (bits 8-10).
pub const APIC_MODE_EXTINT: u32 = 0x7;
/// Delivery mode NMI.
pub const APIC_MODE_NMI: u32 = 0x4;

fn get_reg(lapic: &kvm_lapic_state, off: usize) -> u32 {
    let b = &lapic.regs[off..off + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_reg(lapic: &mut kvm_lapic_state, off: usize, v: u32) {
    for (i, byte) in v.to_le_bytes().iter().enumerate() {
        lapic.regs[off + i] = *byte as _;
    }
}

fn set_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// Returns `lapic` with LINT0 = ExtINT and LINT1 = NMI.
pub fn set_lint(mut lapic: kvm_lapic_state) -> kvm_lapic_state {
    let lvt0 = get_reg(&lapic, APIC_LVT0);
    set_reg(
        &mut lapic,
        APIC_LVT0,
        set_delivery_mode(lvt0, APIC_MODE_EXTINT),
    );
    let lvt1 = get_reg(&lapic, APIC_LVT1);
    set_reg(
        &mut lapic,
        APIC_LVT1,
        set_delivery_mode(lvt1, APIC_MODE_NMI),
    );
    lapic
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lint_modes_are_set_and_other_bits_kept() {
        let mut l = kvm_lapic_state::default();
        set_reg(&mut l, APIC_LVT0, 0x0001_0000 | 0x700); // masked, some mode
        let l = set_lint(l);
        assert_eq!(
            get_reg(&l, APIC_LVT0),
            0x0001_0000 | (APIC_MODE_EXTINT << 8)
        );
        assert_eq!(get_reg(&l, APIC_LVT1), APIC_MODE_NMI << 8);
    }
}
