//! Installing a file atomically, shared by every writer of the snapshot
//! crate (the snapshot container, the fixture cache, restore images, the
//! lab index): a temporary name beside the target that says whose it is
//! ([`temp_sibling`], read back by [`temp_owner`] to clean up after a dead
//! writer), and what a write that ran out of space reports ([`NoSpace`]:
//! which directory, how much is free, how much was needed).
//!
//! Each writer's own error enum turns a [`NoSpace`] into its variant
//! (`SnapshotError::NoSpace`, `CacheError::NoSpace`), so the message names
//! its layer and the fix.

use std::io;
use std::path::{Path, PathBuf};

/// Whether `e` says the file system is full (or the writer's quota is).
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Bytes an unprivileged writer may still allocate on the file system
/// holding `dir` (0 when it cannot be asked).
pub fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs only writes the struct it is given; zeroed is a
    // valid value of it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a live statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    st.f_bavail.saturating_mul(st.f_frsize)
}

/// What a write that ran out of space reports, whoever reports it: the
/// fields of `SnapshotError::NoSpace` and `CacheError::NoSpace`, built in
/// one place.
pub(crate) struct NoSpace {
    /// The file being written.
    pub path: PathBuf,
    /// The directory whose file system is full.
    pub dir: PathBuf,
    /// Space left there for an unprivileged writer, in bytes.
    pub free_bytes: u64,
    /// What the write needed in all, in bytes.
    pub needed_bytes: u64,
    /// The I/O error (ENOSPC or EDQUOT).
    pub source: io::Error,
}

impl NoSpace {
    /// `Ok` when `source` says the file system holding `dir` is full
    /// (`needed_bytes` is only asked then); otherwise the error back.
    pub(crate) fn detect(
        path: &Path,
        dir: &Path,
        needed_bytes: impl FnOnce() -> u64,
        source: io::Error,
    ) -> Result<NoSpace, io::Error> {
        if !is_no_space(&source) {
            return Err(source);
        }
        Ok(NoSpace {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            free_bytes: free_bytes(dir),
            needed_bytes: needed_bytes(),
            source,
        })
    }
}

/// Puts the sparse file `src` at `dst` (a fresh name) without filling its
/// holes: a hard link where both are on one file system (no bytes copied;
/// the source may be deleted afterwards), else a copy of its data extents
/// only (`SEEK_DATA`/`SEEK_HOLE`), synced. `fs::copy` would read the holes
/// as zeros and write them out: a 2 GiB restore image holding 20 MiB of
/// data would take 2 GiB of disk.
pub fn link_or_copy_sparse(src: &Path, dst: &Path) -> io::Result<()> {
    if std::fs::hard_link(src, dst).is_ok() {
        return Ok(());
    }
    let r = copy_sparse(src, dst);
    if r.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    r
}

/// `lseek(file, pos, whence)` for `SEEK_DATA` / `SEEK_HOLE`: the offset
/// found, or `None` when there is no data at or after `pos` (ENXIO). For
/// readers of sparse files that skip their holes (a restore image's copy,
/// a sparse copy).
pub fn seek_extent(file: &std::fs::File, pos: u64, whence: i32) -> io::Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    let off = libc::off_t::try_from(pos).map_err(io::Error::other)?;
    // SAFETY: lseek on a descriptor the caller holds; the result is checked.
    let r = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(u64::try_from(r).ok())
}

fn copy_sparse(src: &Path, dst: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let from = std::fs::File::open(src)?;
    let len = from.metadata()?.len();
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)?;
    to.set_len(len)?;
    let seek = |pos: u64, whence: i32| seek_extent(&from, pos, whence);
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0;
    while pos < len {
        let Some(data) = seek(pos, libc::SEEK_DATA)? else {
            break;
        };
        let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let mut at = data;
        while at < hole {
            let n = usize::try_from((hole - at).min(buf.len() as u64)).expect("at most 1 MiB");
            from.read_exact_at(&mut buf[..n], at)?;
            to.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        pos = hole;
    }
    to.sync_all()
}

/// `<dir>/.<name>.tmp-<pid>-<random>@<host>`, beside `path`: unique across
/// the processes of every machine sharing the directory (a cache on NFS),
/// and saying whose it is, so only its own host judges whether its writer
/// is gone ([`temp_owner`]).
pub(crate) fn temp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".into());
    let mut b = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .map(|()| u64::from_le_bytes(b))
        .unwrap_or_else(|_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    path.with_file_name(format!(
        ".{name}.tmp-{}-{random:016x}@{}",
        std::process::id(),
        host_name()
    ))
}

/// This machine's host name, reduced to `[A-Za-z0-9.-]` (others become `_`).
pub(crate) fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let h: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if h.is_empty() {
        "localhost".into()
    } else {
        h
    }
}

/// The writer of a temporary name from [`temp_sibling`]: (pid, host); the
/// host is `None` for names written before hosts were recorded.
pub(crate) fn temp_owner(file_name: &str) -> Option<(u32, Option<&str>)> {
    let rest = file_name.strip_prefix('.')?.split_once(".tmp-")?.1;
    let (rest, host) = match rest.split_once('@') {
        Some((r, h)) => (r, Some(h)),
        None => (rest, None),
    };
    let pid = rest.split('-').next()?.parse().ok()?;
    Some((pid, host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    #[test]
    fn a_sparse_copy_keeps_the_data_and_the_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("s.img");
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[7; 4096], 4096 * 3).unwrap();
        f.write_all_at(&[9; 10], (64 << 20) - 10).unwrap();
        f.sync_all().unwrap();
        let dst = dir.path().join("d.img");
        copy_sparse(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
        let blocks_bytes = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(blocks_bytes < 1 << 20, "{blocks_bytes} bytes allocated");
        // On one file system it is a link: nothing copied.
        let linked = dir.path().join("l.img");
        link_or_copy_sparse(&src, &linked).unwrap();
        assert_eq!(
            std::fs::metadata(&linked).unwrap().ino(),
            std::fs::metadata(&src).unwrap().ino()
        );
        // An existing destination is not overwritten.
        assert!(copy_sparse(&src, &dst).is_err());
    }
}
