//! Snapshots, restore, lab snapshots and reset_between_tests through the
//! real `provium` binary on the local backend (root, as in CI).

mod common;

use common::{ensure_agent, repo_root as repo};

use std::process::Command;

fn run_json(path: &str) -> (i32, serde_json::Value, String) {
    ensure_agent();
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args([
            "--vmm",
            "local",
            "--json",
            "--config",
            "tests/lua/provium.toml",
            path,
        ])
        .current_dir(repo())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("--json output: {e}\n{stderr}"));
    (o.status.code().unwrap_or(-1), v, stderr)
}

fn statuses(v: &serde_json::Value) -> Vec<(String, String, String)> {
    v["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or("").to_string(),
                t["status"].as_str().unwrap_or("").to_string(),
                t["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn snapshot_suite_passes() {
    let (code, v, err) = run_json("tests/lua/snapshots/snapshot.test.lua");
    let st = statuses(&v);
    assert_eq!(code, 0, "{st:#?}\n{err}");
    assert_eq!(st.len(), 6, "{st:#?}");
    assert!(st.iter().all(|(_, s, _)| s == "passed"), "{st:#?}");
}

/// `vm:fork` and `lab:fork` on sandboxes: four tests pass; the disk and
/// seeded-rng tests skip, saying they need the kvm backend.
#[test]
fn fork_suite_passes() {
    let (code, v, err) = run_json("tests/lua/snapshots/fork.test.lua");
    let st = statuses(&v);
    assert_eq!(code, 0, "{st:#?}\n{err}");
    assert_eq!(st.len(), 6, "{st:#?}");
    let passed = st.iter().filter(|(_, s, _)| s == "passed").count();
    assert_eq!(passed, 4, "{st:#?}");
    for (name, s, msg) in st.iter().filter(|(_, s, _)| s != "passed") {
        assert_eq!(s, "skipped", "{name}: {msg}");
        assert!(msg.contains("--vmm kvm"), "{name}: {msg}");
    }
}

/// Lives here rather than under tests/lua: one of its tests fails on purpose
/// (the baseline must come back after a failed test too), which would fail
/// any run over the whole tests/lua tree.
const RESET_LUA: &str = r#"-- provium.reset_between_tests: file-scope VMs are restored to the state
-- the chunk left them in before every test.
provium.reset_between_tests = true

local vm = provium:vm("reset", "linux"):boot()
vm:write_file("/srv/baseline", "base")

test("a test mutates file-scope state", function(t)
  t:assert_eq(vm:read_file("/srv/baseline"), "base")
  vm:write_file("/srv/baseline", "mutated")
  vm:write_file("/srv/extra", "x")
end)

test("a failing test mutates too", function(t)
  vm:write_file("/srv/baseline", "mutated again")
  t:assert(false, "deliberate failure")
end)

test("the next test sees the baseline again", function(t)
  t:assert_eq(vm:read_file("/srv/baseline"), "base")
  t:assert_raises(function() vm:stat("/srv/extra") end)
end)
"#;

#[test]
fn reset_between_tests_restores_the_baseline_after_every_test() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("reset.test.lua");
    std::fs::write(&file, RESET_LUA).unwrap();
    let (code, v, err) = run_json(file.to_str().unwrap());
    let st = statuses(&v);
    assert_eq!(code, 1, "one test fails on purpose: {st:#?}\n{err}");
    assert_eq!(st[0].1, "passed", "{st:#?}");
    assert_eq!(st[1].1, "failed", "{st:#?}");
    assert!(st[1].2.contains("deliberate failure"), "{st:#?}");
    assert_eq!(st[2].1, "passed", "the baseline was not restored: {st:#?}");
}
