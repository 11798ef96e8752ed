//! The restore image: an uncompressed, sparse copy of a snapshot's memory
//! section kept beside the snapshot (`<snapshot>.img`), which a restore maps
//! `MAP_PRIVATE` as guest RAM.
//!
//! Why: decompressing and copying all of guest RAM before the guest runs
//! costs time proportional to the guest. A private file mapping costs
//! nothing up front; the guest faults pages in from the page cache on first
//! touch, untouched memory costs nothing (holes read as zero), and parallel
//! restores of one snapshot share the page cache's copy until they write.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "PRVMIMG1"
//!      8     4  image version (2), u32 LE
//!     12     4  reserved, 0
//!     16     8  guest memory length in bytes, u64 LE
//!     24    32  SHA-256 of the snapshot's stored memory section
//!     56    32  SHA-256 of the guest memory's non-zero pages ([`ImageDigest`])
//!   4096     -  guest memory, guest_len bytes; zero pages are holes
//! ```
//!
//! The image is derived data: it is rebuilt whenever its header does not
//! match the snapshot it sits beside (another snapshot written to the same
//! path, an interrupted build, a different guest size, a cut file). Its
//! data pages are not hashed when it is opened (that would cost a pass over
//! them on every restore); the restore that copies them
//! (`provium_vmm`'s guest RAM) hashes them as it goes and refuses an image
//! whose pages do not match the digest, before the guest runs. It is written under a
//! temporary name, synced and renamed, so a reader sees a whole image or
//! none; a restore that already mapped an older image keeps its own inode.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::format::{write_error, SectionKind, Snapshot, SnapshotError};
use crate::install::temp_sibling;
use crate::memory;
use sha2::{Digest, Sha256};

/// The first eight bytes of a restore image.
pub const IMAGE_MAGIC: [u8; 8] = *b"PRVMIMG1";
/// The image layout version.
pub const IMAGE_VERSION: u32 = 2;
/// File offset of guest memory: one page, so the data maps page-aligned.
pub const IMAGE_DATA_OFFSET: u64 = 4096;
/// The header bytes that must equal what the snapshot implies.
const HEADER_MATCHED: usize = 56;
/// The header bytes in use: the matched part, then the data digest.
const HEADER_USED: usize = HEADER_MATCHED + 32;

/// The digest of a guest memory image: SHA-256 over `(page index as u64
/// LE, page bytes)` of every page that is not all zero, in increasing page
/// order, for 4 KiB pages. Holes and zero pages are skipped, so it is the
/// same however the file's holes fell, and a reader that skips holes with
/// SEEK_DATA computes it in one pass over the data it copies.
pub struct ImageDigest {
    sha: Sha256,
}

impl Default for ImageDigest {
    fn default() -> Self {
        ImageDigest { sha: Sha256::new() }
    }
}

impl ImageDigest {
    /// Fold in page `index` (4 KiB, or shorter at the end of guest
    /// memory); an all-zero page is skipped. Pages come in increasing order.
    pub fn page(&mut self, index: u64, bytes: &[u8]) {
        if bytes.iter().all(|b| *b == 0) {
            return;
        }
        self.sha.update(index.to_le_bytes());
        self.sha.update(bytes);
    }

    /// The digest.
    pub fn finish(self) -> [u8; 32] {
        self.sha.finalize().into()
    }
}

/// Where the restore image of the snapshot at `snapshot` lives.
pub fn image_path(snapshot: &Path) -> PathBuf {
    let mut s = snapshot.as_os_str().to_owned();
    s.push(".img");
    PathBuf::from(s)
}

/// Whether `path` names the restore image of a `.snap` file
/// (`<name>.snap.img`): what directory walkers that size or copy snapshot
/// directories leave out (derived data, sparse; its length is the guest's
/// size however few blocks hold data). A disk image named `vda.img` is not one.
pub fn is_snapshot_image_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".snap.img"))
}

/// An opened, verified restore image.
#[derive(Debug)]
pub struct RestoreImage {
    /// The image file (map it from `data_offset`).
    pub file: File,
    /// Where guest memory starts in the file.
    pub data_offset: u64,
    /// Guest memory length in bytes.
    pub guest_len_bytes: u64,
    /// Whether this call built the image (false: an existing one matched).
    pub built: bool,
    /// The digest its data pages must have ([`ImageDigest`]); a reader
    /// copying them checks it.
    pub data_sha256: [u8; 32],
}

fn header(guest_len: u64, sha: &[u8; 32]) -> [u8; HEADER_MATCHED] {
    let mut h = [0u8; HEADER_MATCHED];
    h[..8].copy_from_slice(&IMAGE_MAGIC);
    h[8..12].copy_from_slice(&IMAGE_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&guest_len.to_le_bytes());
    h[24..56].copy_from_slice(sha);
    h
}

/// Whether `path` holds a whole image matching `want`; with its data digest.
fn matches(path: &Path, want: &[u8; HEADER_MATCHED], guest_len: u64) -> Option<(File, [u8; 32])> {
    let f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len != IMAGE_DATA_OFFSET.checked_add(guest_len)? {
        return None;
    }
    let mut h = [0u8; HEADER_USED];
    f.read_exact_at(&mut h, 0).ok()?;
    if h[..HEADER_MATCHED] != want[..] {
        return None;
    }
    let digest: [u8; 32] = h[HEADER_MATCHED..].try_into().expect("32 bytes");
    Some((f, digest))
}

/// What [`Snapshot::image_state`] found at a restore image's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageState {
    /// No image there (the next restore builds one).
    Absent,
    /// A whole image whose header matches this snapshot: a restore uses it
    /// (and checks its data pages' digest as it copies them).
    Matches,
    /// A file that is not this snapshot's image: cut, grown, another
    /// snapshot's, or a damaged header.
    Mismatch,
}

/// Whether the snapshot file at `snapshot` has its own restore image beside
/// it (`<snapshot>.img`, its header bound to the snapshot's memory section):
/// what an installer checks before carrying the image along with the
/// snapshot. Any protocol version: this does not restore.
pub fn has_matching_image(snapshot: &Path) -> bool {
    let Some(protocol) = crate::format::recorded_protocol_version(snapshot) else {
        return false;
    };
    let Ok(s) = Snapshot::open(snapshot, &crate::format::Expect::protocol(protocol)) else {
        return false;
    };
    s.sections()
        .iter()
        .find(|x| x.kind == SectionKind::Memory)
        .is_some_and(|m| s.image_state(&m.name, &image_path(snapshot)) == ImageState::Matches)
}

impl Snapshot {
    /// Whether the restore image at `path` is the image of memory section
    /// `name`: its length and header (the section's SHA-256, the guest
    /// size) checked, its data pages not read (the restore's copy hashes
    /// them). For a whole-entry check of the fixture cache.
    pub fn image_state(&self, name: &str, path: &Path) -> ImageState {
        if !path.exists() {
            return ImageState::Absent;
        }
        let section = self
            .sections()
            .iter()
            .find(|s| s.name == name && s.kind == SectionKind::Memory);
        let guest_len = self.shape().memory_bytes;
        match section {
            Some(s) if matches(path, &header(guest_len, &s.sha256), guest_len).is_some() => {
                ImageState::Matches
            }
            _ => ImageState::Mismatch,
        }
    }

    /// The restore image of memory section `name` at `path`: opened when one
    /// matching this snapshot is there, else built (decoding the section
    /// once, writing only its non-zero pages) and installed atomically.
    /// The guest size is the snapshot's shape.
    pub fn restore_image(&self, name: &str, path: &Path) -> Result<RestoreImage, SnapshotError> {
        let section = self
            .sections()
            .iter()
            .find(|s| s.name == name && s.kind == SectionKind::Memory)
            .ok_or_else(|| SnapshotError::MissingSection {
                file: self.origin().into(),
                name: name.into(),
                present: self
                    .sections()
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let guest_len = self.shape().memory_bytes;
        let len = usize::try_from(guest_len)
            .ok()
            .filter(|l| *l > 0)
            .ok_or_else(|| SnapshotError::Malformed {
                file: self.origin().into(),
                detail: format!("guest memory of {guest_len} bytes cannot be mapped on this host"),
            })?;
        let want = header(guest_len, &section.sha256);
        if let Some((file, data_sha256)) = matches(path, &want, guest_len) {
            return Ok(RestoreImage {
                file,
                data_offset: IMAGE_DATA_OFFSET,
                guest_len_bytes: guest_len,
                built: false,
                data_sha256,
            });
        }
        // Decoded into anonymous memory first (untouched pages cost
        // nothing), then written as the snapshot writer writes it.
        let mut guest = vec![0u8; len];
        self.memory_into(name, &mut guest)?;
        let parts = [guest.as_slice()];
        let pages = memory::DataPages::scan(&parts, &[]).map_err(|e| SnapshotError::Malformed {
            file: self.origin().into(),
            detail: format!("cannot scan the decoded memory: {e}"),
        })?;
        write_image(path, &section.sha256, &pages)
    }
}

/// Writes the restore image of guest memory `pages` (whose memory section
/// is stored with SHA-256 `section_sha256`) to `path`: only the non-zero
/// pages are written with `pwrite` (the rest stay holes), then the header,
/// fsync, and an atomic rename. The snapshot writer calls it with the pages
/// it just encoded (so the first restore of a new snapshot finds its image
/// ready); a restore that finds no matching image calls it after decoding
/// the section.
///
/// A full file system is an ENOSPC error here ([`SnapshotError::NoSpace`]),
/// where stores through a shared file mapping would die of SIGBUS; the
/// temporary file is removed on any error.
pub fn write_image(
    path: &Path,
    section_sha256: &[u8; 32],
    pages: &memory::DataPages<'_>,
) -> Result<RestoreImage, SnapshotError> {
    let guest_len = pages.guest_len_bytes();
    let want = header(guest_len, section_sha256);
    let page = u64::from(memory::PAGE_SIZE_BYTES);
    let data_bytes: u64 = pages.runs().iter().map(|r| r.page_count * page).sum();
    let mut digest = ImageDigest::default();
    for (at, bytes) in pages.slices() {
        for (i, p) in bytes.chunks(page as usize).enumerate() {
            digest.page(at / page + i as u64, p);
        }
    }
    let data_sha256 = digest.finish();
    let mut head = [0u8; HEADER_USED];
    head[..HEADER_MATCHED].copy_from_slice(&want);
    head[HEADER_MATCHED..].copy_from_slice(&data_sha256);
    let tmp = temp_sibling(path);
    let werr = |source| write_error(path, IMAGE_DATA_OFFSET + data_bytes, source);
    let built = (|| {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(werr)?;
        // Sized sparse: pages the image has no data for stay holes.
        file.set_len(IMAGE_DATA_OFFSET + guest_len).map_err(werr)?;
        for (at, bytes) in pages.slices() {
            file.write_all_at(bytes, IMAGE_DATA_OFFSET + at)
                .map_err(werr)?;
        }
        file.write_all_at(&head, 0).map_err(werr)?;
        // The image stands in for the checksummed section: make it
        // durable before it becomes visible under its name.
        file.sync_data().map_err(werr)?;
        std::fs::rename(&tmp, path).map_err(werr)?;
        Ok(file)
    })();
    match built {
        Ok(file) => Ok(RestoreImage {
            file,
            data_offset: IMAGE_DATA_OFFSET,
            guest_len_bytes: guest_len,
            built: true,
            data_sha256,
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Expect, Shape, SnapshotBuilder};
    use std::os::unix::fs::MetadataExt;

    fn snap(dir: &Path, guest: &[u8]) -> std::path::PathBuf {
        let shape = Shape {
            backend: "kvm".into(),
            memory_bytes: guest.len() as u64,
            vcpus: 1,
        };
        let mut b = SnapshotBuilder::new(1, shape);
        b.add_memory("memory", guest).unwrap();
        let p = dir.join("x.snap");
        b.write_file(&p).unwrap();
        p
    }

    fn read_data(img: &RestoreImage) -> Vec<u8> {
        let mut v = vec![0u8; img.guest_len_bytes as usize];
        img.file.read_exact_at(&mut v, img.data_offset).unwrap();
        v
    }

    #[test]
    fn image_is_built_once_sparse_and_rebuilt_when_stale() {
        let dir = tempfile::tempdir().unwrap();
        let mut guest = vec![0u8; 64 << 20];
        guest[4096 * 3] = 7;
        guest[(64 << 20) - 1] = 9;
        let p = snap(dir.path(), &guest);
        let s = Snapshot::open(&p, &Expect::protocol(1)).unwrap();
        let ip = image_path(&p);
        assert_eq!(ip, dir.path().join("x.snap.img"));
        let img = s.restore_image("memory", &ip).unwrap();
        assert!(img.built);
        assert_eq!(read_data(&img), guest);
        // Sparse: two data pages (and the header), not 64 MiB of blocks.
        let blocks_bytes = std::fs::metadata(&ip).unwrap().blocks() * 512;
        assert!(blocks_bytes < 1 << 20, "{blocks_bytes} bytes allocated");
        let again = s.restore_image("memory", &ip).unwrap();
        assert!(!again.built, "a matching image is reused");

        // Another snapshot at the same path: the old image no longer matches.
        guest[4096 * 3] = 8;
        let p2 = snap(dir.path(), &guest);
        let s2 = Snapshot::open(&p2, &Expect::protocol(1)).unwrap();
        let img2 = s2.restore_image("memory", &ip).unwrap();
        assert!(img2.built);
        assert_eq!(read_data(&img2)[4096 * 3], 8);

        // A cut image is rebuilt, not trusted.
        let f = OpenOptions::new().write(true).open(&ip).unwrap();
        f.set_len(IMAGE_DATA_OFFSET + 4096).unwrap();
        assert!(s2.restore_image("memory", &ip).unwrap().built);
    }

    fn digest_of(data: &[u8]) -> [u8; 32] {
        let mut d = ImageDigest::default();
        for (i, p) in data.chunks(4096).enumerate() {
            d.page(i as u64, p);
        }
        d.finish()
    }

    #[test]
    fn the_header_carries_the_digest_of_the_data_pages() {
        let dir = tempfile::tempdir().unwrap();
        let mut guest = vec![0u8; 32 * 4096];
        guest[4096 * 5 + 1] = 3;
        guest[4096 * 6] = 4;
        let p = snap(dir.path(), &guest);
        let s = Snapshot::open(&p, &Expect::protocol(1)).unwrap();
        let ip = image_path(&p);
        let img = s.restore_image("memory", &ip).unwrap();
        assert_eq!(img.data_sha256, digest_of(&guest));
        assert_ne!(img.data_sha256, digest_of(&vec![0u8; 32 * 4096]));
        // A flipped data byte leaves the header matching (the image is
        // reused, unhashed) but no longer matches the digest a reader checks.
        let f = OpenOptions::new().write(true).open(&ip).unwrap();
        f.write_all_at(&[9], IMAGE_DATA_OFFSET + 4096 * 5 + 1)
            .unwrap();
        let again = s.restore_image("memory", &ip).unwrap();
        assert!(!again.built);
        assert_eq!(again.data_sha256, img.data_sha256);
        assert_ne!(digest_of(&read_data(&again)), again.data_sha256);
        // Where a page's data sits matters, not only its bytes.
        let mut moved = vec![0u8; 32 * 4096];
        moved[4096 * 7 + 1] = 3;
        moved[4096 * 6] = 4;
        assert_ne!(digest_of(&moved), digest_of(&guest));
    }

    #[test]
    fn image_state_tells_a_matching_image_from_a_cut_or_foreign_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut guest = vec![0u8; 32 * 4096];
        guest[4096 * 2] = 5;
        let p = snap(dir.path(), &guest);
        let s = Snapshot::open(&p, &Expect::protocol(1)).unwrap();
        let ip = image_path(&p);
        assert_eq!(s.image_state("memory", &ip), ImageState::Absent);
        s.restore_image("memory", &ip).unwrap();
        assert_eq!(s.image_state("memory", &ip), ImageState::Matches);
        // A flipped header byte (the section digest it is bound to).
        let f = OpenOptions::new().write(true).open(&ip).unwrap();
        f.write_all_at(&[0xff], 30).unwrap();
        assert_eq!(s.image_state("memory", &ip), ImageState::Mismatch);
        s.restore_image("memory", &ip).unwrap();
        // Cut.
        let f = OpenOptions::new().write(true).open(&ip).unwrap();
        f.set_len(IMAGE_DATA_OFFSET).unwrap();
        assert_eq!(s.image_state("memory", &ip), ImageState::Mismatch);
        // No memory section of that name.
        assert_eq!(s.image_state("ram", &ip), ImageState::Mismatch);
    }

    #[test]
    fn an_image_written_with_the_snapshot_is_the_one_a_restore_would_build() {
        let dir = tempfile::tempdir().unwrap();
        let mut guest = vec![0u8; 64 * 4096];
        guest[4096 * 3 + 5] = 1;
        guest[4096 * 9] = 2;
        guest[64 * 4096 - 1] = 3;
        // Two host mappings, a run of data pages across their boundary.
        guest[4096 * 31] = 4;
        guest[4096 * 32] = 5;
        let (a, b) = guest.split_at(32 * 4096);
        let parts = [a, b];
        let pages = memory::DataPages::scan(&parts, &[]).unwrap();
        let shape = crate::format::Shape {
            backend: "kvm".into(),
            memory_bytes: guest.len() as u64,
            vcpus: 1,
        };
        let mut sb = SnapshotBuilder::new(1, shape);
        sb.add_memory_pages("memory", &pages).unwrap();
        let p = dir.path().join("w.snap");
        sb.write_file(&p).unwrap();
        let ip = image_path(&p);
        let written = write_image(&ip, &sb.section_sha256("memory").unwrap(), &pages).unwrap();
        assert!(has_matching_image(&p));
        let s = Snapshot::open(&p, &Expect::protocol(1)).unwrap();
        assert_eq!(s.image_state("memory", &ip), ImageState::Matches);
        let opened = s.restore_image("memory", &ip).unwrap();
        assert!(!opened.built, "the restore found the written image");
        assert_eq!(read_data(&opened), guest);
        assert_eq!(opened.data_sha256, written.data_sha256);
        assert_eq!(opened.data_sha256, digest_of(&guest));
        // Built from the section instead, it is the same image.
        std::fs::remove_file(&ip).unwrap();
        let rebuilt = s.restore_image("memory", &ip).unwrap();
        assert!(rebuilt.built);
        assert_eq!(rebuilt.data_sha256, written.data_sha256);
        // Another snapshot's image beside it does not match.
        let mut other = SnapshotBuilder::new(1, s.shape().clone());
        other.add_memory("memory", &vec![0u8; guest.len()]).unwrap();
        other.write_file(&p).unwrap();
        assert!(!has_matching_image(&p));
        assert!(!has_matching_image(&dir.path().join("absent.snap")));
    }

    #[test]
    fn missing_section_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = snap(dir.path(), &[0u8; 8192]);
        let s = Snapshot::open(&p, &Expect::protocol(1)).unwrap();
        let e = s
            .restore_image("ram", &image_path(&p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `ram` section"), "{e}");
    }
}
