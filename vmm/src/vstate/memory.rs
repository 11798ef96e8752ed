//! Guest RAM: one memfd holding every RAM range, mapped shared; or, for a
//! restored VM, a sealed private copy of a snapshot's restore image,
//! mapped private.
//!
//! A restore does not decompress or copy all of RAM before the guest runs:
//! it copies only the restore image's (`provium_snapshot::image`) data
//! pages into a sealed memfd ([`guest_ram_from_image_copy`]) and maps that
//! `MAP_PRIVATE`; holes read as zero without allocating and a guest write
//! copies only that page. The copy is what keeps a running VM independent
//! of the image file: a private mapping of the file itself would SIGBUS the
//! process if the file were truncated under it. A snapshot reads RAM
//! through the mappings (`host_parts`), never through the file, so it sees
//! the guest's writes whichever way RAM is backed.

use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap};

use crate::arch::layout::ram_ranges;
use provium_snapshot::ImageDigest;

/// Guest memory as the rest of the VMM sees it.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// An error creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// memfd_create failed.
    #[error("cannot create the guest RAM memfd")]
    Memfd(#[source] io::Error),
    /// Sealing a restore's RAM copy against shrinking failed.
    #[error("cannot seal the restored guest RAM memfd against shrinking")]
    Seal(#[source] io::Error),
    /// Sizing the memfd failed.
    #[error("cannot size the guest RAM memfd to {mem_bytes} bytes (is there enough memory?)")]
    Truncate {
        /// Requested size.
        mem_bytes: u64,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Reading the restore image failed (it was cut or is unreadable).
    #[error("cannot read the restore image (it was truncated or is unreadable; the restore is refused and the next one rebuilds it)")]
    Image {
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The restore image's data pages do not match its digest.
    #[error("the restore image is corrupt: its memory pages do not match the digest in its header (the restore is refused before the guest runs; delete the `.img` file, or let the fixture cache evict the entry, and the next restore rebuilds it from the snapshot)")]
    ImageCorrupt,
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

/// Guest RAM for a restore: the data pages of the restore image at
/// `data_offset` in `image` copied into a fresh sealed memfd, which is then
/// mapped privately (copy-on-write).
///
/// Why a copy: a private mapping of the image file itself would tie the
/// running guest to that file. If anyone truncated it (a `cp` over it, a
/// cache cleanup, a disk tool), every page not yet copied-on-write would
/// vanish from the mapping and the next access, by a vCPU or by a device
/// model in this process, would be SIGBUS: the whole run dies. The memfd
/// is private to this process and sealed against shrinking, growing and
/// writes, so nothing outside can change what the guest sees; unlinking,
/// replacing or truncating the image afterwards does not affect the VM.
///
/// Cost (docs/reliability.md): one pass over the image's data pages
/// (holes are skipped with SEEK_DATA/SEEK_HOLE and zero pages are not
/// copied, so untouched guest RAM still costs nothing), and the data pages
/// are held once per restored VM in the memfd instead of being shared
/// through the page cache by parallel restores of one image.
///
/// The pages are checked as they are copied: their [`ImageDigest`] must be
/// `data_sha256` (the image header's), else the restore is refused with
/// [`MemoryError::ImageCorrupt`] before any vCPU exists.
pub fn guest_ram_from_image_copy(
    image: &File,
    mem_bytes: u64,
    data_offset: u64,
    data_sha256: &[u8; 32],
) -> Result<GuestRam, MemoryError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: a valid NUL-terminated name and valid flags; checked below.
    let fd = unsafe {
        libc::memfd_create(
            c"provium-restored-ram".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(MemoryError::Memfd(io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let ram = unsafe { File::from_raw_fd(fd) };
    ram.set_len(mem_bytes)
        .map_err(|source| MemoryError::Truncate { mem_bytes, source })?;
    let image_err = |source| MemoryError::Image { source };
    let end = data_offset
        .checked_add(mem_bytes)
        .ok_or(MemoryError::TooLarge(mem_bytes))?;
    let raw = image.as_raw_fd();
    let seek = |pos: u64, whence: i32| -> io::Result<Option<u64>> {
        let off = libc::off_t::try_from(pos).map_err(io::Error::other)?;
        // SAFETY: lseek on a descriptor we hold; the result is checked.
        let r = unsafe { libc::lseek(raw, off, whence) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: no data at or after `pos`.
            return if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(u64::try_from(r).ok())
    };
    const PAGE: usize = 4096;
    let page = PAGE as u64;
    // Extents are rounded out to whole pages of guest memory (a file system
    // with blocks under 4 KiB may report finer ones).
    let page_floor = |o: u64| data_offset + (o - data_offset) / page * page;
    let mut digest = ImageDigest::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = data_offset;
    while pos < end {
        let Some(data) = seek(pos, libc::SEEK_DATA).map_err(image_err)? else {
            break;
        };
        if data >= end {
            break;
        }
        let data = page_floor(data.max(pos));
        let hole = seek(data, libc::SEEK_HOLE)
            .map_err(image_err)?
            .unwrap_or(end)
            .min(end);
        let hole = page_floor(hole + page - 1).min(end);
        let mut at = data;
        while at < hole {
            let n = usize::try_from((hole - at).min(buf.len() as u64)).expect("at most 1 MiB");
            // A short read here means the image was cut while being read:
            // an error for this restore, never a fault.
            image.read_exact_at(&mut buf[..n], at).map_err(image_err)?;
            for (i, bytes) in buf[..n].chunks(PAGE).enumerate() {
                if bytes.iter().all(|b| *b == 0) {
                    continue;
                }
                let to = at - data_offset + (i * PAGE) as u64;
                digest.page(to / page, bytes);
                ram.write_all_at(bytes, to)
                    .map_err(|source| MemoryError::Truncate { mem_bytes, source })?;
            }
            at += n as u64;
        }
        pos = hole;
    }
    if digest.finish() != *data_sha256 {
        return Err(MemoryError::ImageCorrupt);
    }
    // Shrinking is what could SIGBUS the mappings; growing is sealed too.
    // Not F_SEAL_WRITE: the kernel refuses it with EBUSY while any of the
    // pages just written still has an extra reference (a per-CPU LRU batch
    // on another CPU holds one for a while), which made restores fail
    // under load; and nothing outside this process holds the memfd (it is
    // CLOEXEC and never passed on), so there is no writer to keep out.
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on the memfd we own; checked below.
    if unsafe { libc::fcntl(ram.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(MemoryError::Seal(io::Error::last_os_error()));
    }
    let memory = map_ranges(&ram, mem_bytes, 0, libc::MAP_PRIVATE)?;
    Ok(GuestRam { memory, file: ram })
}

/// Maps `mem_bytes` of guest RAM privately (copy-on-write) from a restore
/// image whose guest memory starts at `data_offset` (page-aligned). The
/// guest then depends on that file staying whole: see
/// [`guest_ram_from_image_copy`], which a restore uses.
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
