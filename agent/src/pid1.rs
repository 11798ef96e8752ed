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
//! 3. staying PID 1, it is also the init that handles the power button: it
//!    turns the kernel's Ctrl-Alt-Del reboot off (`reboot(CAD_OFF)`), so the
//!    kernel sends PID 1 SIGINT instead (what the VMM's power button, a
//!    Ctrl+Alt+Del on the i8042, turns into), and on SIGINT it powers off
//!    gracefully: SIGTERM to every process, up to `POWER_OFF_GRACE` for them
//!    to exit, SIGKILL for the rest, `sync`, `reboot(POWER_OFF)`. An exec'd
//!    init gets the SIGINT itself and does its own shutdown. (In a child pid
//!    namespace, as in the agent's tests, CAD_OFF fails with EINVAL and
//!    POWER_OFF ends the namespace as if PID 1 was killed by SIGINT.)
//!    On a guest with ACPI the VMM's button is an ACPI event instead, which
//!    the kernel reports as KEY_POWER on its "Power Button" input device:
//!    PID 1 watches those devices (`power_button`) and takes a press as it
//!    takes SIGINT.
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
/// Returns, in the agent child, whether PID 1 execs the initrd's own init
/// (then that init, which reads no input devices, gets the ACPI power
/// button from the agent: `power_button::forward_presses_to_init`).
pub fn split(init: Option<&Path>, args: &[OsString]) -> bool {
    let agent = match fork() {
        Ok(0) => return init_to_exec(init).is_some(),
        Ok(pid) => pid,
        Err(e) => {
            // No child: serve from PID 1 itself rather than not at all.
            eprintln!("provium-agent: fork failed ({e}); serving from PID 1");
            return false;
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
    // A restarted agent child: PID 1 is this agent, which watches the
    // button itself.
    false
}

/// How long processes get between SIGTERM and SIGKILL on power-off.
pub const POWER_OFF_GRACE: Duration = Duration::from_secs(5);

extern "C" fn on_sigint(_: libc::c_int) {
    // Never runs: SIGINT stays blocked and is taken with sigwaitinfo. The
    // handler exists because the kernel drops a signal to init whose
    // disposition is the default.
}

/// The signals PID 1 waits for: SIGCHLD (reap) and SIGINT (power button).
fn pid1_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// Step 3 of the module docs: C-A-D off; SIGINT and SIGCHLD blocked, so
/// the loop takes them with `sigwaitinfo` and none can slip in between a
/// check and a wait.
fn handle_power_button(set: &libc::sigset_t) {
    // SAFETY: reboot(2) with the CAD_OFF command takes no argument.
    let rc = unsafe { libc::reboot(libc::LINUX_REBOOT_CMD_CAD_OFF) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // EINVAL: a child pid namespace, where C-A-D is the host's business.
        if e.raw_os_error() != Some(libc::EINVAL) {
            eprintln!(
                "provium-agent: cannot turn Ctrl-Alt-Del off ({e}); the power button will reboot"
            );
        }
    }
    // SAFETY: a zeroed sigaction with an empty mask and a handler that does
    // nothing; `set` is a valid signal set.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigprocmask(libc::SIG_BLOCK, set, std::ptr::null_mut());
    }
}

/// Undoes `handle_power_button` in a forked agent (a mask and handler are
/// inherited across fork).
fn release_power_button(set: &libc::sigset_t) {
    // SAFETY: restoring the default disposition and unblocking a valid set.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::sigprocmask(libc::SIG_UNBLOCK, set, std::ptr::null_mut());
    }
}

/// Reaps every exited child without blocking. Returns (whether `agent` was
/// among them, whether no child at all is left).
fn reap_all_nohang(agent: libc::pid_t) -> (bool, bool) {
    let mut agent_exited = false;
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a live status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            agent_exited |= pid == agent;
            continue;
        }
        let none_left = pid < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
        return (agent_exited, none_left);
    }
}

/// The graceful power-off of step 3. Does not return.
fn power_off() -> ! {
    eprintln!("provium-agent: power button: stopping every process, then powering off");
    for (sig, grace) in [
        (libc::SIGTERM, POWER_OFF_GRACE),
        (libc::SIGKILL, Duration::from_secs(1)),
    ] {
        // SAFETY: kill(-1) signals every process but PID 1 itself.
        unsafe { libc::kill(-1, sig) };
        let deadline = std::time::Instant::now() + grace;
        while !reap_all_nohang(0).1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // SAFETY: sync and reboot take no pointers.
    unsafe {
        libc::sync();
        libc::reboot(libc::LINUX_REBOOT_CMD_POWER_OFF);
    }
    // reboot(POWER_OFF) only returns on error; PID 1 must not exit.
    eprintln!(
        "provium-agent: reboot(POWER_OFF) failed: {}",
        io::Error::last_os_error()
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// How often PID 1 looks for power-button input devices while it has none.
const POWER_BUTTON_RESCAN_MS: i32 = 5000;

/// PID 1 without an init: reap everything; if the agent child dies, fork a
/// new one (which returns from here to serve); power off on SIGINT or a
/// KEY_POWER press on a "Power Button" input device. Signals arrive on a
/// signalfd, polled with the button devices (no threads: this loop forks).
fn reap_forever(mut agent: libc::pid_t) {
    let set = pid1_signals();
    handle_power_button(&set);
    let mut sigfd = match crate::power_button::signalfd(&set) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("provium-agent: signalfd failed ({e}); waiting with sigwaitinfo");
            None
        }
    };
    let mut buttons = crate::power_button::open_power_buttons();
    loop {
        let (agent_exited, none_left) = reap_all_nohang(agent);
        if agent_exited || none_left {
            eprintln!("provium-agent: the agent process exited; restarting it in 1 s");
            std::thread::sleep(Duration::from_secs(1));
            match fork() {
                Ok(0) => {
                    drop(sigfd.take());
                    drop(std::mem::take(&mut buttons));
                    release_power_button(&set);
                    return;
                }
                Ok(new) => agent = new,
                Err(e) => eprintln!("provium-agent: cannot restart the agent: {e}"),
            }
            continue;
        }
        let Some(sfd) = sigfd.as_mut() else {
            // SAFETY: `set` is valid; a null siginfo pointer is allowed.
            let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
            if sig == libc::SIGINT {
                power_off();
            }
            continue;
        };
        let timeout = if buttons.is_empty() {
            POWER_BUTTON_RESCAN_MS
        } else {
            -1
        };
        let ready = {
            let mut fds: Vec<&std::fs::File> = vec![&*sfd];
            fds.extend(buttons.iter());
            crate::power_button::poll_readable(&fds, timeout)
        };
        if ready.first() == Some(&true) {
            while let Some(sig) = crate::power_button::read_signal(sfd) {
                if sig == libc::SIGINT as u32 {
                    power_off();
                }
            }
        }
        let mut gone = Vec::new();
        for (i, (b, r)) in buttons.iter_mut().zip(ready.iter().skip(1)).enumerate() {
            match r.then(|| crate::power_button::read_press(b)) {
                Some(Some(true)) => power_off(),
                Some(None) => gone.push(i),
                _ => {}
            }
        }
        for i in gone.into_iter().rev() {
            buttons.remove(i);
        }
        if buttons.is_empty() {
            buttons = crate::power_button::open_power_buttons();
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
