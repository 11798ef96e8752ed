//! Guest RAM: one memfd holding every RAM range, mapped shared.
//!
//! Backing RAM with a file (rather than anonymous memory) is what lets a
//! snapshot later save it by reading the fd and a restore map a memory image
//! file directly (copy-on-write, pages faulted in on first touch) instead of
//! copying all of RAM before the guest runs.

use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

use vm_memory::{FileOffset, GuestAddress, GuestRegionMmap};

use crate::arch::layout::ram_ranges;

/// Guest memory as the rest of the VMM sees it.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// An error creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// memfd_create failed.
    #[error("cannot create the guest RAM memfd")]
    Memfd(#[source] io::Error),
    /// Sizing the memfd failed.
    #[error("cannot size the guest RAM memfd to {mem_bytes} bytes (is there enough memory?)")]
    Truncate {
        /// Requested size.
        mem_bytes: u64,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The size does not fit this host's address space.
    #[error("guest memory of {0} bytes is too large for this host")]
    TooLarge(u64),
    /// Mapping a region failed.
    #[error("cannot map guest RAM at {gpa:#x}")]
    Map {
        /// Guest address of the region.
        gpa: u64,
        /// Cause.
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
    /// Assembling the region collection failed.
    #[error("cannot assemble guest memory regions")]
    Regions(#[source] vm_memory::GuestRegionCollectionError),
}

/// Guest RAM and the file behind it.
pub struct GuestRam {
    /// The mapped regions.
    pub memory: GuestMemoryMmap,
    /// The memfd; region `i` starts at file offset = sum of earlier lengths.
    pub file: File,
}

/// Creates `mem_bytes` of guest RAM (split around the MMIO gap).
pub fn create_guest_ram(mem_bytes: u64) -> Result<GuestRam, MemoryError> {
    // SAFETY: the name is a valid NUL-terminated string and the flags are valid;
    // the result is checked before use.
    let fd = unsafe { libc::memfd_create(c"provium-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(MemoryError::Memfd(io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(mem_bytes)
        .map_err(|source| MemoryError::Truncate { mem_bytes, source })?;
    let mut regions = Vec::new();
    let mut offset = 0u64;
    for (gpa, len) in ram_ranges(mem_bytes) {
        let size = usize::try_from(len).map_err(|_| MemoryError::TooLarge(mem_bytes))?;
        let f = file.try_clone().map_err(MemoryError::Memfd)?;
        let region =
            GuestRegionMmap::from_range(GuestAddress(gpa), size, Some(FileOffset::new(f, offset)))
                .map_err(|source| MemoryError::Map { gpa, source })?;
        regions.push(region);
        offset += len;
    }
    let memory = GuestMemoryMmap::from_regions(regions).map_err(MemoryError::Regions)?;
    Ok(GuestRam { memory, file })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn ram_is_backed_by_the_memfd() {
        let mut ram = create_guest_ram(8 << 20).expect("8 MiB memfd");
        assert_eq!(ram.memory.num_regions(), 1);
        ram.memory
            .write_obj(0xdead_beef_u32, GuestAddress(0x1000))
            .expect("in range");
        let mut buf = vec![0u8; 0x1004];
        ram.file.read_exact(&mut buf).expect("memfd readable");
        assert_eq!(&buf[0x1000..], &0xdead_beef_u32.to_le_bytes());
    }
}
