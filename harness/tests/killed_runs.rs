//! SIGKILL of `provium` in the middle of a fixture build and in the middle
//! of a snapshot write (local backend), and in the middle of a kvm boot (a
//! fixture build booting a Linux guest), leaves no process, mount, network
//! device or namespace, stale lock, temporary file or partial cache entry,
//! and the next run starts clean: on the local backend it builds the
//! fixture, installs it and passes, and removes what the killed run left
//! (its sandbox directory, its temporary snapshot files); on kvm it takes
//! the build lock at once and boots a fresh VM (see
//! `sigkill_mid_kvm_boot_leaves_nothing_and_the_next_run_boots_at_once`).
//!
//! "Middle": the fixture's VM runs a `sleep` (build) or the run's temporary
//! snapshot file appears while a 256 MiB sandbox is written (snapshot); a
//! host-side marker file, visible inside the sandbox through its overlay
//! root, makes the first run slow and the second one quick. On kvm, a few
//! seconds after the VM's vCPU exists, long before an emulated kernel
//! reaches init. Needs root (the local backend) and /dev/kvm, as in CI.
mod common;

use common::{sandbox_dirs, sandbox_pids};

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Project {
    dir: tempfile::TempDir,
    vm: String,
    /// `--vmm`: "local" or "kvm".
    vmm: &'static str,
}

impl Project {
    /// The fixture `fixtures/fx` boots VM `vm`; while `marker` exists it
    /// runs `slow` inside before snapshotting.
    fn new(kind: &str, slow: &str) -> Project {
        common::ensure_agent();
        // Outside /tmp (the sandbox has a /tmp of its own, and a checkout
        // may be under /tmp): the sandbox sees the marker through its
        // overlay of the host's root.
        let base = common::outside_tmp("killed-runs");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{kind}-"))
            .tempdir_in(&base)
            .unwrap();
        let vm = format!("kill-{kind}-{:x}", std::process::id());
        let p = Project {
            dir,
            vm,
            vmm: "local",
        };
        std::fs::write(
            p.path("provium.toml"),
            "[provium]\nroots = [\".\"]\ncache_dir = \"cache\"\n\n[profiles.linux]\ncmdline = \"quiet\"\nguest_os = \"linux\"\n",
        )
        .unwrap();
        std::fs::create_dir_all(p.path("fixtures")).unwrap();
        std::fs::create_dir_all(p.path("tmp")).unwrap();
        std::fs::write(p.marker(), "slow").unwrap();
        std::fs::write(
            p.path("fixtures/fx.fixture.lua"),
            format!(
                "local vm = provium:vm(\"{}\", \"linux\"):boot()\nvm:write_file(\"/srv/fx\", \"built\")\nvm:run(\"if [ -e {} ]; then {slow}; fi\")\nreturn vm:snapshot()\n",
                p.vm,
                p.marker().display()
            ),
        )
        .unwrap();
        std::fs::write(
            p.path("uses.test.lua"),
            "test(\"uses the fixture\", function(t)\n  t:assert_eq(provium:vm_fixture(\"fixtures/fx\"):read_file(\"/srv/fx\"), \"built\")\nend)\n",
        )
        .unwrap();
        p
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn marker(&self) -> PathBuf {
        self.path("slow.marker")
    }

    fn spawn(&self) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_provium"));
        cmd.args([
            "--vmm",
            self.vmm,
            "--no-preflight",
            "--config",
            "provium.toml",
        ])
        .current_dir(self.dir.path())
        .env("PROVIUM_RERUN_STATE", self.path("rerun.json"))
        // Temporary snapshots go here, where the test can see them.
        .env("TMPDIR", self.path("tmp"))
        // The kvm backend's merged initrds (agent overlay) too.
        .env("PROVIUM_OVERLAY_CACHE", self.path("overlay-cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if self.vmm == "local" {
            cmd.env("PROVIUM_AGENT", common::agent());
        }
        cmd.spawn().unwrap()
    }

    /// The fixture cache's lock files (`locks`), or all its other files.
    fn cache_files(&self, locks: bool) -> Vec<String> {
        self.names("cache")
            .into_iter()
            .filter(|n| n.ends_with(".lock") == locks)
            .collect()
    }

    fn names(&self, rel: &str) -> Vec<String> {
        sorted_names(&self.path(rel))
    }
}

/// The names in directory `dir`, sorted; none if it cannot be read.
fn sorted_names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn wait_until(what: &str, child: &mut Child, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("provium exited ({status}) before {what}: {err}");
        }
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL `child`, then check what it leaves behind.
fn kill_and_check(p: &Project, mut child: Child, mounts_before: &[String]) {
    let pid = child.id();
    // SAFETY: kill of our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    // The sandbox dies with its owner (PDEATHSIG); its processes, and with
    // them its namespaces, go.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sandbox_pids(&p.vm, None).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sandbox processes survived the SIGKILL: {:?}",
            sandbox_pids(&p.vm, None)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(mounts(), mounts_before, "host mounts changed");
    // No cache entry, partial or whole: only lock files (and temporaries of
    // the dead writer, which the next run sweeps).
    let entries: Vec<String> = p
        .cache_files(false)
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(entries, Vec::<String>::new(), "cache entry after SIGKILL");
    // No stale lock: every lock can be taken at once.
    for n in &p.cache_files(true) {
        let f = std::fs::File::open(p.path("cache").join(n)).unwrap();
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(rc, 0, "lock {n} still held after SIGKILL");
    }
}

/// The next run, quick (marker gone): passes, and leaves nothing of the
/// killed run behind.
fn next_run_is_clean(p: &Project, killed_pid: u32) {
    std::fs::remove_file(p.marker()).unwrap();
    let out = p.spawn().wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let entries: Vec<String> = p.cache_files(false);
    assert_eq!(entries.len(), 1, "one installed entry: {entries:?}");
    assert!(!entries[0].starts_with('.'), "{entries:?}");
    let dead = format!("-{killed_pid}-");
    let left: Vec<String> = p
        .names("tmp")
        .into_iter()
        .filter(|n| n.contains(&dead))
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "temporaries of the killed run left"
    );
    assert_eq!(
        sandbox_dirs(&p.vm),
        Vec::<String>::new(),
        "sandbox dir left"
    );
}

#[test]
fn sigkill_mid_fixture_build_leaves_nothing_and_the_next_run_builds() {
    let p = Project::new("build", "sleep 300");
    let mounts_before = mounts();
    let mut child = p.spawn();
    let pid = child.id();
    let vm = p.vm.clone();
    wait_until("the fixture's sleep ran", &mut child, || {
        !sandbox_pids(&vm, Some("sleep")).is_empty()
    });
    kill_and_check(&p, child, &mounts_before);
    next_run_is_clean(&p, pid);
}

#[test]
fn sigkill_mid_snapshot_write_leaves_nothing_and_the_next_run_builds() {
    // 256 MiB in the sandbox's /tmp: capturing and writing it takes long
    // enough to be caught in the act.
    let p = Project::new(
        "snapshot",
        "dd if=/dev/urandom of=/tmp/big bs=1M count=256 status=none",
    );
    let mounts_before = mounts();
    let mut child = p.spawn();
    let pid = child.id();
    let tmp = p.path("tmp");
    let writing = format!(".provium-{pid}-");
    wait_until("the snapshot write started", &mut child, || {
        std::fs::read_dir(&tmp).is_ok_and(|d| {
            d.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(&writing)
                    && e.metadata().is_ok_and(|m| m.len() > 0)
            })
        })
    });
    kill_and_check(&p, child, &mounts_before);
    // The killed write's temporary is still there (nobody could delete it)…
    assert!(
        p.names("tmp").iter().any(|n| n.starts_with(&writing)),
        "{:?}",
        p.names("tmp")
    );
    // …and the next run sweeps it.
    next_run_is_clean(&p, pid);
}

/// The Linux guest the kvm case boots: `PROVIUM_TEST_KERNEL` and
/// `PROVIUM_TEST_INITRD`, or the probe kernel and busybox initrd `.ci/run`
/// builds (as the real-guest tier, `real_kernel.rs`, finds them). Missing,
/// the test fails saying how to build them, unless
/// `PROVIUM_SKIP_REAL_GUEST=1` (or no /dev/kvm and `PROVIUM_SKIP_KVM=1`):
/// then `None`, after printing why.
fn linux_guest(test: &str) -> Option<(PathBuf, PathBuf)> {
    if let Some(kernel) = std::env::var_os("PROVIUM_TEST_KERNEL") {
        let initrd = std::env::var_os("PROVIUM_TEST_INITRD").unwrap_or_else(|| {
            panic!("{test}: PROVIUM_TEST_KERNEL is set but PROVIUM_TEST_INITRD is not; set both")
        });
        return Some((PathBuf::from(kernel), PathBuf::from(initrd)));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("target"));
    let wanted = [
        (
            target.join("probe-kernel/vmlinux"),
            "scripts/build-probe-kernel.sh",
        ),
        (
            target.join("guest-initrd/initrd.cpio"),
            "scripts/build-guest-initrd.sh",
        ),
    ];
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(p, _)| !p.is_file())
        .map(|(p, script)| format!("{} (build it with `{script}`)", p.display()))
        .collect();
    if missing.is_empty() {
        let [(kernel, _), (initrd, _)] = wanted;
        return Some((
            kernel.canonicalize().unwrap(),
            initrd.canonicalize().unwrap(),
        ));
    }
    let why = format!(
        "a kvm boot to kill needs {} (.ci/run builds both), or PROVIUM_TEST_KERNEL and PROVIUM_TEST_INITRD",
        missing.join(" and ")
    );
    if common::env_is_1("PROVIUM_SKIP_REAL_GUEST") {
        eprintln!("SKIP {test}: {why} (PROVIUM_SKIP_REAL_GUEST=1)");
        return None;
    }
    if !common::kvm_or_skip(test) {
        return None;
    }
    panic!("{test}: {why}; set PROVIUM_SKIP_REAL_GUEST=1 to skip it");
}

impl Project {
    /// The fixture `fixtures/fx` boots VM `vm` on the kvm backend from
    /// `kernel` and `initrd`, then snapshots it.
    fn kvm(kernel: &std::path::Path, initrd: &std::path::Path) -> Project {
        let base = common::outside_tmp("killed-runs");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("kvm-boot-")
            .tempdir_in(&base)
            .unwrap();
        let p = Project {
            dir,
            vm: format!("kill-kvm-{:x}", std::process::id()),
            vmm: "kvm",
        };
        std::fs::write(
            p.path("provium.toml"),
            format!(
                "[provium]\nroots = [\".\"]\ncache_dir = \"cache\"\n\n[profiles.linux]\nkernel = {:?}\ninitrd = {:?}\ncmdline = \"console=ttyS0\"\nguest_os = \"linux\"\n",
                kernel.display().to_string(),
                initrd.display().to_string(),
            ),
        )
        .unwrap();
        for d in ["fixtures", "tmp", "overlay-cache"] {
            std::fs::create_dir_all(p.path(d)).unwrap();
        }
        std::fs::write(
            p.path("fixtures/fx.fixture.lua"),
            format!(
                "local vm = provium:vm(\"{}\", \"linux\"):boot()\nreturn vm:snapshot()\n",
                p.vm
            ),
        )
        .unwrap();
        std::fs::write(
            p.path("uses.test.lua"),
            "test(\"uses the fixture\", function(t)\n  t:assert(provium:vm_fixture(\"fixtures/fx\"))\nend)\n",
        )
        .unwrap();
        p
    }
}

/// Whether process `pid` holds a vCPU of a KVM VM (the VMM runs in
/// `provium`'s process: a vCPU fd means the VM was built and is booting).
fn has_vcpu(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| {
        d.flatten().any(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("anon_inode:kvm-vcpu"))
        })
    })
}

/// Processes whose working directory is in `dir` (the runs' cwd is the
/// project directory; whatever they spawned inherits it).
fn processes_in(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c.starts_with(dir))
        })
        .collect()
}

/// The host's network devices and named network namespaces.
fn network_state() -> (Vec<String>, Vec<String>) {
    (
        sorted_names("/sys/class/net".as_ref()),
        sorted_names("/run/netns".as_ref()),
    )
}

/// Spawns a kvm run, waits until its VM's vCPU exists, lets the boot run
/// for `into_boot`, checks the run is still going, and SIGKILLs it; then
/// checks it left nothing. Returns the run's pid and stderr.
fn kill_kvm_boot(p: &Project, into_boot: Duration) -> (u32, String) {
    let mounts_before = mounts();
    let network_before = network_state();
    let started = Instant::now();
    let mut child = p.spawn();
    let pid = child.id();
    wait_until("the fixture's VM was spawned", &mut child, || has_vcpu(pid));
    let spawned = started.elapsed();
    std::thread::sleep(into_boot);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended within {into_boot:?} of the VM's spawn: no boot to kill"
    );
    // The build holds the fixture's lock while its VM boots.
    let locks: Vec<String> = p.cache_files(true);
    assert_eq!(locks.len(), 1, "one build lock: {locks:?}");
    let lock = std::fs::File::open(p.path("cache").join(&locks[0])).unwrap();
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, -1, "the booting build does not hold its lock");
    drop(lock);
    let mut stderr = child.stderr.take().unwrap();
    kill_and_check(p, child, &mounts_before);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    eprintln!("kvm run {pid}: VM spawned {spawned:?} after the start, killed {into_boot:?} later");
    assert_eq!(
        processes_in(p.dir.path()),
        Vec::<u32>::new(),
        "processes left"
    );
    assert_eq!(
        network_state(),
        network_before,
        "network devices or namespaces left"
    );
    // Killed before any snapshot: not even a temporary in the fixture
    // cache (only lock files) or the temp directory.
    let cache: Vec<String> = p.cache_files(false);
    assert_eq!(cache, Vec::<String>::new(), "fixture cache after SIGKILL");
    assert_eq!(
        p.names("tmp"),
        Vec::<String>::new(),
        "temporaries after SIGKILL"
    );
    // The overlay cache holds whole merged initrds only (written under a
    // temporary name and renamed into place before the VM is built).
    let overlays = p.names("overlay-cache");
    assert!(
        !overlays.is_empty()
            && overlays
                .iter()
                .all(|n| n.ends_with(".cpio") && !n.starts_with('.')),
        "overlay cache after SIGKILL: {overlays:?}"
    );
    (pid, err)
}

#[test]
fn sigkill_mid_kvm_boot_leaves_nothing_and_the_next_run_boots_at_once() {
    let test = "sigkill_mid_kvm_boot_leaves_nothing_and_the_next_run_boots_at_once";
    let Some((kernel, initrd)) = linux_guest(test) else {
        return;
    };
    let p = Project::kvm(&kernel, &initrd);
    let (_, first_err) = kill_kvm_boot(&p, Duration::from_secs(3));
    assert!(!first_err.contains("panicked"), "{first_err}");
    // The next run starts clean. Its only VM is the fixture's, which it
    // boots only once it holds the build lock (a lock still held would
    // have it wait and retry, forever), and the cache holds no entry it
    // could restore instead; so its vCPU appearing, with the lock file the
    // killed run held now held by it (checked in `kill_kvm_boot`), proves
    // the lock was free and nothing of the killed run was in the way. It is
    // killed in turn, which leaves nothing either. (Its full boot, minutes
    // of emulated kernel on kvm_pvm, is not waited for: the real-guest tier
    // boots, snapshots and restores through this fixture path.)
    let (_, second_err) = kill_kvm_boot(&p, Duration::from_secs(1));
    assert!(!second_err.contains("panicked"), "{second_err}");
}
