//! SIGINT and SIGTERM stop a run gracefully: the `provium` binary, in the
//! middle of a test blocked on a VM (a `sleep` running in a local sandbox),
//! gets the signal; it tears the VM down (no process of the sandbox, no
//! sandbox directory remains), reports the results so far (plain, `--json`
//! and JUnit stay well-formed), runs nothing more, and exits 128 + the
//! signal (130, 143). Needs root (the local backend), as in CI.
mod common;

use common::{sandbox_dirs, sandbox_pids};

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const QUICK: &str = r#"test("quick", function(t) t:assert_eq(1, 1) end)"#;

fn sleeper(vm: &str) -> String {
    format!(
        r#"
test("sleeps", function(t)
  local vm = provium:vm("{vm}", "linux"):boot()
  vm:run("sleep 300")
end)
test("never runs", function(t) error("ran after the interrupt") end)
"#
    )
}

fn project(vm: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("provium.toml"),
        "[provium]\nroots = [\"tests\"]\n\n[profiles.linux]\ncmdline = \"quiet\"\nguest_os = \"linux\"\n",
    )
    .unwrap();
    let tests = dir.path().join("tests");
    std::fs::create_dir_all(&tests).unwrap();
    std::fs::write(tests.join("a_quick.test.lua"), QUICK).unwrap();
    std::fs::write(tests.join("b_sleeper.test.lua"), sleeper(vm)).unwrap();
    dir
}

struct Stopped {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Run `provium` with `args`, wait until the sandbox's `sleep` runs, send
/// `sig`, and wait (bounded) for the exit.
fn interrupt(dir: &Path, vm: &str, sig: i32, args: &[&str]) -> Stopped {
    common::ensure_agent();
    let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "--no-preflight"])
        .args(args)
        .current_dir(dir)
        .env("PROVIUM_AGENT", common::agent())
        .env("PROVIUM_RERUN_STATE", dir.join("rerun.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for l in BufReader::new(out).lines() {
            lines.push(l.unwrap());
        }
        lines.join("\n")
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while sandbox_pids(vm, Some("sleep")).is_empty() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "provium exited ({status}) before the sandbox's sleep ran: {}",
                t_err.join().unwrap()
            );
        }
        assert!(Instant::now() < deadline, "the sandbox's sleep never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill of our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("provium did not stop within 60 s of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stopped = Stopped {
        code: status.code().unwrap_or_else(|| panic!("killed: {status}")),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    };
    // The VM is shut down: nothing of its sandbox remains.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sandbox_pids(vm, None).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sandbox processes survived the run: {:?}",
            sandbox_pids(vm, None)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        sandbox_dirs(vm),
        Vec::<String>::new(),
        "sandbox directory left"
    );
    assert!(!stopped.stderr.contains("panicked"), "{}", stopped.stderr);
    stopped
}

fn tag() -> String {
    format!("{:x}", std::process::id())
}

#[test]
fn sigint_reports_json_and_junit_so_far_and_exits_130() {
    let vm = format!("intr-int-{}", tag());
    let dir = project(&vm);
    let junit = dir.path().join("junit.xml");
    let s = interrupt(
        dir.path(),
        &vm,
        libc::SIGINT,
        &["--json", "--junit", junit.to_str().unwrap()],
    );
    let ctx = format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        s.code, s.stdout, s.stderr
    );
    assert_eq!(s.code, 130, "{ctx}");
    assert!(s.stderr.contains("provium: interrupted by SIGINT"), "{ctx}");
    let files: Vec<serde_json::Value> = s
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{ctx}")))
        .collect();
    let sleeper = files
        .iter()
        .find(|f| f["path"] == "b_sleeper.test.lua")
        .unwrap_or_else(|| panic!("the interrupted file is not reported\n{ctx}"));
    let tests = sleeper["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 1, "nothing runs after the interrupt\n{ctx}");
    assert_eq!(tests[0]["status"], "failed", "{ctx}");
    assert!(
        tests[0]["message"]
            .as_str()
            .unwrap()
            .contains("interrupted by SIGINT"),
        "{ctx}"
    );
    if let Some(quick) = files.iter().find(|f| f["path"] == "a_quick.test.lua") {
        assert_eq!(quick["tests"][0]["status"], "passed", "{ctx}");
    }
    // JUnit: well-formed, one case per test that ran, the failure named.
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    let mut reader = quick_xml::Reader::from_str(&xml);
    let (mut cases, mut failures) = (0, 0);
    loop {
        match reader.read_event().unwrap_or_else(|e| panic!("{e}: {xml}")) {
            quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e) => {
                match e.name().as_ref() {
                    b"testcase" => cases += 1,
                    b"failure" => failures += 1,
                    _ => {}
                }
            }
            quick_xml::events::Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(
        cases,
        files
            .iter()
            .map(|f| f["tests"].as_array().unwrap().len())
            .sum::<usize>(),
        "{xml}"
    );
    assert_eq!(failures, 1, "{xml}");
}

#[test]
fn sigterm_reports_plain_so_far_and_exits_143() {
    let vm = format!("intr-term-{}", tag());
    let dir = project(&vm);
    let s = interrupt(dir.path(), &vm, libc::SIGTERM, &[]);
    let ctx = format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        s.code, s.stdout, s.stderr
    );
    assert_eq!(s.code, 143, "{ctx}");
    assert!(s.stdout.contains("FAIL b_sleeper.test.lua"), "{ctx}");
    assert!(s.stdout.contains("interrupted by SIGTERM"), "{ctx}");
    assert!(!s.stdout.contains("never runs"), "{ctx}");
    // The summary is printed.
    assert!(s.stdout.contains("file(s); "), "{ctx}");
    assert!(
        s.stderr.contains("provium: interrupted by SIGTERM"),
        "{ctx}"
    );
}

#[test]
fn sigint_mid_fixture_build_tears_its_vm_down_and_installs_nothing() {
    // The fixture build's VM belongs to a build-time environment, not the
    // file's: the interrupt tears down every VM of the run.
    let vm = format!("intr-fx-{}", tag());
    let dir = project(&vm);
    std::fs::write(
        dir.path().join("provium.toml"),
        "[provium]\nroots = [\"tests\"]\ncache_dir = \"cache\"\n\n[profiles.linux]\ncmdline = \"quiet\"\nguest_os = \"linux\"\n",
    )
    .unwrap();
    let tests = dir.path().join("tests");
    std::fs::create_dir_all(tests.join("fixtures")).unwrap();
    std::fs::write(
        tests.join("fixtures/slow.fixture.lua"),
        format!(
            "local vm = provium:vm(\"{vm}\", \"linux\"):boot()\nvm:run(\"sleep 300\")\nreturn vm:snapshot()\n"
        ),
    )
    .unwrap();
    std::fs::write(
        tests.join("b_sleeper.test.lua"),
        "test(\"uses the fixture\", function(t) provium:vm_fixture(\"fixtures/slow\") end)\ntest(\"never runs\", function(t) error(\"ran after the interrupt\") end)\n",
    )
    .unwrap();
    let s = interrupt(dir.path(), &vm, libc::SIGINT, &["--json"]);
    let ctx = format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        s.code, s.stdout, s.stderr
    );
    assert_eq!(s.code, 130, "{ctx}");
    assert!(!s.stdout.contains("never runs"), "{ctx}");
    for l in s.stdout.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
    let entries: Vec<String> = std::fs::read_dir(dir.path().join("cache"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(entries, Vec::<String>::new(), "{ctx}");
}
