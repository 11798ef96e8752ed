//! Two instructions kvm_pvm's emulator cannot run whose effect the VMM can
//! give the guest itself, so a stock kernel gets past them instead of
//! stopping on KVM_EXIT_INTERNAL_ERROR (`internal_error`):
//!
//! - `int3` (0xCC): the breakpoint trap. The VMM moves RIP past it and
//!   injects #BP (vector 3) with KVM_SET_VCPU_EVENTS, so the guest's #BP
//!   handler sees what the CPU would have pushed: the address after the
//!   int3. Linux's boot-time `int3_selftest` and its text patching
//!   (`text_poke_bp`, static keys, jump labels) use int3 at CPL0.
//! - `fwait` (0x9B) with no unmasked x87 exception pending (FSW.ES clear):
//!   it does nothing, so the VMM moves RIP past it. With FSW.ES set it
//!   would raise #MF; that case stays an internal error.
//!
//! On hardware KVM neither instruction ever reaches the VMM.

use kvm_bindings::kvm_vcpu_events;
use kvm_ioctls::VcpuFd;

use super::internal_error::InternalErrorExit;
use crate::guest_memory::GuestMemoryMmap;

/// `int3`.
pub const INT3: u8 = 0xcc;
/// `fwait` / `wait`.
pub const FWAIT: u8 = 0x9b;
/// #BP.
pub const BP_VECTOR: u8 = 3;
/// FSW.ES: an unmasked x87 exception is pending.
const FSW_ES: u16 = 1 << 7;

/// What the VMM did instead of the emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fixup {
    /// Injected #BP after the int3.
    Int3,
    /// Stepped over an fwait.
    Fwait,
}

/// The instruction's first byte: the one KVM's emulator fetched, else the
/// byte in guest RAM at the GPA RIP translates to.
fn first_byte(exit: &InternalErrorExit, mem: &GuestMemoryMmap) -> Option<u8> {
    if let Some(b) = exit.kvm_insn_bytes() {
        return b.first().copied();
    }
    use vm_memory::{Bytes, GuestAddress};
    let gpa = exit.rip_gpa?;
    mem.read_obj::<u8>(GuestAddress(gpa)).ok()
}

/// Which fixup an emulation failure admits, if any (`fsw`: the x87 status
/// word, read only for an fwait).
pub fn classify(first: u8, fsw: impl FnOnce() -> Option<u16>) -> Option<Fixup> {
    match first {
        INT3 => Some(Fixup::Int3),
        FWAIT if fsw().is_some_and(|w| w & FSW_ES == 0) => Some(Fixup::Fwait),
        _ => None,
    }
}

/// Applies the fixup an emulation failure admits; `None` when there is
/// none (or an ioctl failed), and the VM stops with the report as before.
pub fn try_fixup(fd: &VcpuFd, exit: &InternalErrorExit, mem: &GuestMemoryMmap) -> Option<Fixup> {
    if exit.suberror != kvm_bindings::KVM_INTERNAL_ERROR_EMULATION {
        return None;
    }
    let first = first_byte(exit, mem)?;
    let fix = classify(first, || fd.get_fpu().ok().map(|f| f.fsw))?;
    let mut regs = fd.get_regs().ok()?;
    regs.rip = regs.rip.wrapping_add(1);
    fd.set_regs(&regs).ok()?;
    if fix == Fixup::Int3 {
        let mut ev: kvm_vcpu_events = fd.get_vcpu_events().ok()?;
        ev.exception.injected = 1;
        ev.exception.pending = 0;
        ev.exception.nr = BP_VECTOR;
        ev.exception.has_error_code = 0;
        ev.exception.error_code = 0;
        ev.exception_has_payload = 0;
        // Leave NMI/SIPI/SMI state as it was (their VALID flags unset).
        ev.flags = 0;
        fd.set_vcpu_events(&ev).ok()?;
    }
    Some(fix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_int3_and_a_quiet_fwait_are_fixed() {
        assert_eq!(classify(INT3, || None), Some(Fixup::Int3));
        assert_eq!(classify(FWAIT, || Some(0)), Some(Fixup::Fwait));
        assert_eq!(classify(FWAIT, || Some(FSW_ES)), None, "#MF pending");
        assert_eq!(classify(FWAIT, || None), None, "FPU state unknown");
        assert_eq!(classify(0x0f, || Some(0)), None);
    }
}
