//! The local backend's system calls, each wrapped once with its SAFETY
//! argument: the rest of the backend (the sandbox lifecycle in mod.rs, the
//! filesystem snapshots in snapshot.rs, the NIC setup in net.rs) calls these
//! safe functions and holds no `unsafe` of its own for them. A wrapper takes
//! the descriptor it returns into an `OwnedFd` at once, so no raw descriptor
//! can leak between the call and its owner.
//!
//! Not here: init.rs, whose code runs in the freshly cloned sandbox init
//! before exec, where only raw system calls over memory prepared in advance
//! are allowed (no allocation, no locks); it keeps its own raw calls.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `rc` as a result: the thread's errno when negative.
fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Owns the descriptor a successful call just returned.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: `fd` is a descriptor the kernel just returned to this
    // thread; nothing else holds it, so the OwnedFd is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `p` as a C string (a path holding a NUL byte is an error).
pub fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("path holds a NUL byte"))
}

/// The effective user id.
pub fn geteuid() -> libc::uid_t {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the two-element array.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    Ok((owned(fds[0].into())?, owned(fds[1].into())?))
}

/// A pidfd for `pid`, which must be the caller's own unreaped child (so the
/// pid cannot have been reused).
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a descriptor.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })
}

/// Sends `signal` through `pidfd`: unlike kill(2), it can only reach the
/// process the pidfd was opened for, never a later holder of its pid.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    check(libc::c_int::try_from(rc).unwrap_or(-1)).map(drop)
}

/// kill(2). The caller must know `pid` is still the process it means: its
/// own unreaped child, or a pid read from a pid namespace it owns.
pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes plain integers.
    check(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// waitpid(2) for `pid` (with `__WALL`), retried on EINTR: its wait status.
pub fn wait_child(pid: libc::pid_t) -> io::Result<libc::c_int> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Waits up to `timeout_ms` for `fd` to be readable: false on timeout.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout_ms: libc::c_int) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd that lives across the call.
    let n = check(unsafe { libc::poll(&mut pfd, 1, timeout_ms) })?;
    Ok(n > 0)
}

/// Opens directory `p` as an `O_PATH` descriptor (a handle for *at calls).
pub fn open_dir_path(p: &Path) -> io::Result<OwnedFd> {
    let c = cpath(p)?;
    // SAFETY: open of a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    owned(fd.into())
}

/// Opens directory `rel` beneath `base`, never leaving it (`..` and absolute
/// symlinks stay inside: `RESOLVE_IN_ROOT`) and, with `no_symlinks`,
/// following no symlink at all.
pub fn open_beneath(base: BorrowedFd<'_>, rel: &[u8], no_symlinks: bool) -> io::Result<OwnedFd> {
    let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
    let c = CString::new(rel).map_err(|_| io::Error::other("path holds a NUL byte"))?;
    // SAFETY: open_how is plain data; zero is a valid value for each field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    if no_symlinks {
        how.resolve |= libc::RESOLVE_NO_SYMLINKS;
    }
    // SAFETY: openat2 with a valid dirfd, a NUL-terminated path and an
    // open_how of the size passed.
    owned(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            base.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })
}

/// openat(2) of `leaf` in `dir` with `flags` (`O_CLOEXEC` is added) and,
/// when `flags` creates, `mode`.
pub fn openat(
    dir: BorrowedFd<'_>,
    leaf: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: a valid dirfd and a NUL-terminated name; the mode is read
    // only when the flags create.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            leaf.as_ptr(),
            flags | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    };
    owned(fd.into())
}

/// The `lstat` of `leaf` in `dir` (not following a symlink), or None when
/// it does not exist.
pub fn fstatat_nofollow(dir: BorrowedFd<'_>, leaf: &CStr) -> io::Result<Option<libc::stat>> {
    // SAFETY: stat is plain data; all-zero is a valid value, filled below.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid dirfd, a NUL-terminated name and a stat buffer.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            leaf.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(rc) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// unlinkat(2): `flags` 0 for a file, `AT_REMOVEDIR` for an empty directory.
pub fn unlinkat(dir: BorrowedFd<'_>, leaf: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid dirfd and a NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), leaf.as_ptr(), flags) }).map(drop)
}

/// mkdirat(2).
pub fn mkdirat(dir: BorrowedFd<'_>, leaf: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: a valid dirfd and a NUL-terminated name.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), leaf.as_ptr(), mode) }).map(drop)
}

/// symlinkat(2): `leaf` in `dir` pointing at `target`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, leaf: &CStr) -> io::Result<()> {
    // SAFETY: two NUL-terminated strings and a valid dirfd.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), leaf.as_ptr()) }).map(drop)
}

/// mknodat(2).
pub fn mknodat(
    dir: BorrowedFd<'_>,
    leaf: &CStr,
    mode: libc::mode_t,
    rdev: libc::dev_t,
) -> io::Result<()> {
    // SAFETY: a valid dirfd and a NUL-terminated name.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), leaf.as_ptr(), mode, rdev) }).map(drop)
}

/// linkat(2) without flags (no symlink is followed).
pub fn linkat(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    // SAFETY: valid dirfds and NUL-terminated names.
    check(unsafe {
        libc::linkat(
            from_dir.as_raw_fd(),
            from.as_ptr(),
            to_dir.as_raw_fd(),
            to.as_ptr(),
            0,
        )
    })
    .map(drop)
}

/// fchownat(2) not following a symlink.
pub fn lchownat(
    dir: BorrowedFd<'_>,
    leaf: &CStr,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> io::Result<()> {
    // SAFETY: a valid dirfd and a NUL-terminated name.
    check(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            leaf.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// fchmodat(2) (Linux cannot change a symlink's own mode).
pub fn fchmodat(dir: BorrowedFd<'_>, leaf: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: a valid dirfd and a NUL-terminated name.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), leaf.as_ptr(), mode, 0) }).map(drop)
}

/// Sets the mtime of `leaf` in `dir` (not following a symlink), leaving
/// its atime.
pub fn set_mtime_nofollow(
    dir: BorrowedFd<'_>,
    leaf: &CStr,
    seconds: libc::time_t,
    nanos: libc::c_long,
) -> io::Result<()> {
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: nanos,
        },
    ];
    // SAFETY: a valid dirfd, a NUL-terminated name and two timespecs.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            leaf.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// fsetxattr(2).
pub fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: a valid fd, a NUL-terminated name and `value`'s bytes.
    check(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

/// `llistxattr(2)` of `path`: the NUL-separated names (empty when the
/// filesystem has no xattrs).
pub fn llistxattr(path: &CStr) -> io::Result<Vec<u8>> {
    // SAFETY: a size query with a null buffer.
    let n = unsafe { libc::llistxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOTSUP) {
            Ok(Vec::new())
        } else {
            Err(e)
        };
    }
    // One spare byte: a list that grew between the calls fails with ERANGE
    // rather than being cut short.
    let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0) + 1];
    // SAFETY: buf has buf.len() writable bytes.
    let n = unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(usize::try_from(n).unwrap_or(0));
    Ok(buf)
}

/// `lgetxattr(2)`: the value of `name` on `path` (not following a symlink).
pub fn lgetxattr(path: &CStr, name: &CStr) -> io::Result<Vec<u8>> {
    // SAFETY: a size query with a null buffer.
    let len = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
    // SAFETY: buf has buf.len() writable bytes.
    let len = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(usize::try_from(len).unwrap_or(0));
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// The *at wrappers on a scratch directory: create, inspect, link,
    /// remove; a missing name is None, not an error; errno comes through.
    #[test]
    fn at_wrappers_work_on_a_scratch_directory() {
        let d = tempfile::tempdir().unwrap();
        let dir = open_dir_path(d.path()).unwrap();
        let c = |s: &str| CString::new(s).unwrap();
        assert!(fstatat_nofollow(dir.as_fd(), &c("f")).unwrap().is_none());
        let f = openat(
            dir.as_fd(),
            &c("f"),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
        .unwrap();
        drop(f);
        let again = openat(
            dir.as_fd(),
            &c("f"),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        );
        assert_eq!(again.unwrap_err().raw_os_error(), Some(libc::EEXIST));
        mkdirat(dir.as_fd(), &c("sub"), 0o700).unwrap();
        symlinkat(&c("f"), dir.as_fd(), &c("l")).unwrap();
        linkat(dir.as_fd(), &c("f"), dir.as_fd(), &c("h")).unwrap();
        let st = fstatat_nofollow(dir.as_fd(), &c("l")).unwrap().unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
        let st = fstatat_nofollow(dir.as_fd(), &c("h")).unwrap().unwrap();
        assert_eq!(st.st_nlink, 2);
        set_mtime_nofollow(dir.as_fd(), &c("f"), 1_000_000, 5).unwrap();
        let st = fstatat_nofollow(dir.as_fd(), &c("f")).unwrap().unwrap();
        assert_eq!((st.st_mtime, st.st_mtime_nsec), (1_000_000, 5));
        let sub = open_beneath(dir.as_fd(), b"sub", true).unwrap();
        assert!(fstatat_nofollow(sub.as_fd(), &c("x")).unwrap().is_none());
        // `..` stays inside the base.
        let up = open_beneath(sub.as_fd(), b"..", true).unwrap();
        assert!(fstatat_nofollow(up.as_fd(), &c("f")).unwrap().is_none());
        unlinkat(dir.as_fd(), &c("sub"), libc::AT_REMOVEDIR).unwrap();
        assert_eq!(
            unlinkat(dir.as_fd(), &c("sub"), 0)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOENT)
        );
    }

    #[test]
    fn a_pipe_carries_bytes_and_poll_sees_them() {
        use std::io::{Read, Write};
        let (r, w) = pipe().unwrap();
        assert!(!poll_readable(r.as_fd(), 0).unwrap());
        std::fs::File::from(w).write_all(b"x").unwrap();
        assert!(poll_readable(r.as_fd(), 1000).unwrap());
        let mut b = [0u8; 1];
        std::fs::File::from(r).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
    }
}
