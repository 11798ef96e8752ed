//! The `provium` binary end to end: exit codes, output shapes, JSON and
//! JUnit, the event stream's guarantees, selection flags, timeouts and the
//! framework semantics that only show in a whole run.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use common::{exit_code, read_events, stdout, LocalProject};
use provium_protocol::frame::{read_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::{Event, EventFrame};

const PASSING: &str = r#"
test("one", function(t) t:assert_eq(1, 1) end)
test("two", {tags = {"smoke"}}, function(t) t:log("note") end)
"#;

const FAILING: &str = r#"
test("ok", function(t) end)
test("bad", function(t) t:assert_eq(1, 2) end)
test("skipped", {skip = "later"}, function(t) end)
"#;

#[test]
fn exit_codes_zero_one_two() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    assert_eq!(exit_code(&p.run(&[])), 0);
    let p = LocalProject::new(&[("a.test.lua", PASSING), ("b.test.lua", FAILING)]);
    assert_eq!(exit_code(&p.run(&[])), 1);
    std::fs::write(p.path().join("provium.toml"), "[provium\n").unwrap();
    let o = p.run(&[]);
    assert_eq!(exit_code(&o), 2);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("parse `provium.toml`"),
        "{o:?}"
    );
    let o = p.run(&["--config", "missing.toml"]);
    assert_eq!(exit_code(&o), 2);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("read `missing.toml`"),
        "{o:?}"
    );
    std::fs::write(
        p.path().join("provium.toml"),
        "[profiles.x]\nkernel = \"k\"\n",
    )
    .unwrap();
    let o = p.run(&[]);
    assert_eq!(exit_code(&o), 2);
    // main prints the chain once, a layer per numbered line.
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("invalid config in `provium.toml`\n  2: profile `x` has empty cmdline"));
    assert_eq!(
        exit_code(&LocalProject::new(&[]).run(&["--tag-meta", "novalue"])),
        2
    );
}

/// A failure with causes prints as one chain, once: the outermost message
/// after `provium: `, then each cause on its own numbered line, none of
/// them repeated inside another.
#[test]
fn an_error_chain_is_printed_once_numbered() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    let o = p.run(&["--config", "absent.toml"]);
    assert_eq!(exit_code(&o), 2, "{o:?}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "provium: cannot load the configuration",
            "  1: read `absent.toml`",
            "  2: No such file or directory (os error 2)",
        ],
        "{stderr}"
    );
}

/// An unknown key is ignored with a warning naming the file and the key
/// path; the run goes on (it used to be a parse error, exit 2).
#[test]
fn unknown_config_keys_warn_with_their_path() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    std::fs::write(
        p.path().join("provium.toml"),
        "[provium]\nrootz = []\n[profiles.x]\ncmdline = \"q\"\nkernal = \"k\"\n",
    )
    .unwrap();
    let o = p.run(&[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(exit_code(&o), 0, "{o:?}");
    for key in ["provium.rootz", "profiles.x.kernal"] {
        assert!(
            stderr.contains(&format!(
                "provium: warning: `provium.toml`: unknown key `{key}` ignored"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn plain_verbose_and_quiet_shapes() {
    let p = LocalProject::new(&[("a.test.lua", PASSING), ("b.test.lua", FAILING)]);
    let out = stdout(&p.run(&[]));
    assert!(
        out.contains("PASS a.test.lua (2 passed, 0 failed, 0 skipped)\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "FAIL b.test.lua (1 passed, 1 failed, 1 skipped)\n    FAIL bad\n        1 ~= 2\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("\n2 file(s); 3 passed, 1 failed, 1 skipped; "),
        "{out}"
    );
    assert!(!out.contains("PASS one"), "{out}");
    let v = stdout(&p.run(&["-v"]));
    assert!(
        v.contains("    PASS one\n") && v.contains("    SKIP skipped (skipped: later)\n"),
        "{v}"
    );
    let q = stdout(&p.run(&["-q"]));
    assert!(
        !q.contains("a.test.lua") && q.contains("FAIL b.test.lua"),
        "{q}"
    );
    assert_eq!(
        exit_code(&p.run(&["-q", "-v"])),
        2,
        "-q and -v are exclusive"
    );
}

#[test]
fn json_objects_follow_the_schema() {
    let p = LocalProject::new(&[("a.test.lua", PASSING), ("b.test.lua", FAILING)]);
    let out = stdout(&p.run(&["--json"]));
    let objs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objs.len(), 2);
    for o in &objs {
        let keys: BTreeSet<&str> = o.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["path", "timeout", "passed", "chunk_error", "tests"]),
            "an unsharded run keeps the reference's schema exactly"
        );
        for t in o["tests"].as_array().unwrap() {
            let keys: BTreeSet<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, BTreeSet::from(["name", "status", "message", "log"]));
        }
    }
    let b = objs.iter().find(|o| o["path"] == "b.test.lua").unwrap();
    assert_eq!(b["timeout"], "in_time");
    assert_eq!(b["passed"], false);
    assert_eq!(b["chunk_error"], serde_json::Value::Null);
    assert_eq!(
        b["tests"][1],
        serde_json::json!({"name": "bad", "status": "failed", "message": "1 ~= 2", "log": []})
    );
    assert_eq!(b["tests"][2]["status"], "skipped");
    let a = objs.iter().find(|o| o["path"] == "a.test.lua").unwrap();
    assert_eq!(a["tests"][1]["log"], serde_json::json!(["note"]));
}

#[test]
fn junit_parses_back() {
    use quick_xml::events::Event as X;
    let p = LocalProject::new(&[("a.test.lua", PASSING), ("b.test.lua", FAILING)]);
    let xml_path = p.path().join("junit.xml");
    p.run(&["--junit", xml_path.to_str().unwrap()]);
    let xml = std::fs::read_to_string(&xml_path).unwrap();
    let mut reader = quick_xml::Reader::from_str(&xml);
    let (mut suites, mut cases, mut failures, mut skipped) = (0, 0, 0, 0);
    let mut failure_msg = String::new();
    loop {
        match reader.read_event().unwrap() {
            X::Start(e) | X::Empty(e) => match e.name().as_ref() {
                b"testsuite" => suites += 1,
                b"testcase" => cases += 1,
                b"failure" => {
                    failures += 1;
                    failure_msg = e
                        .try_get_attribute("message")
                        .unwrap()
                        .unwrap()
                        .unescape_value()
                        .unwrap()
                        .into();
                }
                b"skipped" => skipped += 1,
                _ => {}
            },
            X::Eof => break,
            _ => {}
        }
    }
    assert_eq!((suites, cases, failures, skipped), (2, 5, 1, 1));
    assert_eq!(failure_msg, "1 ~= 2");
}

/// Every guarantee of the reference's Events page, checked on a real stream.
fn check_guarantees(events: &[EventFrame]) {
    let first_dispatch = events
        .iter()
        .position(|e| matches!(e.event, Event::FileDispatched(_)))
        .unwrap();
    let discovered: Vec<&str> = events
        .iter()
        .filter_map(|e| {
            if let Event::FileDiscovered(d) = &e.event {
                Some(d.path.as_str())
            } else {
                None
            }
        })
        .collect();
    assert!(
        events[..first_dispatch]
            .iter()
            .filter(|e| matches!(e.event, Event::FileDiscovered(_)))
            .count()
            == discovered.len(),
        "file_discovered must all precede dispatching"
    );
    for path in &discovered {
        let of_file: Vec<&Event> = events
            .iter()
            .map(|e| &e.event)
            .filter(|e| match e {
                Event::FileDispatched(x) => x.path == *path,
                Event::FileCompleted(x) => x.path == *path,
                Event::FileBlocked(x) => x.path == *path,
                _ => false,
            })
            .collect();
        let dispatched = of_file
            .iter()
            .filter(|e| matches!(e, Event::FileDispatched(_)))
            .count();
        let completed = of_file
            .iter()
            .filter(|e| matches!(e, Event::FileCompleted(_)))
            .count();
        assert!(dispatched <= 1 && completed == 1, "{path}: {of_file:?}");
        assert!(
            matches!(of_file.last(), Some(Event::FileCompleted(_))),
            "{path}: completed must come last"
        );
        if let Some(pos) = of_file
            .iter()
            .position(|e| matches!(e, Event::FileDispatched(_)))
        {
            assert!(of_file[..pos]
                .iter()
                .all(|e| matches!(e, Event::FileBlocked(_))));
        }
    }
    // Per test: one started, then exactly one outcome (a skip has no start).
    let mut state: BTreeMap<(String, String), Vec<&'static str>> = BTreeMap::new();
    let mut claims: BTreeMap<String, i32> = BTreeMap::new();
    for e in events {
        let (key, what) = match &e.event {
            Event::TestStarted(x) => ((x.path.clone(), x.name.clone()), "started"),
            Event::TestPassed(x) => ((x.path.clone(), x.name.clone()), "passed"),
            Event::TestFailed(x) => ((x.path.clone(), x.name.clone()), "failed"),
            Event::TestSkipped(x) => ((x.path.clone(), x.name.clone()), "skipped"),
            Event::ClaimAcquired(x) => {
                *claims.entry(x.path.clone()).or_default() += 1;
                continue;
            }
            Event::ClaimReleased(x) => {
                *claims.entry(x.path.clone()).or_default() -= 1;
                continue;
            }
            _ => continue,
        };
        state.entry(key).or_default().push(what);
    }
    for (test, seq) in &state {
        assert!(
            seq == &["started", "passed"] || seq == &["started", "failed"] || seq == &["skipped"],
            "{test:?}: {seq:?}"
        );
    }
    assert!(
        claims.values().all(|n| *n == 0),
        "claims must pair: {claims:?}"
    );
}

#[test]
fn saved_event_stream_keeps_every_guarantee() {
    let claim = "provium:claim({memory = \"64M\", cpus = 1})\n".to_string() + PASSING;
    let p = LocalProject::new(&[
        ("a.test.lua", &claim),
        ("b.test.lua", FAILING),
        ("c.test.lua", "syntax error here"),
    ]);
    let ev = p.path().join("events.msgpack");
    p.run(&["--save-events", ev.to_str().unwrap(), "--cpus", "1"]);
    let events = read_events(&ev);
    check_guarantees(&events);
    let kinds: BTreeSet<&str> = events.iter().map(|e| e.event.kind().as_str()).collect();
    for k in [
        "file_discovered",
        "file_dispatched",
        "file_completed",
        "test_started",
        "test_passed",
        "test_failed",
        "test_skipped",
        "claim_acquired",
        "claim_released",
        "pool_state",
    ] {
        assert!(kinds.contains(k), "no {k} in {kinds:?}");
    }
    let discovered = events.iter().find_map(|e| match &e.event {
        Event::FileDiscovered(d) if d.path == "a.test.lua" => Some(d.clone()),
        _ => None,
    });
    assert_eq!(
        discovered.unwrap().declared_claim.unwrap().memory_bytes,
        64 << 20
    );
    let failed = events.iter().find_map(|e| match &e.event {
        Event::TestFailed(f) => Some(f.clone()),
        _ => None,
    });
    assert_eq!(failed.unwrap().reason, "1 ~= 2");
}

#[test]
fn events_stdout_moves_human_output_to_stderr() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    let o = p.run(&["--events-stdout"]);
    let mut r = &o.stdout[..];
    let mut n = 0;
    while let Some(_f) = read_message::<EventFrame, _>(&mut r, DEFAULT_MAX_FRAME_BYTES).unwrap() {
        n += 1;
    }
    assert!(n >= 5, "{n} frames");
    assert!(String::from_utf8_lossy(&o.stderr).contains("PASS a.test.lua"));
    assert_eq!(
        exit_code(&p.run(&["--events-stdout", "--json"])),
        2,
        "--json and --events-stdout are exclusive"
    );
}

#[test]
fn a_chunk_error_does_not_stop_the_other_files() {
    let p = LocalProject::new(&[
        ("a.test.lua", PASSING),
        (
            "bad.test.lua",
            "test('x', function(t) end)\nerror('top level boom')\n",
        ),
    ]);
    let o = p.run(&["--json"]);
    assert_eq!(exit_code(&o), 1);
    let objs: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let bad = objs.iter().find(|o| o["path"] == "bad.test.lua").unwrap();
    assert!(
        bad["chunk_error"]
            .as_str()
            .unwrap()
            .contains("top level boom"),
        "{bad}"
    );
    assert_eq!(
        objs.iter().find(|o| o["path"] == "a.test.lua").unwrap()["passed"],
        true
    );
}

#[test]
fn framework_semantics_that_need_a_whole_run() {
    let p = LocalProject::new(&[
        (
            "sticky.test.lua",
            r#"
test("pcall does not hide a failed assertion", function(t)
  pcall(function() t:assert(false, "recorded") end)
end)
test("error objects fail with their text", function(t) error({code = 7}) end)
test("fail has a default", function(t) t:fail() end)
test("skip inside pcall is still a skip", function(t) pcall(function() t:skip("why") end) end)
"#,
        ),
        ("dup.test.lua", "test('foo', function() end)\ntest('foo', function() end)\n"),
        ("todo.test.lua", "todo('waiting on the spec')\ntest('a', function() error('ran') end)\ntest('b', function() end)\n"),
    ]);
    let objs: BTreeMap<String, serde_json::Value> = stdout(&p.run(&["--json"]))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["path"].as_str().unwrap().to_string(), v)
        })
        .collect();
    let sticky = &objs["sticky.test.lua"]["tests"];
    assert_eq!(sticky[0]["status"], "failed");
    assert_eq!(sticky[0]["message"], "recorded");
    assert_eq!(sticky[1]["status"], "failed");
    assert_eq!(sticky[1]["message"], "error object: {code = 7}");
    assert_eq!(sticky[2]["message"], "explicit failure (t:fail)");
    assert_eq!(sticky[3]["status"], "skipped");
    assert_eq!(sticky[3]["message"], "why");
    assert!(objs["dup.test.lua"]["chunk_error"]
        .as_str()
        .unwrap()
        .contains("test: duplicate name `foo` in this file"));
    for t in objs["todo.test.lua"]["tests"].as_array().unwrap() {
        assert_eq!(t["status"], "skipped");
        assert_eq!(t["message"], "waiting on the spec");
    }
}

#[test]
fn tag_filters_select_tests() {
    let p = LocalProject::new(&[(
        "tags.test.lua",
        r#"
test("smoke", {tags = {"smoke"}}, function() end)
test("slow", {slow = true, tags = {"smoke"}}, function() end)
test("net", {subsystems = {"net", "fs"}}, function() end)
test("plain", function() end)
"#,
    )]);
    let statuses = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let v: serde_json::Value =
            serde_json::from_str(stdout(&p.run(&a)).lines().next().unwrap()).unwrap();
        v["tests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["status"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(statuses(&[]), ["passed", "skipped", "passed", "passed"]);
    assert_eq!(
        statuses(&["--include-slow"]),
        ["passed", "passed", "passed", "passed"]
    );
    assert_eq!(
        statuses(&["--tag", "smoke"]),
        ["passed", "skipped", "skipped", "skipped"]
    );
    assert_eq!(
        statuses(&["--no-tag", "smoke", "--include-slow"]),
        ["skipped", "skipped", "passed", "passed"]
    );
    assert_eq!(
        statuses(&["--tag-meta", "subsystems=fs"]),
        ["skipped", "skipped", "passed", "skipped"]
    );
    assert_eq!(
        statuses(&["--no-tag-meta", "subsystems=net"]),
        ["passed", "skipped", "skipped", "passed"]
    );
}

#[test]
fn rerun_failed_and_since() {
    let p = LocalProject::new(&[("a.test.lua", PASSING), ("b.test.lua", FAILING)]);
    assert_eq!(exit_code(&p.run(&[])), 1);
    let state: Vec<PathBuf> =
        serde_json::from_str(&std::fs::read_to_string(p.path().join("rerun.json")).unwrap())
            .unwrap();
    assert_eq!(state.len(), 1);
    assert!(state[0].ends_with("b.test.lua"));
    let out = stdout(&p.run(&["--rerun-failed"]));
    assert!(
        out.contains("b.test.lua") && !out.contains("a.test.lua"),
        "{out}"
    );
    // A clean run leaves the state alone.
    std::fs::write(p.path().join("tests/b.test.lua"), PASSING).unwrap();
    assert_eq!(exit_code(&p.run(&["--rerun-failed"])), 0);
    assert!(std::fs::read_to_string(p.path().join("rerun.json"))
        .unwrap()
        .contains("b.test.lua"));
    // --since: only files modified after the reference.
    let reference = p.path().join("ref");
    std::fs::write(&reference, "").unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(p.path().join("tests/a.test.lua"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    let out = stdout(&p.run(&["--since", "ref"]));
    assert!(
        out.contains("a.test.lua") && !out.contains("b.test.lua"),
        "{out}"
    );
    // --filter on the root-relative path.
    let out = stdout(&p.run(&["--filter", "b.test"]));
    assert!(
        out.contains("b.test.lua") && !out.contains("a.test.lua"),
        "{out}"
    );
}

#[test]
fn timeouts_per_test_and_per_file() {
    let p = LocalProject::new(&[
        (
            "per_test.test.lua",
            r#"
test("spins forever", {timeout = "300ms"}, function(t) while true do end end)
test("still runs afterwards", function(t) t:assert(true) end)
"#,
        ),
        (
            "file_default.test.lua",
            "provium.timeout = 0.2\ntest('uses the file default', function() while true do end end)\n",
        ),
        ("forever.test.lua", "test('a', function() end)\ntest('b', function() while true do end end)\n"),
    ]);
    let o = p.run(&["--json", "--timeout", "2s"]);
    assert_eq!(exit_code(&o), 1);
    let objs: BTreeMap<String, serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["path"].as_str().unwrap().to_string(), v)
        })
        .collect();
    let per = &objs["per_test.test.lua"];
    assert_eq!(per["timeout"], "in_time");
    assert!(
        per["tests"][0]["message"]
            .as_str()
            .unwrap()
            .contains("test timed out after 0.300s"),
        "{per}"
    );
    assert_eq!(per["tests"][1]["status"], "passed");
    assert!(objs["file_default.test.lua"]["tests"][0]["message"]
        .as_str()
        .unwrap()
        .contains("timed out after 0.200s"));
    let forever = &objs["forever.test.lua"];
    assert_eq!(forever["timeout"], "timed_out");
    assert_eq!(forever["tests"][0]["status"], "passed");
    let plain = stdout(&p.run(&["--timeout", "1s", "--filter", "forever"]));
    assert!(plain.starts_with("TIME forever.test.lua"), "{plain}");
}

#[test]
fn fail_fast_stops_dispatching() {
    // Each file claims the single vCPU, so they run one at a time.
    let claim = "provium:claim({cpus = 1})\n";
    let (a, b) = (format!("{claim}{FAILING}"), format!("{claim}{PASSING}"));
    let p = LocalProject::new(&[("a.test.lua", &a), ("b.test.lua", &b), ("c.test.lua", &b)]);
    let out = stdout(&p.run(&["--fail-fast", "--cpus", "1", "--json"]));
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[test]
fn list_and_lsp_setup() {
    let p = LocalProject::new(&[
        ("a.test.lua", PASSING),
        ("sub/b.test.lua", PASSING),
        ("base.fixture.lua", "return 1"),
    ]);
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .arg("list")
        .current_dir(p.path())
        .output()
        .unwrap();
    // Tests, under their file, as the reference's `provium list # tests`.
    assert_eq!(
        stdout(&o),
        "a.test.lua\n    one\n    two\nsub/b.test.lua\n    one\n    two\n"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["list", "--fixtures"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert_eq!(stdout(&o), "base\n");
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["lsp-setup"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert_eq!(exit_code(&o), 0);
    assert!(
        std::fs::read_to_string(p.path().join(".provium-meta/types.lua"))
            .unwrap()
            .starts_with("---@meta")
    );
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["lsp-setup"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert!(stdout(&o).contains("not overwriting"), "{}", stdout(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["prepare", "nope"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert_eq!(exit_code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("provium prepare: profile `nope` not found in provium.toml"));
}

#[test]
fn a_failing_build_command_aborts_with_exit_two() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    std::fs::write(
        p.path().join("provium.toml"),
        "[provium]\nroots = [\"tests\"]\n[profiles.linux]\ncmdline = \"q\"\nbuild = \"echo {out} > built; exit 3\"\nbuild_out = \"out\"\n",
    )
    .unwrap();
    let o = p.run(&[]);
    assert_eq!(exit_code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("build command failed"));
    assert!(std::fs::read_to_string(p.path().join("built"))
        .unwrap()
        .trim()
        .ends_with("/out"));
    assert_eq!(exit_code(&p.run(&["--no-build"])), 0);
}

#[test]
fn repl_and_console_run_the_profiles_build_first() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    std::fs::write(
        p.path().join("provium.toml"),
        "[provium]\nroots = [\"tests\"]\n[profiles.linux]\ncmdline = \"q\"\nbuild = \"echo $PPID >> built; exit 3\"\nbuild_out = \"out\"\n",
    )
    .unwrap();
    for args in [&["repl", "linux"][..], &["console", "linux"][..]] {
        let _ = std::fs::remove_file(p.path().join("built"));
        let o = p.run(args);
        assert_eq!(exit_code(&o), 2, "{args:?}: {o:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            e.contains("profile `linux`: build command failed"),
            "{args:?}: {e}"
        );
        assert!(
            p.path().join("built").exists(),
            "{args:?}: the build did not run"
        );
    }
}

#[test]
fn rerun_failed_without_recorded_state_prints_the_notice_and_runs_nothing() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    let o = p.run(&["--rerun-failed"]);
    assert_eq!(exit_code(&o), 0, "{o:?}");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("provium: --rerun-failed: no failed files recorded (no state at ")
            && e.contains("rerun.json); nothing to run"),
        "{e}"
    );
    assert_eq!(stdout(&o), "", "nothing ran, so no report");
}

#[test]
fn events_socket_serves_the_stream() {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    let p = LocalProject::new(&[(
        "slow.test.lua",
        // Give the test a moment to connect before the first test runs.
        "local t0 = os.clock()\nwhile os.clock() - t0 < 0.5 do end\ntest('a', function() end)\n",
    )]);
    let sock = p.path().join("events.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args([
            "--vmm",
            "local",
            "--no-preflight",
            "--events-socket",
            sock.to_str().unwrap(),
        ])
        .current_dir(p.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut conn = None;
    for _ in 0..200 {
        if let Ok(c) = UnixStream::connect(&sock) {
            conn = Some(c);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut conn = conn.expect("connect to --events-socket");
    assert!(child.wait().unwrap().success());
    let mut bytes = Vec::new();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let _ = conn.read_to_end(&mut bytes);
    let mut r = &bytes[..];
    let mut kinds = Vec::new();
    while let Ok(Some(f)) = read_message::<EventFrame, _>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
        kinds.push(f.event.kind().as_str());
    }
    assert!(
        kinds.contains(&"test_passed") && kinds.contains(&"file_completed"),
        "{kinds:?}"
    );
}

#[test]
fn coverage_hook_runs_and_its_failure_counts() {
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    let bin = p.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let hook = bin.join("provium-coverage");
    // The fake consumer records its arguments and the stream's size, then
    // exits with the code the test asks for.
    std::fs::write(&hook, "#!/bin/sh\necho \"$@\" > \"$COV_LOG\"\nwc -c < \"$2\" >> \"$COV_LOG\"\nexit \"$COV_EXIT\"\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = p.path().join("cov.log");
    let run = |exit: &str| {
        Command::new(env!("CARGO_BIN_EXE_provium"))
            .args(["--vmm", "local", "--coverage"])
            .current_dir(p.path())
            .env("PATH", &path)
            .env("COV_LOG", &log)
            .env("COV_EXIT", exit)
            .env("PROVIUM_RERUN_STATE", p.path().join("rerun.json"))
            .output()
            .unwrap()
    };
    let o = run("0");
    assert_eq!(exit_code(&o), 0, "{o:?}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.starts_with("--from "), "{logged}");
    let size: u64 = logged.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(size > 0, "the hook saw an empty event stream");
    assert_eq!(
        exit_code(&run("3")),
        1,
        "a failing coverage hook fails the run"
    );
}

/// `provium --vmm local repl ARGS` in `p` with `input` on its stdin, to
/// the end.
fn repl(p: &LocalProject, args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "repl"])
        .args(args)
        .current_dir(p.path())
        .env("XDG_CACHE_HOME", p.path().join("cache"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn repl_evaluates_lines_against_a_vm() {
    let p = LocalProject::new(&[]);
    let o = repl(
        &p,
        &["linux", "--name", "box"],
        b"vm:state()\nvm:run('hostname').stdout\nnot_a_thing()\n",
    );
    assert_eq!(exit_code(&o), 0, "{o:?}");
    assert_eq!(stdout(&o), "booted\nbox\n\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("error: "),
        "{o:?}"
    );
}

#[test]
fn watch_reruns_when_a_file_changes() {
    use std::io::{BufRead, BufReader};
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "--no-preflight", "--watch", "-q"])
        .current_dir(p.path())
        .env("PROVIUM_RERUN_STATE", p.path().join("rerun.json"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut summaries = 0;
    while let Some(Ok(line)) = lines.next() {
        if line.contains(" file(s); ") {
            summaries += 1;
            if summaries == 1 {
                // Change the test so the next run fails, and bump its mtime.
                std::fs::write(p.path().join("tests/a.test.lua"), FAILING).unwrap();
            } else {
                assert!(line.contains("1 failed"), "{line}");
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(summaries, 2);
}

#[test]
fn repl_resumes_from_a_fixture() {
    let p = LocalProject::new(&[(
        "base.fixture.lua",
        "local vm = provium:vm('base', 'linux'):boot()\nvm:write_file('/etc/marker', 'from fixture')\nreturn vm:snapshot()\n",
    )]);
    let o = repl(
        &p,
        &["--fixture", "base"],
        b"vm:read_file('/etc/marker')\nvm:name()\n",
    );
    assert_eq!(exit_code(&o), 0, "{o:?}");
    assert_eq!(stdout(&o), "from fixture\nbase\n", "{o:?}");
}

#[test]
fn events_socket_outlives_watch_iterations() {
    use std::os::unix::net::UnixStream;
    let p = LocalProject::new(&[("a.test.lua", PASSING)]);
    let sock = p.path().join("watch.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args([
            "--vmm",
            "local",
            "--no-preflight",
            "--watch",
            "--events-socket",
        ])
        .arg(&sock)
        .current_dir(p.path())
        .env("PROVIUM_RERUN_STATE", p.path().join("rerun.json"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut conn = None;
    for _ in 0..500 {
        if let Ok(c) = UnixStream::connect(&sock) {
            conn = Some(c);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut conn = conn.expect("connect to --events-socket");
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    // One connection sees file_completed from two runs, each triggered by an
    // edit made after connecting (the first run may finish before we
    // connect): the socket is not rebound between iterations.
    let test_file = p.path().join("tests/a.test.lua");
    for body in [FAILING, PASSING] {
        std::fs::write(&test_file, body).unwrap();
        loop {
            let f = read_message::<EventFrame, _>(&mut conn, DEFAULT_MAX_FRAME_BYTES)
                .expect("read an event")
                .expect("the stream stays open across iterations");
            if let Event::FileCompleted(_) = f.event {
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}
