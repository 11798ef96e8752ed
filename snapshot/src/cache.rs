//! The fixture cache directory.
//!
//! ```text
//! <cache_dir>/
//!   <key>.snap        single-VM fixture (a snapshot file: sparse, zstd)
//!   <key>.lock        its build lock
//!   <key>.lab/        lab fixture: lab.json + one .snap per VM
//!   <key>.lab.lock
//! ```
//!
//! `<key>` is the 64-digit hex SHA-256 the harness computes with
//! [`KeyBuilder`] over the fixture's inputs.
//!
//! - Build locks are `flock(2)` locks on the `.lock` file, so a crashed
//!   holder's lock is released by the kernel; the holder writes its name
//!   into the file so a waiter can say whom it waits for. Lock files are
//!   never deleted while the cache is in use (deleting a lock file someone
//!   waits on would let two builders in); only [`FixtureCache::clean`] does.
//! - Install is atomic: an entry is written under a temporary name in the
//!   cache directory and renamed into place (for lab directories
//!   `renameat2(RENAME_NOREPLACE)`, then `RENAME_EXCHANGE` over an existing
//!   one, with a sibling-rename fallback where the kernel lacks renameat2).
//!   A reader sees the old entry or the new one, never half of one.
//! - Restores bump an entry's atime explicitly ([`FixtureCache::touch`]):
//!   under relatime, reads alone would not keep popular entries young.
//! - [`FixtureCache::evict_lru`] deletes oldest-atime entries until the
//!   entries' total size is at most the limit.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::install::NoSpace;
use crate::lab_index::LAB_INDEX_FILE;

/// A fixture cache key: SHA-256 over the fixture's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// 64 lowercase hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parse 64 hex digits.
    pub fn from_hex(s: &str) -> Option<CacheKey> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(CacheKey(k))
    }
}

impl std::fmt::Display for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

/// Builds a [`CacheKey`] from tagged, length-prefixed fields, so no two
/// different field sequences hash the same bytes (`"ab" + "c"` is not
/// `"a" + "bc"`).
pub struct KeyBuilder(Sha256);

impl KeyBuilder {
    /// A key in `domain` (e.g. `provium-fixture-v1`); change the domain when
    /// the meaning of the fields changes.
    pub fn new(domain: &str) -> KeyBuilder {
        let mut k = KeyBuilder(Sha256::new());
        k.field("domain", domain.as_bytes());
        k
    }

    /// Fold in one field.
    pub fn field(&mut self, tag: &str, value: &[u8]) -> &mut Self {
        self.0.update((tag.len() as u64).to_le_bytes());
        self.0.update(tag.as_bytes());
        self.0.update((value.len() as u64).to_le_bytes());
        self.0.update(value);
        self
    }

    /// The key.
    pub fn finish(self) -> CacheKey {
        CacheKey(self.0.finalize().into())
    }
}

/// The two entry shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKind {
    /// `<key>.snap`, one snapshot file.
    Vm,
    /// `<key>.lab/`, a directory with `lab.json`.
    Lab,
}

impl EntryKind {
    /// `vm` or `lab`, as `provium fixture list` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Vm => "vm",
            EntryKind::Lab => "lab",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            EntryKind::Vm => ".snap",
            EntryKind::Lab => ".lab",
        }
    }
}

/// One cached entry, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// Its key.
    pub key: CacheKey,
    /// Vm or lab.
    pub kind: EntryKind,
    /// Its path.
    pub path: PathBuf,
    /// Total bytes of its files.
    pub size_bytes: u64,
    /// Last access (what LRU sorts by).
    pub atime: SystemTime,
}

/// What the cache store can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A filesystem operation on the cache failed.
    #[error("fixture cache: cannot {action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The cache's file system is full: the entry was not installed and
    /// nothing partial of it is left.
    #[error(
        "fixture cache: cannot install {path}: no space left in {dir} ({free_bytes} bytes free, \
         {needed_bytes} needed; free space there, lower the cache size limit, or point cache_dir \
         at a larger file system, then run again)"
    )]
    NoSpace {
        /// What was being installed.
        path: PathBuf,
        /// The cache directory.
        dir: PathBuf,
        /// Space left there for an unprivileged writer, in bytes.
        free_bytes: u64,
        /// What the entry needs, in bytes.
        needed_bytes: u64,
        /// The I/O error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// A snapshot of an entry fails its whole check (cut, a flipped byte
    /// in the header, table or any section, the memory section included).
    #[error("fixture cache: entry {entry} is corrupt (evict it and build it again: `provium fixture rebuild`, or delete it)")]
    CorruptSnapshot {
        /// The entry (a `.snap`, or a `.lab` directory).
        entry: PathBuf,
        /// What the snapshot check found (boxed: it is large, and this
        /// enum is every cache call's error).
        #[source]
        source: Box<crate::format::SnapshotError>,
    },
    /// An entry's restore image is not its snapshot's (cut, grown, or a
    /// damaged header): a cache entry's image is only ever installed whole.
    #[error("fixture cache: entry {entry} is corrupt: its restore image {image} does not match its snapshot (cut, grown or damaged; evict the entry and build it again)")]
    CorruptImage {
        /// The entry.
        entry: PathBuf,
        /// The image.
        image: PathBuf,
    },
    /// A lab entry's index does not read.
    #[error("fixture cache: lab entry {entry} is corrupt (evict it and build it again: `provium fixture rebuild`, or delete it)")]
    CorruptLabIndex {
        /// The `.lab` directory.
        entry: PathBuf,
        /// Why its index does not read (boxed, as above).
        #[source]
        source: Box<crate::lab_index::LabIndexError>,
    },
    /// What was handed to install is not a valid entry.
    #[error("fixture cache: refusing to install {path}: {detail}")]
    InvalidEntry {
        /// The source path.
        path: PathBuf,
        /// Why.
        detail: String,
    },
}

impl From<NoSpace> for CacheError {
    fn from(n: NoSpace) -> CacheError {
        CacheError::NoSpace {
            path: n.path,
            dir: n.dir,
            free_bytes: n.free_bytes,
            needed_bytes: n.needed_bytes,
            source: n.source,
        }
    }
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CacheError {
    let path = path.to_path_buf();
    move |source| CacheError::Io {
        action,
        path,
        source,
    }
}

/// The outcome of [`FixtureCache::try_lock`].
pub enum LockAttempt {
    /// We hold the lock until the guard drops.
    Acquired(BuildLock),
    /// Someone else does; `held_by` is what they wrote (may be empty for a
    /// holder that has not written yet).
    Busy {
        /// The holder's self-description (a test file path).
        held_by: String,
    },
}

/// A held build lock; released on drop (or by the kernel if we die).
#[derive(Debug)]
pub struct BuildLock {
    _file: File,
    path: PathBuf,
}

impl BuildLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The cache directory.
#[derive(Debug, Clone)]
pub struct FixtureCache {
    dir: PathBuf,
}

impl FixtureCache {
    /// Use (and create if needed) `dir`.
    pub fn open(dir: &Path) -> Result<FixtureCache, CacheError> {
        fs::create_dir_all(dir).map_err(io_err("create the cache directory", dir))?;
        Ok(FixtureCache {
            dir: dir.to_path_buf(),
        })
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry for `key` lives (whether or not it exists).
    pub fn entry_path(&self, key: &CacheKey, kind: EntryKind) -> PathBuf {
        self.dir.join(format!("{}{}", key.hex(), kind.suffix()))
    }

    /// The entry's build lock file.
    pub fn lock_path(&self, key: &CacheKey, kind: EntryKind) -> PathBuf {
        self.dir.join(format!(
            "{}{}.lock",
            key.hex(),
            kind.suffix().trim_end_matches(".snap")
        ))
    }

    /// The entry's path if it is installed.
    pub fn lookup(&self, key: &CacheKey, kind: EntryKind) -> Option<PathBuf> {
        let p = self.entry_path(key, kind);
        let ok = match kind {
            EntryKind::Vm => p.is_file(),
            EntryKind::Lab => p.is_dir(),
        };
        ok.then_some(p)
    }

    /// Try to take the build lock for `key` without waiting; on success,
    /// record `holder` in the lock file.
    pub fn try_lock(
        &self,
        key: &CacheKey,
        kind: EntryKind,
        holder: &str,
    ) -> Result<LockAttempt, CacheError> {
        let path = self.lock_path(key, kind);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err("open the build lock", &path))?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut held_by = String::new();
                let _ = file.read_to_string(&mut held_by);
                return Ok(LockAttempt::Busy {
                    held_by: held_by.trim().to_string(),
                });
            }
            return Err(io_err("lock", &path)(e));
        }
        let write = (|| {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(holder.as_bytes())
        })();
        write.map_err(io_err("write the build lock", &path))?;
        Ok(LockAttempt::Acquired(BuildLock { _file: file, path }))
    }

    /// Bump the entry's atime to now (mtime unchanged), so LRU sees the use.
    pub fn touch(&self, path: &Path) -> Result<(), CacheError> {
        set_atime(path, None).map_err(io_err("update the access time of", path))
    }

    /// Install the snapshot file `src` as the entry for `key` (copy into the
    /// cache under a temporary name, fsync, rename). Returns the entry's path.
    pub fn install_vm(&self, key: &CacheKey, src: &Path) -> Result<PathBuf, CacheError> {
        let dst = self.entry_path(key, EntryKind::Vm);
        let tmp = crate::install::temp_sibling(&dst);
        let r = (|| {
            fs::copy(src, &tmp)?;
            File::open(&tmp)?.sync_all()?;
            fs::rename(&tmp, &dst)
        })();
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r.map_err(|e| self.install_error(src, e))?;
        // The snapshot's restore image, written with it, comes along (linked,
        // or copied without filling its holes), so the entry's first restore
        // does not build it. A replaced entry's image was the old snapshot's:
        // it goes whether or not a new one comes (a whole-entry check would
        // call it corrupt). Running VMs hold their own copy of it.
        let dst_image = crate::image::image_path(&dst);
        let _ = fs::remove_file(&dst_image);
        if crate::image::has_matching_image(src) {
            // Best effort: without it the first restore builds the image.
            let _ = carry_image(&crate::image::image_path(src), &dst_image);
        }
        Ok(dst)
    }

    /// Install the lab snapshot directory `src` (flat: `lab.json` and
    /// snapshot files) as the entry for `key`, atomically replacing any
    /// existing one. Returns the entry's path.
    pub fn install_lab(&self, key: &CacheKey, src: &Path) -> Result<PathBuf, CacheError> {
        if !src.join(LAB_INDEX_FILE).is_file() {
            return Err(CacheError::InvalidEntry {
                path: src.to_path_buf(),
                detail: format!("it has no {LAB_INDEX_FILE}"),
            });
        }
        let dst = self.entry_path(key, EntryKind::Lab);
        let tmp = crate::install::temp_sibling(&dst);
        let r = copy_flat_dir(src, &tmp);
        if let Err(e) = r {
            let _ = fs::remove_dir_all(&tmp);
            return Err(match e {
                CacheError::Io { source, .. } if crate::install::is_no_space(&source) => {
                    self.install_error(src, source)
                }
                e => e,
            });
        }
        let swapped = rename_exchange_or_replace(&tmp, &dst);
        let _ = fs::remove_dir_all(&tmp);
        swapped.map_err(io_err("install", src))?;
        Ok(dst)
    }

    /// The error for a failed install of `src`: [`CacheError::NoSpace`]
    /// when the cache's file system is full.
    fn install_error(&self, src: &Path, source: io::Error) -> CacheError {
        let needed_bytes = || match fs::metadata(src) {
            Ok(m) if m.is_dir() => dir_size(src),
            Ok(m) => m.len(),
            Err(_) => 0,
        };
        match NoSpace::detect(src, &self.dir, needed_bytes, source) {
            Ok(full) => full.into(),
            Err(source) => io_err("install", src)(source),
        }
    }

    /// Checks the whole entry at `path` (as [`FixtureCache::lookup`]
    /// returned it): each snapshot opened for `protocol_version` with every
    /// section's checksum verified, the memory section's included; beside
    /// each snapshot with a memory section, the restore image, if there is
    /// one, matching it (length and header; its data pages are hashed by
    /// the restore that copies them); for a lab, its index read and every
    /// snapshot it lists checked.
    ///
    /// Why: opening a snapshot checks only its header and table, and a
    /// restore from a valid image never reads the memory section, so a
    /// flipped byte there would go unnoticed until the image is next
    /// rebuilt. Cost: one read of the entry's snapshot files (compressed;
    /// the images are not read); the harness does it once per entry per run.
    pub fn verify_entry(
        &self,
        path: &Path,
        kind: EntryKind,
        protocol_version: u32,
    ) -> Result<(), CacheError> {
        match kind {
            EntryKind::Vm => verify_snapshot(path, path, protocol_version),
            EntryKind::Lab => {
                let index = crate::lab_index::LabIndex::read(path).map_err(|source| {
                    CacheError::CorruptLabIndex {
                        entry: path.to_path_buf(),
                        source: Box::new(source),
                    }
                })?;
                for vm in &index.vms {
                    verify_snapshot(path, &path.join(&vm.file), protocol_version)?;
                }
                Ok(())
            }
        }
    }

    /// Remove the entry for `key` (absent is fine).
    pub fn evict(&self, key: &CacheKey, kind: EntryKind) -> Result<(), CacheError> {
        remove_entry(&self.entry_path(key, kind))
    }

    /// Every entry, sorted by key.
    pub fn list(&self) -> Result<Vec<CacheEntry>, CacheError> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("read the cache directory", &self.dir)(e)),
        };
        let mut out = Vec::new();
        for ent in rd.flatten() {
            let name = ent.file_name();
            let name = String::from_utf8_lossy(name.as_bytes()).into_owned();
            let (stem, kind) = if let Some(s) = name.strip_suffix(".snap") {
                (s, EntryKind::Vm)
            } else if let Some(s) = name.strip_suffix(".lab") {
                (s, EntryKind::Lab)
            } else {
                continue;
            };
            let Some(key) = CacheKey::from_hex(stem) else {
                continue;
            };
            let path = ent.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let size_bytes = match kind {
                EntryKind::Vm => meta.len(),
                EntryKind::Lab => dir_size(&path),
            };
            let atime = UNIX_EPOCH
                + Duration::new(
                    u64::try_from(meta.atime()).unwrap_or(0),
                    u32::try_from(meta.atime_nsec()).unwrap_or(0),
                );
            out.push(CacheEntry {
                key,
                kind,
                path,
                size_bytes,
                atime,
            });
        }
        out.sort_by_key(|e| (e.key, e.kind));
        Ok(out)
    }

    /// Delete least-recently-accessed entries until the entries total at
    /// most `max_bytes`. Returns what was evicted, oldest first. Also
    /// removes temporary files left by dead writers.
    pub fn evict_lru(&self, max_bytes: u64) -> Result<Vec<CacheEntry>, CacheError> {
        self.remove_stale_temps();
        let mut entries = self.list()?;
        let mut total: u64 = entries.iter().map(|e| e.size_bytes).sum();
        entries.sort_by_key(|e| (e.atime, e.key));
        let mut evicted = Vec::new();
        for e in entries {
            if total <= max_bytes {
                break;
            }
            remove_entry(&e.path)?;
            total = total.saturating_sub(e.size_bytes);
            evicted.push(e);
        }
        Ok(evicted)
    }

    /// Temporary names record their writer's pid and host
    /// (`.<name>.tmp-<pid>-<random>@<host>`): remove those of this host whose
    /// writer is gone. Another host's are left alone (its pids mean nothing
    /// here, and deleting a live writer's temporary would fail its install)
    /// unless a day old. Best effort.
    fn remove_stale_temps(&self) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        let here = crate::install::host_name();
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            let Some((pid, host)) = crate::install::temp_owner(&name) else {
                continue;
            };
            let gone = match host {
                Some(h) if h != here => fs::symlink_metadata(ent.path())
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > Duration::from_secs(24 * 3600)),
                _ => !Path::new(&format!("/proc/{pid}")).exists(),
            };
            if gone {
                let _ = remove_entry(&ent.path());
            }
        }
    }

    /// Remove the whole cache directory (entries, locks, temporaries).
    pub fn clean(&self) -> Result<(), CacheError> {
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", &self.dir)(e)),
        }
    }
}

/// [`FixtureCache::verify_entry`] for one snapshot file `snap` of `entry`.
fn verify_snapshot(entry: &Path, snap: &Path, protocol_version: u32) -> Result<(), CacheError> {
    use crate::format::{Expect, SectionKind, Snapshot};
    use crate::image::{image_path, ImageState};
    let corrupt = |source| CacheError::CorruptSnapshot {
        entry: entry.to_path_buf(),
        source: Box::new(source),
    };
    let s = Snapshot::open(snap, &Expect::protocol(protocol_version)).map_err(corrupt)?;
    s.verify_sections().map_err(corrupt)?;
    // The image is built from the (one) memory section.
    let memory = s.sections().iter().find(|x| x.kind == SectionKind::Memory);
    if let Some(memory) = memory {
        let image = image_path(snap);
        if s.image_state(&memory.name, &image) == ImageState::Mismatch {
            return Err(CacheError::CorruptImage {
                entry: entry.to_path_buf(),
                image,
            });
        }
    }
    Ok(())
}

fn remove_entry(path: &Path) -> Result<(), CacheError> {
    // A single-VM entry's restore image (`<key>.snap.img`) is derived from
    // it and goes with it.
    if path.extension().is_some_and(|e| e == "snap") {
        let _ = fs::remove_file(crate::image::image_path(path));
    }
    let r = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", path)(e)),
    }
}

/// The bytes of the files under `path`, restore images left out: they are
/// derived data (as a VM entry's size is its `.snap` alone), and their
/// length is the guest's size however few of their blocks hold data.
fn dir_size(path: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(path) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(_) if crate::image::is_snapshot_image_name(&e.path()) => 0,
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Places the restore image `src` at `dst` atomically, holes kept.
fn carry_image(src: &Path, dst: &Path) -> io::Result<()> {
    let tmp = crate::install::temp_sibling(dst);
    crate::install::link_or_copy_sparse(src, &tmp)?;
    fs::rename(&tmp, dst).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

fn copy_flat_dir(src: &Path, dst: &Path) -> Result<(), CacheError> {
    fs::create_dir(dst).map_err(io_err("create", dst))?;
    for ent in fs::read_dir(src).map_err(io_err("read", src))? {
        let ent = ent.map_err(io_err("read", src))?;
        let ty = ent.file_type().map_err(io_err("read", &ent.path()))?;
        if !ty.is_file() {
            return Err(CacheError::InvalidEntry {
                path: ent.path(),
                detail: "a lab snapshot directory holds plain files only".into(),
            });
        }
        let to = dst.join(ent.file_name());
        if crate::image::is_snapshot_image_name(&ent.path()) {
            // A VM's restore image, written with its snapshot: kept sparse
            // (fs::copy would fill its holes), and derived data, so one that
            // is stale or cannot be placed is left for the first restore to
            // build.
            if crate::image::has_matching_image(&ent.path().with_extension("")) {
                let _ = crate::install::link_or_copy_sparse(&ent.path(), &to);
            }
            continue;
        }
        fs::copy(ent.path(), &to).map_err(io_err("copy", &ent.path()))?;
        File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(io_err("sync", &to))?;
    }
    File::open(dst)
        .and_then(|f| f.sync_all())
        .map_err(io_err("sync", dst))
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let from = std::ffi::CString::new(from.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let to = std::ffi::CString::new(to.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: two NUL-terminated paths relative to the cwd.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Move directory `new` to `dst`. If `dst` exists, swap them atomically
/// (the old entry ends up at `new`, for the caller to delete); without
/// renameat2, fall back to moving the old one aside first.
fn rename_exchange_or_replace(new: &Path, dst: &Path) -> io::Result<()> {
    match renameat2(new, dst, libc::RENAME_NOREPLACE) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
            return replace_by_sibling_rename(new, dst)
        }
        Err(e) => return Err(e),
    }
    match renameat2(new, dst, libc::RENAME_EXCHANGE) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
            replace_by_sibling_rename(new, dst)
        }
        Err(e) => Err(e),
    }
}

fn replace_by_sibling_rename(new: &Path, dst: &Path) -> io::Result<()> {
    let old = crate::install::temp_sibling(dst);
    match fs::rename(dst, &old) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let r = move_in_or_keep_peer(new, dst);
    let _ = fs::remove_dir_all(&old);
    r
}

/// Rename the directory `new` to `dst`. If another writer (on another host:
/// the sibling-rename path is taken where the filesystem lacks renameat2,
/// e.g. NFS) installed the same key in the meantime, `dst` is a non-empty
/// directory and the rename fails; its entry is as good as ours, so keep it.
fn move_in_or_keep_peer(new: &Path, dst: &Path) -> io::Result<()> {
    match fs::rename(new, dst) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) => Ok(()),
        r => r,
    }
}

/// Set `path`'s atime (None: now), leaving mtime alone.
pub fn set_atime(path: &Path, at: Option<SystemTime>) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let atime = match at {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(t) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            libc::timespec {
                tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(d.subsec_nanos()),
            }
        }
    };
    let times = [
        atime,
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: a NUL-terminated path and a two-element timespec array.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CacheKey {
        let mut b = KeyBuilder::new("test");
        b.field("n", &[n]);
        b.finish()
    }

    #[test]
    fn keys_are_deterministic_and_fields_are_separated() {
        assert_eq!(key(1), key(1));
        assert_ne!(key(1), key(2));
        let mut a = KeyBuilder::new("d");
        a.field("x", b"ab").field("y", b"c");
        let mut b = KeyBuilder::new("d");
        b.field("x", b"a").field("y", b"bc");
        assert_ne!(a.finish(), b.finish());
        let k = key(3);
        assert_eq!(CacheKey::from_hex(&k.hex()), Some(k));
        assert_eq!(k.hex().len(), 64);
        assert_eq!(CacheKey::from_hex("zz"), None);
    }

    #[test]
    fn paths_follow_the_reference_layout() {
        let c = FixtureCache { dir: "/c".into() };
        let k = key(1);
        let h = k.hex();
        assert_eq!(
            c.entry_path(&k, EntryKind::Vm),
            PathBuf::from(format!("/c/{h}.snap"))
        );
        assert_eq!(
            c.lock_path(&k, EntryKind::Vm),
            PathBuf::from(format!("/c/{h}.lock"))
        );
        assert_eq!(
            c.entry_path(&k, EntryKind::Lab),
            PathBuf::from(format!("/c/{h}.lab"))
        );
        assert_eq!(
            c.lock_path(&k, EntryKind::Lab),
            PathBuf::from(format!("/c/{h}.lab.lock"))
        );
    }

    #[test]
    fn lock_excludes_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(dir.path()).unwrap();
        let k = key(1);
        let LockAttempt::Acquired(held) =
            c.try_lock(&k, EntryKind::Vm, "tests/a.test.lua").unwrap()
        else {
            panic!("first lock must succeed");
        };
        match c.try_lock(&k, EntryKind::Vm, "tests/b.test.lua").unwrap() {
            LockAttempt::Busy { held_by } => assert_eq!(held_by, "tests/a.test.lua"),
            LockAttempt::Acquired(_) => panic!("second lock must wait"),
        }
        // Another key is independent.
        assert!(matches!(
            c.try_lock(&key(2), EntryKind::Vm, "x").unwrap(),
            LockAttempt::Acquired(_)
        ));
        drop(held);
        assert!(matches!(
            c.try_lock(&k, EntryKind::Vm, "tests/b.test.lua").unwrap(),
            LockAttempt::Acquired(_)
        ));
    }

    #[test]
    fn a_killed_holders_lock_is_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(dir.path()).unwrap();
        let k = key(1);
        let lock = c.lock_path(&k, EntryKind::Vm);
        // A separate process holds the lock, then dies by SIGKILL.
        // -F: flock(1) execs `sleep` itself, so one process holds the lock.
        let mut child = match std::process::Command::new("flock")
            .arg("-F")
            .arg(&lock)
            .args(["sleep", "60"])
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "skipped: flock(1) is not available to hold a lock from another process: {e}"
                );
                return;
            }
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match c.try_lock(&k, EntryKind::Vm, "me").unwrap() {
                LockAttempt::Busy { .. } => break,
                LockAttempt::Acquired(l) => {
                    drop(l);
                    assert!(
                        std::time::Instant::now() < deadline,
                        "flock(1) never took the lock"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match c.try_lock(&k, EntryKind::Vm, "me").unwrap() {
                LockAttempt::Acquired(_) => break,
                LockAttempt::Busy { .. } => {
                    if std::time::Instant::now() > deadline {
                        panic!("the dead holder's lock was never released");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    #[test]
    fn install_vm_is_atomic_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(&dir.path().join("cache")).unwrap();
        let k = key(1);
        assert_eq!(c.lookup(&k, EntryKind::Vm), None);
        let src = dir.path().join("x.snap");
        fs::write(&src, b"one").unwrap();
        let p = c.install_vm(&k, &src).unwrap();
        assert_eq!(c.lookup(&k, EntryKind::Vm), Some(p.clone()));
        fs::write(&src, b"two!").unwrap();
        c.install_vm(&k, &src).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two!");
        // Only the entry is in the cache: no temporaries left.
        let names: Vec<_> = fs::read_dir(c.dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let listed = c.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].kind, listed[0].size_bytes), (EntryKind::Vm, 4));
    }

    #[test]
    fn install_lab_exchanges_directories() {
        let dir = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(&dir.path().join("cache")).unwrap();
        let k = key(1);
        let src = dir.path().join("lab");
        fs::create_dir(&src).unwrap();
        let e = c.install_lab(&k, &src).unwrap_err().to_string();
        assert!(e.contains("no lab.json"), "{e}");
        fs::write(src.join(LAB_INDEX_FILE), b"{}").unwrap();
        fs::write(src.join("a.snap"), b"aaaa").unwrap();
        let p = c.install_lab(&k, &src).unwrap();
        assert_eq!(fs::read(p.join("a.snap")).unwrap(), b"aaaa");
        fs::remove_file(src.join("a.snap")).unwrap();
        fs::write(src.join("b.snap"), b"bb").unwrap();
        c.install_lab(&k, &src).unwrap();
        assert!(!p.join("a.snap").exists());
        assert_eq!(fs::read(p.join("b.snap")).unwrap(), b"bb");
        let listed = c.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].kind, listed[0].size_bytes), (EntryKind::Lab, 4));
        let names: Vec<_> = fs::read_dir(c.dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn sibling_rename_fallback_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new");
        let dst = dir.path().join("dst");
        fs::create_dir(&new).unwrap();
        fs::write(new.join("f"), b"new").unwrap();
        fs::create_dir(&dst).unwrap();
        fs::write(dst.join("f"), b"old").unwrap();
        replace_by_sibling_rename(&new, &dst).unwrap();
        assert_eq!(fs::read(dst.join("f")).unwrap(), b"new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn lru_evicts_oldest_atime_first_until_under_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(dir.path()).unwrap();
        let src = dir.path().join("src");
        fs::write(&src, vec![0u8; 100]).unwrap();
        let base = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        // Keys 1..=4 installed; atimes make the LRU order 3, 1, 4, 2.
        for (n, age) in [(1u8, 2u64), (2, 4), (3, 1), (4, 3)] {
            let p = c.install_vm(&key(n), &src).unwrap();
            set_atime(&p, Some(base + Duration::from_secs(age))).unwrap();
        }
        fs::remove_file(&src).unwrap();
        let evicted = c.evict_lru(250).unwrap();
        let order: Vec<_> = evicted.iter().map(|e| e.key).collect();
        assert_eq!(order, vec![key(3), key(1)]);
        let left: Vec<_> = c.list().unwrap().iter().map(|e| e.key).collect();
        let mut want = vec![key(2), key(4)];
        want.sort();
        assert_eq!(left, want);
        // A touch makes an entry the youngest.
        c.touch(&c.entry_path(&key(4), EntryKind::Vm)).unwrap();
        let evicted = c.evict_lru(100).unwrap();
        assert_eq!(
            evicted.iter().map(|e| e.key).collect::<Vec<_>>(),
            vec![key(2)]
        );
        assert!(c.evict_lru(1 << 30).unwrap().is_empty());
    }

    #[test]
    fn stale_temporaries_are_removed_and_clean_wipes() {
        let dir = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(&dir.path().join("cache")).unwrap();
        let stale = c.dir().join(".x.snap.tmp-999999999-1");
        fs::write(&stale, b"half").unwrap();
        let live = c
            .dir()
            .join(format!(".y.snap.tmp-{}-1", std::process::id()));
        fs::write(&live, b"half").unwrap();
        let here = crate::install::host_name();
        let stale_here = c.dir().join(format!(".z.snap.tmp-999999999-ab@{here}"));
        fs::write(&stale_here, b"half").unwrap();
        // Another host's writer: pid 999999999 means nothing here, so it stays.
        let other_host = c.dir().join(".w.snap.tmp-999999999-ab@other-host.example");
        fs::write(&other_host, b"half").unwrap();
        let fresh = crate::install::temp_sibling(&c.dir().join("k.snap"));
        let fresh_name = fresh.file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(
            crate::install::temp_owner(&fresh_name),
            Some((std::process::id(), Some(here.as_str())))
        );
        c.evict_lru(0).unwrap();
        assert!(!stale.exists());
        assert!(!stale_here.exists());
        assert!(
            other_host.exists(),
            "another host's temporary is not ours to judge"
        );
        assert!(live.exists());
        c.clean().unwrap();
        assert!(!c.dir().exists());
        c.clean().unwrap();
    }

    #[test]
    fn losing_the_sibling_rename_race_keeps_the_peers_entry() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, dst) = (dir.path().join("ours"), dir.path().join("k.lab"));
        for (d, who) in [(&ours, "ours"), (&dst, "peer")] {
            fs::create_dir(d).unwrap();
            fs::write(d.join(LAB_INDEX_FILE), who).unwrap();
        }
        move_in_or_keep_peer(&ours, &dst).unwrap();
        assert_eq!(
            fs::read_to_string(dst.join(LAB_INDEX_FILE)).unwrap(),
            "peer"
        );
        // With no peer, ours moves in.
        fs::remove_dir_all(&dst).unwrap();
        move_in_or_keep_peer(&ours, &dst).unwrap();
        assert_eq!(
            fs::read_to_string(dst.join(LAB_INDEX_FILE)).unwrap(),
            "ours"
        );
    }

    /// A kvm-shaped snapshot with a memory section (one data page) and
    /// its restore image, installed as the entry for `k`.
    fn vm_entry_with_image(c: &FixtureCache, k: CacheKey) -> PathBuf {
        use crate::format::{Expect, Shape, Snapshot, SnapshotBuilder};
        let mut guest = vec![0u8; 64 * 4096];
        guest[4096 * 3..4096 * 4].fill(0x5a);
        let shape = Shape {
            backend: "kvm".into(),
            memory_bytes: guest.len() as u64,
            vcpus: 1,
        };
        let mut b = SnapshotBuilder::new(7, shape);
        b.add_section("vm", b"device state").unwrap();
        b.add_memory("memory", &guest).unwrap();
        let src = c.dir().join("src.snap");
        b.write_file(&src).unwrap();
        let entry = c.install_vm(&k, &src).unwrap();
        let s = Snapshot::open(&entry, &Expect::protocol(7)).unwrap();
        s.restore_image("memory", &crate::image::image_path(&entry))
            .unwrap();
        entry
    }

    #[test]
    fn verify_entry_finds_a_flipped_byte_in_the_memory_section_behind_a_valid_image() {
        use crate::format::{Expect, SectionKind, Snapshot};
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(d.path()).unwrap();
        let entry = vm_entry_with_image(&c, key(1));
        c.verify_entry(&entry, EntryKind::Vm, 7).unwrap();
        let s = Snapshot::open(&entry, &Expect::protocol(7)).unwrap();
        let memory = s
            .sections()
            .iter()
            .find(|x| x.kind == SectionKind::Memory)
            .unwrap()
            .clone();
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&entry)
            .unwrap();
        let at = memory.offset + memory.stored_len / 2;
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, at).unwrap();
        f.write_all_at(&[byte[0] ^ 1], at).unwrap();
        // The restore path would not notice: the image still matches.
        let s = Snapshot::open(&entry, &Expect::protocol(7)).unwrap();
        assert_eq!(
            s.image_state("memory", &crate::image::image_path(&entry)),
            crate::image::ImageState::Matches
        );
        let e = c.verify_entry(&entry, EntryKind::Vm, 7).unwrap_err();
        assert!(matches!(e, CacheError::CorruptSnapshot { .. }), "{e}");
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains(&entry.display().to_string()), "{chain}");
        assert!(
            chain.contains("checksum mismatch in section `memory`"),
            "{chain}"
        );
    }

    #[test]
    fn verify_entry_finds_a_cut_snapshot_a_cut_image_and_a_bad_protocol() {
        let d = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(d.path()).unwrap();
        let entry = vm_entry_with_image(&c, key(2));
        let e = c.verify_entry(&entry, EntryKind::Vm, 8).unwrap_err();
        assert!(matches!(e, CacheError::CorruptSnapshot { .. }), "{e}");
        let image = crate::image::image_path(&entry);
        let f = OpenOptions::new().write(true).open(&image).unwrap();
        f.set_len(4096 * 2).unwrap();
        let e = c.verify_entry(&entry, EntryKind::Vm, 7).unwrap_err();
        assert!(
            matches!(&e, CacheError::CorruptImage { image: i, .. } if *i == image),
            "{e}"
        );
        // No image at all is fine: the next restore builds it.
        fs::remove_file(&image).unwrap();
        c.verify_entry(&entry, EntryKind::Vm, 7).unwrap();
        let len = fs::metadata(&entry).unwrap().len();
        let f = OpenOptions::new().write(true).open(&entry).unwrap();
        f.set_len(len - 10).unwrap();
        let e = c.verify_entry(&entry, EntryKind::Vm, 7).unwrap_err();
        assert!(matches!(e, CacheError::CorruptSnapshot { .. }), "{e}");
    }

    #[test]
    fn verify_entry_checks_a_labs_index_and_every_snapshot_it_lists() {
        use crate::format::{Shape, SnapshotBuilder};
        use crate::lab_index::{LabIndex, LabVm};
        let d = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(d.path().join("cache").as_path()).unwrap();
        let src = d.path().join("lab-src");
        fs::create_dir_all(&src).unwrap();
        let mut index = LabIndex::new("root");
        for name in ["a", "b"] {
            let shape = Shape {
                backend: "local".into(),
                memory_bytes: 0,
                vcpus: 1,
            };
            let mut b = SnapshotBuilder::new(7, shape);
            b.add_section("upper", name.as_bytes()).unwrap();
            b.write_file(&src.join(format!("{name}.snap"))).unwrap();
            index.vms.push(LabVm {
                lab_path: Vec::new(),
                name: name.into(),
                profile: "p".into(),
                memory_bytes: 0,
                cpus: 1,
                file: format!("{name}.snap"),
            });
        }
        index.write(&src).unwrap();
        let entry = c.install_lab(&key(3), &src).unwrap();
        c.verify_entry(&entry, EntryKind::Lab, 7).unwrap();
        // A flipped byte in b's section.
        let b_snap = entry.join("b.snap");
        let mut bytes = fs::read(&b_snap).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        fs::write(&b_snap, &bytes).unwrap();
        let e = c.verify_entry(&entry, EntryKind::Lab, 7).unwrap_err();
        assert!(matches!(e, CacheError::CorruptSnapshot { .. }), "{e}");
        bytes[n - 1] ^= 0xff;
        fs::write(&b_snap, &bytes).unwrap();
        c.verify_entry(&entry, EntryKind::Lab, 7).unwrap();
        // A cut index.
        let idx = entry.join(LAB_INDEX_FILE);
        let text = fs::read(&idx).unwrap();
        fs::write(&idx, &text[..text.len() / 2]).unwrap();
        let e = c.verify_entry(&entry, EntryKind::Lab, 7).unwrap_err();
        assert!(matches!(e, CacheError::CorruptLabIndex { .. }), "{e}");
    }

    #[test]
    fn reinstalling_an_entry_drops_the_old_snapshots_image() {
        let d = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(d.path()).unwrap();
        let entry = vm_entry_with_image(&c, key(4));
        let image = crate::image::image_path(&entry);
        assert!(image.exists());
        let src = d.path().join("other.snap");
        fs::copy(&entry, &src).unwrap();
        c.install_vm(&key(4), &src).unwrap();
        assert!(!image.exists(), "the old image went with the old entry");
    }

    /// A snapshot of a 64 MiB guest with two data pages at `dir/name`,
    /// with its restore image beside it, as `Vm::snapshot` writes them.
    fn snapshot_with_its_image(dir: &Path, name: &str) -> PathBuf {
        use crate::format::{Shape, SnapshotBuilder};
        use crate::memory::DataPages;
        let mut guest = vec![0u8; 64 << 20];
        guest[4096 * 3] = 1;
        guest[(64 << 20) - 1] = 2;
        let parts = [guest.as_slice()];
        let pages = DataPages::scan(&parts, &[]).unwrap();
        let shape = Shape {
            backend: "kvm".into(),
            memory_bytes: guest.len() as u64,
            vcpus: 1,
        };
        let mut b = SnapshotBuilder::new(7, shape);
        b.add_memory_pages("memory", &pages).unwrap();
        let p = dir.join(name);
        b.write_file(&p).unwrap();
        let sha = b.section_sha256("memory").unwrap();
        crate::image::write_image(&crate::image::image_path(&p), &sha, &pages).unwrap();
        p
    }

    #[test]
    fn installing_a_snapshot_carries_its_restore_image_sparse_and_ready() {
        use crate::format::{Expect, Snapshot};
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(d.path().join("cache").as_path()).unwrap();
        let src = snapshot_with_its_image(d.path(), "built.snap");
        let entry = c.install_vm(&key(5), &src).unwrap();
        // The builder's temporaries go away after the install.
        fs::remove_file(crate::image::image_path(&src)).unwrap();
        fs::remove_file(&src).unwrap();
        let image = crate::image::image_path(&entry);
        assert!(crate::image::has_matching_image(&entry));
        let blocks_bytes = fs::metadata(&image).unwrap().blocks() * 512;
        assert!(blocks_bytes < 1 << 20, "holes kept: {blocks_bytes} bytes");
        c.verify_entry(&entry, EntryKind::Vm, 7).unwrap();
        let s = Snapshot::open(&entry, &Expect::protocol(7)).unwrap();
        assert!(!s.restore_image("memory", &image).unwrap().built);
        // The entry's size is its snapshot's, not the image's.
        let listed = c.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].size_bytes, fs::metadata(&entry).unwrap().len());

        // A lab's VM images come along too, and are not counted either.
        let lab = d.path().join("lab");
        fs::create_dir(&lab).unwrap();
        let a = snapshot_with_its_image(&lab, "a.snap");
        let mut index = crate::lab_index::LabIndex::new("root");
        index.vms.push(crate::lab_index::LabVm {
            lab_path: Vec::new(),
            name: "a".into(),
            profile: "p".into(),
            memory_bytes: 64 << 20,
            cpus: 1,
            file: "a.snap".into(),
        });
        index.write(&lab).unwrap();
        let lab_entry = c.install_lab(&key(6), &lab).unwrap();
        assert!(crate::image::has_matching_image(&lab_entry.join("a.snap")));
        c.verify_entry(&lab_entry, EntryKind::Lab, 7).unwrap();
        let lab_listed = c.list().unwrap();
        let l = lab_listed.iter().find(|e| e.path == lab_entry).unwrap();
        assert!(l.size_bytes < 1 << 20, "{} bytes", l.size_bytes);
        assert!(fs::metadata(crate::image::image_path(&a)).is_ok());
    }

    /// A stale image (another snapshot's) beside the source is not carried.
    #[test]
    fn installing_does_not_carry_another_snapshots_image() {
        let d = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(d.path().join("cache").as_path()).unwrap();
        let src = snapshot_with_its_image(d.path(), "s.snap");
        let other = snapshot_with_its_image(d.path(), "o.snap");
        let mut b = crate::format::SnapshotBuilder::new(
            7,
            crate::format::Shape {
                backend: "kvm".into(),
                memory_bytes: 64 << 20,
                vcpus: 1,
            },
        );
        b.add_memory("memory", &vec![0u8; 64 << 20]).unwrap();
        b.write_file(&src).unwrap();
        let _ = other;
        let entry = c.install_vm(&key(7), &src).unwrap();
        assert!(!crate::image::image_path(&entry).exists());
        c.verify_entry(&entry, EntryKind::Vm, 7).unwrap();
    }

    #[test]
    fn evict_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let c = FixtureCache::open(dir.path()).unwrap();
        c.evict(&key(9), EntryKind::Lab).unwrap();
        c.evict(&key(9), EntryKind::Vm).unwrap();
    }
}
