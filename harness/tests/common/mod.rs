//! Helpers shared by the integration tests. Each test crate uses a subset.
#![allow(dead_code)]

pub mod real_guest;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use provium::backend::local;
use provium::settings::Settings;

/// The agent as the harness finds it from this test binary
/// (`target/<profile>/deps/`): beside it or one directory up.
fn locate_agent() -> Result<PathBuf, provium::agent_search::AgentSearchError> {
    local::locate_agent(&Settings::from_env())
}

/// The repository root (the harness crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The agent binary, built on demand so a test never silently runs without
/// one.
pub fn agent() -> PathBuf {
    if let Ok(p) = locate_agent() {
        return p;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "provium-agent"])
        .current_dir(repo_root())
        .status()
        .expect("run cargo build -p provium-agent");
    assert!(status.success(), "cargo build -p provium-agent failed");
    locate_agent().expect("provium-agent after building it")
}

/// Make sure the agent exists (for tests that run the `provium` binary).
pub fn ensure_agent() {
    agent();
}

/// The kernel command line that hides the CPU features this machine's
/// paravirtual KVM cannot emulate (DESIGN.md, "This machine's KVM").
pub const PROBE_CMDLINE: &str = "noxsave nokaslr tsc=reliable \
     clearcpuid=308,141,151,145,158,288,298,306,291,296,156,293";

pub fn env_is_1(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

/// False (after printing why) when the test should skip for lack of KVM;
/// without `PROVIUM_SKIP_KVM=1` a missing /dev/kvm fails the test, since CI
/// machines have one.
pub fn kvm_or_skip(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) if env_is_1("PROVIUM_SKIP_KVM") => {
            eprintln!("SKIP {test}: /dev/kvm is not usable: {e} (PROVIUM_SKIP_KVM=1)");
            false
        }
        Err(e) => panic!(
            "{test}: /dev/kvm is not usable: {e} — set PROVIUM_SKIP_KVM=1 on a machine without KVM"
        ),
    }
}

/// The kernel-probe tier's bzImage (`scripts/build-probe-kernel.sh`), or
/// `PROVIUM_PROBE_KERNEL`. Missing: the test fails saying how to build it,
/// unless `PROVIUM_SKIP_PROBE_KERNEL=1` (then `None`, after printing why).
pub fn probe_kernel(test: &str) -> Option<PathBuf> {
    let path = match std::env::var_os("PROVIUM_PROBE_KERNEL") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target"))
            .join("probe-kernel/bzImage"),
    };
    if path.is_file() {
        return Some(path.canonicalize().expect("canonical kernel path"));
    }
    let why = format!(
        "the probe kernel {} is missing: build it with `scripts/build-probe-kernel.sh` \
         (installs Debian's linux-source-6.1 and build tools if missing; 2.5 min on 2 idle \
         cores, much longer on busy ones), or point PROVIUM_PROBE_KERNEL at a bzImage",
        path.display()
    );
    if env_is_1("PROVIUM_SKIP_PROBE_KERNEL") {
        eprintln!("SKIP {test}: {why} (PROVIUM_SKIP_PROBE_KERNEL=1)");
        return None;
    }
    panic!("{test}: {why}; set PROVIUM_SKIP_PROBE_KERNEL=1 to skip this tier");
}

/// An uncompressed initrd (the probe kernel unpacks it fast) with `/init`
/// and `/dev/console`, written to `dir/initrd.cpio`.
pub fn probe_initrd(dir: &Path) -> PathBuf {
    let mut w = provium_vmm::initrd::CpioWriter::new();
    w.dir("dev", 0o755).unwrap();
    w.char_dev("dev/console", 0o600, 5, 1).unwrap();
    w.file("init", 0o755, b"#!/bin/sh\necho provium probe init\n")
        .unwrap();
    let path = dir.join("initrd.cpio");
    std::fs::write(&path, w.finish()).unwrap();
    path
}

/// The peak resident set (`VmHWM`, KiB) of process `pid`, from
/// /proc/<pid>/status; None once it is gone.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The per-file results of a `provium --json` run's stdout, one JSON
/// object a line; `ctx` (the run's output) goes into any failure.
pub fn json_file_results(stdout: &str, ctx: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{ctx}")))
        .collect()
}

/// The result of file `name` among [`json_file_results`].
pub fn file_result<'a>(
    files: &'a [serde_json::Value],
    name: &str,
    ctx: &str,
) -> &'a serde_json::Value {
    files
        .iter()
        .find(|f| f["path"] == name)
        .unwrap_or_else(|| panic!("no result for {name}\n{ctx}"))
}

/// The event frames a `provium --save-events PATH` run wrote.
pub fn read_events(path: &Path) -> Vec<provium_protocol::EventFrame> {
    use provium_protocol::frame::{read_message, DEFAULT_MAX_FRAME_BYTES};
    let bytes = std::fs::read(path).unwrap();
    let mut r = &bytes[..];
    let mut out = Vec::new();
    while let Some(f) = read_message(&mut r, DEFAULT_MAX_FRAME_BYTES).unwrap() {
        out.push(f);
    }
    out
}

/// Pids of processes the sandbox `vm` runs (the agent's environment holds
/// `PROVIUM_SANDBOX=<vm>`), whose command is `comm` when given.
pub fn sandbox_pids(vm: &str, comm: Option<&str>) -> Vec<u32> {
    let needle = format!("PROVIUM_SANDBOX={vm}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&needle))
        })
        .filter(|pid| {
            comm.is_none_or(|c| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|s| s.trim() == c)
            })
        })
        .collect()
}

/// The local backend's runtime directories of sandbox `vm` (`<vm>-...`).
pub fn sandbox_dirs(vm: &str) -> Vec<String> {
    std::fs::read_dir(provium::backend::local::DEFAULT_RUNTIME_DIR)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{vm}-")))
                .collect()
        })
        .unwrap_or_default()
}

/// A scratch directory of this test process on the root filesystem outside
/// /tmp, `/var/tmp/provium-<what>-<pid>`, for files a local sandbox must see:
/// a sandbox sees the host's root through its overlay but has a /tmp of its
/// own, and the checkout itself may be under /tmp (a CI clone). Directories
/// of earlier test processes that are gone are removed first.
pub fn outside_tmp(what: &str) -> PathBuf {
    let prefix = format!("provium-{what}-");
    for e in std::fs::read_dir("/var/tmp")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&prefix) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let d = PathBuf::from(format!("/var/tmp/{prefix}{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The `provium.toml` of a [`LocalProject`]: tests under `tests/`, one
/// `linux` profile (the local backend boots no kernel).
pub const LOCAL_PROJECT_TOML: &str =
    "[provium]\nroots = [\"tests\"]\n\n[profiles.linux]\ncmdline = \"quiet\"\nguest_os = \"linux\"\n";

/// A throwaway project for running the `provium` binary end to end with
/// the local backend.
pub struct LocalProject {
    dir: tempfile::TempDir,
}

impl LocalProject {
    /// A project with [`LOCAL_PROJECT_TOML`] and `files` (name, body)
    /// under `tests/`.
    pub fn new(files: &[(&str, &str)]) -> LocalProject {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("provium.toml"), LOCAL_PROJECT_TOML).unwrap();
        let p = LocalProject { dir };
        for (name, body) in files {
            p.write(&format!("tests/{name}"), body);
        }
        p
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write `body` at `rel` inside the project, making its directories.
    pub fn write(&self, rel: &str, body: &str) {
        let p = self.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }

    /// [`provium_local`] in this project.
    pub fn run(&self, args: &[&str]) -> Output {
        provium_local(self.path(), args)
    }
}

/// Run the `provium` binary in `dir` with `--vmm local --no-preflight` and
/// `args`, its rerun state kept inside `dir` (`rerun.json`) so runs never
/// share one.
pub fn provium_local(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "--no-preflight"])
        .args(args)
        .current_dir(dir)
        .env("PROVIUM_RERUN_STATE", dir.join("rerun.json"))
        .output()
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exit code, or -1 when a signal ended the process.
pub fn exit_code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}
