//! CPUID for each vCPU: KVM's supported list, filtered by a named CPU template,
//! then the per-vCPU leaves the VMM owns (APIC IDs, topology, hypervisor bit).
//!
//! Templates are data (`CpuTemplate::masks`), so a test can check them without
//! /dev/kvm. On this machine's kvm_pvm, `KVM_SET_CPUID2` does not change what
//! the guest sees (DESIGN.md): there the same features are hidden with the
//! kernel's `clearcpuid=` list, which `CpuTemplate::Minimal` mirrors bit for bit.

use std::fmt;
use std::str::FromStr;

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

/// Which CPUID register a mask applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuidReg {
    /// EAX
    Eax,
    /// EBX
    Ebx,
    /// ECX
    Ecx,
    /// EDX
    Edx,
}

/// Bits to clear in one register of one leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuidMask {
    /// Leaf (EAX input).
    pub leaf: u32,
    /// Sub-leaf (ECX input); `None` applies to every sub-leaf.
    pub subleaf: Option<u32>,
    /// Register the mask applies to.
    pub reg: CpuidReg,
    /// Bits that are cleared.
    pub clear_bits: u32,
}

/// A named CPU template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuTemplate {
    /// Everything KVM supports on this host, plus the VMM-owned leaves.
    Host,
    /// Host minus the features the kvm_pvm emulator lacks or that send a Linux
    /// guest down paths this project does not need (XSAVE/AVX family,
    /// CMPXCHG16B, PCID/INVPCID, FSGSBASE, SMAP, RDRAND/RDSEED, BMI, POPCNT):
    /// the same set as the kernel command line `clearcpuid=308,141,151,145,158,
    /// 288,298,306,291,296,156,293` plus OSXSAVE.
    #[default]
    Minimal,
}

const LEAF1_ECX_MINIMAL: u32 = (1 << 13) // CX16
    | (1 << 17) // PCID
    | (1 << 23) // POPCNT
    | (1 << 26) // XSAVE
    | (1 << 27) // OSXSAVE
    | (1 << 28) // AVX
    | (1 << 30); // RDRAND
const LEAF7_EBX_MINIMAL: u32 = 1 // FSGSBASE
    | (1 << 3) // BMI1
    | (1 << 5) // AVX2
    | (1 << 8) // BMI2
    | (1 << 10) // INVPCID
    | (1 << 18) // RDSEED
    | (1 << 20); // SMAP

/// KVM's paravirt feature leaf (Documentation/virt/kvm/x86/cpuid.rst).
pub const KVM_CPUID_FEATURES: u32 = 0x4000_0001;
/// The KVM paravirt features a guest drives with `vmcall`, which hangs on
/// kvm_pvm (DESIGN.md): PV_UNHALT (bit 7, pv spinlock kicks), PV_TLB_FLUSH
/// (9), PV_SEND_IPI (11), PV_SCHED_YIELD (13). An SMP Linux guest uses them
/// for every IPI; without them it sends IPIs through the LAPIC. The
/// MSR-based features (kvmclock, steal time, async PF, EOI) stay.
pub const KVM_FEATURES_HYPERCALL: u32 = (1 << 7) | (1 << 9) | (1 << 11) | (1 << 13);

const MINIMAL_MASKS: &[CpuidMask] = &[
    CpuidMask {
        leaf: 1,
        subleaf: None,
        reg: CpuidReg::Ecx,
        clear_bits: LEAF1_ECX_MINIMAL,
    },
    CpuidMask {
        leaf: 7,
        subleaf: Some(0),
        reg: CpuidReg::Ebx,
        clear_bits: LEAF7_EBX_MINIMAL,
    },
    CpuidMask {
        leaf: KVM_CPUID_FEATURES,
        subleaf: None,
        reg: CpuidReg::Eax,
        clear_bits: KVM_FEATURES_HYPERCALL,
    },
];

impl CpuTemplate {
    /// Every template, in a stable order.
    pub const ALL: [CpuTemplate; 2] = [CpuTemplate::Host, CpuTemplate::Minimal];

    /// The name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            CpuTemplate::Host => "host",
            CpuTemplate::Minimal => "minimal",
        }
    }

    /// The masks this template applies.
    pub fn masks(self) -> &'static [CpuidMask] {
        match self {
            CpuTemplate::Host => &[],
            CpuTemplate::Minimal => MINIMAL_MASKS,
        }
    }
}

impl fmt::Display for CpuTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown template name.
#[derive(Debug, thiserror::Error)]
#[error("unknown cpu template {0:?} (known: host, minimal)")]
pub struct UnknownCpuTemplate(pub String);

impl FromStr for CpuTemplate {
    type Err = UnknownCpuTemplate;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuTemplate::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownCpuTemplate(s.to_string()))
    }
}

fn reg_mut(e: &mut kvm_cpuid_entry2, r: CpuidReg) -> &mut u32 {
    match r {
        CpuidReg::Eax => &mut e.eax,
        CpuidReg::Ebx => &mut e.ebx,
        CpuidReg::Ecx => &mut e.ecx,
        CpuidReg::Edx => &mut e.edx,
    }
}

/// Applies `template`'s masks to `cpuid` in place.
pub fn apply_template(cpuid: &mut CpuId, template: CpuTemplate) {
    for e in cpuid.as_mut_slice() {
        for m in template.masks() {
            if e.function == m.leaf && m.subleaf.is_none_or(|s| s == e.index) {
                *reg_mut(e, m.reg) &= !m.clear_bits;
            }
        }
    }
}

const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
const LEAF1_EDX_HTT: u32 = 1 << 28;

/// Fixes the leaves that depend on the vCPU: initial APIC ID (leaf 1 EBX[31:24],
/// x2APIC ID in leaves 0xB/0x1F EDX), logical processor count (leaf 1
/// EBX[23:16], HTT) and the hypervisor-present bit.
pub fn set_vcpu_leaves(cpuid: &mut CpuId, vcpu_index: u8, vcpu_count: u8) {
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x0000_ffff)
                    | (u32::from(vcpu_index) << 24)
                    | (u32::from(vcpu_count) << 16);
                e.ecx |= LEAF1_ECX_HYPERVISOR;
                if vcpu_count > 1 {
                    e.edx |= LEAF1_EDX_HTT;
                } else {
                    e.edx &= !LEAF1_EDX_HTT;
                }
            }
            0xb | 0x1f => e.edx = u32::from(vcpu_index),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CpuId {
        let entries = [
            kvm_cpuid_entry2 {
                function: 1,
                ecx: u32::MAX,
                ebx: 0x0012_3456,
                edx: u32::MAX,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 7,
                index: 0,
                ebx: u32::MAX,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 7,
                index: 1,
                ebx: u32::MAX,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 0xb,
                index: 1,
                ..Default::default()
            },
        ];
        CpuId::from_entries(&entries).expect("4 entries fit")
    }

    #[test]
    fn minimal_clears_the_pvm_list() {
        let mut c = sample();
        apply_template(&mut c, CpuTemplate::Minimal);
        let s = c.as_slice();
        assert_eq!(s[0].ecx & (1 << 13), 0, "cmpxchg16b hidden");
        assert_eq!(s[0].ecx & (1 << 26), 0, "xsave hidden");
        assert_eq!(s[1].ebx & (1 << 20), 0, "smap hidden");
        assert_eq!(s[2].ebx, u32::MAX, "other sub-leaves untouched");
        assert_ne!(s[0].ecx & 1, 0, "sse3 kept");
    }

    #[test]
    fn minimal_hides_the_hypercall_pv_features_only() {
        let kvm = kvm_cpuid_entry2 {
            function: KVM_CPUID_FEATURES,
            eax: 0x0100_7efb, // what KVM reports on this machine
            ..Default::default()
        };
        let mut c = CpuId::from_entries(&[kvm]).expect("1 entry fits");
        apply_template(&mut c, CpuTemplate::Minimal);
        let eax = c.as_slice()[0].eax;
        assert_eq!(eax & KVM_FEATURES_HYPERCALL, 0);
        assert_ne!(eax & (1 << 3), 0, "CLOCKSOURCE2 (kvmclock) kept");
        assert_ne!(eax & (1 << 24), 0, "CLOCKSOURCE_STABLE kept");
        assert_eq!(eax, 0x0100_547b);
    }

    #[test]
    fn host_changes_nothing() {
        let mut c = sample();
        apply_template(&mut c, CpuTemplate::Host);
        assert_eq!(c.as_slice(), sample().as_slice());
    }

    #[test]
    fn minimal_matches_clearcpuid_list() {
        // Linux feature numbers are word * 32 + bit; word 4 = leaf 1 ECX, word 9 = leaf 7 EBX.
        let list = [308, 141, 151, 145, 158, 288, 298, 306, 291, 296, 156, 293];
        for n in list {
            let (word, bit) = (n / 32, n % 32);
            let mask = match word {
                4 => LEAF1_ECX_MINIMAL,
                9 => LEAF7_EBX_MINIMAL,
                _ => panic!("unexpected word {word}"),
            };
            assert_ne!(mask & (1 << bit), 0, "feature {n} not masked");
        }
    }

    #[test]
    fn vcpu_leaves_carry_apic_id() {
        let mut c = sample();
        set_vcpu_leaves(&mut c, 3, 4);
        let s = c.as_slice();
        assert_eq!(s[0].ebx >> 24, 3);
        assert_eq!((s[0].ebx >> 16) & 0xff, 4);
        assert_eq!(s[0].ebx & 0xffff, 0x3456);
        assert_ne!(s[0].ecx & LEAF1_ECX_HYPERVISOR, 0);
        assert_eq!(s[3].edx, 3);
    }

    #[test]
    fn names_round_trip() {
        for t in CpuTemplate::ALL {
            assert_eq!(t.as_str().parse::<CpuTemplate>().expect("known"), t);
        }
        assert!("t2".parse::<CpuTemplate>().is_err());
    }
}
