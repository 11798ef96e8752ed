//! The local backend end to end, with the real agent: namespaces, overlay
//! isolation, fresh /proc, /dev, /tmp, hostname, network, teardown.
//!
//! Needs root (as in CI). Without root these tests fail, saying so: the
//! local backend is the tier that must run here.
mod common;

use common::agent;

use std::path::PathBuf;

use provium::backend::local::{LocalOptions, LocalSandbox};
use provium::client::AgentOps;

fn opts(tag: &str) -> LocalOptions {
    let mut o = LocalOptions::new(agent());
    // Not under /tmp: the sandbox's socket directory is visible inside at the
    // same path, and the /tmp test wants an empty /tmp.
    o.runtime_dir = PathBuf::from(format!("/run/provium-test/{tag}"));
    o
}

fn mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .count()
}

#[test]
fn sandbox_has_its_own_hostname_pids_tmp_and_network() {
    let sb = LocalSandbox::start("sbx-basic", &opts("basic")).expect("start sandbox");
    let vm = sb.connect().expect("connect");
    vm.ping().unwrap();

    let r = vm.run("hostname").unwrap();
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stdout_str().trim(), "sbx-basic");

    // The agent is a low pid in a fresh pid namespace; `ps` sees only the
    // sandbox's few processes (init, agent, the shell and ps itself).
    let r = vm.run("echo $$; ps -e -o pid= | wc -l").unwrap();
    assert!(r.success(), "{r:?}");
    let out = r.stdout_str();
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let sh_pid: u32 = lines[0].parse().unwrap();
    let nprocs: u32 = lines[1].parse().unwrap();
    assert!(
        sh_pid < 100,
        "shell pid {sh_pid} is not low: no fresh pid namespace?"
    );
    assert!(nprocs <= 6, "{nprocs} processes visible in the sandbox");
    let status = vm.read_file("/proc/1/status").unwrap();
    assert!(String::from_utf8_lossy(&status).contains("\nPid:\t1\n"));
    assert!(sb.host_pids().len() >= 2, "{:?}", sb.host_pids());
    assert!(sb.host_pids().contains(&sb.init_pid()));

    // Fresh /tmp: empty at start.
    let entries = vm.listdir("/tmp").unwrap();
    assert!(entries.is_empty(), "{entries:?}");

    // Network namespace: only lo, and it is up.
    let r = vm.run("ls /sys/class/net; ip -o link show lo").unwrap();
    assert!(r.success(), "{r:?}");
    let out = r.stdout_str();
    let ifaces: Vec<&str> = out.lines().take_while(|l| !l.contains(':')).collect();
    assert_eq!(ifaces, vec!["lo"], "{out}");
    assert!(out.contains("UP") || out.contains("UNKNOWN"), "{out}");

    // /dev has the basic nodes and they work.
    let r = vm
        .run("head -c 16 /dev/urandom | wc -c; head -c 4 /dev/zero | od -An -tx1; ls /dev/pts/ptmx /dev/shm")
        .unwrap();
    assert!(r.success(), "{r:?}");
    assert!(r.stdout_str().starts_with("16\n"), "{}", r.stdout_str());
}

#[test]
fn writes_inside_never_reach_the_host() {
    let before = mounts();
    let mut sb = LocalSandbox::start("sbx-overlay", &opts("overlay")).expect("start sandbox");
    assert_eq!(
        mounts(),
        before,
        "the sandbox's mounts leaked into the host's namespace"
    );
    let vm = sb.connect().unwrap();
    vm.write_file("/etc/provium-canary", b"inside").unwrap();
    assert_eq!(vm.read_file("/etc/provium-canary").unwrap(), b"inside");
    assert!(
        !std::path::Path::new("/etc/provium-canary").exists(),
        "a write inside the sandbox reached the host's /etc"
    );
    // Host files are visible (read through the overlay).
    assert!(vm.stat("/etc/passwd").is_ok());
    let r = vm.run("rm -f /etc/hostname && echo gone").unwrap();
    assert!(r.success(), "{r:?}");
    assert!(
        std::path::Path::new("/etc/hostname").exists(),
        "deleting /etc/hostname inside removed the host's copy"
    );
    sb.shutdown().unwrap();
}

#[test]
fn teardown_leaves_nothing_behind() {
    let before = mounts();
    let mut sb = LocalSandbox::start("sbx-teardown", &opts("teardown")).expect("start sandbox");
    let vm = sb.connect().unwrap();
    // A background process that would outlive a sloppy teardown.
    let r = vm.run("sleep 1000 >/dev/null 2>&1 & echo started").unwrap();
    assert!(r.success(), "{r:?}");
    let pids = sb.host_pids();
    assert!(pids.len() >= 3, "{pids:?}");
    let socket = sb.socket_path().to_path_buf();
    let dir = sb.dir().to_path_buf();
    let t = std::thread::spawn(move || vm.exec_sleep());
    sb.shutdown().unwrap();
    for pid in &pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "sandbox process {pid} survived teardown"
        );
    }
    assert!(
        !socket.exists() && !dir.exists(),
        "{} left behind",
        dir.display()
    );
    assert_eq!(mounts(), before);
    // The open connection sees the agent go.
    let err = t.join().unwrap().unwrap_err();
    assert!(
        err.to_string().starts_with("agent connection closed"),
        "{err}"
    );
    let err = sb.connect().unwrap_err();
    assert!(err.to_string().contains("shut down"), "{err}");
}

trait SleepExt {
    fn exec_sleep(&self) -> Result<provium::client::RunOutput, provium::client::ClientError>;
}
impl SleepExt for provium::client::AgentClient {
    fn exec_sleep(&self) -> Result<provium::client::RunOutput, provium::client::ClientError> {
        self.run("sleep 1000")
    }
}

#[test]
fn start_fails_clearly_for_a_missing_agent() {
    let mut o = opts("missing");
    o.agent = "/nonexistent/provium-agent".into();
    let err = LocalSandbox::start("sbx-missing", &o).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/provium-agent"),
        "{err}"
    );
}
