//! A hostile agent, end to end: the `hostile_agent` double
//! (harness/examples/hostile_agent.rs) runs where the real agent would, in a
//! local sandbox, and misbehaves after a valid Hello. Each test runs the real
//! `provium` binary on two files: one whose VM `hostile-<mode>` misbehaves
//! (next to a healthy VM), and a healthy file. Each time:
//! - `provium`'s peak memory (VmHWM, polled from /proc/<pid>/status, and
//!   the kernel's ru_maxrss at exit) stays under a bound well below what
//!   the agent sent or claimed;
//! - the hostile call fails with an error naming the VM and what its agent
//!   did wrong;
//! - the other VM of that test still answers, the file's next test (a fresh
//!   VM) passes, and the other file passes;
//! - the run exits 1 (a test failed), without a panic, within its timeout.
//!
//! Needs root (the local backend), as in CI.
mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one `provium` run may take before the test calls it a hang.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The double, built once per test binary (`cargo test --test` does not
/// build examples by itself).
fn double() -> &'static Path {
    static DOUBLE: OnceLock<PathBuf> = OnceLock::new();
    DOUBLE.get_or_init(|| {
        common::ensure_agent();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "provium", "--example", "hostile_agent"])
            .current_dir(common::repo_root())
            .status()
            .expect("run cargo build --example hostile_agent");
        assert!(
            status.success(),
            "building the hostile_agent example failed"
        );
        // target/<profile>/deps/<this test> -> target/<profile>/examples/.
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let double = profile_dir.join("examples").join("hostile_agent");
        assert!(double.is_file(), "{} missing", double.display());
        // It execs the real agent for healthy VMs from its parent directory.
        let real = profile_dir.join("provium-agent");
        assert!(real.is_file(), "the double needs {}", real.display());
        // Inside a sandbox the double sees the host's root filesystem but a
        // /tmp of its own: a checkout under /tmp (a CI clone) would hide
        // the real agent from it. Both are staged side by side outside /tmp.
        let stage = common::outside_tmp("hostile").join("bin");
        std::fs::create_dir_all(stage.join("examples")).unwrap();
        let staged = stage.join("examples").join("hostile_agent");
        copy_replacing(&double, &staged);
        copy_replacing(&real, &stage.join("provium-agent"));
        staged
    })
}

/// Copy `from` to `to` through a temporary sibling and a rename, so a
/// running double is never overwritten in place.
fn copy_replacing(from: &Path, to: &Path) {
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    std::fs::rename(&tmp, to).unwrap();
}

/// A project directory on the root filesystem (not /tmp: the sandbox has a
/// /tmp of its own, and `connflood` must see the project's socket path).
fn project(mode: &str, hostile_body: &str, test_timeout: &str) -> tempfile::TempDir {
    let base = common::outside_tmp("hostile").join("projects");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{mode}-"))
        .tempdir_in(&base)
        .unwrap();
    std::fs::write(
        dir.path().join("provium.toml"),
        "[provium]\nroots = [\"tests\"]\n\n[profiles.linux]\ncmdline = \"quiet\"\nguest_os = \"linux\"\n",
    )
    .unwrap();
    let tests = dir.path().join("tests");
    std::fs::create_dir_all(&tests).unwrap();
    std::fs::write(
        tests.join("hostile.test.lua"),
        format!(
            r#"
test("hostile", {{timeout = "{test_timeout}"}}, function(t)
  local good = provium:vm("good-{mode}", "linux"):boot()
  local bad = provium:vm("hostile-{mode}", "linux"):boot()
  local ok, e = pcall(function()
{hostile_body}
  end)
  if not ok then
    if "{mode}" ~= "stdin" then
      -- The other VM of the test is unaffected (for stdin the watchdog
      -- tears the whole lab down: nothing else in this test runs).
      t:assert_eq(good:run("echo fine").stdout, "fine\n")
    end
    error(e, 0)
  end
  error("the hostile agent's call succeeded", 0)
end)
test("after", function(t)
  local vm = provium:vm("after-{mode}", "linux"):boot()
  t:assert_eq(vm:run("echo fine").stdout, "fine\n")
end)
"#
        ),
    )
    .unwrap();
    std::fs::write(
        tests.join("healthy.test.lua"),
        format!(
            r#"
test("healthy", function(t)
  local vm = provium:vm("healthy-{mode}", "linux"):boot()
  t:assert_eq(vm:run("echo fine").stdout, "fine\n")
end)
"#
        ),
    )
    .unwrap();
    dir
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    /// Largest VmHWM seen while it ran, KiB.
    hwm_kib: u64,
    /// ru_maxrss at exit, KiB.
    maxrss_kib: u64,
}

// The child is reaped by wait4 (for its rusage), not `Child::wait`.
#[allow(clippy::zombie_processes)]
fn run_provium(dir: &Path, extra: &[&str]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args([
            "--vmm",
            "local",
            "--no-preflight",
            "--json",
            "--timeout",
            "90s",
        ])
        .args(extra)
        .current_dir(dir)
        .env("PROVIUM_AGENT", double())
        .env("PROVIUM_RERUN_STATE", dir.join("rerun.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let started = Instant::now();
    let mut hwm_kib = 0;
    let (status, usage) = loop {
        if let Some(h) = common::vm_hwm_kib(pid) {
            hwm_kib = hwm_kib.max(h);
        }
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 on our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child, with live out-pointers.
        let r = unsafe { libc::wait4(pid as i32, &mut status, libc::WNOHANG, &mut usage) };
        assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == pid as i32 {
            break (status, usage);
        }
        if started.elapsed() > RUN_LIMIT {
            // SAFETY: kill of our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("provium hung: still running after {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        libc::WIFEXITED(status),
        "provium did not exit normally (wait status {status:#x})"
    );
    Run {
        code: libc::WEXITSTATUS(status),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
        hwm_kib,
        maxrss_kib: usage.ru_maxrss as u64,
    }
}

/// Run `mode` and check everything the module doc promises; `expect` must
/// appear in the hostile test's failure message.
fn hostile(mode: &str, body: &str, test_timeout: &str, expect: &str, bound_mib: u64) -> Run {
    let dir = project(mode, body, test_timeout);
    let run = run_provium(dir.path(), &[]);
    let ctx = format!(
        "mode {mode}: exit {}\nstdout:\n{}\nstderr:\n{}",
        run.code, run.stdout, run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{ctx}");
    assert_eq!(run.code, 1, "{ctx}");
    let files = common::json_file_results(&run.stdout, &ctx);
    let file = |name: &str| common::file_result(&files, name, &ctx);
    let h = file("hostile.test.lua");
    assert_eq!(h["tests"][0]["name"], "hostile", "{ctx}");
    assert_eq!(h["tests"][0]["status"], "failed", "{ctx}");
    let msg = h["tests"][0]["message"].as_str().unwrap_or_default();
    if mode != "connflood" {
        assert!(
            msg.contains(&format!("vm `hostile-{mode}`")),
            "{msg}\n{ctx}"
        );
    }
    assert!(msg.contains(expect), "expected `{expect}` in: {msg}\n{ctx}");
    assert_eq!(h["tests"][1]["name"], "after", "{ctx}");
    assert_eq!(h["tests"][1]["status"], "passed", "{ctx}");
    let healthy = file("healthy.test.lua");
    assert_eq!(healthy["tests"][0]["status"], "passed", "{ctx}");
    let bound_kib = bound_mib << 10;
    assert!(
        run.hwm_kib > 0 && run.hwm_kib < bound_kib,
        "VmHWM {} KiB, bound {bound_kib} KiB\n{ctx}",
        run.hwm_kib
    );
    eprintln!(
        "{mode}: VmHWM {} KiB (bound {bound_kib} KiB); ru_maxrss {} KiB (not asserted: it covers the sandboxes provium reaped too)",
        run.hwm_kib, run.maxrss_kib
    );
    run
}

/// Two calls: the first may already fail, the second must.
const TWO_CALLS: &str = r#"    bad:run("echo one")
    bad:run("echo two")"#;

/// Peak memory bound for floods that claim or send far more: 64 MiB, against
/// a 1 MiB burst of garbage that keeps coming, a 4 GiB length field.
const SMALL_BOUND_MIB: u64 = 64;

#[test]
fn garbage_bytes_break_the_connection() {
    hostile(
        "garbage",
        TWO_CALLS,
        "30s",
        "agent connection broken: undecodable frame from the agent",
        SMALL_BOUND_MIB,
    );
}

#[test]
fn a_length_field_of_2_pow_32_minus_1_allocates_nothing() {
    hostile(
        "hugelen",
        TWO_CALLS,
        "30s",
        "agent connection broken: frame of 4294967295 bytes exceeds the maximum of 16777216 bytes",
        SMALL_BOUND_MIB,
    );
}

#[test]
fn a_frame_that_stops_mid_body_breaks_the_connection() {
    hostile(
        "stall",
        TWO_CALLS,
        "60s",
        "the agent stopped sending in the middle of a frame: 14 of its 1004 bytes arrived, then nothing for 10000 ms",
        SMALL_BOUND_MIB,
    );
}

#[test]
fn an_answer_to_a_request_never_sent_breaks_the_connection() {
    hostile(
        "unknownid",
        TWO_CALLS,
        "30s",
        "the agent answered request 1001, which the host never sent",
        SMALL_BOUND_MIB,
    );
}

#[test]
fn a_second_answer_breaks_the_connection() {
    hostile(
        "dupanswer",
        TWO_CALLS,
        "30s",
        "the agent answered request 1 twice",
        SMALL_BOUND_MIB,
    );
}

#[test]
fn a_second_end_of_a_stream_breaks_the_connection() {
    hostile(
        "dupend",
        TWO_CALLS,
        "30s",
        "the agent ended stream 1 (stdout) twice",
        SMALL_BOUND_MIB,
    );
}

#[test]
fn endless_stdout_is_capped() {
    // The agent sends as fast as the window allows, forever; exec keeps at
    // most 64 MiB (MAX_COLLECTED_OUTPUT_BYTES) and fails.
    hostile(
        "flood",
        TWO_CALLS,
        "30s",
        "the agent sent more than 67108864 bytes of output for `exec`",
        // 64 MiB collected (and the Vec's growth) plus the harness itself:
        // bounded, where the flood is not (88 MiB measured).
        160,
    );
}

#[test]
fn a_stdin_window_never_acknowledged_fails_the_write() {
    hostile(
        "stdin",
        r#"    local p = bad:run_async("cat")
    p:stdin_write(string.rep("x", 1048576))"#,
        "5s",
        "the agent did not acknowledge the stdin of process",
        SMALL_BOUND_MIB,
    );
}

#[test]
fn connections_to_the_host_side_do_not_reach_it() {
    // On the local backend the host side a sandbox could reach is a Unix
    // socket on the host's filesystem; the run's event socket is one. The
    // double tries thousands of connections to it; none may arrive (the
    // sandbox's root is an overlay, its /run and /tmp its own), so the
    // harness holds no connection for them.
    let mode = "connflood";
    let dir = project(
        mode,
        &format!(r#"    error(bad:run("{}").stdout, 0)"#, "SOCKET"),
        "30s",
    );
    let sock = dir.path().join("ev.sock");
    // Write the socket path into the hostile file.
    let f = dir.path().join("tests/hostile.test.lua");
    let text = std::fs::read_to_string(&f).unwrap();
    std::fs::write(&f, text.replace("SOCKET", &sock.to_string_lossy())).unwrap();
    let run = run_provium(dir.path(), &["--events-socket", &sock.to_string_lossy()]);
    let ctx = format!("exit {}\n{}\n{}", run.code, run.stdout, run.stderr);
    assert_eq!(run.code, 1, "{ctx}");
    assert!(run.stdout.contains("connected 0 of 4000"), "{ctx}");
    assert!(run.hwm_kib < SMALL_BOUND_MIB << 10, "{ctx}");
}
