//! SIGKILL of `provium` in the middle of a fixture build and in the middle
//! of a snapshot write (local backend) leaves no process, mount, stale lock
//! or partial cache entry, and the next run starts clean: it builds the
//! fixture, installs it and passes, and removes what the killed run left
//! (its sandbox directory, its temporary snapshot files).
//!
//! "Middle": the fixture's VM runs a `sleep` (build) or the run's temporary
//! snapshot file appears while a 256 MiB sandbox is written (snapshot); a
//! host-side marker file, visible inside the sandbox through its overlay
//! root, makes the first run slow and the second one quick. Needs root (the
//! local backend), as in CI.
mod common;

use common::{sandbox_dirs, sandbox_pids};

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Project {
    dir: tempfile::TempDir,
    vm: String,
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
        let p = Project { dir, vm };
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
        Command::new(env!("CARGO_BIN_EXE_provium"))
            .args([
                "--vmm",
                "local",
                "--no-preflight",
                "--config",
                "provium.toml",
            ])
            .current_dir(self.dir.path())
            .env("PROVIUM_AGENT", common::agent())
            .env("PROVIUM_RERUN_STATE", self.path("rerun.json"))
            // Temporary snapshots go here, where the test can see them.
            .env("TMPDIR", self.path("tmp"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn names(&self, rel: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path(rel))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
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
        .names("cache")
        .into_iter()
        .filter(|n| !n.ends_with(".lock") && !n.starts_with('.'))
        .collect();
    assert_eq!(entries, Vec::<String>::new(), "cache entry after SIGKILL");
    // No stale lock: every lock can be taken at once.
    for n in p.names("cache").iter().filter(|n| n.ends_with(".lock")) {
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
    let entries: Vec<String> = p
        .names("cache")
        .into_iter()
        .filter(|n| !n.ends_with(".lock"))
        .collect();
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
