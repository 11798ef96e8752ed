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

/// Per RAM region (in `host_parts` order), one entry per 4 KiB page: false
/// where the page is certainly zero and untouched (a hole of the file
/// behind it, and not resident in the mapping), so a snapshot skips it
/// without reading it. Reading such a page would allocate it (a memfd
/// hole) or pull a zero page into the page cache (an image hole): a 2 GiB
/// guest that touched 1 % would become 2 GiB resident. `None` for a region
/// whose holes cannot be told (no file, or lseek/mincore unsupported): it
/// is scanned whole.
pub fn data_masks(mem: &GuestMemoryMmap) -> Vec<Option<Vec<bool>>> {
    mem.iter().map(region_mask).collect()
}

fn region_mask(r: &GuestRegionMmap) -> Option<Vec<bool>> {
    use std::os::fd::AsRawFd;
    const PAGE: u64 = 4096;
    let len = r.len();
    let pages = usize::try_from(len.div_ceil(PAGE)).ok()?;
    let mut mask = vec![false; pages];
    let fo = r.file_offset()?;
    let fd = fo.file().as_raw_fd();
    let (start, end) = (fo.start(), fo.start().checked_add(len)?);
    let mut pos = start;
    while pos < end {
        let at = libc::off_t::try_from(pos).ok()?;
        // SAFETY: lseek on a file descriptor the region keeps open; it only
        // reads the file's extent map.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break; // no data past `pos`
            }
            return None;
        }
        let data = u64::try_from(data).ok()?;
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, libc::off_t::try_from(data).ok()?, libc::SEEK_HOLE) };
        let hole = u64::try_from(hole).ok()?.min(end);
        let first = usize::try_from((data - start) / PAGE).ok()?;
        let last = usize::try_from((hole - start).div_ceil(PAGE)).ok()?;
        mask.get_mut(first..last.min(pages))?.fill(true);
        pos = hole.max(data + 1);
    }
    // Pages resident in the mapping but not in the file: a private
    // mapping's copy-on-write pages (what a restored guest wrote).
    let mut resident = vec![0u8; pages];
    // SAFETY: the region maps `len` bytes at `as_ptr()` (page-aligned, from
    // mmap); `resident` has one byte per page of that range.
    let rc = unsafe {
        libc::mincore(
            r.as_ptr().cast(),
            usize::try_from(len).ok()?,
            resident.as_mut_ptr().cast(),
        )
    };
    if rc != 0 {
        return None;
    }
    for (m, v) in mask.iter_mut().zip(&resident) {
        *m |= v & 1 == 1;
    }
    Some(mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn masks_mark_written_pages_and_leave_holes_unread() {
        let ram = create_guest_ram(16 << 20).expect("16 MiB memfd");
        ram.memory
            .write_obj(7u8, GuestAddress(5 * 4096 + 9))
            .expect("in range");
        let masks = data_masks(&ram.memory);
        let m = masks[0].as_ref().expect("a memfd has an extent map");
        assert_eq!(m.len(), 4096);
        assert!(m[5], "the written page");
        assert_eq!(m.iter().filter(|b| **b).count(), 1, "only it");
        // The snapshot encoder skips the rest without faulting it in.
        let mut img = Vec::new();
        provium_snapshot::memory::encode_masked_parts_into(
            &host_parts(&ram.memory),
            &masks,
            &mut img,
        )
        .expect("encodes");
        let mut resident = vec![0u8; 4096];
        let r = ram.memory.iter().next().expect("a region");
        // SAFETY: the region maps 16 MiB at as_ptr(); one byte per page.
        assert_eq!(
            unsafe { libc::mincore(r.as_ptr().cast(), 16 << 20, resident.as_mut_ptr().cast()) },
            0
        );
        assert_eq!(
            resident.iter().filter(|b| **b & 1 == 1).count(),
            1,
            "no hole was faulted in"
        );
    }

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
