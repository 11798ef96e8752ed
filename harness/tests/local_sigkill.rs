//! SIGKILL of the process that owns a sandbox leaves no sandbox process,
//! namespace or mount behind; its socket stays as a file nobody listens on
//! (connecting is refused), and the next sandbox started under the same
//! runtime directory removes it.
//!
//! The owner is this test binary re-executed to run `holder` (an ignored
//! test that only runs when `sigkill_of_the_owner_tears_the_sandbox_down`
//! spawns it with `PROVIUM_SIGKILL_HOLDER` set). Needs root, as in CI.
mod common;

use common::agent;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use provium::backend::local::{LocalOptions, LocalSandbox};
use provium::client::AgentOps;

const HOLDER_ENV: &str = "PROVIUM_SIGKILL_HOLDER";

fn mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .map(String::from)
        .collect()
}

/// Processes whose namespace `kind` (`pid`, `mnt`) is the link `ns`.
fn processes_in(kind: &str, ns: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read_link(e.path().join("ns").join(kind))
                .is_ok_and(|l| l.to_string_lossy() == ns)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
#[ignore = "helper process for sigkill_of_the_owner_tears_the_sandbox_down, which runs it"]
fn holder() {
    let runtime = std::env::var(HOLDER_ENV).unwrap_or_else(|_| {
        panic!("holder only runs under sigkill_of_the_owner_tears_the_sandbox_down ({HOLDER_ENV} unset)")
    });
    let mut opts = LocalOptions::new(agent());
    opts.runtime_dir = runtime.into();
    let sb = LocalSandbox::start("sbx-sigkill", &opts).expect("start sandbox");
    let vm = sb.connect().expect("connect");
    let r = vm.run("sleep 1000 >/dev/null 2>&1 & echo ok").expect("run");
    assert!(r.success(), "{r:?}");
    let init = sb.init_pid();
    let ns = |kind: &str| {
        std::fs::read_link(format!("/proc/{init}/ns/{kind}"))
            .expect("read the init's namespace link")
            .to_string_lossy()
            .into_owned()
    };
    let pids: Vec<String> = sb.host_pids().iter().map(|p| p.to_string()).collect();
    println!(
        "SANDBOX {init} {} {} {} {} {}",
        ns("pid"),
        ns("mnt"),
        sb.socket_path().display(),
        sb.dir().display(),
        pids.join(",")
    );
    loop {
        std::thread::sleep(Duration::from_secs(1000));
    }
}

#[test]
fn sigkill_of_the_owner_tears_the_sandbox_down() {
    // Become the subreaper: the orphaned sandbox init is reparented to us,
    // so we can see it reaped rather than guess.
    // SAFETY: prctl with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
    let runtime = Path::new("/run/provium-test/sigkill");
    let _ = std::fs::remove_dir_all(runtime);
    let mounts_before = mounts();

    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "holder", "--ignored", "--nocapture"])
        .env(HOLDER_ENV, runtime)
        .env("PROVIUM_AGENT", agent())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut line = String::new();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    while !line.starts_with("SANDBOX ") {
        line.clear();
        let n = out.read_line(&mut line).expect("read the holder's stdout");
        assert!(n > 0, "the holder exited without starting a sandbox");
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    let init: i32 = f[1].parse().unwrap();
    let (pidns, mntns, socket, dir) = (f[2], f[3], PathBuf::from(f[4]), PathBuf::from(f[5]));
    let pids: Vec<&str> = f[6].split(',').collect();
    assert!(pids.len() >= 3, "init, agent and sleep expected: {pids:?}");
    assert!(!processes_in("pid", pidns).is_empty());

    // SAFETY: kill with a pid we spawned.
    unsafe { libc::kill(holder.id() as i32, libc::SIGKILL) };
    holder.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut reaped = false;
    loop {
        if !reaped {
            let mut status = 0;
            // SAFETY: waitpid on a pid that is (or will be) our child.
            let r = unsafe { libc::waitpid(init, &mut status, libc::WNOHANG | libc::__WALL) };
            if r == init {
                assert!(libc::WIFSIGNALED(status), "init status {status:#x}");
                assert_eq!(libc::WTERMSIG(status), libc::SIGKILL);
                reaped = true;
            }
        }
        let left_pid = processes_in("pid", pidns);
        let left_mnt = processes_in("mnt", mntns);
        if reaped && left_pid.is_empty() && left_mnt.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "20 s after SIGKILL: init reaped={reaped}, still in the pid ns: {left_pid:?}, in the mount ns: {left_mnt:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in &pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "sandbox process {pid} survived"
        );
    }
    assert_eq!(mounts(), mounts_before, "host mounts changed");

    // The socket file is left behind, but nobody listens on it.
    let err = UnixStream::connect(&socket).unwrap_err();
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{}: {err}",
        socket.display()
    );
    assert!(dir.exists());

    // The next start under the same runtime directory removes the stale one.
    let mut opts = LocalOptions::new(agent());
    opts.runtime_dir = runtime.into();
    let mut sb = LocalSandbox::start("sbx-after", &opts).expect("start a second sandbox");
    assert!(!dir.exists(), "stale {} not removed", dir.display());
    sb.connect().unwrap().ping().unwrap();
    sb.shutdown().unwrap();
    assert_eq!(std::fs::read_dir(runtime).unwrap().count(), 0);
}
