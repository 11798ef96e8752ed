//! The Intel MultiProcessor table (MP spec 1.4, chapter 4): how a guest
//! without ACPI finds its processors, its IOAPIC and the ISA interrupt routing.
//!
//! Linux (`CONFIG_X86_MPPARSE`, arch/x86/kernel/mpparse.c) scans the top KiB
//! of base memory (639 KiB, our `EBDA_START`) for the 16-byte floating pointer
//! `_MP_`, which points at the configuration table `PCMP` written right after
//! it: one processor entry per vCPU (APIC ID = vCPU index, vCPU 0 the boot
//! processor), one ISA bus, the in-kernel IOAPIC, ISA IRQ *n* → IOAPIC pin *n*
//! for every pin, and the local interrupts (LINT0 ExtINT, LINT1 NMI) matching
//! what `interrupts::set_lint` programs. Both structures carry a checksum that
//! makes their bytes sum to zero. The layout follows Firecracker's
//! `arch/x86_64/mptable.rs`; the bytes are written field by field here, so
//! the format is visible and `parse` (the tests' reader) checks it back.
//!
//! The table lies in `[EBDA_START, HIMEM_START)`, which the e820 map does not
//! report as RAM, so the guest never allocates over it.

use vm_memory::{Bytes, GuestAddress, GuestMemoryError};

use super::layout::{EBDA_START, HIMEM_START};

/// Where the floating pointer goes: the last KiB of base memory, which
/// Linux's `default_find_smp_config` scans.
pub const MPTABLE_START: u64 = EBDA_START;
/// The local APIC's physical base (every vCPU's, as KVM emulates it).
pub const APIC_DEFAULT_PHYS_BASE: u32 = 0xfee0_0000;
/// The IOAPIC's physical base (KVM's in-kernel IOAPIC).
pub const IO_APIC_DEFAULT_PHYS_BASE: u32 = 0xfec0_0000;
/// The APIC version KVM's local APIC and IOAPIC report (integrated APIC).
pub const APIC_VERSION: u8 = 0x14;
/// Pins of KVM's in-kernel IOAPIC (`KVM_IOAPIC_NUM_PINS`).
pub const IOAPIC_PINS: u8 = 24;

const MPF_SIGNATURE: &[u8; 4] = b"_MP_";
const MPC_SIGNATURE: &[u8; 4] = b"PCMP";
/// MP spec revision 1.4.
const MP_SPEC_REV: u8 = 4;
const MPF_LEN_BYTES: usize = 16;
const MPC_HEADER_LEN_BYTES: usize = 44;
const MPC_CPU_LEN_BYTES: usize = 20;
const MPC_SHORT_ENTRY_LEN_BYTES: usize = 8;

/// Entry types (MP spec table 4-3).
const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;
/// Processor flags.
const CPU_ENABLED: u8 = 1;
const CPU_BOOTPROCESSOR: u8 = 2;
/// Family 6 signature and the FPU + APIC feature bits (CPUID.1:EDX).
const CPU_STEPPING: u32 = 0x600;
const CPU_FEATURE_FPU: u32 = 1;
const CPU_FEATURE_APIC: u32 = 1 << 9;
const MPC_APIC_USABLE: u8 = 1;
/// Interrupt types (MP spec table 4-8).
const MP_INT: u8 = 0;
const MP_NMI: u8 = 1;
const MP_EXTINT: u8 = 3;
/// Polarity and trigger "conforms to the bus" (ISA: active high, edge).
const MP_IRQDIR_DEFAULT: u16 = 0;
const ISA_BUS_ID: u8 = 0;
/// The IOAPIC's ID follows the processors' APIC IDs (0..count), so IDs never clash.
const fn ioapic_id(cpus: u8) -> u8 {
    cpus
}

/// Largest vCPU count the table describes (every xAPIC ID but the IOAPIC's and broadcast).
pub const MAX_CPUS: u8 = 254;

/// An error writing the MP table.
#[derive(Debug, thiserror::Error)]
pub enum MptableError {
    /// The vCPU count cannot be described.
    #[error("cannot describe {0} vCPUs in the MP table (use 1 to {MAX_CPUS})")]
    CpuCount(u8),
    /// The table does not fit in guest memory below 1 MiB.
    #[error("the MP table ({len_bytes} bytes at {MPTABLE_START:#x}) does not fit in guest memory")]
    Write {
        /// Size of floating pointer + configuration table.
        len_bytes: usize,
        /// Cause.
        #[source]
        source: GuestMemoryError,
    },
}

/// Bytes that make `bytes` sum to zero (mod 256) when stored as its checksum.
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

/// The floating pointer and configuration table for `cpus` vCPUs, as the
/// bytes to place at `MPTABLE_START`.
pub fn build(cpus: u8) -> Result<Vec<u8>, MptableError> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(MptableError::CpuCount(cpus));
    }
    let mpc_gpa = u32::try_from(MPTABLE_START).expect("below 1 MiB") + MPF_LEN_BYTES as u32;

    // The configuration table: header first (length and checksum filled last).
    let mut mpc = Vec::new();
    mpc.extend_from_slice(MPC_SIGNATURE);
    mpc.extend_from_slice(&[0, 0]); // length
    mpc.push(MP_SPEC_REV);
    mpc.push(0); // checksum
    mpc.extend_from_slice(b"PROVIUM ");
    mpc.extend_from_slice(b"MICROVM     ");
    mpc.extend_from_slice(&0u32.to_le_bytes()); // oemptr
    mpc.extend_from_slice(&0u16.to_le_bytes()); // oemsize
    mpc.extend_from_slice(&0u16.to_le_bytes()); // oemcount (entries)
    mpc.extend_from_slice(&APIC_DEFAULT_PHYS_BASE.to_le_bytes());
    mpc.extend_from_slice(&0u32.to_le_bytes()); // reserved
    debug_assert_eq!(mpc.len(), MPC_HEADER_LEN_BYTES);
    let mut entries: u16 = 0;

    for id in 0..cpus {
        mpc.push(MP_PROCESSOR);
        mpc.push(id); // APIC ID = KVM vCPU id
        mpc.push(APIC_VERSION);
        mpc.push(CPU_ENABLED | if id == 0 { CPU_BOOTPROCESSOR } else { 0 });
        mpc.extend_from_slice(&CPU_STEPPING.to_le_bytes());
        mpc.extend_from_slice(&(CPU_FEATURE_APIC | CPU_FEATURE_FPU).to_le_bytes());
        mpc.extend_from_slice(&[0; 8]); // reserved
        entries += 1;
    }
    mpc.extend_from_slice(&[MP_BUS, ISA_BUS_ID]);
    mpc.extend_from_slice(b"ISA   ");
    entries += 1;
    let ioapic = ioapic_id(cpus);
    mpc.extend_from_slice(&[MP_IOAPIC, ioapic, APIC_VERSION, MPC_APIC_USABLE]);
    mpc.extend_from_slice(&IO_APIC_DEFAULT_PHYS_BASE.to_le_bytes());
    entries += 1;
    for pin in 0..IOAPIC_PINS {
        mpc.extend_from_slice(&[MP_INTSRC, MP_INT]);
        mpc.extend_from_slice(&MP_IRQDIR_DEFAULT.to_le_bytes());
        mpc.extend_from_slice(&[ISA_BUS_ID, pin, ioapic, pin]);
        entries += 1;
    }
    // LINT0 of the boot processor's local APIC is ExtINT (the PIC's
    // output); LINT1 of every local APIC (0xff) is NMI.
    mpc.extend_from_slice(&[MP_LINTSRC, MP_EXTINT]);
    mpc.extend_from_slice(&MP_IRQDIR_DEFAULT.to_le_bytes());
    mpc.extend_from_slice(&[ISA_BUS_ID, 0, 0, 0]);
    mpc.extend_from_slice(&[MP_LINTSRC, MP_NMI]);
    mpc.extend_from_slice(&MP_IRQDIR_DEFAULT.to_le_bytes());
    mpc.extend_from_slice(&[ISA_BUS_ID, 0, 0xff, 1]);
    entries += 2;
    debug_assert_eq!(
        mpc.len(),
        MPC_HEADER_LEN_BYTES
            + usize::from(cpus) * MPC_CPU_LEN_BYTES
            + (usize::from(entries) - usize::from(cpus)) * MPC_SHORT_ENTRY_LEN_BYTES
    );

    let len = u16::try_from(mpc.len()).expect("254 vCPUs make about 5 KiB");
    mpc[4..6].copy_from_slice(&len.to_le_bytes());
    mpc[34..36].copy_from_slice(&entries.to_le_bytes());
    mpc[7] = checksum(&mpc);

    let mut mpf = Vec::with_capacity(MPF_LEN_BYTES + mpc.len());
    mpf.extend_from_slice(MPF_SIGNATURE);
    mpf.extend_from_slice(&mpc_gpa.to_le_bytes()); // physptr
    mpf.push(1); // length in 16-byte units
    mpf.push(MP_SPEC_REV);
    mpf.push(0); // checksum
                 // feature1 = 0: a configuration table is present (no default config);
                 // feature2 bit 7 clear: virtual-wire mode, no IMCR to program.
    mpf.extend_from_slice(&[0; 5]);
    mpf[10] = checksum(&mpf);
    mpf.extend_from_slice(&mpc);
    Ok(mpf)
}

/// Writes the MP table for `cpus` vCPUs at `MPTABLE_START`.
pub fn setup_mptable<M: Bytes<GuestAddress, E = GuestMemoryError>>(
    mem: &M,
    cpus: u8,
) -> Result<(), MptableError> {
    let bytes = build(cpus)?;
    let len_bytes = bytes.len();
    let end = MPTABLE_START + len_bytes as u64;
    if end > HIMEM_START {
        // Cannot happen for MAX_CPUS (about 5 KiB), but never write over the kernel.
        return Err(MptableError::Write {
            len_bytes,
            source: GuestMemoryError::InvalidGuestAddress(GuestAddress(end)),
        });
    }
    mem.write_slice(&bytes, GuestAddress(MPTABLE_START))
        .map_err(|source| MptableError::Write { len_bytes, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_memory::GuestMemoryMmap;

    /// What a reader (Linux's `smp_read_mpc`) finds in a table.
    #[derive(Debug, Default, PartialEq)]
    struct Parsed {
        cpus: Vec<(u8, u8)>, // (APIC ID, flags)
        buses: Vec<(u8, [u8; 6])>,
        ioapics: Vec<(u8, u32)>,
        intsrc: Vec<(u8, u8, u8, u8)>, // (type, bus irq, dst apic, dst pin)
        lintsrc: Vec<(u8, u8)>,        // (type, lint)
        lapic: u32,
    }

    fn le16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn le32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    /// Scans [start, start+1 KiB) of `mem` for the floating pointer, as Linux
    /// does, and parses the configuration table it points at.
    fn parse(mem: &GuestMemoryMmap) -> Parsed {
        let mut low = vec![0u8; 1024];
        mem.read_slice(&mut low, GuestAddress(EBDA_START))
            .expect("base memory");
        let at = (0..1024)
            .step_by(16)
            .find(|i| &low[*i..*i + 4] == MPF_SIGNATURE)
            .expect("_MP_ on a 16-byte boundary in the scanned KiB");
        let mpf = &low[at..at + 16];
        assert_eq!(sum(mpf), 0, "floating pointer checksum");
        assert_eq!(mpf[8], 1, "16 bytes long");
        assert_eq!(mpf[9], 4, "spec 1.4");
        assert_eq!(mpf[11], 0, "a configuration table, not a default config");
        let ptr = u64::from(le32(mpf, 4));
        let mut hdr = [0u8; MPC_HEADER_LEN_BYTES];
        mem.read_slice(&mut hdr, GuestAddress(ptr)).expect("mpc");
        assert_eq!(&hdr[..4], MPC_SIGNATURE);
        let len = usize::from(le16(&hdr, 4));
        let mut mpc = vec![0u8; len];
        mem.read_slice(&mut mpc, GuestAddress(ptr)).expect("mpc");
        assert_eq!(sum(&mpc), 0, "configuration table checksum");
        assert_eq!(mpc[6], 4, "spec 1.4");
        let count = le16(&mpc, 34);
        let mut p = Parsed {
            lapic: le32(&mpc, 36),
            ..Parsed::default()
        };
        let mut off = MPC_HEADER_LEN_BYTES;
        for _ in 0..count {
            let e = &mpc[off..];
            match e[0] {
                MP_PROCESSOR => {
                    p.cpus.push((e[1], e[3]));
                    assert_eq!(e[2], APIC_VERSION);
                    off += MPC_CPU_LEN_BYTES;
                    continue;
                }
                MP_BUS => p.buses.push((e[1], e[2..8].try_into().expect("6 bytes"))),
                MP_IOAPIC => {
                    assert_eq!(e[3] & MPC_APIC_USABLE, MPC_APIC_USABLE);
                    p.ioapics.push((e[1], le32(e, 4)));
                }
                MP_INTSRC => p.intsrc.push((e[1], e[5], e[6], e[7])),
                MP_LINTSRC => p.lintsrc.push((e[1], e[7])),
                t => panic!("unknown entry type {t} at {off}"),
            }
            off += MPC_SHORT_ENTRY_LEN_BYTES;
        }
        assert_eq!(off, len, "the entries fill the table exactly");
        p
    }

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).expect("2 MiB")
    }

    #[test]
    fn two_cpus_parse_back() {
        let m = mem();
        setup_mptable(&m, 2).expect("fits");
        let p = parse(&m);
        assert_eq!(
            p.cpus,
            vec![(0, CPU_ENABLED | CPU_BOOTPROCESSOR), (1, CPU_ENABLED)]
        );
        assert_eq!(p.buses, vec![(0, *b"ISA   ")]);
        assert_eq!(p.ioapics, vec![(2, IO_APIC_DEFAULT_PHYS_BASE)]);
        assert_eq!(p.intsrc.len(), usize::from(IOAPIC_PINS));
        for (i, (kind, irq, apic, pin)) in p.intsrc.iter().enumerate() {
            assert_eq!((*kind, *apic), (MP_INT, 2));
            assert_eq!(
                (usize::from(*irq), usize::from(*pin)),
                (i, i),
                "ISA IRQ n on pin n"
            );
        }
        assert_eq!(p.lintsrc, vec![(MP_EXTINT, 0), (MP_NMI, 1)]);
        assert_eq!(p.lapic, APIC_DEFAULT_PHYS_BASE);
    }

    #[test]
    fn entry_counts_follow_the_vcpu_count() {
        for cpus in [1u8, 4, 37, MAX_CPUS] {
            let m = mem();
            setup_mptable(&m, cpus).expect("fits");
            let p = parse(&m);
            assert_eq!(p.cpus.len(), usize::from(cpus));
            assert_eq!(
                p.cpus
                    .iter()
                    .filter(|c| c.1 & CPU_BOOTPROCESSOR != 0)
                    .count(),
                1,
                "exactly one boot processor"
            );
            let ids: Vec<u8> = p.cpus.iter().map(|c| c.0).collect();
            assert_eq!(ids, (0..cpus).collect::<Vec<_>>());
            assert!(!ids.contains(&p.ioapics[0].0), "IOAPIC ID is unique");
            let bytes = build(cpus).expect("valid");
            assert!(MPTABLE_START + bytes.len() as u64 <= HIMEM_START);
        }
    }

    #[test]
    fn checksums_cover_every_byte() {
        let mut b = build(3).expect("valid");
        assert_eq!(sum(&b[..16]), 0);
        assert_eq!(sum(&b[16..]), 0);
        b[40] ^= 1;
        assert_ne!(sum(&b[16..]), 0, "a flipped byte shows");
    }

    #[test]
    fn bad_counts_are_refused() {
        assert!(matches!(build(0), Err(MptableError::CpuCount(0))));
        assert!(matches!(build(255), Err(MptableError::CpuCount(255))));
        let e = build(255).expect_err("too many").to_string();
        assert!(e.contains("use 1 to 254"), "{e}");
    }

    #[test]
    fn too_little_memory_is_an_error_not_a_panic() {
        let m = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x9f000)]).expect("small");
        assert!(matches!(
            setup_mptable(&m, 2),
            Err(MptableError::Write { .. })
        ));
    }
}
