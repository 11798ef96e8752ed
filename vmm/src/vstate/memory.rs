//! Guest RAM: one memfd holding every RAM range, mapped shared; or, for a
//! restored VM, a snapshot's restore image mapped private.
//!
//! A restore maps the image file (`provium_snapshot::image`) `MAP_PRIVATE`
//! instead of copying all of RAM before the guest runs: pages fault in from
//! the page cache on first touch, holes read as zero without allocating, a
//! guest write copies only that page, and parallel restores of one image
//! share its page-cache pages. A snapshot reads RAM through the mappings
//! (`host_parts`), never through the file, so it sees the guest's writes
//! whichever way RAM is backed.

use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap};

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
    /// Mapping a region (of the memfd or a restore image) failed.
    #[error("cannot map guest RAM at {gpa:#x}")]
    Mmap {
        /// Guest address of the region.
        gpa: u64,
        /// Cause.
        #[source]
        source: vm_memory::mmap::MmapRegionError,
    },
    /// Assembling the region collection failed.
    #[error("cannot assemble guest memory regions")]
    Regions(#[source] vm_memory::GuestRegionCollectionError),
}

/// Guest RAM and the file behind it.
pub struct GuestRam {
    /// The mapped regions.
    pub memory: GuestMemoryMmap,
    /// The memfd (or restore image); region `i` starts at file offset =
    /// `data_offset` + the sum of earlier lengths. A private image mapping
    /// does not write back: read RAM through `memory`, not this file.
    pub file: File,
}

/// Maps `ram_ranges(mem_bytes)` from `file`, starting at `data_offset`,
/// with `flags` (`MAP_SHARED` or `MAP_PRIVATE`).
fn map_ranges(
    file: &File,
    mem_bytes: u64,
    data_offset: u64,
    flags: i32,
) -> Result<GuestMemoryMmap, MemoryError> {
    let mut regions = Vec::new();
    let mut offset = data_offset;
    for (gpa, len) in ram_ranges(mem_bytes) {
        let size = usize::try_from(len).map_err(|_| MemoryError::TooLarge(mem_bytes))?;
        let f = file.try_clone().map_err(MemoryError::Memfd)?;
        let mapping = MmapRegionBuilder::new(size)
            .with_file_offset(FileOffset::new(f, offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(flags | libc::MAP_NORESERVE)
            .build()
            .map_err(|source| MemoryError::Mmap { gpa, source })?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(gpa))
            .ok_or(MemoryError::TooLarge(mem_bytes))?;
        regions.push(region);
        offset += len;
    }
    GuestMemoryMmap::from_regions(regions).map_err(MemoryError::Regions)
}

/// Maps `mem_bytes` of guest RAM privately (copy-on-write) from a restore
/// image whose guest memory starts at `data_offset` (page-aligned).
pub fn guest_ram_from_image(
    file: File,
    mem_bytes: u64,
    data_offset: u64,
) -> Result<GuestRam, MemoryError> {
    let memory = map_ranges(&file, mem_bytes, data_offset, libc::MAP_PRIVATE)?;
    Ok(GuestRam { memory, file })
}

/// The host view of every RAM region, in guest order (= image order).
///
/// The slices alias guest memory: call this only while no vCPU runs and no
/// device worker writes (a snapshot pauses both first), and drop them before
/// anything resumes.
pub fn host_parts(mem: &GuestMemoryMmap) -> Vec<&[u8]> {
    mem.iter()
        .map(|r| {
            let len = usize::try_from(r.len()).expect("a mapped region fits the address space");
            // SAFETY: the region maps `len` bytes at `as_ptr()` for as long
            // as `mem` (borrowed for the slices' lifetime) keeps it; the
            // caller guarantees nothing writes to it meanwhile.
            unsafe { std::slice::from_raw_parts(r.as_ptr().cast_const(), len) }
        })
        .collect()
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
    let memory = map_ranges(&file, mem_bytes, 0, libc::MAP_SHARED)?;
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
