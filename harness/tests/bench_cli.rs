//! `provium bench` end to end: boot (the tiny guest, and the probe kernel up
//! to "Run /init"), restore of a local vm_fixture, agent ops on the local
//! backend, the JSON shape, and `--compare` exit codes.
//!
//! Shapes and behaviour only: no timing value is asserted (a slow machine
//! must not fail these). Like the other tiers: the boot tests need /dev/kvm
//! (`PROVIUM_SKIP_KVM=1` skips them, printing why, where there is none); the
//! probe-kernel test needs `target/probe-kernel/bzImage` (or
//! `PROVIUM_PROBE_KERNEL`) and fails saying how to build it unless
//! `PROVIUM_SKIP_PROBE_KERNEL=1`; restore and ops need root and the agent,
//! as every local-backend test does.
mod common;

use common::ensure_agent;
use common::{kvm_or_skip, probe_kernel};

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const BOOT_PHASES: [&str; 7] = [
    "vm_create",
    "vmm_setup",
    "kernel_to_console",
    "kernel_to_init",
    "kernel_to_ready",
    "kernel_to_agent_hello",
    "start_to_console",
];

/// DESIGN.md's command line for Linux guests on kvm_pvm.
const PROBE_CMDLINE: &str = "console=ttyS0 noxsave nokaslr tsc=reliable \
     clearcpuid=308,141,151,145,158,288,298,306,291,296,156,293";

fn provium(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run provium")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json_lines(o: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {e}: {l}")))
        .collect()
}

fn phase<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["phase"] == name)
        .unwrap_or_else(|| panic!("no phase {name} in {lines:#?}"))
}

/// Every object has the documented fields; available ones have ordered
/// statistics over `n` raw samples, unavailable ones a reason and no numbers.
fn check_shape(lines: &[Value], bench: &str, runs: usize) {
    assert!(!lines.is_empty());
    for l in lines {
        assert_eq!(l["schema"], "provium-bench/1", "{l}");
        assert_eq!(l["bench"], bench, "{l}");
        assert!(l["target"].is_string(), "{l}");
        assert!(l["phase"].is_string() && l["what"].is_string(), "{l}");
        assert!(l["source"].is_string(), "{l}");
        assert!(l["unit"] == "ns" || l["unit"] == "bytes", "{l}");
        assert_eq!(l["runs"], runs, "{l}");
        assert!(l["warmup"].is_u64(), "{l}");
        for k in ["kernel", "kvm", "cpu_model", "arch", "provium_version"] {
            assert!(l["host"][k].is_string(), "host.{k}: {l}");
        }
        assert!(l["host"]["nproc"].as_u64().is_some_and(|n| n > 0), "{l}");
        assert!(l["host"]["loadavg"].is_array(), "{l}");
        assert!(l["guest"].is_object(), "{l}");
        if l["available"] == true {
            assert!(l["reason"].is_null(), "{l}");
            let samples: Vec<u64> = l["samples"]
                .as_array()
                .expect("samples")
                .iter()
                .map(|v| v.as_u64().expect("integer sample"))
                .collect();
            assert_eq!(l["n"], samples.len(), "{l}");
            assert!(!samples.is_empty());
            let g = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k}: {l}"));
            assert_eq!(g("min"), *samples.iter().min().expect("some"));
            assert_eq!(g("max"), *samples.iter().max().expect("some"));
            assert!(g("min") <= g("median") && g("median") <= g("p90"), "{l}");
            assert!(g("p90") <= g("p99") && g("p99") <= g("max"), "{l}");
            assert!(l["mean"].is_number() && l["noisy"].is_boolean(), "{l}");
        } else {
            assert_eq!(l["available"], false, "{l}");
            assert!(l["reason"].as_str().is_some_and(|r| !r.is_empty()), "{l}");
            assert_eq!(l["n"], 0, "{l}");
            assert_eq!(l["samples"], serde_json::json!([]), "{l}");
            for k in ["min", "median", "p90", "p99", "max", "mean"] {
                assert!(l[k].is_null(), "{k}: {l}");
            }
        }
    }
}

/// A successful `bench boot --json`'s lines: every boot phase, in order,
/// each of the shape `check_shape` wants for `runs` samples.
fn boot_lines(o: &Output, runs: usize) -> Vec<Value> {
    assert_eq!(o.status.code(), Some(0), "{}", text(o));
    let lines = json_lines(o);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["phase"].as_str().expect("phase"))
        .collect();
    assert_eq!(names, BOOT_PHASES);
    check_shape(&lines, "boot", runs);
    lines
}

#[test]
fn boot_tiny_guest_json_has_every_phase() {
    if !kvm_or_skip("boot_tiny_guest_json_has_every_phase") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let o = provium(
        dir.path(),
        &[
            "bench",
            "boot",
            "--tiny-guest",
            "-n",
            "3",
            "--warmup",
            "1",
            "--json",
        ],
    );
    let lines = boot_lines(&o, 3);
    for l in &lines {
        assert_eq!(l["target"], "tiny-guest");
        assert_eq!(l["unit"], "ns");
        assert_eq!(l["warmup"], 1);
    }
    for p in [
        "vm_create",
        "vmm_setup",
        "kernel_to_console",
        "kernel_to_ready",
        "start_to_console",
    ] {
        let l = phase(&lines, p);
        assert_eq!(l["available"], true, "{l}");
        assert_eq!(l["n"], 3, "{l}");
    }
    assert_eq!(phase(&lines, "vmm_setup")["source"], "vmm");
    let init = phase(&lines, "kernel_to_init");
    assert_eq!(init["available"], false);
    assert!(init["reason"]
        .as_str()
        .expect("reason")
        .contains("not Linux"));
    let hello = phase(&lines, "kernel_to_agent_hello");
    assert!(hello["reason"]
        .as_str()
        .expect("reason")
        .contains("no agent"));
    let guest = &lines[0]["guest"];
    assert_eq!(guest["kernel_version"], "PROVIUM-TINY-GUEST v1", "{guest}");
    assert_eq!(guest["until"], "ready");
    // Every sampled boot is accounted for: it took a VM the bench's pool
    // prepared, or built its own (a pool never makes a boot wait).
    let pool = &guest["prepared_vms"];
    assert_eq!(pool["used"], true, "{guest}");
    let counted = pool["sampled_boots_prepared"].as_u64().expect("prepared")
        + pool["sampled_boots_built"].as_u64().expect("built");
    assert_eq!(counted, 3, "{pool}");
    assert!(pool["stopped_because"].is_null(), "{pool}");

    // --no-prepared: every boot builds its own, and the report says so.
    let o = provium(
        dir.path(),
        &[
            "bench",
            "boot",
            "--tiny-guest",
            "-n",
            "2",
            "--warmup",
            "0",
            "--no-prepared",
            "--json",
        ],
    );
    let lines = boot_lines(&o, 2);
    assert_eq!(
        lines[0]["guest"]["prepared_vms"]["used"], false,
        "{}",
        lines[0]
    );
    assert_eq!(phase(&lines, "vmm_setup")["n"], 2);
}

/// A profile boots through the kvm backend's config builder: with the agent
/// injected its cmdline tells the agent the boot-timer port, without it
/// not, and the Hello phase says why it was not measured. The tiny guest's
/// bzImage stands in for a kernel (it ignores the initrd and cmdline), and
/// a non-ELF executable for the agent (injection only copies its bytes).
#[test]
fn boot_profile_injects_the_agent_with_the_boot_timer_port() {
    if !kvm_or_skip("boot_profile_injects_the_agent_with_the_boot_timer_port") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bzImage"), provium_vmm::tiny_guest::BZIMAGE).expect("kernel");
    let agent = dir.path().join("fake-agent");
    std::fs::write(&agent, b"#!/bin/sh\n").expect("agent");
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    for inject in [true, false] {
        std::fs::write(
            dir.path().join("provium.toml"),
            format!(
                "[profiles.t]\nkernel = \"bzImage\"\ncmdline = \"quiet\"\ninject_agent = {inject}\n"
            ),
        )
        .expect("config");
        let o = Command::new(env!("CARGO_BIN_EXE_provium"))
            .args([
                "bench", "boot", "t", "-n", "1", "--warmup", "0", "--json", "--until", "console",
            ])
            .env("PROVIUM_AGENT", &agent)
            .current_dir(dir.path())
            .output()
            .expect("run provium");
        let lines = boot_lines(&o, 1);
        let cmdline = lines[0]["guest"]["cmdline"].as_str().expect("cmdline");
        let hello = phase(&lines, "kernel_to_agent_hello");
        assert_eq!(hello["available"], false, "{hello}");
        let why = hello["reason"].as_str().expect("reason");
        assert!(why.contains("Hello"), "{why}");
        if inject {
            assert!(cmdline.ends_with(" provium.boot_timer=0x440"), "{cmdline}");
            assert!(cmdline.contains("rdinit="), "{cmdline}");
        } else {
            assert!(!cmdline.contains("provium.boot_timer"), "{cmdline}");
            assert!(why.contains("inject_agent = false"), "{why}");
        }
    }
}

#[test]
fn boot_tiny_guest_prints_a_table() {
    if !kvm_or_skip("boot_tiny_guest_prints_a_table") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let o = provium(
        dir.path(),
        &["bench", "boot", "--tiny-guest", "-n", "2", "--pin", "0"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("provium bench boot tiny-guest: 2 run(s) after 1 warm-up"),
        "{out}"
    );
    assert!(out.contains("kvm: "), "{out}");
    assert!(out.contains("pinned to CPU 0"), "{out}");
    for h in ["phase", "min", "median", "p90", "max"] {
        assert!(out.contains(h), "{h}: {out}");
    }
    for p in BOOT_PHASES {
        assert!(out.contains(p), "{p}: {out}");
    }
    assert!(
        out.contains("unavailable: the tiny guest has no agent"),
        "{out}"
    );
}

#[test]
fn boot_tiny_guest_refuses_until_init() {
    if !kvm_or_skip("boot_tiny_guest_refuses_until_init") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let o = provium(
        dir.path(),
        &["bench", "boot", "--tiny-guest", "--until", "init"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("prints no \"Run /init\""), "{}", text(&o));
}

#[test]
fn boot_probe_kernel_reaches_run_init() {
    let test = "boot_probe_kernel_reaches_run_init";
    let Some(kernel) = probe_kernel(test) else {
        return;
    };
    if !kvm_or_skip(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // An uncompressed initrd with /init: the kernel prints "Run /init" after
    // finding it (it never runs on kvm_pvm, which has no Linux user space).
    let mut w = provium_vmm::initrd::CpioWriter::new();
    w.dir("dev", 0o755).expect("dir");
    w.char_dev("dev/console", 0o600, 5, 1).expect("console");
    w.file("init", 0o755, b"#!/bin/sh\necho provium bench init\n")
        .expect("init");
    std::fs::write(dir.path().join("initrd.cpio"), w.finish()).expect("initrd");
    std::fs::write(
        dir.path().join("provium.toml"),
        format!(
            "[profiles.probe]\nkernel = {:?}\ninitrd = \"initrd.cpio\"\ncmdline = {PROBE_CMDLINE:?}\n",
            kernel.display().to_string()
        ),
    )
    .expect("config");
    let o = provium(
        dir.path(),
        &[
            "bench",
            "boot",
            "probe",
            "-n",
            "1",
            "--warmup",
            "0",
            "--json",
            "--until",
            "init",
            "--timeout",
            "1800",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lines = json_lines(&o);
    check_shape(&lines, "boot", 1);
    eprintln!("probe kernel bench: {}", String::from_utf8_lossy(&o.stdout));
    for p in [
        "vm_create",
        "vmm_setup",
        "kernel_to_console",
        "kernel_to_init",
        "start_to_console",
    ] {
        assert_eq!(phase(&lines, p)["available"], true, "{p}: {lines:#?}");
    }
    let ready = phase(&lines, "kernel_to_ready");
    assert_eq!(ready["available"], false, "{ready}");
    let hello = phase(&lines, "kernel_to_agent_hello");
    assert!(
        hello["reason"].as_str().expect("reason").contains("Hello"),
        "{hello}"
    );
    let guest = &lines[0]["guest"];
    assert!(
        guest["kernel_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("Linux version 6.1")),
        "{guest}"
    );
    assert_eq!(guest["until"], "init");
}

fn fixture_project() -> tempfile::TempDir {
    ensure_agent();
    let dir = tempfile::tempdir().expect("tempdir");
    let w = |rel: &str, body: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    };
    w(
        "provium.toml",
        "[provium]\nroots = [\".\"]\ncache_dir = \"cache\"\n\n[profiles.linux]\nkernel = \"k/bzImage\"\ncmdline = \"q\"\n",
    );
    w("k/bzImage", "not booted by the local backend");
    w(
        "fixtures/base.fixture.lua",
        "local vm = provium:vm(\"base\", \"linux\"):boot()\nvm:write_file(\"/srv/tag\", \"bench\")\nreturn vm:snapshot()\n",
    );
    w(
        "fixtures/lab.fixture.lua",
        "provium:vm(\"a\", \"linux\"):boot()\nreturn provium:snapshot()\n",
    );
    dir
}

#[test]
fn restore_a_local_fixture() {
    let dir = fixture_project();
    let o = provium(
        dir.path(),
        &[
            "bench",
            "restore",
            "fixtures/base",
            "--vmm",
            "local",
            "-n",
            "3",
            "--parallel",
            "2",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("built fixture `fixtures/base`"),
        "{}",
        text(&o)
    );
    let lines = json_lines(&o);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["phase"].as_str().expect("phase"))
        .collect();
    assert_eq!(
        names,
        [
            "restore_to_agent_answer",
            "restore_machine",
            "restore_to_first_instruction",
            "rss_per_vm",
            "pss_per_vm"
        ]
    );
    check_shape(&lines, "restore", 3);
    for p in ["restore_to_agent_answer", "restore_machine"] {
        let l = phase(&lines, p);
        assert_eq!(
            (l["available"].clone(), l["n"].clone(), l["unit"].clone()),
            (true.into(), 3.into(), "ns".into()),
            "{l}"
        );
    }
    for p in ["rss_per_vm", "pss_per_vm"] {
        let l = phase(&lines, p);
        assert_eq!(l["unit"], "bytes", "{l}");
        assert!(
            l["min"].as_u64().is_some_and(|b| b > 0),
            "memory measured: {l}"
        );
    }
    let first = phase(&lines, "restore_to_first_instruction");
    assert!(
        first["reason"]
            .as_str()
            .expect("reason")
            .contains("bench restore --tiny-guest"),
        "{first}"
    );
    let guest = &lines[0]["guest"];
    assert_eq!(guest["backend"], "local");
    assert_eq!(guest["parallel"], 2);
    assert_eq!(guest["fixture"], "fixtures/base");

    // Cached now: no build, and the human table.
    let o = provium(
        dir.path(),
        &[
            "bench",
            "restore",
            "fixtures/base",
            "--vmm",
            "local",
            "-n",
            "1",
            "--warmup",
            "0",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("built fixture"),
        "{}",
        text(&o)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("restore_to_agent_answer"));

    // A lab fixture is refused with the reason; on the kvm backend the
    // fixture is built by booting the profile's kernel, which here is not
    // one: the error names the file.
    let o = provium(
        dir.path(),
        &["bench", "restore", "fixtures/lab", "--vmm", "local"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("takes a vm_fixture"), "{}", text(&o));
    if !kvm_or_skip("restore_a_local_fixture (its --vmm kvm part)") {
        return;
    }
    let o = provium(
        dir.path(),
        &["bench", "restore", "fixtures/base", "--vmm", "kvm"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("cannot load the kernel ./k/bzImage"),
        "{}",
        text(&o)
    );
}

#[test]
fn restore_the_tiny_guest_fixture_on_the_vmm() {
    if !kvm_or_skip("restore_the_tiny_guest_fixture_on_the_vmm") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // The fixture cache lives in the test's directory (provium.toml).
    std::fs::write(
        dir.path().join("provium.toml"),
        "[provium]\ncache_dir = \"cache\"\n",
    )
    .expect("config");
    let args = [
        "bench",
        "restore",
        "--tiny-guest",
        "-n",
        "4",
        "--parallel",
        "2",
        "--warmup",
        "1",
        "--json",
    ];
    let o = provium(dir.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("built the tiny-guest fixture"),
        "{}",
        text(&o)
    );
    let lines = json_lines(&o);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["phase"].as_str().expect("phase"))
        .collect();
    assert_eq!(
        names,
        [
            "restore_to_first_instruction",
            "restore_machine",
            "restore_to_guest_running",
            "rss_per_vm",
            "pss_per_vm"
        ]
    );
    check_shape(&lines, "restore", 4);
    for l in &lines {
        assert_eq!(l["available"], true, "{l}");
        assert_eq!(l["n"], 4, "{l}");
        assert_eq!(l["target"], "tiny-guest", "{l}");
    }
    assert_eq!(
        phase(&lines, "restore_to_first_instruction")["source"],
        "vmm"
    );
    // The restored guest touched some RAM (its stack, counter and code)
    // but far less than its 32 MiB: untouched memory costs nothing.
    let rss = phase(&lines, "rss_per_vm");
    let max = rss["max"].as_u64().expect("bytes");
    assert!(
        rss["min"].as_u64().is_some_and(|b| b > 0) && max < 8 << 20,
        "resident guest RAM per restored VM: {rss}"
    );
    let guest = &lines[0]["guest"];
    assert_eq!(guest["backend"], "kvm");
    assert_eq!(guest["memory_bytes"], 32 << 20);
    assert!(
        guest["entry"].as_str().expect("entry").contains("cache"),
        "{guest}"
    );

    // Cached now: no build.
    let o = provium(dir.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("built the tiny-guest"),
        "{}",
        text(&o)
    );
}

#[test]
fn ops_on_the_local_backend() {
    ensure_agent();
    let dir = tempfile::tempdir().expect("tempdir");
    let o = provium(
        dir.path(),
        &[
            "bench", "ops", "--vmm", "local", "-n", "5", "--warmup", "1", "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lines = json_lines(&o);
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["phase"].as_str().expect("phase"))
        .collect();
    assert_eq!(names, ["ping", "run_true", "read_4k", "write_read_1m"]);
    check_shape(&lines, "ops", 5);
    for l in &lines {
        assert_eq!(l["available"], true, "{l}");
        assert_eq!(l["n"], 5, "{l}");
        assert!(l["p99"].is_u64(), "{l}");
    }
    // On kvm it boots a guest: without a profile it refuses before booting.
    let o = provium(dir.path(), &["bench", "ops", "--vmm", "kvm"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("name a profile"), "{}", text(&o));
}

/// `bench fork` on both of its routes: the phases per `--copies` value, in
/// order, each with a sample per run (the source's pause once per fork).
fn check_fork(lines: &[Value], runs: usize, copies: &[usize], tiny: bool) {
    check_shape(lines, "fork", runs);
    let mut want = vec!["source_paused".to_string()];
    for n in copies {
        want.push(format!("fork_n{n}"));
        want.push(format!("pss_per_copy_n{n}"));
        if tiny {
            want.push(format!("snapshot_fixture_restores_n{n}"));
        }
    }
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["phase"].as_str().expect("phase"))
        .collect();
    assert_eq!(names, want);
    assert_eq!(phase(lines, "source_paused")["n"], runs * copies.len());
    for n in copies {
        assert_eq!(phase(lines, &format!("fork_n{n}"))["n"], runs);
        // Each copy holds something of its own (its touched pages, or a
        // sandbox's processes), never nothing.
        let pss = phase(lines, &format!("pss_per_copy_n{n}"));
        assert!(pss["min"].as_u64().is_some_and(|b| b > 0), "{pss}");
    }
}

#[test]
fn fork_the_tiny_guest_on_the_vmm() {
    if !kvm_or_skip("fork_the_tiny_guest_on_the_vmm") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("provium.toml"),
        "[provium]\ncache_dir = \"cache\"\n",
    )
    .expect("config");
    let args = [
        "bench",
        "fork",
        "--tiny-guest",
        "--copies",
        "1,3",
        "-n",
        "2",
        "--json",
    ];
    let o = provium(dir.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    check_fork(&json_lines(&o), 2, &[1, 3], true);
}

#[test]
fn fork_a_local_sandbox() {
    ensure_agent();
    let dir = tempfile::tempdir().expect("tempdir");
    let args = [
        "bench", "fork", "--vmm", "local", "--copies", "1,2", "-n", "2", "--json",
    ];
    let o = provium(dir.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    check_fork(&json_lines(&o), 2, &[1, 2], false);
}

/// A baseline whose medians are `median` for each of `phases`.
fn synthetic(bench: &str, phases: &[&str], median: u64) -> String {
    phases
        .iter()
        .map(|p| {
            serde_json::json!({
                "schema": "provium-bench/1", "bench": bench, "target": "synthetic",
                "phase": p, "unit": "ns", "available": true, "n": 1,
                "samples": [median], "min": median, "median": median, "p90": median,
                "p99": median, "max": median,
            })
            .to_string()
                + "\n"
        })
        .collect()
}

#[test]
fn compare_files_exits_1_only_on_a_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("old.json"), synthetic("boot", &["a", "b"], 1000)).expect("old");
    std::fs::write(d.join("same.json"), synthetic("boot", &["a", "b"], 1000)).expect("same");
    std::fs::write(d.join("slow.json"), synthetic("boot", &["a", "b"], 1200)).expect("slow");
    std::fs::write(d.join("bit.json"), synthetic("boot", &["a", "b"], 1050)).expect("bit");

    let o = provium(d, &["bench", "compare", "old.json", "same.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("result: ok"));

    let o = provium(d, &["bench", "compare", "old.json", "slow.json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("boot/a") && out.contains("1.200") && out.contains("REGRESSED"),
        "{out}"
    );

    // 5% is inside the default 10% and outside an explicit 2%.
    let o = provium(d, &["bench", "compare", "old.json", "bit.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = provium(
        d,
        &[
            "bench",
            "compare",
            "old.json",
            "bit.json",
            "--max-regression",
            "2%",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let o = provium(
        d,
        &[
            "bench",
            "compare",
            "old.json",
            "bit.json",
            "--max-regression",
            "soon",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("percentage"), "{}", text(&o));
    let o = provium(d, &["bench", "compare", "old.json", "missing.json"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn live_compare_gates_on_the_baseline() {
    if !kvm_or_skip("live_compare_gates_on_the_baseline") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // A baseline no real boot can match (1 ns) and one no boot can miss (11 days).
    std::fs::write(d.join("fast.json"), synthetic("boot", &BOOT_PHASES, 1)).expect("fast");
    std::fs::write(
        d.join("slow.json"),
        synthetic("boot", &BOOT_PHASES, 1_000_000_000_000_000),
    )
    .expect("slow");
    let args = |base: &str| {
        vec![
            "bench".to_string(),
            "boot".into(),
            "--tiny-guest".into(),
            "-n".into(),
            "1".into(),
            "--warmup".into(),
            "0".into(),
            "--compare".into(),
            base.into(),
        ]
    };
    let run = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        provium(d, &a)
    };
    let o = run(args("fast.json"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("REGRESSED"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("not comparable"),
        "unavailable phases are not compared: {}",
        text(&o)
    );
    let o = run(args("slow.json"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("result: ok"),
        "{}",
        text(&o)
    );
    // With --json the comparison goes to stderr and stdout stays JSON lines.
    let mut a = args("fast.json");
    a.push("--json".into());
    let o = run(a);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(json_lines(&o).len(), BOOT_PHASES.len());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("REGRESSED"),
        "{}",
        text(&o)
    );
}

#[test]
fn bench_boot_needs_a_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = provium(dir.path(), &["bench", "boot"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = provium(dir.path(), &["bench", "boot", "nosuch"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no profile `nosuch`"), "{}", text(&o));
}
