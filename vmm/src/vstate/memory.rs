//! Guest RAM: one memfd holding every RAM range, mapped shared; or, for a
//! restored VM, a sealed copy of a snapshot's restore image, shared by
//! every VM of the run restored from that image and mapped private.
//!
//! A restore does not decompress or copy all of RAM before the guest runs:
//! the first restore of an image in a run copies only the restore image's
//! (`provium_snapshot::image`) data pages into a sealed memfd
//! ([`RestoreRamCache`]), and every restore of it maps that memfd
//! `MAP_PRIVATE`; holes read as zero without allocating and a guest write
//! copies only that page, into that VM alone. The copy is what keeps a
//! running VM independent of the image file: a private mapping of the file
//! itself would SIGBUS the process if the file were truncated under it. A snapshot reads RAM
//! through the mappings (`host_parts`), never through the file, so it sees
//! the guest's writes whichever way RAM is backed.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap};

use crate::arch::layout::ram_ranges;
use crate::guest_memory::GuestMemoryMmap;
use provium_snapshot::ImageDigest;

/// An error creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// memfd_create failed.
    #[error("cannot create the guest RAM memfd")]
    Memfd(#[source] io::Error),
    /// Sealing a restore image's RAM copy failed.
    #[error("cannot seal the restored guest RAM memfd against writes, shrinking and growing (Linux 5.1 or later is needed)")]
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

/// What makes two restore images the same image: where it lives (the
/// `.img` beside its snapshot), the guest size, and the digest of its data
/// pages from its header. A rebuilt image at the same path (another
/// snapshot written there) has another digest, so it is another image.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ImageIdentity {
    guest_len_bytes: u64,
    data_sha256: [u8; 32],
}

/// One image's sealed RAM copy, filled by the first restore that needs it;
/// the others of that image wait on its lock instead of copying too.
type SharedRamSlot = Arc<Mutex<Option<Arc<File>>>>;

/// The restore images' sealed RAM copies of one run: one memfd per image
/// (per [`ImageIdentity`]), copied from the image and digest-checked once,
/// then mapped `MAP_PRIVATE` by every VM restored from it.
///
/// Why: a private copy per VM (what keeps a VM independent of its image
/// file, see [`RestoreRamCache::guest_ram`]) held one copy of a fixture's
/// pages per VM; 10 parallel restores of one fixture held 10. Shared, the
/// data pages are held once per run and a VM holds only the pages it wrote
/// (copy-on-write). The memfd is sealed against writes as well as shrinking
/// and growing, so no VM (and nothing else) can change what the others see.
///
/// The owner is the run (the harness's kvm backend holds one; a lone
/// `Vm::restore` makes its own); dropping it drops the cache's reference,
/// and a memfd is freed once the last VM mapping it is gone. It keeps at
/// most one memfd per image path: an image rebuilt under the same path
/// replaces the entry (VMs restored from the old one keep their mapping).
#[derive(Default)]
pub struct RestoreRamCache {
    images: Mutex<HashMap<PathBuf, (ImageIdentity, SharedRamSlot)>>,
    copies_made: AtomicU64,
}

impl RestoreRamCache {
    /// An empty cache (no image copied yet).
    pub fn new() -> RestoreRamCache {
        RestoreRamCache::default()
    }

    /// Lets go of the cache's copy of `image_path`'s RAM: VMs restored from
    /// it keep their mappings (and so the pages they share); a later
    /// restore of that path reads the image again. For images restored a
    /// known number of times and then deleted (a fork's frozen snapshot),
    /// so their RAM lives as long as their VMs, not as long as the run.
    pub fn forget(&self, image_path: &Path) {
        self.images
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(image_path);
    }

    /// How many image copies this cache made: one per image restored, not
    /// one per restore (tests and benches read it).
    pub fn copies_made(&self) -> u64 {
        self.copies_made.load(Ordering::Relaxed)
    }

    /// Guest RAM for a restore from `image`, opened from `image_path`: its
    /// data pages (`mem_bytes` at `data_offset`) as a sealed memfd mapped
    /// privately (copy-on-write). The first restore of an image copies and
    /// checks it; later ones of the same image (same path and
    /// `data_sha256`, the header's digest) map that memfd without reading
    /// the image again.
    ///
    /// Why a copy at all: a private mapping of the image file itself would
    /// tie the running guest to that file. If anyone truncated it (a `cp`
    /// over it, a cache cleanup, a disk tool), every page not yet
    /// copied-on-write would vanish from the mapping and the next access,
    /// by a vCPU or by a device model in this process, would be SIGBUS:
    /// the whole run dies. The memfd is private to this process and sealed
    /// against shrinking, growing and writes, so nothing outside can change
    /// what the guest sees; unlinking, replacing or truncating the image
    /// afterwards affects neither the running VMs nor later restores of
    /// the same image in this run.
    ///
    /// Cost (docs/snapshots.md): one pass over the image's data pages per
    /// image per run (holes are skipped with SEEK_DATA/SEEK_HOLE and zero
    /// pages are not copied, so untouched guest RAM still costs nothing).
    /// The pages are checked as they are copied: their [`ImageDigest`] must
    /// be `data_sha256`, else the restore is refused with
    /// [`MemoryError::ImageCorrupt`] before any vCPU exists, and nothing is
    /// kept (the next restore reads the image again).
    pub fn guest_ram(
        &self,
        image_path: &Path,
        image: &File,
        mem_bytes: u64,
        data_offset: u64,
        data_sha256: &[u8; 32],
    ) -> Result<GuestRam, MemoryError> {
        let identity = ImageIdentity {
            guest_len_bytes: mem_bytes,
            data_sha256: *data_sha256,
        };
        let slot = {
            let mut images = self.images.lock().unwrap_or_else(|e| e.into_inner());
            match images.get(image_path) {
                Some((known, slot)) if *known == identity => Arc::clone(slot),
                _ => {
                    let slot = SharedRamSlot::default();
                    images.insert(image_path.to_path_buf(), (identity, Arc::clone(&slot)));
                    slot
                }
            }
        };
        // The map's lock is released: restores of other images copy in
        // parallel; those of this image wait here for the first one's copy.
        let mut shared = slot.lock().unwrap_or_else(|e| e.into_inner());
        let memfd = match shared.as_ref() {
            Some(memfd) => Arc::clone(memfd),
            None => {
                let memfd = Arc::new(sealed_copy_of_image(
                    image,
                    mem_bytes,
                    data_offset,
                    data_sha256,
                )?);
                self.copies_made.fetch_add(1, Ordering::Relaxed);
                *shared = Some(Arc::clone(&memfd));
                memfd
            }
        };
        drop(shared);
        let memory = map_ranges(&memfd, mem_bytes, 0, libc::MAP_PRIVATE)?;
        let file = memfd.try_clone().map_err(MemoryError::Memfd)?;
        Ok(GuestRam { memory, file })
    }
}

/// The data pages of the restore image at `data_offset` in `image` copied
/// into a fresh memfd of `mem_bytes`, checked against `data_sha256` and
/// then sealed: no write, shrink or grow from here on.
fn sealed_copy_of_image(
    image: &File,
    mem_bytes: u64,
    data_offset: u64,
    data_sha256: &[u8; 32],
) -> Result<File, MemoryError> {
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
    let seek = |pos: u64, whence: i32| provium_snapshot::install::seek_extent(image, pos, whence);
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
    // F_SEAL_FUTURE_WRITE, not F_SEAL_WRITE: every restored VM of the
    // image maps this memfd, so a write to it would reach them all; the
    // future-write seal refuses write(2) and new shared writable mappings
    // from here on and leaves private (copy-on-write) mappings writable.
    // F_SEAL_WRITE would also do, but the kernel refuses it with EBUSY
    // while any page just written still has an extra reference (a per-CPU
    // LRU batch on another CPU holds one for a while), which made restores
    // fail under load.
    let seals =
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on the memfd we own; checked below.
    if unsafe { libc::fcntl(ram.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(MemoryError::Seal(io::Error::last_os_error()));
    }
    Ok(ram)
}

/// Maps `mem_bytes` of guest RAM privately (copy-on-write) from a restore
/// image whose guest memory starts at `data_offset` (page-aligned). The
/// guest then depends on that file staying whole: see
/// [`RestoreRamCache::guest_ram`], which a restore uses.
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
        assert_eq!(
            // SAFETY: the region maps 16 MiB at as_ptr(); one byte per page.
            unsafe { libc::mincore(r.as_ptr().cast(), 16 << 20, resident.as_mut_ptr().cast()) },
            0
        );
        assert_eq!(
            resident.iter().filter(|b| **b & 1 == 1).count(),
            1,
            "no hole was faulted in"
        );
    }

    const IMAGE_MEM_BYTES: u64 = 2 << 20;
    const IMAGE_DATA_OFFSET: u64 = 4096;

    /// A restore image's data part at `IMAGE_DATA_OFFSET` in a sparse file
    /// `path`: `pages` (index, fill byte) of guest memory; with its digest.
    fn write_image(path: &Path, pages: &[(u64, u8)]) -> (File, [u8; 32]) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .expect("image file");
        f.set_len(IMAGE_DATA_OFFSET + IMAGE_MEM_BYTES)
            .expect("sized");
        let mut digest = ImageDigest::default();
        for (index, fill) in pages {
            let page = vec![*fill; 4096];
            f.write_all_at(&page, IMAGE_DATA_OFFSET + index * 4096)
                .expect("page written");
            digest.page(*index, &page);
        }
        (f, digest.finish())
    }

    fn inode(f: &File) -> u64 {
        use std::os::unix::fs::MetadataExt;
        f.metadata().expect("fstat").ino()
    }

    fn byte_at(ram: &GuestRam, gpa: u64) -> u8 {
        ram.memory.read_obj(GuestAddress(gpa)).expect("in range")
    }

    #[test]
    fn restores_of_one_image_share_one_sealed_copy_and_keep_their_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.snap.img");
        let (image, digest) = write_image(&path, &[(3, 0x33), (100, 0x64)]);
        let cache = RestoreRamCache::new();
        let a = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("first restore copies");
        let b = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("second restore shares");
        assert_eq!(cache.copies_made(), 1, "one copy for two restores");
        assert_eq!(inode(&a.file), inode(&b.file), "both map the same memfd");
        assert_ne!(inode(&a.file), inode(&image), "a copy, not the image");
        assert_eq!(byte_at(&a, 3 * 4096), 0x33);
        assert_eq!(byte_at(&b, 100 * 4096 + 7), 0x64);
        // Copy-on-write: each VM's writes are its own.
        a.memory
            .write_obj(0xaau8, GuestAddress(3 * 4096))
            .expect("in range");
        b.memory
            .write_obj(0xbbu8, GuestAddress(50 * 4096))
            .expect("in range");
        assert_eq!(byte_at(&a, 3 * 4096), 0xaa);
        assert_eq!(byte_at(&b, 3 * 4096), 0x33, "a's write did not reach b");
        assert_eq!(byte_at(&a, 50 * 4096), 0, "b's write did not reach a");
        let c = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("third restore");
        assert_eq!(byte_at(&c, 3 * 4096), 0x33, "nor the shared copy");
        assert_eq!(byte_at(&c, 50 * 4096), 0);
    }

    /// What `vm:fork(n)` relies on (docs/snapshots.md, "Forking"): one
    /// frozen image, n private mappings of one sealed memfd; each copy's
    /// writes are its own, and none reaches the frozen pages the others
    /// (and later copies) read.
    #[test]
    fn a_fork_maps_one_frozen_image_n_times_copy_on_write() {
        const N: u8 = 8;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fork.snap.img");
        let (image, digest) = write_image(&path, &[(0, 0x5a), (7, 0x77)]);
        let cache = RestoreRamCache::new();
        let copies: Vec<GuestRam> = (0..N)
            .map(|_| {
                cache
                    .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
                    .expect("a copy maps the frozen image")
            })
            .collect();
        assert_eq!(cache.copies_made(), 1, "one frozen copy for {N} mappings");
        let first = inode(&copies[0].file);
        assert!(copies.iter().all(|c| inode(&c.file) == first), "one memfd");
        for (i, c) in (0u8..).zip(&copies) {
            c.memory
                .write_obj(i + 1, GuestAddress(0))
                .expect("in range");
        }
        for (i, c) in (0u8..).zip(&copies) {
            assert_eq!(byte_at(c, 0), i + 1, "copy {i} keeps its own write");
            assert_eq!(byte_at(c, 1), 0x5a, "and the frozen rest of that page");
            assert_eq!(
                byte_at(c, 7 * 4096),
                0x77,
                "and the frozen pages it never wrote"
            );
        }
        let later = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("a later copy");
        assert_eq!(
            byte_at(&later, 0),
            0x5a,
            "no copy's write reached the frozen image"
        );
        // Forgotten once the fork is done: the copies keep their pages, and
        // the cache holds nothing of the image any more.
        cache.forget(&path);
        assert_eq!(byte_at(&copies[3], 7 * 4096), 0x77);
        cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("a restore after forget reads the image again");
        assert_eq!(cache.copies_made(), 2);
    }

    #[test]
    fn the_shared_copy_is_sealed_against_writes_and_resizing() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.snap.img");
        let (image, digest) = write_image(&path, &[(1, 1)]);
        let cache = RestoreRamCache::new();
        let ram = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("restore");
        assert!(ram.file.write_all_at(&[9], 4096).is_err(), "write sealed");
        assert!(ram.file.set_len(4096).is_err(), "shrink sealed");
        assert!(
            ram.file.set_len(IMAGE_MEM_BYTES * 2).is_err(),
            "grow sealed"
        );
        assert_eq!(byte_at(&ram, 4096), 1);
    }

    #[test]
    fn an_image_truncated_after_the_first_restore_affects_no_restore_of_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.snap.img");
        let (image, digest) = write_image(&path, &[(2, 0x22), (400, 0x44)]);
        let cache = RestoreRamCache::new();
        let first = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("first restore");
        image.set_len(0).expect("truncate the image under the VM");
        // A mapping of the file itself would SIGBUS on these reads.
        assert_eq!(byte_at(&first, 400 * 4096), 0x44);
        let second = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("the second restore does not read the cut image");
        assert_eq!(byte_at(&second, 2 * 4096), 0x22);
        assert_eq!(byte_at(&second, 400 * 4096), 0x44);
        assert_eq!(byte_at(&first, 2 * 4096), 0x22);
        assert_eq!(cache.copies_made(), 1);
    }

    #[test]
    fn a_corrupt_image_is_refused_and_not_kept() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.snap.img");
        let (image, digest) = write_image(&path, &[(5, 0x55)]);
        image
            .write_all_at(&[0x56], IMAGE_DATA_OFFSET + 5 * 4096 + 9)
            .expect("flip a byte");
        let cache = RestoreRamCache::new();
        let e = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .err()
            .expect("a corrupt image is refused");
        assert!(matches!(e, MemoryError::ImageCorrupt), "{e}");
        assert_eq!(cache.copies_made(), 0, "nothing kept");
        // Mended, the next restore copies it (the refusal was not cached).
        image
            .write_all_at(&[0x55], IMAGE_DATA_OFFSET + 5 * 4096 + 9)
            .expect("mend");
        let ram = cache
            .guest_ram(&path, &image, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &digest)
            .expect("a whole image restores");
        assert_eq!(byte_at(&ram, 5 * 4096 + 9), 0x55);
    }

    #[test]
    fn an_image_rebuilt_under_its_path_is_another_image() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.snap.img");
        let (old, old_digest) = write_image(&path, &[(1, 0x11)]);
        let cache = RestoreRamCache::new();
        let a = cache
            .guest_ram(&path, &old, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &old_digest)
            .expect("old image");
        let new_path = dir.path().join("new.img");
        let (new, new_digest) = write_image(&new_path, &[(1, 0x12)]);
        let b = cache
            .guest_ram(&path, &new, IMAGE_MEM_BYTES, IMAGE_DATA_OFFSET, &new_digest)
            .expect("new image at the old path");
        assert_eq!(cache.copies_made(), 2);
        assert_ne!(inode(&a.file), inode(&b.file));
        assert_eq!(byte_at(&a, 4096), 0x11, "the old VM keeps its RAM");
        assert_eq!(byte_at(&b, 4096), 0x12);
        assert_eq!(
            cache.images.lock().expect("unpoisoned").len(),
            1,
            "one entry per image path"
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
