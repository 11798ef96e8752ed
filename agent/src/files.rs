//! File ops: whole files (read_file, write_file), metadata (stat, listdir),
//! directories (mkdir, unlink, rename) and handles (open, read, write, seek,
//! tell, close).
//!
//! `stat` decision: `entry_type` comes from lstat (a symlink reports
//! `symlink`), while size, mtime and perm describe what the path resolves to,
//! like `stat(1)` on the target; a dangling symlink reports the link itself.
//!
//! `perm` on mkdir and on a newly created file is applied exactly (chmod after
//! creation), not masked by the agent's umask: a test that asks for 0o777 gets
//! 0o777. Reads and writes on handles are single read(2)/write(2) calls, so a
//! short count is reported as the kernel gave it.

use std::ffi::CString;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use provium_protocol::op::{HandleId, OpenMode, Whence};
use provium_protocol::result::{DirEntry, EntryType, OpError, StatInfo};
use provium_protocol::OpValue;

use crate::ctx::Ctx;
use crate::op_error::{self, MAX_ANSWER_BYTES};

pub fn read_file(path: &str) -> Result<OpValue, OpError> {
    let file = File::open(path).map_err(|e| op_error::io(&e, path))?;
    let too_large = || {
        op_error::too_large(format!(
            "{path} is larger than {MAX_ANSWER_BYTES} bytes; use open_file and read it in pieces"
        ))
    };
    // The size is a hint only (/proc files say 0): the read itself is capped.
    if file
        .metadata()
        .is_ok_and(|m| m.len() > MAX_ANSWER_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut data = Vec::new();
    file.take(MAX_ANSWER_BYTES as u64 + 1)
        .read_to_end(&mut data)
        .map_err(|e| op_error::io(&e, path))?;
    if data.len() > MAX_ANSWER_BYTES {
        return Err(too_large());
    }
    Ok(OpValue::Bytes(data))
}

pub fn write_file(path: &str, data: &[u8]) -> Result<OpValue, OpError> {
    fs::write(path, data).map_err(|e| op_error::io(&e, path))?;
    Ok(OpValue::Unit)
}

fn entry_type(ft: fs::FileType) -> EntryType {
    if ft.is_symlink() {
        EntryType::Symlink
    } else if ft.is_dir() {
        EntryType::Directory
    } else if ft.is_file() {
        EntryType::File
    } else if ft.is_fifo() {
        EntryType::Fifo
    } else if ft.is_socket() {
        EntryType::Socket
    } else if ft.is_block_device() {
        EntryType::BlockDevice
    } else if ft.is_char_device() {
        EntryType::CharDevice
    } else {
        EntryType::Other
    }
}

fn stat_info(lmeta: &Metadata, target: &Metadata) -> StatInfo {
    let mtime_ns = target
        .mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(target.mtime_nsec());
    StatInfo {
        size: target.len(),
        mtime_ns,
        perm: target.mode() & 0o7777,
        entry_type: entry_type(lmeta.file_type()),
    }
}

pub fn stat(path: &str) -> Result<OpValue, OpError> {
    let lmeta = fs::symlink_metadata(path).map_err(|e| op_error::io(&e, path))?;
    let target = if lmeta.file_type().is_symlink() {
        fs::metadata(path).unwrap_or_else(|_| lmeta.clone())
    } else {
        lmeta.clone()
    };
    Ok(OpValue::Stat(stat_info(&lmeta, &target)))
}

pub fn listdir(path: &str) -> Result<OpValue, OpError> {
    let mut entries = Vec::new();
    let mut name_bytes = 0usize;
    for entry in fs::read_dir(path).map_err(|e| op_error::io(&e, path))? {
        let entry = entry.map_err(|e| op_error::io(&e, path))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        name_bytes = name_bytes.saturating_add(name.len() + 16);
        if name_bytes > MAX_ANSWER_BYTES {
            return Err(op_error::too_large(format!(
                "{path} has too many entries to list in one answer; list it with `ls` through exec"
            )));
        }
        let entry_type = entry.file_type().map_or(EntryType::Other, entry_type);
        entries.push(DirEntry { name, entry_type });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(OpValue::Entries(entries))
}

pub fn mkdir(path: &str, parents: bool, perm: Option<u32>) -> Result<OpValue, OpError> {
    let mut b = fs::DirBuilder::new();
    b.recursive(parents).mode(perm.unwrap_or(0o777) & 0o7777);
    b.create(path).map_err(|e| op_error::io(&e, path))?;
    if let Some(perm) = perm {
        fs::set_permissions(path, fs::Permissions::from_mode(perm & 0o7777))
            .map_err(|e| op_error::io(&e, path))?;
    }
    Ok(OpValue::Unit)
}

pub fn unlink(path: &str) -> Result<OpValue, OpError> {
    let meta = fs::symlink_metadata(path).map_err(|e| op_error::io(&e, path))?;
    let r = if meta.is_dir() {
        fs::remove_dir(path)
    } else {
        fs::remove_file(path)
    };
    r.map_err(|e| op_error::io(&e, path))?;
    Ok(OpValue::Unit)
}

pub fn rename(from: &str, to: &str) -> Result<OpValue, OpError> {
    fs::rename(from, to).map_err(|e| op_error::io(&e, format!("{from} -> {to}")))?;
    Ok(OpValue::Unit)
}

/// open(2) with the mode's flags as given (no std policy on top), close-on-exec.
fn open_raw(path: &str, mode: &OpenMode, extra: libc::c_int, perm: u32) -> io::Result<File> {
    let cpath = CString::new(Path::new(path).as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let mut flags = libc::O_CLOEXEC | extra;
    flags |= match (mode.read, mode.write || mode.append) {
        (true, true) => libc::O_RDWR,
        (false, true) => libc::O_WRONLY,
        _ => libc::O_RDONLY,
    };
    if mode.append {
        flags |= libc::O_APPEND;
    }
    if mode.truncate {
        flags |= libc::O_TRUNC;
    }
    // SAFETY: `cpath` is a NUL-terminated string alive for the call.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags, libc::c_uint::from(perm)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a fresh fd that we now own.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

pub fn open(
    ctx: &Ctx<'_>,
    path: &str,
    mode: OpenMode,
    perm: Option<u32>,
) -> Result<OpValue, OpError> {
    mode.check().map_err(|e| op_error::invalid(e.to_string()))?;
    let file = if mode.create {
        let p = perm.unwrap_or(0o666) & 0o7777;
        // Try to create it ourselves first so we know whether to apply perm.
        match open_raw(path, &mode, libc::O_CREAT | libc::O_EXCL, p) {
            Ok(f) => {
                if perm.is_some() {
                    f.set_permissions(fs::Permissions::from_mode(p))
                        .map_err(|e| op_error::io(&e, path))?;
                }
                f
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && !mode.exclusive => {
                open_raw(path, &mode, 0, p).map_err(|e| op_error::io(&e, path))?
            }
            Err(e) => return Err(op_error::io(&e, path)),
        }
    } else {
        open_raw(path, &mode, 0, 0).map_err(|e| op_error::io(&e, path))?
    };
    let handle = ctx.ns.insert_handle(file)?;
    Ok(OpValue::Handle { handle })
}

pub fn read(ctx: &Ctx<'_>, handle: HandleId, len: u64) -> Result<OpValue, OpError> {
    let file = ctx.ns.handle(handle)?;
    let len = usize::try_from(len)
        .unwrap_or(usize::MAX)
        .min(MAX_ANSWER_BYTES);
    let mut buf = vec![0u8; len];
    let n = loop {
        match (&*file).read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(op_error::io(&e, format!("read from handle {handle}"))),
        }
    };
    buf.truncate(n);
    Ok(OpValue::Bytes(buf))
}

pub fn write(ctx: &Ctx<'_>, handle: HandleId, data: &[u8]) -> Result<OpValue, OpError> {
    let file = ctx.ns.handle(handle)?;
    let n = loop {
        match (&*file).write(data) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(op_error::io(&e, format!("write to handle {handle}"))),
        }
    };
    Ok(OpValue::Written { bytes: n as u64 })
}

pub fn seek(
    ctx: &Ctx<'_>,
    handle: HandleId,
    offset: i64,
    whence: Whence,
) -> Result<OpValue, OpError> {
    let file = ctx.ns.handle(handle)?;
    let pos = match whence {
        Whence::Set => SeekFrom::Start(u64::try_from(offset).map_err(|_| {
            op_error::invalid(format!(
                "seek to {offset} from the start: offset must be >= 0"
            ))
        })?),
        Whence::Cur => SeekFrom::Current(offset),
        Whence::End => SeekFrom::End(offset),
    };
    let at = (&*file)
        .seek(pos)
        .map_err(|e| op_error::io(&e, format!("seek on handle {handle}")))?;
    Ok(OpValue::Offset { offset: at })
}

pub fn tell(ctx: &Ctx<'_>, handle: HandleId) -> Result<OpValue, OpError> {
    seek(ctx, handle, 0, Whence::Cur)
}

pub fn close(ctx: &Ctx<'_>, handle: HandleId) -> Result<OpValue, OpError> {
    ctx.ns.remove_handle(handle)?;
    Ok(OpValue::Unit)
}

/// Open `path` read-only for a tail.
pub fn open_for_tail(path: &str) -> Result<File, OpError> {
    OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| op_error::io(&e, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::result::ErrorCode;

    #[test]
    fn stat_reports_symlink_type_with_target_data() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        fs::write(&f, b"12345").unwrap();
        let l = dir.path().join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        let OpValue::Stat(s) = stat(l.to_str().unwrap()).unwrap() else {
            panic!()
        };
        assert_eq!(s.entry_type, EntryType::Symlink);
        assert_eq!(s.size, 5);
        let dangling = dir.path().join("d");
        std::os::unix::fs::symlink("/nonexistent", &dangling).unwrap();
        let OpValue::Stat(s) = stat(dangling.to_str().unwrap()).unwrap() else {
            panic!()
        };
        assert_eq!(s.entry_type, EntryType::Symlink);
        assert_eq!(s.size, "/nonexistent".len() as u64);
    }

    #[test]
    fn read_file_refuses_big_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("big");
        File::create(&f)
            .unwrap()
            .set_len(MAX_ANSWER_BYTES as u64 + 1)
            .unwrap();
        let err = read_file(f.to_str().unwrap()).unwrap_err();
        assert_eq!(err.code, ErrorCode::TooLarge);
        assert!(err.message.contains("open_file"));
        let err = read_file("/nonexistent/x").unwrap_err();
        assert_eq!(err.errno, Some(libc::ENOENT));
        assert_eq!(
            err.message,
            "No such file or directory (os error 2): /nonexistent/x"
        );
    }

    #[test]
    fn mkdir_perm_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("a/b/c");
        mkdir(d.to_str().unwrap(), true, Some(0o777)).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o777);
        // parents=true on an existing dir is fine, like mkdir -p.
        mkdir(d.to_str().unwrap(), true, None).unwrap();
        assert!(mkdir(d.to_str().unwrap(), false, None).is_err());
    }
}
