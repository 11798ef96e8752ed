//! KVM_EXIT_INTERNAL_ERROR, reported so the reader sees where the guest was
//! and what it ran: the suberror and its name, every `ndata` word KVM gave,
//! the guest's RIP and CS base, the instruction bytes, and (added by the
//! lifecycle, which owns the console) the last console lines.
//!
//! On kvm_pvm (no VT-x) the guest's CPL0 code runs in KVM's instruction
//! emulator, which lacks some instructions (`fwait`, `xrstor`,
//! `cmpxchg16b`, ...): one of them stops the VM with suberror 1
//! (KVM_INTERNAL_ERROR_EMULATION). For an emulation failure at CPL0, Linux
//! (`prepare_emulation_failure_exit` in arch/x86/kvm/x86.c) fills the exit as
//! `struct kvm_run.emulation_failure`: `data[0]` is flags, and with
//! KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES set `data[1..3]` hold
//! `insn_size` (one byte) then 15 instruction bytes, as fetched by the
//! emulator. When KVM gives none, the bytes are read from guest memory at
//! the GPA that KVM_TRANSLATE gives for RIP's linear address, up to the end
//! of that page (the next one may not be mapped).
//!
//! Capture happens on the vCPU thread right after the exit (`capture`): the
//! `kvm_run` union is only meaningful until the next KVM_RUN.

use std::fmt;

use kvm_bindings::{
    kvm_sregs, KVM_INTERNAL_ERROR_DELIVERY_EV, KVM_INTERNAL_ERROR_EMULATION,
    KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES, KVM_INTERNAL_ERROR_SIMUL_EX,
    KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON,
};
use kvm_ioctls::VcpuFd;

/// Longest x86 instruction.
pub const MAX_INSN_BYTES: usize = 15;

/// EFER.LMA: long mode active.
const EFER_LMA: u64 = 1 << 10;

/// What KVM_EXIT_INTERNAL_ERROR said and what the vCPU showed at that exit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InternalErrorExit {
    /// `kvm_run.internal.suberror` (KVM_INTERNAL_ERROR_*).
    pub suberror: u32,
    /// The `ndata` words of `kvm_run.internal.data` (at most 16, the array's size).
    pub data: Vec<u64>,
    /// The guest's RIP (`None`: KVM_GET_REGS failed).
    pub rip: Option<u64>,
    /// The guest's CS base (`None`: KVM_GET_SREGS failed).
    pub cs_base: Option<u64>,
    /// The GPA RIP's linear address maps to (`None`: KVM_TRANSLATE failed
    /// or the address is not mapped).
    pub rip_gpa: Option<u64>,
}

impl InternalErrorExit {
    /// Reads the exit from `fd`, which just returned KVM_EXIT_INTERNAL_ERROR
    /// from KVM_RUN, and the vCPU's registers. A failing register ioctl
    /// leaves its field `None`: the report says what it could.
    pub fn capture(fd: &mut VcpuFd) -> InternalErrorExit {
        // SAFETY: KVM_RUN returned KVM_EXIT_INTERNAL_ERROR, for which KVM
        // writes the union's `internal` member (include/uapi/linux/kvm.h);
        // it is plain integers, so any bytes are a valid value.
        let internal = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
        let n = usize::try_from(internal.ndata)
            .unwrap_or(usize::MAX)
            .min(internal.data.len());
        let rip = fd.get_regs().ok().map(|r| r.rip);
        let sregs = fd.get_sregs().ok();
        let rip_gpa = rip
            .zip(sregs.as_ref())
            .and_then(|(rip, s)| fd.translate_gva(linear_rip(rip, s)).ok())
            .filter(|t| t.valid != 0)
            .map(|t| t.physical_address);
        InternalErrorExit {
            suberror: internal.suberror,
            data: internal.data[..n].to_vec(),
            rip,
            cs_base: sregs.map(|s| s.cs.base),
            rip_gpa,
        }
    }

    /// The instruction bytes KVM's emulator fetched, when the exit carries
    /// them (an emulation failure with the INSTRUCTION_BYTES flag).
    pub fn kvm_insn_bytes(&self) -> Option<Vec<u8>> {
        if self.suberror != KVM_INTERNAL_ERROR_EMULATION || self.data.len() < 3 {
            return None;
        }
        if self.data[0] & u64::from(KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES) == 0 {
            return None;
        }
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&self.data[1].to_le_bytes());
        raw[8..].copy_from_slice(&self.data[2].to_le_bytes());
        let size = usize::from(raw[0]).min(MAX_INSN_BYTES);
        Some(raw[1..=size].to_vec())
    }
}

/// The linear address of RIP: CS base plus RIP, except in a 64-bit code
/// segment, where the base is ignored; outside long mode it wraps at 4 GiB.
pub fn linear_rip(rip: u64, sregs: &kvm_sregs) -> u64 {
    if sregs.efer & EFER_LMA != 0 && sregs.cs.l != 0 {
        rip
    } else {
        sregs.cs.base.wrapping_add(rip) & 0xffff_ffff
    }
}

/// KVM's name for a suberror (include/uapi/linux/kvm.h, KVM_INTERNAL_ERROR_*).
pub fn suberror_name(suberror: u32) -> &'static str {
    match suberror {
        KVM_INTERNAL_ERROR_EMULATION => "emulation",
        KVM_INTERNAL_ERROR_SIMUL_EX => "simul_ex",
        KVM_INTERNAL_ERROR_DELIVERY_EV => "delivery_ev",
        KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON => "unexpected_exit_reason",
        _ => "unknown suberror",
    }
}

/// What the suberror means and what to look at.
fn suberror_hint(suberror: u32) -> &'static str {
    match suberror {
        KVM_INTERNAL_ERROR_EMULATION => {
            "KVM's instruction emulator cannot run that instruction; on a host without \
             VT-x/SVM (kvm_pvm) all CPL0 guest code is emulated and the emulator lacks \
             xrstor(s), lock cmpxchg16b, clac/stac and fwait with an x87 exception pending \
             (the VMM itself handles int3 and a quiet fwait): keep the guest kernel off \
             them (docs/vmm.md)"
        }
        KVM_INTERNAL_ERROR_SIMUL_EX => {
            "an exception while delivering another that KVM cannot turn into a double \
             fault: check the guest's IDT, TSS and stacks"
        }
        KVM_INTERNAL_ERROR_DELIVERY_EV => {
            "KVM could not deliver an exception or interrupt to the guest: check the \
             guest's IDT and TSS"
        }
        KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON => {
            "the hardware exited for a reason KVM does not handle (KVM data holds it)"
        }
        _ => "see include/uapi/linux/kvm.h of the host kernel",
    }
}

/// The instruction bytes in a report, and where they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InsnBytes {
    /// Fetched by KVM's emulator (carried in the exit).
    Kvm(Vec<u8>),
    /// Read from guest RAM at the GPA RIP translates to.
    GuestMemory {
        /// Where they were read.
        gpa: u64,
        /// The bytes (up to 15, fewer at a page's end).
        bytes: Vec<u8>,
    },
    /// Neither was possible, and why.
    Unknown(&'static str),
}

fn hex_bytes(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            f.write_str(" ")?;
        }
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

impl fmt::Display for InsnBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InsnBytes::Kvm(b) => {
                hex_bytes(f, b)?;
                f.write_str(" (fetched by KVM's emulator)")
            }
            InsnBytes::GuestMemory { gpa, bytes } => {
                hex_bytes(f, bytes)?;
                write!(f, " (read at GPA {gpa:#x})")
            }
            InsnBytes::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// `Some(x)` as hex, `None` as "unknown".
struct HexOpt<'a>(&'a Option<u64>);

impl fmt::Display for HexOpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v:#x}"),
            None => f.write_str("unknown"),
        }
    }
}

/// Words as `0x1, 0x9b`.
struct HexWords<'a>(&'a [u64]);

impl fmt::Display for HexWords<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, w) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{w:#x}")?;
        }
        Ok(())
    }
}

/// A vCPU exit that ends the VM, with what is known about where the guest was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VcpuExitError {
    /// KVM_EXIT_INTERNAL_ERROR: KVM itself could not go on with the guest.
    #[error(
        "vCPU {vcpu} stopped on KVM_EXIT_INTERNAL_ERROR suberror {suberror} ({}) at RIP {} \
         (CS base {}), instruction bytes {insn}, KVM data [{}] ({}); last console lines:\n\
         {console_tail}",
        suberror_name(*.suberror),
        HexOpt(.rip),
        HexOpt(.cs_base),
        HexWords(.data),
        suberror_hint(*.suberror)
    )]
    Internal {
        /// The vCPU.
        vcpu: u8,
        /// KVM_INTERNAL_ERROR_* (1 emulation, 2 simul_ex, 3 delivery_ev,
        /// 4 unexpected_exit_reason).
        suberror: u32,
        /// The guest's RIP, when KVM_GET_REGS worked.
        rip: Option<u64>,
        /// The guest's CS base, when KVM_GET_SREGS worked.
        cs_base: Option<u64>,
        /// The instruction at RIP.
        insn: InsnBytes,
        /// Every `ndata` word of the exit.
        data: Vec<u64>,
        /// The newest console lines when the vCPU stopped.
        console_tail: String,
    },
}

impl VcpuExitError {
    /// The report for `exit` on `vcpu`. `read_ram(gpa, buf)` fills `buf`
    /// from guest RAM and says whether it could; it is asked only when KVM
    /// gave no instruction bytes.
    pub fn internal(
        vcpu: u8,
        exit: &InternalErrorExit,
        read_ram: impl FnOnce(u64, &mut [u8]) -> bool,
        console_tail: String,
    ) -> VcpuExitError {
        let insn = match (exit.kvm_insn_bytes(), exit.rip, exit.rip_gpa) {
            (Some(b), _, _) => InsnBytes::Kvm(b),
            (None, None, _) => InsnBytes::Unknown("KVM_GET_REGS failed"),
            (None, Some(_), None) => InsnBytes::Unknown("RIP does not translate to a GPA"),
            (None, Some(_), Some(gpa)) => {
                // Up to the end of RIP's page: the next page may be unmapped,
                // or mapped elsewhere.
                let to_page_end = 0x1000 - (gpa & 0xfff);
                let len =
                    usize::try_from(to_page_end).map_or(MAX_INSN_BYTES, |n| n.min(MAX_INSN_BYTES));
                let mut bytes = vec![0u8; len];
                if read_ram(gpa, &mut bytes) {
                    InsnBytes::GuestMemory { gpa, bytes }
                } else {
                    InsnBytes::Unknown("RIP's GPA is not guest RAM")
                }
            }
        };
        VcpuExitError::Internal {
            vcpu,
            suberror: exit.suberror,
            rip: exit.rip,
            cs_base: exit.cs_base,
            insn,
            data: exit.data.clone(),
            console_tail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Linux puts in the exit for an emulation failure at CPL0 with
    /// `fwait` (9b) at RIP: flags, then insn_size and the bytes (the rest
    /// filled with 0x90), then exit info.
    fn fwait_exit() -> InternalErrorExit {
        let mut insn = [0x90u8; 16];
        insn[0] = 1; // insn_size
        insn[1] = 0x9b;
        InternalErrorExit {
            suberror: KVM_INTERNAL_ERROR_EMULATION,
            data: vec![
                u64::from(KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES),
                u64::from_le_bytes(insn[..8].try_into().expect("8")),
                u64::from_le_bytes(insn[8..].try_into().expect("8")),
                0xdead_beef,
            ],
            rip: Some(0x10_020d),
            cs_base: Some(0),
            rip_gpa: Some(0x10_020d),
        }
    }

    #[test]
    fn the_report_names_every_field() {
        let e = VcpuExitError::internal(
            1,
            &fwait_exit(),
            |_, _| panic!("KVM gave the bytes; RAM is not read"),
            "PROVIUM-TINY-GUEST v1\nlast line".into(),
        );
        let msg = e.to_string();
        for want in [
            "vCPU 1 ",
            "suberror 1 (emulation)",
            "RIP 0x10020d",
            "CS base 0x0",
            "instruction bytes 9b (fetched by KVM's emulator)",
            "0x1, 0x9090909090909b01, 0x9090909090909090, 0xdeadbeef",
            "cannot run that instruction",
            "last console lines:\nPROVIUM-TINY-GUEST v1\nlast line",
        ] {
            assert!(msg.contains(want), "{want:?} missing from: {msg}");
        }
    }

    #[test]
    fn without_kvm_bytes_the_instruction_is_read_at_rips_gpa() {
        let mut exit = fwait_exit();
        exit.suberror = KVM_INTERNAL_ERROR_DELIVERY_EV;
        exit.data = vec![0x80, 0x1234];
        // 5 bytes before a page end: only those are read.
        exit.rip_gpa = Some(0x20_0ffb);
        let mut asked = None;
        let e = VcpuExitError::internal(
            0,
            &exit,
            |gpa, buf| {
                asked = Some((gpa, buf.len()));
                buf.copy_from_slice(&[0x0f, 0x0b, 0xf4, 0xeb, 0xfd]);
                true
            },
            String::new(),
        );
        assert_eq!(asked, Some((0x20_0ffb, 5)));
        let msg = e.to_string();
        assert!(msg.contains("suberror 3 (delivery_ev)"), "{msg}");
        assert!(
            msg.contains("0f 0b f4 eb fd (read at GPA 0x200ffb)"),
            "{msg}"
        );
        assert!(msg.contains("KVM data [0x80, 0x1234]"), "{msg}");

        exit.rip_gpa = None;
        exit.cs_base = None;
        let msg = VcpuExitError::internal(0, &exit, |_, _| true, String::new()).to_string();
        assert!(
            msg.contains("instruction bytes unknown (RIP does not translate"),
            "{msg}"
        );
        assert!(msg.contains("CS base unknown"), "{msg}");
    }

    #[test]
    fn instruction_bytes_come_only_from_flagged_emulation_exits() {
        let exit = fwait_exit();
        assert_eq!(exit.kvm_insn_bytes(), Some(vec![0x9b]));
        let mut no_flag = exit.clone();
        no_flag.data[0] = 0;
        assert_eq!(no_flag.kvm_insn_bytes(), None);
        let mut short = exit.clone();
        short.data.truncate(2);
        assert_eq!(short.kvm_insn_bytes(), None);
        let mut other = exit.clone();
        other.suberror = KVM_INTERNAL_ERROR_SIMUL_EX;
        assert_eq!(other.kvm_insn_bytes(), None);
        // An insn_size past 15 is capped.
        let mut big = exit;
        big.data[1] = (big.data[1] & !0xff) | 0xff;
        assert_eq!(big.kvm_insn_bytes().map(|b| b.len()), Some(MAX_INSN_BYTES));
    }

    #[test]
    fn linear_rip_ignores_cs_base_only_in_64_bit_code() {
        let mut s = kvm_sregs::default();
        s.cs.base = 0x1000;
        assert_eq!(linear_rip(0x20, &s), 0x1020, "real/protected mode");
        s.cs.base = 0xffff_f000;
        assert_eq!(linear_rip(0x2000, &s), 0x1000, "wraps at 4 GiB");
        s.efer = EFER_LMA;
        s.cs.l = 1;
        assert_eq!(linear_rip(0xffff_ffff_8100_0000, &s), 0xffff_ffff_8100_0000);
        assert_eq!(suberror_name(4), "unexpected_exit_reason");
        assert_eq!(suberror_name(2), "simul_ex");
    }
}
