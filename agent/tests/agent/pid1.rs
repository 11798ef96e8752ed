//! The agent as PID 1, in a fresh pid + mount namespace (`unshare`), the
//! closest this machine gets to `rdinit=` (its KVM cannot run Linux user
//! space). Skipped, with the reason printed, where unshare is not permitted.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use provium_protocol::op::{Op, SyscallSpec};
use provium_protocol::wire::Channel;
use provium_protocol::OpValue;

use crate::client::*;

fn unshare_works() -> Result<(), String> {
    let out = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount",
            "--mount-proc",
            "--kill-child",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "unshare --pid --mount failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn start_pid1(extra: &[String]) -> Agent {
    let extra = extra.to_vec();
    Agent::start_with(move |sock| {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"])
            .arg(agent_bin())
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--no-clock")
            .args(extra)
            // Words the kernel would pass along: ignored as PID 1.
            .arg("quiet");
        c
    })
}

fn getpid(c: &mut Client) -> i64 {
    match c.ok(Op::Syscall(SyscallSpec {
        nr: libc::SYS_getpid,
        args: vec![],
        bufs: vec![],
        ptrs: vec![],
        nested: vec![],
    })) {
        OpValue::Syscall(r) => r.ret,
        other => panic!("{other:?}"),
    }
}

#[test]
fn pid1_forks_the_agent_and_execs_init() {
    if let Err(why) = unshare_works() {
        eprintln!("skipping pid1_forks_the_agent_and_execs_init: {why}");
        return;
    }
    let dir = tempfile::tempdir_in(scratch_base()).unwrap();
    let init = dir.path().join("init.sh");
    std::fs::write(&init, "#!/bin/sh\nexec sleep 300\n").unwrap();
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = start_pid1(&["--init".into(), init.display().to_string()]);
    let mut c = a.client();
    // The agent is PID 1's child; PID 1 became the init.
    assert_ne!(getpid(&mut c), 1);
    let (_, comm, _) = c.sh("cat /proc/1/comm");
    assert_eq!(comm, "sleep\n");
    // /tmp was not a mount point in the new namespace, so it got a tmpfs.
    let (_, fstype, _) = c.sh("awk '$2 == \"/tmp\" {print $3}' /proc/mounts | tail -n 1");
    assert_eq!(fstype, "tmpfs\n");
}

#[test]
fn pid1_without_init_reaps_orphans() {
    if let Err(why) = unshare_works() {
        eprintln!("skipping pid1_without_init_reaps_orphans: {why}");
        return;
    }
    if std::path::Path::new("/init").exists() {
        eprintln!("skipping pid1_without_init_reaps_orphans: this host has an /init, which PID 1 would exec");
        return;
    }
    let a = start_pid1(&[]);
    let mut c = a.client();
    let agent_pid = getpid(&mut c);
    assert_ne!(agent_pid, 1);
    // An orphan: its parent shell exits at once, so PID 1 must reap it.
    let (id, exit) = c.exec(shell("sleep 0.2 > /dev/null 2>&1 & echo $!"));
    assert_eq!(exit.exit_code, 0);
    let orphan = c.output(id, Channel::Stdout).trim().to_string();
    let gone = format!("/proc/{orphan}");
    let mut last = String::new();
    wait_until("PID 1 to reap the orphan", || {
        let (_, out, _) = c.sh(&format!("cat {gone}/stat 2>/dev/null || echo gone"));
        last = out;
        last == "gone\n"
    });
    // Still PID 1 itself (no init exec'd).
    let (_, comm, _) = c.sh("cat /proc/1/comm");
    assert!(comm.starts_with("provium-agent"), "{comm}");
}

/// The host pid of the namespace's PID 1: the child of the `unshare` process.
fn ns_init_host_pid(unshare: u32) -> Option<libc::pid_t> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: libc::pid_t = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == unshare).then_some(pid)
    })
}

#[test]
fn pid1_powers_off_gracefully_on_sigint() {
    use std::os::unix::process::ExitStatusExt;
    let test = "pid1_powers_off_gracefully_on_sigint";
    if let Err(why) = unshare_works() {
        eprintln!("skipping {test}: {why}");
        return;
    }
    if std::path::Path::new("/init").exists() {
        eprintln!("skipping {test}: this host has an /init, which PID 1 would exec (and that init would get the SIGINT)");
        return;
    }
    let mut a = start_pid1(&[]);
    let mut c = a.client();
    let dir = tempfile::tempdir_in(scratch_base()).unwrap();
    let marker = dir.path().join("stopped");
    let ready = dir.path().join("ready");
    // A service that must be stopped gracefully: it records SIGTERM. The
    // exec returns once the service is in the background, maybe before its
    // subshell has set the trap (a SIGTERM then would kill it unrecorded):
    // it says when it has.
    let (_, exit) = c.exec(shell(&format!(
        "(trap 'echo stopped > {}; exit 0' TERM; : > {}; while :; do sleep 0.05; done) >/dev/null 2>&1 &",
        marker.display(),
        ready.display()
    )));
    assert_eq!(exit.exit_code, 0);
    wait_until("the service to trap SIGTERM", || ready.exists());
    let init = ns_init_host_pid(a.child.id()).expect("unshare's child is the namespace's PID 1");
    // What the kernel does on Ctrl-Alt-Del once init turned C-A-D off
    // (kill_cad_pid(SIGINT)): the VMM's power button.
    // SAFETY: kill(2) on a pid we just found, a child of our own child.
    assert_eq!(unsafe { libc::kill(init, libc::SIGINT) }, 0);
    let mut status = None;
    wait_until("PID 1 to power off", || {
        status = a.child.try_wait().unwrap();
        status.is_some()
    });
    let status = status.expect("exited");
    // In a child pid namespace reboot(POWER_OFF) ends the namespace as if
    // its init died of SIGINT; unshare passes that on.
    assert!(
        status.signal() == Some(libc::SIGINT) || status.code() == Some(128 + libc::SIGINT),
        "PID 1 powered off: {status:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "stopped\n",
        "the service got SIGTERM before the power-off"
    );
}
