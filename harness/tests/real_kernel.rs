//! The real-guest tier (tests/README.md, tier 6): Lua files driving the
//! agent inside a Linux guest on the `kvm` backend, through the real
//! `provium` binary.
//!
//! The guest and when the tier skips: harness/tests/common/real_guest.rs.
//!
//! `tests/lua/linux/` is the suite, run with a fresh fixture cache: the
//! first file that asks for the `base` fixture boots it once and snapshots
//! it into the cache, and every other file restores it, so fixture restore
//! is proven for real; `devices.test.lua` boots its own two VMs with a disk
//! and NICs from boot (`hotplug.test.lua` gives restored guests theirs after
//! boot, in the profile's disk and NIC slots). On this project's machines (kvm_pvm) guest
//! kernel code is emulated: the suite takes minutes, and the dispatcher runs
//! one VM per host core.
//!
//! `tests/lua/linux-console/` is the same guest with the agent on the
//! virtio-console channel (`agent_channel = "console"`): its own base
//! fixture, built once and restored by each test, and a snapshot in the
//! middle of a session. The tier's tests take [`BOOTS`] so their guests
//! never boot at once.
//!
//! The guest kernel here is distro-shaped (scripts/build-probe-kernel.sh
//! --modular): virtio, its transports, vsock, blk, net, rng and console are
//! modules, discovered through ACPI (no `virtio_mmio.device=` words), and
//! each test first checks (`kernel check`) that its channel and devices are
//! among the modules the harness packs, so the suite passing proves the
//! agent loaded them from its overlay. The two suites cover both virtio
//! transports in one boot each: `tests/lua/linux` over virtio-pci (MSI-X),
//! `tests/lua/linux-console` over virtio-mmio.
//!
//! On hardware KVM with a user's kernel, the local-backend suites under
//! tests/lua (guest, network, snapshots, disks) must pass on kvm too; they
//! boot a VM per file, which an emulated kernel cannot afford, so they run
//! only there.

mod common;

use common::real_guest::{guest, profile, static_guest_binary, write_overlay, Guest};
use common::{ensure_agent, read_events, repo_root};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Held by each test of the tier for its run: one emulated guest kernel at
/// a time is what this tier's machines afford.
static BOOTS: Mutex<()> = Mutex::new(());

fn boots() -> std::sync::MutexGuard<'static, ()> {
    BOOTS.lock().unwrap_or_else(|e| e.into_inner())
}

use provium_protocol::event::{Event, EventFrame};
use provium_vmm::initrd::inject::BootFile;

/// The local-backend suites that also run on the kvm backend where boots
/// are cheap (hardware KVM with a user's kernel).
const HARDWARE_SUITES: &[&str] = &["guest", "network", "snapshots", "disks"];

/// The tier's own suite, the files in it that restore the base fixture
/// (`vm_fixture`), and the file that restores the lab fixture `pair`
/// (`lab_fixture`: VMs `a` and `b` on a bridge).
const LINUX_SUITE: &str = "tests/lua/linux";
/// The console channel's suite.
const CONSOLE_SUITE: &str = "tests/lua/linux-console";
const LAB_FIXTURE_FILE: &str = "devices.test.lua";
const FIXTURE_FILES: &[&str] = &[
    "files.test.lua",
    "hotplug.test.lua",
    "machine.test.lua",
    "reset.test.lua",
    "run.test.lua",
];

/// What the prebuilt agent overlay puts at [`OVERLAY_MARKER_PATH`]: the
/// pair fixture's guests read it back, which proves the kvm backend booted
/// them from the overlay as it is (`agent_overlay_path`), not from an
/// overlay it built.
const OVERLAY_MARKER: &str = "prebuilt agent overlay\n";
const OVERLAY_MARKER_PATH: &str = "/etc/provium-prebuilt-overlay";

/// A prebuilt agent overlay (what a user ships as `agent_overlay_path`):
/// the static guest agent harness/build.rs built, plus the marker file.
fn prebuilt_overlay(dir: &Path) -> PathBuf {
    let agent = static_guest_binary(option_env!("PROVIUM_GUEST_AGENT"), "guest agent");
    let marker = BootFile {
        path: OVERLAY_MARKER_PATH.into(),
        content: OVERLAY_MARKER.as_bytes().to_vec(),
        mode: 0o644,
    };
    write_overlay(&dir.join("agent-overlay.cpio"), &agent, &[marker])
}

/// A provium.toml whose `linux` profile (the one every suite asks for) is
/// `guest`, with a fresh fixture cache under `dir`; `linux-overlay` is the
/// same guest with a [`prebuilt_overlay`] (the pair fixture boots it).
fn config(dir: &Path, guest: &Guest, root: &Path) -> PathBuf {
    config_with(dir, guest, root, PCI, "")
}

/// [`config`] over `transport`, with `extra` lines in the `linux` profile.
fn config_with(dir: &Path, guest: &Guest, root: &Path, transport: &str, extra: &str) -> PathBuf {
    let profile = format!("{}{extra}", profile(guest, transport));
    let path = dir.join("provium.toml");
    std::fs::write(
        &path,
        format!(
            "[provium]\nroots = [{root:?}]\ncache_dir = {cache:?}\n\n[profiles.linux]\n{profile}\n\
             [profiles.linux-overlay]\n{profile}agent_overlay_path = {overlay:?}\n",
            root = root.display().to_string(),
            cache = dir.join("cache").display().to_string(),
            overlay = prebuilt_overlay(dir).display().to_string(),
        ),
    )
    .unwrap();
    path
}

/// `provium --vmm kvm -v --config CONFIG DIR [extra]`: exit code and output.
fn provium(config: &Path, dir: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        // Per-file budget: a file that builds the base fixture boots a whole
        // emulated kernel first (minutes on kvm_pvm), past the 300 s default.
        .args(["--vmm", "kvm", "-v", "--timeout", "2400s", "--config"])
        .arg(config)
        .args(extra)
        .arg(dir)
        .current_dir(repo_root())
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), out)
}

#[test]
fn the_linux_suite_passes_in_real_guests() {
    let test = "the_linux_suite_passes_in_real_guests";
    let Some(guest) = guest(test) else {
        return;
    };
    let _boots = boots();
    assert_packs_modules(
        &guest,
        &[
            "virtio_pci",
            "vsock",
            "vmw_vsock_virtio_transport",
            "virtio_blk",
            "virtio_net",
            "virtio_rng",
        ],
    );
    let events = run_suite(&guest, LINUX_SUITE, PCI);
    // Each fixture was booted once, into the empty cache, and every file
    // that asks for one got VMs restored from its cache entry.
    let mut builds: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::FixtureBuildStarted(b) => Some(b.path.as_str()),
            _ => None,
        })
        .collect();
    builds.sort_unstable();
    assert_eq!(builds, ["base", "pair"], "one build of each fixture");
    for vm in ["a", "b"] {
        assert!(
            events.iter().any(|e| matches!(&e.event,
                Event::VmSpawned(v) if v.file == LAB_FIXTURE_FILE && v.vm_name == vm)),
            "{LAB_FIXTURE_FILE} got no VM `{vm}` restored from the lab fixture"
        );
    }
    for file in FIXTURE_FILES {
        assert!(
            events.iter().any(|e| matches!(&e.event,
                Event::VmSpawned(v) if v.file == *file && v.vm_name == "base")),
            "{file} got no VM restored from the base fixture"
        );
    }
    // Every test the suite's files declare passed: none was lost to a
    // file that stopped early or a test that never ran.
    let passed = events
        .iter()
        .filter(|e| matches!(&e.event, Event::TestPassed(_)))
        .count();
    let declared = declared_tests(&repo_root().join(LINUX_SUITE));
    assert!(declared > 0, "no test( declarations found in {LINUX_SUITE}");
    assert_eq!(
        passed, declared,
        "tests passed vs tests declared in {LINUX_SUITE}"
    );
}

/// The agent on the virtio-console channel: the console suite's base
/// fixture is booted once with `agent_channel = "console"` (no vsock device)
/// and restored by its tests, which run commands with stdin and streams,
/// move files bigger than the port's buffers, use workers and batches, and
/// snapshot in the middle of a session (the original goes on, each restore
/// starts a fresh session). The harness says which channel it used.
#[test]
fn the_agent_serves_over_the_console_channel() {
    let test = "the_agent_serves_over_the_console_channel";
    let Some(guest) = guest(test) else {
        return;
    };
    let _boots = boots();
    assert_packs_modules(&guest, &["virtio_mmio", "virtio_console"]);
    let (events, out) =
        run_suite_with(&guest, CONSOLE_SUITE, MMIO, "agent_channel = \"console\"\n");
    assert!(
        out.contains("provium: agent channel: console"),
        "the harness did not say it used the console channel"
    );
    assert!(
        !out.contains("provium: agent channel: vsock"),
        "a VM of the console profile was reached over vsock"
    );
    let builds: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::FixtureBuildStarted(b) => Some(b.path.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(builds, ["base"], "one build of the console fixture");
    let passed = events
        .iter()
        .filter(|e| matches!(&e.event, Event::TestPassed(_)))
        .count();
    let declared = declared_tests(&repo_root().join(CONSOLE_SUITE));
    assert!(
        declared > 0,
        "no test( declarations found in {CONSOLE_SUITE}"
    );
    assert_eq!(
        passed, declared,
        "tests passed vs declared in {CONSOLE_SUITE}"
    );
}

/// `provium exec` (issue 25) as a user's first line runs it: the tier's
/// kernel, no provium.toml, no `--initrd` (the initrd is the agent alone,
/// which as PID 1 mounts /proc, /sys and /dev and, on the distro-shaped
/// kernel, loads vsock, its virtio transport and virtio-mmio from its
/// overlay: no Hello otherwise), one command through the agent, its stdout
/// streamed back and its exit code provium's. The wall time is printed:
/// docs/benchmarking.md compares it with vmtest's and vng's (emulated kernel
/// here). `exec --vmm local` (harness/tests/own_kernel.rs) covers stderr and
/// a non-zero exit through the same client code.
#[test]
fn exec_boots_the_kernel_and_runs_one_command() {
    let test = "exec_boots_the_kernel_and_runs_one_command";
    let Some(guest) = guest(test) else {
        return;
    };
    let _boots = boots();
    ensure_agent();
    let start = std::time::Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["exec", "--vmm", "kvm", "--kernel"])
        .arg(&guest.kernel)
        .args(["--", "/sbin/provium-agent", "--version"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    let wall = start.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    eprintln!(
        "provium exec on {} ({}): {:.1} s wall, kvm_pvm: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        guest.kernel.display(),
        guest.kernel_kind(),
        wall.as_secs_f64(),
        provium::settings::Settings::from_env().host_kvm_pvm,
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "provium exec failed (output above)"
    );
    assert!(
        stdout.starts_with("provium-agent "),
        "the command's stdout did not come back"
    );
}

/// How many top-level `test("...", ...)` declarations the suite's test
/// files hold: the number of tests a full, green run passes.
fn declared_tests(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".test.lua"))
        .map(|p| {
            std::fs::read_to_string(&p)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("test("))
                .count()
        })
        .sum()
}

/// The two virtio transports, each covered by one suite of the tier.
const PCI: &str = "pci";
const MMIO: &str = "mmio";

/// On the distro-shaped kernel, asserts that `kernel check` finds that a
/// boot can reach the agent and that each of `modules` is a module the
/// harness packs into the agent overlay: the suite that follows then
/// passes only if the agent loaded them. A user's kernel may have them
/// built in, so it is not checked.
fn assert_packs_modules(guest: &Guest, modules: &[&str]) {
    if guest.users {
        return;
    }
    let report = provium::kernel::check(&guest.kernel, None).unwrap();
    assert!(report.can_reach_agent(), "{}", report.render());
    let packed: Vec<&str> = report.modules.iter().map(|m| m.name.as_str()).collect();
    for m in modules {
        assert!(
            packed.contains(m),
            "{m} is not a module the agent loads (the tier's kernel must be \
             scripts/build-probe-kernel.sh --modular): {packed:?}\n{}",
            report.render()
        );
    }
}

/// Runs `suite` (relative to the repository) over `transport` with a fresh
/// fixture cache, prints its output, asserts it passed, and returns its
/// events.
fn run_suite(guest: &Guest, suite: &str, transport: &str) -> Vec<EventFrame> {
    run_suite_with(guest, suite, transport, "").0
}

/// [`run_suite`] with `extra` profile lines; also returns the output.
fn run_suite_with(
    guest: &Guest,
    suite: &str,
    transport: &str,
    extra: &str,
) -> (Vec<EventFrame>, String) {
    ensure_agent();
    let scratch = tempfile::tempdir().unwrap();
    let dir = repo_root().join(suite);
    let config = config_with(scratch.path(), guest, &dir, transport, extra);
    let events = scratch.path().join("events.bin");
    let (code, out) = provium(&config, &dir, &["--save-events", events.to_str().unwrap()]);
    let kernel = guest.kernel_kind();
    eprintln!(
        "== {suite} on the kvm backend ({kernel}, virtio-{transport}; kvm_pvm: {}): exit {code:?}\n{out}",
        provium::settings::Settings::from_env().host_kvm_pvm,
    );
    assert_eq!(
        code,
        Some(0),
        "{suite} failed on the kvm backend (output above)"
    );
    (read_events(&events), out)
}

#[test]
fn the_local_suites_pass_on_the_kvm_backend_with_a_users_kernel() {
    let test = "the_local_suites_pass_on_the_kvm_backend_with_a_users_kernel";
    if std::env::var_os("PROVIUM_TEST_KERNEL").is_none()
        || provium::settings::Settings::from_env().host_kvm_pvm
    {
        eprintln!(
            "SKIP {test}: these suites boot a VM per file, which needs hardware KVM and a user's \
             kernel (PROVIUM_TEST_KERNEL, PROVIUM_TEST_INITRD with a shell, coreutils, ip and \
             ping); kvm_pvm: {}",
            provium::settings::Settings::from_env().host_kvm_pvm
        );
        return;
    }
    let Some(guest) = guest(test) else {
        return;
    };
    let _boots = boots();
    ensure_agent();
    let scratch = tempfile::tempdir().unwrap();
    let config = config(scratch.path(), &guest, &repo_root().join("tests/lua"));
    let mut failed = Vec::new();
    for suite in HARDWARE_SUITES {
        let (code, out) = provium(&config, &repo_root().join("tests/lua").join(suite), &[]);
        eprintln!("== suite {suite}: exit {code:?}\n{out}");
        if code != Some(0) {
            failed.push(*suite);
        }
    }
    assert!(
        failed.is_empty(),
        "suites failing on the kvm backend: {failed:?} (output above)"
    );
}
