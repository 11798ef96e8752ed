//! The snapshot container: a fixed header, a section table and the sections'
//! payloads.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "PRVMSNAP"
//!      8     4  format version (SNAPSHOT_FORMAT_VERSION), u32 LE
//!     12     4  PROTOCOL_VERSION of the writer, u32 LE
//!     16     4  section count, u32 LE
//!     20     4  reserved, 0
//!     24     8  section table length in bytes, u64 LE
//!     32     8  whole file length in bytes, u64 LE
//!     40    32  SHA-256 over bytes 0..40 and the section table
//!     72     -  section table, then payloads
//! ```
//!
//! The section table starts with the *shape* the snapshot was taken from
//! (backend, guest memory size, vCPU count) and then holds one record per
//! section: name, kind, encoding, offset, stored and raw lengths, and the
//! SHA-256 of the stored bytes. The header's checksum covers the table, and
//! the table covers every payload, so the whole state is checksummed while a
//! reader verifies (and decompresses) only the sections it reads.
//!
//! Strings in the table are a u16 LE length then UTF-8 bytes. Section names
//! are 1 to 32 characters from `a-z 0-9 - _ .`; well-known names are
//! `vcpu`, `devices`, `memory`, `fs-upper`, `console`.
//!
//! Reading treats the file as hostile: every length is bounds-checked before
//! use, allocations are bounded, and each problem (truncation, wrong magic,
//! wrong format or protocol version, a checksum mismatch, a shape that is not
//! the caller's) is an error that names it. Nothing here panics on input.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::install::{temp_sibling, NoSpace};
use crate::memory::{self, MemoryError, MemoryStats};

/// The first eight bytes of every snapshot.
pub const MAGIC: [u8; 8] = *b"PRVMSNAP";
/// The container and section layout version. Bump it on any change to the
/// header, the table or a section's encoding; `tests::format_version_pin`
/// makes a change visible.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// Header length in bytes.
pub const HEADER_LEN: u64 = 72;
/// The longest section table a reader accepts.
pub const MAX_TABLE_BYTES: u64 = 1 << 20;
/// The most sections a snapshot may hold.
pub const MAX_SECTIONS: u32 = 256;
/// The largest decoded (raw) section a reader accepts by default, in bytes.
pub const DEFAULT_MAX_SECTION_BYTES: u64 = 64 << 30;
const MAX_NAME_LEN: usize = 32;
const MAX_BACKEND_LEN: usize = 64;
const CHECKED_HEADER_LEN: usize = 40;
const SECTION_RECORD_FIXED: usize = 1 + 1 + 2 + 8 + 8 + 8 + 32;

/// What a snapshot was taken from; a restore into another shape is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// The backend that wrote it (`kvm`, `local`).
    pub backend: String,
    /// Guest memory size in bytes (0 where the backend has none of its own).
    pub memory_bytes: u64,
    /// vCPU count (0 where the backend has none).
    pub vcpus: u32,
}

/// What the reader requires of a file.
#[derive(Debug, Clone)]
pub struct Expect {
    /// The reader's wire protocol version; a snapshot from another version is refused.
    pub protocol_version: u32,
    /// The shape the caller will restore into; `None` accepts any.
    pub shape: Option<Shape>,
    /// Upper bound on a section's decoded size, in bytes.
    pub max_section_bytes: u64,
}

impl Expect {
    /// Require `protocol_version`, accept any shape.
    pub fn protocol(protocol_version: u32) -> Expect {
        Expect {
            protocol_version,
            shape: None,
            max_section_bytes: DEFAULT_MAX_SECTION_BYTES,
        }
    }

    /// Also require `shape`.
    pub fn with_shape(mut self, shape: Shape) -> Expect {
        self.shape = Some(shape);
        self
    }
}

/// How a section's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// As is.
    Raw = 0,
    /// One zstd frame.
    Zstd = 1,
}

/// What a section's decoded bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionKind {
    /// Opaque state owned by whoever wrote the section (serde data, a tree).
    Data = 0,
    /// A sparse memory image (see [`crate::memory`]).
    Memory = 1,
}

/// One section's table record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Its name (`vcpu`, `memory`, ...).
    pub name: String,
    /// What its bytes are.
    pub kind: SectionKind,
    /// How they are stored.
    pub encoding: Encoding,
    /// Absolute file offset of the stored bytes.
    pub offset: u64,
    /// Stored length in bytes.
    pub stored_len: u64,
    /// Decoded length in bytes.
    pub raw_len: u64,
    /// SHA-256 of the stored bytes.
    pub sha256: [u8; 32],
}

/// Everything that can be wrong with a snapshot, or with writing one.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be opened or read.
    #[error("cannot read snapshot {file}")]
    Io {
        /// The snapshot's path.
        file: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its own header says.
    #[error("snapshot {file} is truncated: {detail} (the write was interrupted or the file was cut; take the snapshot again)")]
    Truncated {
        /// The snapshot's path.
        file: String,
        /// What ended early.
        detail: String,
    },
    /// Not a snapshot at all.
    #[error("{file} is not a provium snapshot: it starts with {found}, not the magic `PRVMSNAP`")]
    BadMagic {
        /// The file's path.
        file: String,
        /// Its first bytes, escaped.
        found: String,
    },
    /// Written by a provium with another container layout.
    #[error("snapshot {file} has format version {found}; this provium reads version {supported} only (take the snapshot again, or `provium fixture rebuild` a fixture)")]
    FormatVersion {
        /// The snapshot's path.
        file: String,
        /// The version in the file.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// Written by a provium speaking another wire protocol (its agent state
    /// may not match ours).
    #[error("snapshot {file} was taken with protocol version {found}; this provium speaks {expected} (take the snapshot again, or `provium fixture rebuild` a fixture)")]
    ProtocolVersion {
        /// The snapshot's path.
        file: String,
        /// The version in the file.
        found: u32,
        /// This build's version.
        expected: u32,
    },
    /// Stored bytes do not match their checksum.
    #[error(
        "snapshot {file} is corrupt: checksum mismatch in {what} (delete it and take it again)"
    )]
    Checksum {
        /// The snapshot's path.
        file: String,
        /// Which part failed.
        what: String,
    },
    /// A field is out of range or inconsistent.
    #[error("snapshot {file} is malformed: {detail}")]
    Malformed {
        /// The snapshot's path.
        file: String,
        /// What is wrong.
        detail: String,
    },
    /// Taken from another VM shape than the one restoring it.
    #[error("snapshot {file} was taken from a different VM shape: {field} is {found} in the snapshot but {expected} here (restore it into a VM declared like the one that took it)")]
    ShapeMismatch {
        /// The snapshot's path.
        file: String,
        /// The differing field.
        field: &'static str,
        /// The file's value.
        found: String,
        /// The caller's value.
        expected: String,
    },
    /// A section the caller needs is absent.
    #[error("snapshot {file} has no `{name}` section (it has: {present})")]
    MissingSection {
        /// The snapshot's path.
        file: String,
        /// The section asked for.
        name: String,
        /// The sections it has.
        present: String,
    },
    /// A section's payload failed to decode.
    #[error("snapshot {file}: section `{section}` does not decode")]
    Decode {
        /// The snapshot's path.
        file: String,
        /// The section.
        section: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A memory section's image is unusable.
    #[error("snapshot {file}: memory section `{section}` cannot be restored")]
    Memory {
        /// The snapshot's path.
        file: String,
        /// The section.
        section: String,
        /// Why.
        #[source]
        source: MemoryError,
    },
    /// A builder was given a section it cannot store.
    #[error("cannot add section `{name}`: {reason}")]
    InvalidSection {
        /// The section's name.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// The file system a snapshot (or its restore image) was being
    /// written to is full. Nothing partial is left behind.
    #[error(
        "cannot write {path}: no space left in {dir} ({free_bytes} bytes free, {needed_bytes} \
         needed; free space there, or point the directory at a larger file system, then run \
         again)"
    )]
    NoSpace {
        /// The file being written.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// Space left there for an unprivileged writer, in bytes.
        free_bytes: u64,
        /// What the write needed in all, in bytes.
        needed_bytes: u64,
        /// The I/O error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// Writing the file failed.
    #[error("cannot write snapshot {path}")]
    Write {
        /// Where it was being written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Why a section name is refused (a builder's caller or a file gave it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum SectionNameError {
    /// Empty, or longer than `MAX_NAME_LEN`.
    #[error("a section name has 1 to {MAX_NAME_LEN} characters")]
    Length,
    /// A character outside `a-z 0-9 - _ .`.
    #[error("a section name uses only a-z, 0-9, `-`, `_` and `.`")]
    Characters,
}

fn check_name(name: &str) -> Result<(), SectionNameError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(SectionNameError::Length);
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(SectionNameError::Characters);
    }
    Ok(())
}

struct PendingSection {
    name: String,
    kind: SectionKind,
    encoding: Encoding,
    stored: Vec<u8>,
    raw_len: u64,
    /// SHA-256 of `stored`, computed once (the table and a restore image
    /// written beside the snapshot both need it).
    sha256: [u8; 32],
}

/// Assembles a snapshot in memory, then writes it in one go.
pub struct SnapshotBuilder {
    protocol_version: u32,
    shape: Shape,
    level: i32,
    sections: Vec<PendingSection>,
}

impl SnapshotBuilder {
    /// A snapshot written by a peer speaking `protocol_version`, taken from `shape`.
    pub fn new(protocol_version: u32, shape: Shape) -> SnapshotBuilder {
        SnapshotBuilder {
            protocol_version,
            shape,
            level: 1,
            sections: Vec::new(),
        }
    }

    /// zstd level for the sections added after this call (default 1: a
    /// snapshot is on the latency path; decompression speed barely depends
    /// on the level).
    pub fn compression_level(&mut self, level: i32) -> &mut Self {
        self.level = level;
        self
    }

    fn push(&mut self, s: PendingSection) -> Result<&mut Self, SnapshotError> {
        check_name(&s.name).map_err(|reason| SnapshotError::InvalidSection {
            name: s.name.clone(),
            reason: reason.to_string(),
        })?;
        if self.sections.iter().any(|p| p.name == s.name) {
            return Err(SnapshotError::InvalidSection {
                name: s.name,
                reason: "the snapshot already has a section with that name".into(),
            });
        }
        if self.sections.len() >= MAX_SECTIONS as usize {
            return Err(SnapshotError::InvalidSection {
                name: s.name,
                reason: format!("a snapshot holds at most {MAX_SECTIONS} sections"),
            });
        }
        self.sections.push(s);
        Ok(self)
    }

    fn compress(&self, name: &str, data: &[u8]) -> Result<Vec<u8>, SnapshotError> {
        zstd::bulk::compress(data, self.level).map_err(|e| SnapshotError::InvalidSection {
            name: name.into(),
            reason: format!("zstd compression failed: {e}"),
        })
    }

    /// Add a zstd-compressed data section.
    pub fn add_section(&mut self, name: &str, data: &[u8]) -> Result<&mut Self, SnapshotError> {
        let stored = self.compress(name, data)?;
        self.push(PendingSection {
            name: name.into(),
            kind: SectionKind::Data,
            encoding: Encoding::Zstd,
            sha256: Sha256::digest(&stored).into(),
            stored,
            raw_len: data.len() as u64,
        })
    }

    /// Add a data section stored as is (already compressed, or tiny).
    pub fn add_raw_section(&mut self, name: &str, data: &[u8]) -> Result<&mut Self, SnapshotError> {
        self.push(PendingSection {
            name: name.into(),
            kind: SectionKind::Data,
            encoding: Encoding::Raw,
            sha256: Sha256::digest(data).into(),
            stored: data.to_vec(),
            raw_len: data.len() as u64,
        })
    }

    /// Add guest memory as a sparse (zero pages skipped), zstd-compressed image.
    pub fn add_memory(&mut self, name: &str, guest: &[u8]) -> Result<&mut Self, SnapshotError> {
        self.add_memory_parts(name, &[guest])
    }

    /// Add guest memory held in several host mappings (in guest order; all
    /// but the last a whole number of pages) as one sparse, zstd-compressed
    /// image of their concatenation.
    pub fn add_memory_parts(
        &mut self,
        name: &str,
        parts: &[&[u8]],
    ) -> Result<&mut Self, SnapshotError> {
        self.add_memory_masked(name, parts, &[])
    }

    /// [`SnapshotBuilder::add_memory_parts`] with per-page masks (see
    /// [`memory::encode_masked_parts_into`]): pages known to be holes are
    /// skipped without being read.
    pub fn add_memory_masked(
        &mut self,
        name: &str,
        parts: &[&[u8]],
        masks: &[Option<Vec<bool>>],
    ) -> Result<&mut Self, SnapshotError> {
        let pages = memory::DataPages::scan(parts, masks).map_err(|e| memory_error(name, e))?;
        self.add_memory_pages(name, &pages)
    }

    /// Add guest memory already scanned into its non-zero pages: the same
    /// section [`SnapshotBuilder::add_memory_masked`] writes, for a caller
    /// that also writes the restore image from `pages`
    /// ([`crate::image::write_image`]).
    pub fn add_memory_pages(
        &mut self,
        name: &str,
        pages: &memory::DataPages<'_>,
    ) -> Result<&mut Self, SnapshotError> {
        let fail = |e: io::Error| memory_error(name, e);
        let mut enc = zstd::stream::Encoder::new(Vec::new(), self.level).map_err(fail)?;
        let raw_len = pages.encode_into(&mut enc).map_err(fail)?;
        let stored = enc.finish().map_err(fail)?;
        self.push(PendingSection {
            name: name.into(),
            kind: SectionKind::Memory,
            encoding: Encoding::Zstd,
            sha256: Sha256::digest(&stored).into(),
            stored,
            raw_len,
        })
    }

    /// The SHA-256 of section `name` as it will be stored (what a restore
    /// image's header binds it to), or `None` when there is no such section.
    pub fn section_sha256(&self, name: &str) -> Option<[u8; 32]> {
        self.sections
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.sha256)
    }

    fn table(&self, payload_start: u64) -> Vec<u8> {
        let mut t = Vec::new();
        put_str(&mut t, &self.shape.backend);
        t.extend_from_slice(&self.shape.memory_bytes.to_le_bytes());
        t.extend_from_slice(&self.shape.vcpus.to_le_bytes());
        let mut offset = payload_start;
        for s in &self.sections {
            put_str(&mut t, &s.name);
            t.push(s.kind as u8);
            t.push(s.encoding as u8);
            t.extend_from_slice(&0u16.to_le_bytes());
            t.extend_from_slice(&offset.to_le_bytes());
            t.extend_from_slice(&(s.stored.len() as u64).to_le_bytes());
            t.extend_from_slice(&s.raw_len.to_le_bytes());
            t.extend_from_slice(&s.sha256);
            offset += s.stored.len() as u64;
        }
        t
    }

    fn table_len(&self) -> u64 {
        let names: usize = self.sections.iter().map(|s| 2 + s.name.len()).sum();
        (2 + self.shape.backend.len() + 8 + 4 + names + SECTION_RECORD_FIXED * self.sections.len())
            as u64
    }

    /// Header and table (everything before the payloads).
    fn head(&self) -> Vec<u8> {
        let table_len = self.table_len();
        let payload_start = HEADER_LEN + table_len;
        let table = self.table(payload_start);
        debug_assert_eq!(table.len() as u64, table_len);
        let payload_len: u64 = self.sections.iter().map(|s| s.stored.len() as u64).sum();
        let mut h = Vec::with_capacity(payload_start as usize);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        h.extend_from_slice(&self.protocol_version.to_le_bytes());
        h.extend_from_slice(&(self.sections.len() as u32).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&table_len.to_le_bytes());
        h.extend_from_slice(&(payload_start + payload_len).to_le_bytes());
        let mut sum = Sha256::new();
        sum.update(&h[..CHECKED_HEADER_LEN]);
        sum.update(&table);
        h.extend_from_slice(&sum.finalize());
        h.extend_from_slice(&table);
        h
    }

    /// Write the snapshot to `w`; returns its length in bytes.
    pub fn write_to<W: Write>(&self, w: &mut W) -> io::Result<u64> {
        let head = self.head();
        w.write_all(&head)?;
        let mut n = head.len() as u64;
        for s in &self.sections {
            w.write_all(&s.stored)?;
            n += s.stored.len() as u64;
        }
        Ok(n)
    }

    /// The snapshot's length in bytes once written.
    pub fn len_bytes(&self) -> u64 {
        HEADER_LEN
            + self.table_len()
            + self
                .sections
                .iter()
                .map(|s| s.stored.len() as u64)
                .sum::<u64>()
    }

    /// The whole snapshot as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_to(&mut v).expect("writing to a Vec cannot fail");
        v
    }

    /// Write to `path` atomically: a temporary file beside it, fsync, then
    /// rename, so a reader sees the old file or the whole new one. Returns
    /// the file's length in bytes.
    pub fn write_file(&self, path: &Path) -> Result<u64, SnapshotError> {
        let werr = |source| write_error(path, self.len_bytes(), source);
        let tmp = temp_sibling(path);
        let result = (|| {
            let mut f = File::create(&tmp)?;
            let mut bw = io::BufWriter::with_capacity(1 << 20, &mut f);
            let n = self.write_to(&mut bw)?;
            bw.flush()?;
            drop(bw);
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            Ok(n)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map_err(werr)
    }
}

impl From<NoSpace> for SnapshotError {
    fn from(n: NoSpace) -> SnapshotError {
        SnapshotError::NoSpace {
            path: n.path,
            dir: n.dir,
            free_bytes: n.free_bytes,
            needed_bytes: n.needed_bytes,
            source: n.source,
        }
    }
}

/// Why memory section `name` could not be encoded.
fn memory_error(name: &str, e: io::Error) -> SnapshotError {
    SnapshotError::InvalidSection {
        name: name.into(),
        reason: format!("cannot encode the memory image: {e}"),
    }
}

/// The error for a failed write of `needed_bytes` to `path`: a
/// [`SnapshotError::NoSpace`] naming the directory and its free space when
/// the file system is full, else [`SnapshotError::Write`].
pub(crate) fn write_error(path: &Path, needed_bytes: u64, source: io::Error) -> SnapshotError {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match NoSpace::detect(path, dir, || needed_bytes, source) {
        Ok(full) => full.into(),
        Err(source) => SnapshotError::Write {
            path: path.to_path_buf(),
            source,
        },
    }
}

fn put_str(t: &mut Vec<u8>, s: &str) {
    // Names and backends are checked to be short before they get here.
    let len = u16::try_from(s.len()).expect("short string");
    t.extend_from_slice(&len.to_le_bytes());
    t.extend_from_slice(s.as_bytes());
}

enum Source {
    File(File),
    Bytes(Arc<[u8]>),
}

impl Source {
    fn len(&self) -> io::Result<u64> {
        match self {
            Source::File(f) => Ok(f.metadata()?.len()),
            Source::Bytes(b) => Ok(b.len() as u64),
        }
    }

    /// Read exactly `buf.len()` bytes at `offset` (caller checked bounds).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Source::File(f) => f.read_exact_at(buf, offset),
            Source::Bytes(b) => {
                let start = usize::try_from(offset).map_err(io::Error::other)?;
                let end = start
                    .checked_add(buf.len())
                    .filter(|e| *e <= b.len())
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(&b[start..end]);
                Ok(())
            }
        }
    }
}

/// An opened, header-verified snapshot. Sections are read (and their
/// checksums verified) on demand.
pub struct Snapshot {
    file: String,
    source: Source,
    protocol_version: u32,
    shape: Shape,
    sections: Vec<Section>,
    max_section_bytes: u64,
    len: u64,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("file", &self.file)
            .field("shape", &self.shape)
            .field("sections", &self.sections)
            .finish_non_exhaustive()
    }
}

/// A bounds-checked reader over the section table.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], SnapshotError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let Some(end) = end else {
            return Err(SnapshotError::Malformed {
                file: self.file.into(),
                detail: format!("the section table ends inside {what}"),
            });
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8, SnapshotError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, SnapshotError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, SnapshotError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64, SnapshotError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn string(&mut self, what: &str, max: usize) -> Result<String, SnapshotError> {
        let len = self.u16(what)? as usize;
        if len > max {
            return Err(SnapshotError::Malformed {
                file: self.file.into(),
                detail: format!("{what} is {len} bytes long (at most {max})"),
            });
        }
        let b = self.take(len, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| SnapshotError::Malformed {
            file: self.file.into(),
            detail: format!("{what} is not UTF-8"),
        })
    }
}

fn escape(b: &[u8]) -> String {
    format!("`{}`", b.escape_ascii())
}

/// The fixed header: its bytes (the checksum covers the first 40) and its
/// fields, read but not yet checked against the file (`check_limits`).
struct Header {
    bytes: [u8; HEADER_LEN as usize],
    protocol_version: u32,
    count: u32,
    reserved: u32,
    table_len: u64,
    file_len: u64,
}

/// Where payloads may lie: after the section table, up to the declared end.
#[derive(Clone, Copy)]
struct PayloadArea {
    start: u64,
    end: u64,
}

/// Refuses what is not a snapshot at all: an empty file, a wrong magic (in
/// `head`, the file's first bytes, at most a header's worth) or a file
/// shorter than the header.
fn check_magic(file: &str, head: &[u8], len: u64) -> Result<(), SnapshotError> {
    let magic_len = head.len().min(MAGIC.len());
    if len == 0 {
        return Err(SnapshotError::Truncated {
            file: file.into(),
            detail: "the file is empty".into(),
        });
    }
    if head[..magic_len] != MAGIC[..magic_len] {
        return Err(SnapshotError::BadMagic {
            file: file.into(),
            found: escape(&head[..magic_len]),
        });
    }
    if len < HEADER_LEN {
        return Err(SnapshotError::Truncated {
            file: file.into(),
            detail: format!("the file is {len} bytes, shorter than the {HEADER_LEN}-byte header"),
        });
    }
    Ok(())
}

/// Reads the header's fields and refuses another format or protocol version.
/// The wire protocol version recorded in the header of the snapshot file
/// at `path`, unchecked; `None` when the file cannot be read or is not a
/// snapshot. For code that moves snapshots without restoring them (an
/// installer checking that an image belongs to its snapshot).
pub(crate) fn recorded_protocol_version(path: &Path) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 16];
    File::open(path).ok()?.read_exact_at(&mut b, 0).ok()?;
    (b[..8] == MAGIC).then(|| u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")))
}

fn parse_header(
    file: &str,
    bytes: [u8; HEADER_LEN as usize],
    expect: &Expect,
) -> Result<Header, SnapshotError> {
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8"));
    let version = u32_at(8);
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(SnapshotError::FormatVersion {
            file: file.into(),
            found: version,
            supported: SNAPSHOT_FORMAT_VERSION,
        });
    }
    let protocol_version = u32_at(12);
    if protocol_version != expect.protocol_version {
        return Err(SnapshotError::ProtocolVersion {
            file: file.into(),
            found: protocol_version,
            expected: expect.protocol_version,
        });
    }
    Ok(Header {
        bytes,
        protocol_version,
        count: u32_at(16),
        reserved: u32_at(20),
        table_len: u64_at(24),
        file_len: u64_at(32),
    })
}

/// Checks the header's lengths against the file (`len` bytes) and the
/// reader's caps. Returns where the payloads start.
fn check_limits(file: &str, h: &Header, len: u64) -> Result<u64, SnapshotError> {
    let malformed = |detail: String| SnapshotError::Malformed {
        file: file.into(),
        detail,
    };
    let file_len = h.file_len;
    if len < file_len {
        return Err(SnapshotError::Truncated {
            file: file.into(),
            detail: format!("the file is {len} bytes but its header says {file_len}"),
        });
    }
    if len > file_len {
        return Err(malformed(format!(
            "{} bytes after the end its header declares ({file_len} bytes)",
            len - file_len
        )));
    }
    if h.reserved != 0 {
        return Err(malformed("reserved header field is not zero".into()));
    }
    let count = h.count;
    if count > MAX_SECTIONS {
        return Err(malformed(format!(
            "{count} sections (at most {MAX_SECTIONS})"
        )));
    }
    let table_len = h.table_len;
    if table_len > MAX_TABLE_BYTES {
        return Err(malformed(format!(
            "section table of {table_len} bytes (at most {MAX_TABLE_BYTES})"
        )));
    }
    let payload_start = HEADER_LEN + table_len;
    if payload_start > file_len {
        return Err(malformed(format!(
            "the section table ({table_len} bytes) runs past the end of the file"
        )));
    }
    Ok(payload_start)
}

/// The header's SHA-256 covers its first 40 bytes and the section table.
fn verify_checksum(file: &str, h: &Header, table: &[u8]) -> Result<(), SnapshotError> {
    let mut sum = Sha256::new();
    sum.update(&h.bytes[..CHECKED_HEADER_LEN]);
    sum.update(table);
    if sum.finalize()[..] != h.bytes[CHECKED_HEADER_LEN..] {
        return Err(SnapshotError::Checksum {
            file: file.into(),
            what: "the header and section table".into(),
        });
    }
    Ok(())
}

/// The shape at the start of the section table.
fn parse_shape(c: &mut Cursor<'_>) -> Result<Shape, SnapshotError> {
    Ok(Shape {
        backend: c.string("the shape's backend", MAX_BACKEND_LEN)?,
        memory_bytes: c.u64("the shape's memory size")?,
        vcpus: c.u32("the shape's vCPU count")?,
    })
}

/// The `count` section records after the shape.
fn parse_sections(
    c: &mut Cursor<'_>,
    count: u32,
    area: PayloadArea,
    max_section_bytes: u64,
) -> Result<Vec<Section>, SnapshotError> {
    let mut sections = Vec::with_capacity(count as usize);
    let mut names = BTreeSet::new();
    for i in 0..count {
        sections.push(parse_section_record(
            c,
            i,
            &mut names,
            area,
            max_section_bytes,
        )?);
    }
    Ok(sections)
}

/// Section record `i`: a valid name not in `names` (it is added), a known
/// kind and encoding, and stored bytes inside the payload area that decode
/// to at most `max_section_bytes`.
fn parse_section_record(
    c: &mut Cursor<'_>,
    i: u32,
    names: &mut BTreeSet<String>,
    area: PayloadArea,
    max_section_bytes: u64,
) -> Result<Section, SnapshotError> {
    let file = c.file;
    let malformed = |detail: String| SnapshotError::Malformed {
        file: file.into(),
        detail,
    };
    let what = format!("section record {i}");
    let name = c.string(&what, MAX_NAME_LEN)?;
    check_name(&name).map_err(|r| malformed(format!("section {i} `{name}`: {r}")))?;
    if !names.insert(name.clone()) {
        return Err(malformed(format!("two sections are named `{name}`")));
    }
    let kind = match c.u8(&what)? {
        0 => SectionKind::Data,
        1 => SectionKind::Memory,
        k => return Err(malformed(format!("section `{name}` has unknown kind {k}"))),
    };
    let encoding = match c.u8(&what)? {
        0 => Encoding::Raw,
        1 => Encoding::Zstd,
        e => {
            return Err(malformed(format!(
                "section `{name}` has unknown encoding {e}"
            )))
        }
    };
    if c.u16(&what)? != 0 {
        return Err(malformed(format!(
            "section `{name}`: reserved field is not zero"
        )));
    }
    let offset = c.u64(&what)?;
    let stored_len = c.u64(&what)?;
    let raw_len = c.u64(&what)?;
    let sha256: [u8; 32] = c.take(32, &what)?.try_into().expect("32 bytes");
    let (payload_start, file_len) = (area.start, area.end);
    let end = offset.checked_add(stored_len);
    if offset < payload_start || end.is_none_or(|e| e > file_len) {
        return Err(malformed(format!(
            "section `{name}` (bytes {offset}+{stored_len}) lies outside the payload area \
             ({payload_start}..{file_len})"
        )));
    }
    if encoding == Encoding::Raw && raw_len != stored_len {
        return Err(malformed(format!(
            "raw section `{name}` declares {raw_len} decoded bytes but stores {stored_len}"
        )));
    }
    if raw_len > max_section_bytes {
        return Err(malformed(format!(
            "section `{name}` decodes to {raw_len} bytes (at most {max_section_bytes})"
        )));
    }
    Ok(Section {
        name,
        kind,
        encoding,
        offset,
        stored_len,
        raw_len,
        sha256,
    })
}

/// The table holds nothing after the last record.
fn check_table_consumed(c: &Cursor<'_>) -> Result<(), SnapshotError> {
    if c.pos != c.buf.len() {
        return Err(SnapshotError::Malformed {
            file: c.file.into(),
            detail: format!(
                "{} unused bytes at the end of the section table",
                c.buf.len() - c.pos
            ),
        });
    }
    Ok(())
}

/// Refuses a snapshot taken from another shape than `want`, naming the
/// first field that differs.
fn check_shape(file: &str, shape: &Shape, want: &Shape) -> Result<(), SnapshotError> {
    let diffs: [(&'static str, String, String); 3] = [
        ("the backend", shape.backend.clone(), want.backend.clone()),
        (
            "guest memory",
            format!("{} bytes", shape.memory_bytes),
            format!("{} bytes", want.memory_bytes),
        ),
        (
            "the vCPU count",
            shape.vcpus.to_string(),
            want.vcpus.to_string(),
        ),
    ];
    if let Some((field, found, expected)) = diffs.into_iter().find(|(_, a, b)| a != b) {
        return Err(SnapshotError::ShapeMismatch {
            file: file.into(),
            field,
            found,
            expected,
        });
    }
    Ok(())
}

impl Snapshot {
    /// Open and verify the header and table of the snapshot at `path`.
    pub fn open(path: &Path, expect: &Expect) -> Result<Snapshot, SnapshotError> {
        let file = path.display().to_string();
        let f = File::open(path).map_err(|source| SnapshotError::Io {
            file: file.clone(),
            source,
        })?;
        Snapshot::from_source(file, Source::File(f), expect)
    }

    /// Verify a snapshot held in memory (`origin` names it in errors).
    pub fn from_bytes(
        origin: &str,
        bytes: impl Into<Arc<[u8]>>,
        expect: &Expect,
    ) -> Result<Snapshot, SnapshotError> {
        Snapshot::from_source(origin.into(), Source::Bytes(bytes.into()), expect)
    }

    fn from_source(
        file: String,
        source: Source,
        expect: &Expect,
    ) -> Result<Snapshot, SnapshotError> {
        let io_err = |source| SnapshotError::Io {
            file: file.clone(),
            source,
        };
        let len = source.len().map_err(io_err)?;
        let head_len = len.min(HEADER_LEN) as usize;
        let mut bytes = [0u8; HEADER_LEN as usize];
        source.read_at(&mut bytes[..head_len], 0).map_err(io_err)?;
        check_magic(&file, &bytes[..head_len], len)?;
        let header = parse_header(&file, bytes, expect)?;
        let payload_start = check_limits(&file, &header, len)?;
        // Bounded by MAX_TABLE_BYTES (check_limits).
        let mut table = vec![0u8; header.table_len as usize];
        source.read_at(&mut table, HEADER_LEN).map_err(io_err)?;
        verify_checksum(&file, &header, &table)?;

        let mut c = Cursor {
            buf: &table,
            pos: 0,
            file: &file,
        };
        let shape = parse_shape(&mut c)?;
        let area = PayloadArea {
            start: payload_start,
            end: header.file_len,
        };
        let sections = parse_sections(&mut c, header.count, area, expect.max_section_bytes)?;
        check_table_consumed(&c)?;
        if let Some(want) = &expect.shape {
            check_shape(&file, &shape, want)?;
        }
        Ok(Snapshot {
            file,
            source,
            protocol_version: header.protocol_version,
            shape,
            sections,
            max_section_bytes: expect.max_section_bytes,
            len,
        })
    }

    /// The name it was opened under (its path, or the origin given to
    /// `from_bytes`), as errors show it.
    pub fn origin(&self) -> &str {
        &self.file
    }

    /// The shape it was taken from.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The writer's protocol version (equal to the expected one).
    pub fn protocol_version(&self) -> u32 {
        self.protocol_version
    }

    /// The section records, in file order.
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The file's length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len
    }

    /// Whether it has a section named `name`.
    pub fn has_section(&self, name: &str) -> bool {
        self.sections.iter().any(|s| s.name == name)
    }

    fn find(&self, name: &str) -> Result<&Section, SnapshotError> {
        self.sections
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| SnapshotError::MissingSection {
                file: self.file.clone(),
                name: name.into(),
                present: self
                    .sections
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The stored bytes of `s`, checksum verified.
    fn stored(&self, s: &Section) -> Result<Vec<u8>, SnapshotError> {
        // stored_len lies within the file (checked at open); a section larger
        // than memory fails here as an allocation the caller asked for.
        let len = usize::try_from(s.stored_len).map_err(|_| SnapshotError::Malformed {
            file: self.file.clone(),
            detail: format!("section `{}` is too large for this host", s.name),
        })?;
        let mut buf = vec![0u8; len];
        self.source
            .read_at(&mut buf, s.offset)
            .map_err(|source| SnapshotError::Io {
                file: self.file.clone(),
                source,
            })?;
        if Sha256::digest(&buf)[..] != s.sha256 {
            return Err(SnapshotError::Checksum {
                file: self.file.clone(),
                what: format!("section `{}`", s.name),
            });
        }
        Ok(buf)
    }

    /// Checks every section's stored bytes against its SHA-256, the memory
    /// section's included, reading 1 MiB at a time (nothing is decoded or
    /// held). [`Snapshot::open`] checks only the header, table and length;
    /// a restore checks the sections it reads, and a restore from a valid
    /// restore image never reads the memory section: this is what finds a
    /// flipped byte there. One pass over the file.
    pub fn verify_sections(&self) -> Result<(), SnapshotError> {
        const CHUNK_BYTES: u64 = 1 << 20;
        let mut buf = vec![0u8; CHUNK_BYTES as usize];
        for s in &self.sections {
            let mut sha = Sha256::new();
            let mut done = 0u64;
            while done < s.stored_len {
                let n = (s.stored_len - done).min(CHUNK_BYTES);
                // n <= CHUNK_BYTES, the buffer's length.
                let chunk = &mut buf[..n as usize];
                self.source
                    .read_at(chunk, s.offset + done)
                    .map_err(|source| SnapshotError::Io {
                        file: self.file.clone(),
                        source,
                    })?;
                sha.update(&*chunk);
                done += n;
            }
            if sha.finalize()[..] != s.sha256 {
                return Err(SnapshotError::Checksum {
                    file: self.file.clone(),
                    what: format!("section `{}`", s.name),
                });
            }
        }
        Ok(())
    }

    /// A data section's decoded bytes.
    pub fn section(&self, name: &str) -> Result<Vec<u8>, SnapshotError> {
        let s = self.find(name)?;
        let stored = self.stored(s)?;
        let decode_err = |source| SnapshotError::Decode {
            file: self.file.clone(),
            section: name.into(),
            source,
        };
        match s.encoding {
            Encoding::Raw => Ok(stored),
            Encoding::Zstd => {
                let dec =
                    zstd::stream::read::Decoder::new(stored.as_slice()).map_err(decode_err)?;
                // Grows with the data actually decoded, never past raw_len + 1.
                let mut out = Vec::with_capacity(s.raw_len.min(64 << 20) as usize);
                dec.take(s.raw_len.saturating_add(1))
                    .read_to_end(&mut out)
                    .map_err(decode_err)?;
                if out.len() as u64 != s.raw_len {
                    return Err(decode_err(io::Error::other(format!(
                        "decodes to {} bytes, its record says {}",
                        out.len(),
                        s.raw_len
                    ))));
                }
                Ok(out)
            }
        }
    }

    /// Restore a memory section into `dest` (exactly the guest size, zero
    /// where the image has no pages), writing only the non-zero pages.
    pub fn memory_into(&self, name: &str, dest: &mut [u8]) -> Result<MemoryStats, SnapshotError> {
        let s = self.find(name)?;
        if s.kind != SectionKind::Memory {
            return Err(SnapshotError::Malformed {
                file: self.file.clone(),
                detail: format!("section `{name}` is not a memory image"),
            });
        }
        let stored = self.stored(s)?;
        let mem_err = |source| SnapshotError::Memory {
            file: self.file.clone(),
            section: name.into(),
            source,
        };
        match s.encoding {
            Encoding::Raw => memory::decode_into(&mut stored.as_slice(), dest).map_err(mem_err),
            Encoding::Zstd => {
                let dec =
                    zstd::stream::read::Decoder::new(stored.as_slice()).map_err(|source| {
                        SnapshotError::Decode {
                            file: self.file.clone(),
                            section: name.into(),
                            source,
                        }
                    })?;
                let mut r = dec.take(s.raw_len.min(self.max_section_bytes));
                memory::decode_into(&mut r, dest).map_err(mem_err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PROTO: u32 = 7;

    fn shape() -> Shape {
        Shape {
            backend: "kvm".into(),
            memory_bytes: 64 * 4096,
            vcpus: 2,
        }
    }

    fn sample() -> Vec<u8> {
        let mut guest = vec![0u8; 64 * 4096];
        guest[4096 * 3..4096 * 3 + 10].copy_from_slice(b"0123456789");
        guest[4096 * 40] = 0xaa;
        let mut b = SnapshotBuilder::new(PROTO, shape());
        b.add_section("vcpu", b"registers!").unwrap();
        b.add_raw_section("console", b"boot log tail").unwrap();
        b.add_memory("memory", &guest).unwrap();
        b.to_bytes()
    }

    fn open(bytes: Vec<u8>) -> Result<Snapshot, SnapshotError> {
        Snapshot::from_bytes(
            "t.snap",
            bytes,
            &Expect::protocol(PROTO).with_shape(shape()),
        )
    }

    #[test]
    fn format_version_pin() {
        // A change to the layout must bump SNAPSHOT_FORMAT_VERSION and this pin.
        assert_eq!(SNAPSHOT_FORMAT_VERSION, 1);
        let b = SnapshotBuilder::new(
            1,
            Shape {
                backend: "local".into(),
                memory_bytes: 0,
                vcpus: 0,
            },
        );
        let bytes = b.to_bytes();
        assert_eq!(bytes.len() as u64, HEADER_LEN + 2 + 5 + 8 + 4);
        assert_eq!(
            &bytes[..26],
            b"PRVMSNAP\x01\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\0\x13\0"
        );
    }

    #[test]
    fn round_trip_sections_and_memory() {
        let s = open(sample()).unwrap();
        assert_eq!(s.shape(), &shape());
        assert_eq!(s.protocol_version(), PROTO);
        assert_eq!(s.section("vcpu").unwrap(), b"registers!");
        assert_eq!(s.section("console").unwrap(), b"boot log tail");
        let mut dest = vec![0u8; 64 * 4096];
        let stats = s.memory_into("memory", &mut dest).unwrap();
        assert_eq!(&dest[4096 * 3..4096 * 3 + 10], b"0123456789");
        assert_eq!(dest[4096 * 40], 0xaa);
        assert_eq!(stats.data_bytes, 2 * 4096);
        let names: Vec<_> = s.sections().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["vcpu", "console", "memory"]);
    }

    #[test]
    fn sparse_memory_is_small_on_disk() {
        let mut guest = vec![0u8; 256 << 20];
        for i in (0..guest.len()).step_by(100 * 4096) {
            guest[i] = 1;
        }
        let mut b = SnapshotBuilder::new(PROTO, shape());
        b.add_memory("memory", &guest).unwrap();
        let bytes = b.to_bytes();
        assert!(bytes.len() < 1 << 20, "{} bytes", bytes.len());
    }

    #[test]
    fn truncation_is_named() {
        let full = sample();
        for cut in [0, 3, 8, 40, 71, 72, 100, full.len() - 1] {
            let e = open(full[..cut].to_vec()).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("truncated"), "cut at {cut}: {msg}");
        }
    }

    #[test]
    fn wrong_magic_is_named() {
        let mut b = sample();
        b[0] = b'X';
        let e = open(b).unwrap_err().to_string();
        assert_eq!(
            e,
            "t.snap is not a provium snapshot: it starts with `XRVMSNAP`, not the magic `PRVMSNAP`"
        );
        let e = open(b"\x7fELF".to_vec()).unwrap_err().to_string();
        assert!(e.contains("not a provium snapshot"), "{e}");
    }

    #[test]
    fn wrong_versions_are_named() {
        let mut b = sample();
        b[8] = 9;
        let e = open(b).unwrap_err().to_string();
        assert!(
            e.contains("format version 9; this provium reads version 1"),
            "{e}"
        );
        let e = Snapshot::from_bytes("t.snap", sample(), &Expect::protocol(PROTO + 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("protocol version 7; this provium speaks 8"),
            "{e}"
        );
    }

    #[test]
    fn checksum_mismatch_is_named() {
        let full = sample();
        // A flipped bit in the table.
        let mut b = full.clone();
        b[HEADER_LEN as usize + 1] ^= 1;
        let e = open(b).unwrap_err().to_string();
        assert!(
            e.contains("checksum mismatch in the header and section table"),
            "{e}"
        );
        // A flipped bit in the last payload: found when that section is read.
        let mut b = full.clone();
        let last = b.len() - 1;
        b[last] ^= 1;
        let s = open(b).unwrap();
        assert_eq!(s.section("vcpu").unwrap(), b"registers!");
        let mut dest = vec![0u8; 64 * 4096];
        let e = s.memory_into("memory", &mut dest).unwrap_err().to_string();
        assert!(e.contains("checksum mismatch in section `memory`"), "{e}");
    }

    #[test]
    fn verify_sections_finds_a_flipped_byte_in_any_section() {
        let full = sample();
        assert!(open(full.clone()).unwrap().verify_sections().is_ok());
        let s = open(full.clone()).unwrap();
        for section in s.sections() {
            for at in [section.offset, section.offset + section.stored_len - 1] {
                let mut b = full.clone();
                b[at as usize] ^= 0x10;
                // Open passes (the header and table are intact) ...
                let flipped = open(b).unwrap();
                // ... the whole check does not, naming the section.
                let e = flipped.verify_sections().unwrap_err().to_string();
                assert!(
                    e.contains(&format!("checksum mismatch in section `{}`", section.name)),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn shape_mismatch_is_named() {
        let other = Shape {
            memory_bytes: 128 * 4096,
            ..shape()
        };
        let e = Snapshot::from_bytes(
            "t.snap",
            sample(),
            &Expect::protocol(PROTO).with_shape(other),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("different VM shape: guest memory is 262144 bytes in the snapshot but 524288 bytes here"),
            "{e}"
        );
        let other = Shape {
            backend: "local".into(),
            ..shape()
        };
        let e = Snapshot::from_bytes(
            "t.snap",
            sample(),
            &Expect::protocol(PROTO).with_shape(other),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("the backend is kvm in the snapshot but local here"),
            "{e}"
        );
    }

    #[test]
    fn missing_section_lists_present_ones() {
        let s = open(sample()).unwrap();
        let e = s.section("devices").unwrap_err().to_string();
        assert_eq!(
            e,
            "snapshot t.snap has no `devices` section (it has: vcpu, console, memory)"
        );
    }

    #[test]
    fn builder_refuses_bad_names() {
        let mut b = SnapshotBuilder::new(PROTO, shape());
        assert!(b.add_section("Bad Name", b"").is_err());
        b.add_section("vcpu", b"").unwrap();
        let e = b.add_section("vcpu", b"").err().unwrap().to_string();
        assert!(e.contains("already has a section"), "{e}");
    }

    #[test]
    fn write_file_is_atomic_and_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.snap");
        let mut b = SnapshotBuilder::new(PROTO, shape());
        b.add_section("fs-upper", b"tree").unwrap();
        let n = b.write_file(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), n);
        let s = Snapshot::open(&path, &Expect::protocol(PROTO)).unwrap();
        assert_eq!(s.section("fs-upper").unwrap(), b"tree");
        // Nothing but the file itself is left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let e = Snapshot::open(&dir.path().join("nope"), &Expect::protocol(PROTO))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read snapshot"), "{e}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(s) = Snapshot::from_bytes("fuzz", bytes, &Expect::protocol(PROTO)) {
                for sec in s.sections().to_vec() {
                    let _ = s.section(&sec.name);
                }
            }
        }

        #[test]
        fn corrupted_snapshots_never_panic(pos in any::<prop::sample::Index>(), val in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let mut b = sample();
            let i = pos.index(b.len());
            b[i] = val;
            let keep = cut.index(b.len() + 1);
            b.truncate(keep.max(i));
            if let Ok(s) = open(b) {
                let _ = s.section("vcpu");
                let _ = s.section("console");
                let mut dest = vec![0u8; 64 * 4096];
                let _ = s.memory_into("memory", &mut dest);
            }
        }

        #[test]
        fn corrupted_headers_with_fixed_checksums_never_panic(pos in 0usize..200, val in any::<u8>()) {
            // Re-seal the header checksum after corrupting the table, so the
            // table parser sees hostile input past the checksum.
            let mut b = sample();
            let table_len = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
            let i = HEADER_LEN as usize + pos % table_len;
            b[i] = val;
            let mut sum = Sha256::new();
            sum.update(&b[..40]);
            sum.update(&b[HEADER_LEN as usize..HEADER_LEN as usize + table_len]);
            let d = sum.finalize();
            b[40..72].copy_from_slice(&d);
            if let Ok(s) = open(b) {
                for sec in s.sections().to_vec() {
                    let _ = s.section(&sec.name);
                }
                let mut dest = vec![0u8; 64 * 4096];
                let _ = s.memory_into("memory", &mut dest);
            }
        }
    }

    // The parser's pieces, each on its own.

    fn header_of(bytes: &[u8]) -> Header {
        let mut b = [0u8; HEADER_LEN as usize];
        b.copy_from_slice(&bytes[..HEADER_LEN as usize]);
        parse_header("t.snap", b, &Expect::protocol(PROTO)).expect("valid header")
    }

    #[test]
    fn check_magic_refuses_empty_foreign_and_short_files() {
        let e = check_magic("t.snap", &[], 0).unwrap_err().to_string();
        assert!(e.contains("is truncated: the file is empty"), "{e}");
        let e = check_magic("t.snap", b"NOTASNAPxx", 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("starts with `NOTASNAP`"), "{e}");
        let e = check_magic("t.snap", b"PRVM", 4).unwrap_err().to_string();
        assert!(
            e.contains("the file is 4 bytes, shorter than the 72-byte header"),
            "{e}"
        );
        check_magic("t.snap", &sample()[..HEADER_LEN as usize], HEADER_LEN).expect("a snapshot");
    }

    #[test]
    fn parse_header_reads_fields_and_refuses_other_versions() {
        let bytes = sample();
        let h = header_of(&bytes);
        assert_eq!((h.protocol_version, h.count, h.reserved), (PROTO, 3, 0));
        assert_eq!(h.file_len, bytes.len() as u64);
        let mut b = [0u8; HEADER_LEN as usize];
        b.copy_from_slice(&bytes[..HEADER_LEN as usize]);
        let e = parse_header("t.snap", b, &Expect::protocol(PROTO + 1))
            .err()
            .expect("other protocol")
            .to_string();
        assert!(
            e.contains("protocol version 7; this provium speaks 8"),
            "{e}"
        );
        b[8] = 9;
        let e = parse_header("t.snap", b, &Expect::protocol(PROTO))
            .err()
            .expect("other format")
            .to_string();
        assert!(e.contains("format version 9"), "{e}");
    }

    #[test]
    fn check_limits_holds_lengths_to_the_file_and_the_caps() {
        let bytes = sample();
        let len = bytes.len() as u64;
        let h = header_of(&bytes);
        assert_eq!(
            check_limits("t.snap", &h, len).expect("fits"),
            HEADER_LEN + h.table_len
        );
        let e = check_limits("t.snap", &h, len - 1).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = check_limits("t.snap", &h, len + 3).unwrap_err().to_string();
        assert!(e.contains("3 bytes after the end"), "{e}");
        let bad = |f: &dyn Fn(&mut Header)| {
            let mut h = header_of(&bytes);
            f(&mut h);
            check_limits("t.snap", &h, len).unwrap_err().to_string()
        };
        assert!(bad(&|h| h.reserved = 1).contains("reserved header field"));
        assert!(bad(&|h| h.count = MAX_SECTIONS + 1).contains("257 sections"));
        assert!(bad(&|h| h.table_len = MAX_TABLE_BYTES + 1).contains("at most 1048576"));
        assert!(bad(&|h| h.table_len = len).contains("runs past the end"));
    }

    #[test]
    fn verify_checksum_covers_header_and_table() {
        let bytes = sample();
        let h = header_of(&bytes);
        let table_end = (HEADER_LEN + h.table_len) as usize;
        let mut table = bytes[HEADER_LEN as usize..table_end].to_vec();
        verify_checksum("t.snap", &h, &table).expect("intact");
        table[0] ^= 1;
        let e = verify_checksum("t.snap", &h, &table)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("checksum mismatch in the header and section table"),
            "{e}"
        );
    }

    fn cursor(buf: &[u8]) -> Cursor<'_> {
        Cursor {
            buf,
            pos: 0,
            file: "t.snap",
        }
    }

    fn record(name: &str, kind: u8, encoding: u8, offset: u64, stored: u64, raw: u64) -> Vec<u8> {
        let mut t = Vec::new();
        put_str(&mut t, name);
        t.extend_from_slice(&[kind, encoding, 0, 0]);
        for v in [offset, stored, raw] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        t.extend_from_slice(&[0u8; 32]);
        t
    }

    #[test]
    fn parse_shape_reads_the_table_head() {
        let mut t = Vec::new();
        put_str(&mut t, "kvm");
        t.extend_from_slice(&(1u64 << 20).to_le_bytes());
        t.extend_from_slice(&2u32.to_le_bytes());
        let mut c = cursor(&t);
        let s = parse_shape(&mut c).expect("shape");
        assert_eq!(
            (s.backend.as_str(), s.memory_bytes, s.vcpus),
            ("kvm", 1 << 20, 2)
        );
        check_table_consumed(&c).expect("nothing left");
        let mut c = cursor(&t[..t.len() - 1]);
        let e = parse_shape(&mut c).unwrap_err().to_string();
        assert!(e.contains("ends inside the shape's vCPU count"), "{e}");
    }

    #[test]
    fn parse_section_record_checks_each_field() {
        let area = PayloadArea {
            start: 100,
            end: 200,
        };
        let parse = |t: &[u8], names: &mut BTreeSet<String>| {
            parse_section_record(&mut cursor(t), 0, names, area, 1000)
        };
        let mut names = BTreeSet::new();
        let s = parse(&record("vcpu", 0, 1, 100, 10, 50), &mut names).expect("valid");
        assert_eq!(
            (s.kind, s.encoding, s.offset, s.stored_len, s.raw_len),
            (SectionKind::Data, Encoding::Zstd, 100, 10, 50)
        );
        let err = |t: Vec<u8>| {
            parse(&t, &mut BTreeSet::new())
                .expect_err("refused")
                .to_string()
        };
        let dup = parse(&record("vcpu", 0, 0, 100, 1, 1), &mut names)
            .expect_err("duplicate")
            .to_string();
        assert!(dup.contains("two sections are named `vcpu`"), "{dup}");
        assert!(err(record("Bad!", 0, 0, 100, 1, 1)).contains("section 0 `Bad!`"));
        assert!(err(record("m", 2, 0, 100, 1, 1)).contains("unknown kind 2"));
        assert!(err(record("m", 1, 2, 100, 1, 1)).contains("unknown encoding 2"));
        assert!(
            err(record("m", 0, 0, 99, 1, 1)).contains("lies outside the payload area (100..200)")
        );
        assert!(err(record("m", 0, 0, 150, 51, 51)).contains("lies outside"));
        assert!(err(record("m", 0, 0, u64::MAX, 2, 2)).contains("lies outside"));
        assert!(err(record("m", 0, 0, 100, 4, 5)).contains("declares 5 decoded bytes but stores 4"));
        assert!(
            err(record("m", 0, 1, 100, 4, 1001)).contains("decodes to 1001 bytes (at most 1000)")
        );
        let mut reserved = record("m", 0, 0, 100, 1, 1);
        reserved[5] = 1;
        assert!(err(reserved).contains("reserved field is not zero"));
    }

    #[test]
    fn parse_sections_reads_count_records_and_leftovers_are_refused() {
        let area = PayloadArea { start: 0, end: 10 };
        let mut t = record("a", 0, 0, 0, 1, 1);
        t.extend(record("b", 1, 0, 1, 1, 1));
        let mut c = cursor(&t);
        let got = parse_sections(&mut c, 2, area, 10).expect("two records");
        assert_eq!(
            got.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        check_table_consumed(&c).expect("all read");
        let mut c = cursor(&t);
        parse_sections(&mut c, 1, area, 10).expect("one record");
        let e = check_table_consumed(&c).unwrap_err().to_string();
        assert!(e.contains(&format!("{} unused bytes", t.len() / 2)), "{e}");
    }

    #[test]
    fn check_shape_names_the_first_difference() {
        check_shape("t.snap", &shape(), &shape()).expect("same");
        let other = Shape {
            vcpus: 4,
            ..shape()
        };
        let e = check_shape("t.snap", &shape(), &other)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the vCPU count is 2 in the snapshot but 4 here"),
            "{e}"
        );
        let other = Shape {
            backend: "local".into(),
            vcpus: 4,
            ..shape()
        };
        let e = check_shape("t.snap", &shape(), &other)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the backend is kvm"), "{e}");
    }

    #[test]
    fn no_space_is_detected_once_for_both_error_types() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.snap");
        let other = io::Error::from(io::ErrorKind::PermissionDenied);
        let back = NoSpace::detect(&path, dir.path(), || unreachable!("not full"), other)
            .err()
            .expect("not a no-space error");
        assert_eq!(back.kind(), io::ErrorKind::PermissionDenied);
        let full = || {
            NoSpace::detect(
                &path,
                dir.path(),
                || 4096,
                io::Error::from_raw_os_error(libc::ENOSPC),
            )
            .expect("ENOSPC is no space")
        };
        let e = SnapshotError::from(full()).to_string();
        assert!(
            e.contains("no space left in") && e.contains("4096 needed"),
            "{e}"
        );
        let e = crate::cache::CacheError::from(full()).to_string();
        assert!(e.contains("4096 needed"), "{e}");
        let quota = NoSpace::detect(
            &path,
            dir.path(),
            || 1,
            io::Error::from_raw_os_error(libc::EDQUOT),
        );
        assert!(quota.is_ok(), "EDQUOT counts as no space");
    }

    #[test]
    fn check_name_says_what_a_section_name_may_be() {
        check_name("fs-upper.0_a").expect("valid");
        assert_eq!(check_name(""), Err(SectionNameError::Length));
        assert_eq!(check_name(&"a".repeat(33)), Err(SectionNameError::Length));
        assert_eq!(check_name("Vcpu"), Err(SectionNameError::Characters));
        assert_eq!(
            SectionNameError::Length.to_string(),
            "a section name has 1 to 32 characters"
        );
    }
}
