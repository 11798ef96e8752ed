//! Initrds the VMM makes or changes: the newc cpio format (`cpio`) and the
//! agent overlay appended to a profile's initrd (`inject`).

pub mod cpio;
pub mod inject;

pub use cpio::{CpioEntry, CpioError, CpioWriter};
pub use inject::{inject_agent, AgentInjection, BootFile, InjectError};

/// A static x86-64 ELF whose only instruction is `jmp .`: an init (or a
/// stand-in agent) that execs and then never makes a system call. On a host
/// whose KVM cannot run Linux user space (kvm_pvm, DESIGN.md) it keeps the
/// kernel alive after "Run /init" (a missing or failing init panics it),
/// and it is small, so an emulated kernel unpacks it quickly.
pub fn spinning_init_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const EHDR_BYTES: u64 = 64;
    const PHDR_BYTES: u64 = 56;
    let code = [0xeb, 0xfe]; // jmp .
    let size = EHDR_BYTES + PHDR_BYTES + code.len() as u64;
    let mut e = Vec::new();
    e.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    e.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    e.extend_from_slice(&(BASE + EHDR_BYTES + PHDR_BYTES).to_le_bytes()); // entry
    e.extend_from_slice(&EHDR_BYTES.to_le_bytes()); // phoff
    e.extend_from_slice(&0u64.to_le_bytes()); // shoff
    e.extend_from_slice(&0u32.to_le_bytes()); // flags
                                              // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
    for v in [64u16, 56, 1, 0, 0, 0] {
        e.extend_from_slice(&v.to_le_bytes());
    }
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // R+X
                                              // offset, vaddr, paddr, filesz, memsz, align
    for v in [0, BASE, BASE, size, size, 0x1000] {
        e.extend_from_slice(&v.to_le_bytes());
    }
    e.extend_from_slice(&code);
    debug_assert_eq!(e.len() as u64, size);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_init_is_one_loadable_segment_ending_in_jmp_self() {
        let e = spinning_init_elf();
        assert_eq!(&e[..4], b"\x7fELF");
        let entry = u64::from_le_bytes(e[24..32].try_into().expect("8 bytes"));
        let off = usize::try_from(entry - 0x40_0000).expect("small");
        assert_eq!(&e[off..], [0xeb, 0xfe], "the entry is `jmp .`");
        let filesz = u64::from_le_bytes(e[64 + 32..64 + 40].try_into().expect("8 bytes"));
        assert_eq!(filesz, e.len() as u64);
    }
}
