//! Start-up as PID 1 (the kvm backend boots with `rdinit=/sbin/provium-agent`).
//!
//! When the agent finds itself PID 1 it:
//! 1. mounts what it needs if the initrd has not: `/proc` (proc), then, unless
//!    already mount points, `/sys` (sysfs), `/dev` (devtmpfs) and `/tmp` (tmpfs);
//! 2. forks. The child serves host connections (it is the agent proper). The
//!    parent stays PID 1: it execs the initrd's own init (`--init PATH`, else
//!    `/init` if it exists) with the same arguments, so the guest boots as it
//!    would without the agent; with no init to exec, it remains PID 1 itself,
//!    reaping every orphan and restarting the agent if the agent dies.
//!
//! The agent is never the reaper of processes other than its own children, so
//! its `wait`s never race a `waitpid(-1)`.
//!
//! Everything here runs before any thread exists (fork is only safe then).

use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub fn is_pid1() -> bool {
    std::process::id() == 1
}

fn mount(source: &str, target: &str, fstype: &str) -> io::Result<()> {
    if !Path::new(target).exists() {
        std::fs::create_dir_all(target)?;
    }
    let c = |s: &str| CString::new(s).expect("constant mount strings have no NUL");
    let (src, tgt, fs) = (c(source), c(target), c(fstype));
    // SAFETY: NUL-terminated strings alive for the call; no mount data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fs.as_ptr(),
            libc::MS_NOSUID,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Mount points listed in a mountinfo text (5th field of each line).
pub fn mount_points(mountinfo: &str) -> HashSet<String> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(str::to_string)
        .collect()
}

/// Step 1 of the module docs. Failures are logged, not fatal.
pub fn mount_basics() {
    if !Path::new("/proc/self").exists() {
        if let Err(e) = mount("proc", "/proc", "proc") {
            eprintln!("provium-agent: cannot mount /proc: {e}");
        }
    }
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|s| mount_points(&s))
        .unwrap_or_default();
    for (source, target, fstype) in [
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
        ("tmpfs", "/tmp", "tmpfs"),
    ] {
        if !mounted.contains(target) {
            if let Err(e) = mount(source, target, fstype) {
                eprintln!("provium-agent: cannot mount {fstype} on {target}: {e}");
            }
        }
    }
}

/// The init the parent should exec, if any.
pub fn init_to_exec(explicit: Option<&Path>) -> Option<PathBuf> {
    match explicit {
        Some(p) => Some(p.to_path_buf()),
        None => Some(PathBuf::from("/init")).filter(|p| p.is_file()),
    }
}

fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: called before any thread exists, so the child inherits a
    // consistent single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

fn exec_init(init: &Path, args: &[OsString]) -> io::Error {
    let Ok(path) = CString::new(init.as_os_str().as_bytes()) else {
        return io::Error::new(io::ErrorKind::InvalidInput, "init path has a NUL byte");
    };
    let mut argv: Vec<CString> = vec![path.clone()];
    argv.extend(args.iter().filter_map(|a| CString::new(a.as_bytes()).ok()));
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: `path` and every argv string are NUL-terminated and alive; the
    // array is null-terminated. execv only returns on failure.
    unsafe { libc::execv(path.as_ptr(), ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Step 2 of the module docs. Returns only in the child that serves.
/// `args` are the agent's own arguments (without argv\[0\]), passed on to init.
pub fn split(init: Option<&Path>, args: &[OsString]) {
    let agent = match fork() {
        Ok(0) => return,
        Ok(pid) => pid,
        Err(e) => {
            // No child: serve from PID 1 itself rather than not at all.
            eprintln!("provium-agent: fork failed ({e}); serving from PID 1");
            return;
        }
    };
    if let Some(init) = init_to_exec(init) {
        let err = exec_init(&init, args);
        eprintln!(
            "provium-agent: cannot exec {}: {err}; staying PID 1 and reaping",
            init.display()
        );
    }
    reap_forever(agent);
}

/// PID 1 without an init: reap everything; if the agent child dies, fork a
/// new one (which returns from here to serve).
fn reap_forever(mut agent: libc::pid_t) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a live status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ECHILD) {
            continue;
        }
        if pid == agent || pid < 0 {
            eprintln!("provium-agent: the agent process exited; restarting it in 1 s");
            std::thread::sleep(Duration::from_secs(1));
            match fork() {
                Ok(0) => return,
                Ok(new) => agent = new,
                Err(e) => eprintln!("provium-agent: cannot restart the agent: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo() {
        let text = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                    23 1 0:5 / /dev rw - devtmpfs devtmpfs rw\n";
        let m = mount_points(text);
        assert!(m.contains("/proc") && m.contains("/dev"));
        assert!(!m.contains("/tmp"));
    }

    #[test]
    fn explicit_init_wins() {
        assert_eq!(
            init_to_exec(Some(Path::new("/sbin/init"))),
            Some(PathBuf::from("/sbin/init"))
        );
    }
}
