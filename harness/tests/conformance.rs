//! Reference conformance (issue 14): each documented behaviour, through the
//! real `provium` binary on the local backend (root, as in CI).

mod common;

use common::ensure_agent;

use std::path::Path;
use std::process::Command;

/// Write `files` (name, text) and a one-profile provium.toml into a fresh
/// directory, run `provium --vmm local --json <args>` there, and return the
/// exit code, the `--json` summary and the human output.
fn run_lua(files: &[(&str, &str)], args: &[&str]) -> (i32, serde_json::Value, String) {
    ensure_agent();
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), files, args)
}

fn run_in(dir: &Path, files: &[(&str, &str)], args: &[&str]) -> (i32, serde_json::Value, String) {
    if !dir.join("provium.toml").exists() {
        std::fs::write(
            dir.join("provium.toml"),
            "[provium]\nroots = [\".\"]\ncache_dir = \"cache\"\n\n[profiles.linux]\ncmdline = \"q\"\n",
        )
        .unwrap();
    }
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "--json"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    // One JSON line per file: gathered as {"files": [...], "tests": [...]}.
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let mut files = Vec::new();
    let mut tests = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let f: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("--json line: {e}\nstdout: {stdout}\nstderr: {stderr}"));
        tests.extend(f["tests"].as_array().cloned().unwrap_or_default());
        files.push(f);
    }
    let v = serde_json::json!({"files": files, "tests": tests});
    (o.status.code().unwrap_or(-1), v, stderr)
}

/// Every test in the summary passed (and there was at least one).
fn assert_all_passed(code: i32, v: &serde_json::Value, stderr: &str) {
    let tests = v["tests"].as_array().expect("tests array");
    assert!(!tests.is_empty(), "{v}\n{stderr}");
    for t in tests {
        assert_eq!(t["status"], "passed", "{t}\n{v}\n{stderr}");
    }
    assert_eq!(code, 0, "{v}\n{stderr}");
}

#[test]
fn env_clear_shows_only_the_supplied_keys_in_every_form() {
    let (code, v, err) = run_lua(
        &[(
            "env.test.lua",
            r#"
local vm = provium:vm("envc", "linux")
test("env_clear", function(t)
  vm:boot()
  local want = "FOO=bar\n"
  local opts = {env = {FOO = "bar"}, env_clear = true, cwd = "/tmp"}
  t:assert_eq(vm:run("/usr/bin/env", opts).stdout, want)
  t:assert_eq(vm:run("/usr/bin/env", {args = {}, env = {FOO = "bar"}, env_clear = true}).stdout, want)
  local p = vm:run_async("/usr/bin/env", {env = {FOO = "bar"}, env_clear = true})
  t:assert_eq(p:wait().stdout, want)
  local w = vm:spawn_worker()
  t:assert_eq(w:run("/usr/bin/env", opts).stdout, want)
  w:close()
end)
"#,
        )],
        &["."],
    );
    assert_all_passed(code, &v, &err);
}

#[test]
fn spawn_worker_thread_false_is_a_plain_worker() {
    let (code, v, err) = run_lua(
        &[(
            "worker.test.lua",
            r#"
local vm = provium:vm("wk", "linux")
test("thread = false", function(t)
  vm:boot()
  local w = vm:spawn_worker({thread = false})
  t:assert_eq(w:run("echo hi").stdout, "hi\n")
  w:close()
  t:assert_contains(t:assert_raises(function() vm:spawn_worker({thread = true}) end), "future work")
  t:assert_contains(t:assert_raises(function() vm:spawn_worker({threads = 2}) end), "unknown option `threads`")
end)
"#,
        )],
        &["."],
    );
    assert_all_passed(code, &v, &err);
}

#[test]
fn file_fd_is_zero_after_close_and_handle_tails_start_at_the_cursor() {
    let (code, v, err) = run_lua(
        &[(
            "files.test.lua",
            r#"
local vm = provium:vm("fds", "linux")
test("fd and cursor tails", function(t)
  vm:boot()
  vm:write_file("/tmp/log", "old-bytes\n")
  local h = vm:open_file("/tmp/log", {read = true})
  t:assert(h:fd() ~= 0, "an open file has a non-zero handle")
  h:seek(0, "end")
  local s = h:tail_stream()
  local g = vm:fd_stream(h)
  vm:run("echo new >> /tmp/log"):assert_ok()
  t:assert_eq(s:read_until("\n", "10s"), "new\n")
  t:assert_eq(g:read_until("\n", "10s"), "new\n")
  s:close()
  g:close()
  -- A cursor in the middle: the tail starts there, not at byte 0.
  local m = vm:open_file("/tmp/log", {read = true})
  m:seek(4, "set")
  local ms = m:tail_stream()
  t:assert_eq(ms:read_until("\n", "10s"), "bytes\n")
  ms:close()
  m:close()
  h:close()
  t:assert_eq(h:fd(), 0)
end)
"#,
        )],
        &["."],
    );
    assert_all_passed(code, &v, &err);
}

#[test]
fn vm_and_lab_fixtures_restore_a_fresh_copy_at_every_call() {
    let (code, v, err) = run_lua(
        &[
            (
                "fixtures/base.fixture.lua",
                r#"
local vm = provium:vm("base", "linux"):boot()
vm:write_file("/srv/tag", "v1")
return vm:snapshot()
"#,
            ),
            (
                "fixtures/pair.fixture.lua",
                r#"
provium:vm("a", "linux"):boot():write_file("/srv/who", "a")
return provium:snapshot()
"#,
            ),
            (
                "uses.test.lua",
                r#"
local root = provium:vm_fixture("fixtures/base")
local root2 = provium:vm_fixture("fixtures/base")
test("two nodes from one base, file root and test", function(t)
  t:assert_eq(root:name(), "base")
  t:assert_eq(root2:name(), "base-2")
  local a = provium:vm_fixture("fixtures/base")
  local b = provium:vm_fixture("fixtures/base", {name = "node-b"})
  t:assert_eq(a:name(), "base-3")
  t:assert_eq(b:name(), "node-b")
  a:write_file("/srv/tag", "changed")
  t:assert_eq(b:read_file("/srv/tag"), "v1")
  t:assert_eq(root:read_file("/srv/tag"), "v1")
  a:shutdown()
  local c = provium:vm_fixture("fixtures/base")
  t:assert_eq(c:name(), "base-4")
  t:assert_eq(c:read_file("/srv/tag"), "v1")
  t:assert_contains(t:assert_raises(function()
    provium:vm_fixture("fixtures/base", {name = "node-b"})
  end), "node-b")
end)
test("a later test gets fresh copies again", function(t)
  local a = provium:vm_fixture("fixtures/base")
  t:assert_eq(a:name(), "base-3")
  t:assert_eq(a:read_file("/srv/tag"), "v1")
end)
test("two labs from one lab fixture", function(t)
  local l1 = provium:lab_fixture("fixtures/pair")
  local l2 = provium:lab_fixture("fixtures/pair")
  l1:vm("a"):write_file("/srv/who", "changed")
  t:assert_eq(l2:vm("a"):read_file("/srv/who"), "a")
  t:assert_eq(l1:vm("a"):read_file("/srv/who"), "changed")
end)
"#,
            ),
        ],
        &["uses.test.lua"],
    );
    assert_all_passed(code, &v, &err);
}

#[test]
fn skip_and_slow_meta_follow_the_reference() {
    let (code, v, err) = run_lua(
        &[(
            "meta.test.lua",
            r#"
test("string skip", {skip = "see issue #42"}, function(t) error("must not run") end)
test("int skip", {skip = 1}, function(t) error("must not run") end)
test("zero skip runs", {skip = 0}, function(t) end)
test("slow", {slow = true}, function(t) error("must not run") end)
test("int slow", {slow = 3}, function(t) error("must not run") end)
test("zero slow runs", {slow = 0}, function(t) end)
"#,
        )],
        &["."],
    );
    assert_eq!(code, 0, "{v}\n{err}");
    let want = [
        ("string skip", "skipped", Some("skipped: see issue #42")),
        ("int skip", "skipped", Some("skipped (meta.skip)")),
        ("zero skip runs", "passed", None),
        (
            "slow",
            "skipped",
            Some("filtered: slow tests skipped (pass --include-slow)"),
        ),
        (
            "int slow",
            "skipped",
            Some("filtered: slow tests skipped (pass --include-slow)"),
        ),
        ("zero slow runs", "passed", None),
    ];
    let tests = v["tests"].as_array().unwrap();
    assert_eq!(tests.len(), want.len(), "{v}");
    for (t, (name, status, message)) in tests.iter().zip(want) {
        assert_eq!(t["name"], name, "{v}");
        assert_eq!(t["status"], status, "{t}");
        if let Some(m) = message {
            assert_eq!(t["message"], m, "{t}");
        }
    }
}

#[test]
fn bridge_route_records_the_intent_and_warns_once_per_bridge() {
    let (code, v, err) = run_lua(
        &[(
            "route.test.lua",
            r#"
test("routes", function(t)
  local lan = provium:bridge("lan")
  local wan = provium:bridge("wan")
  t:assert_eq(#lan:routes(), 0)
  lan:route(wan)
  lan:route({wan, "dmz"})
  t:assert_eq(table.concat(lan:routes(), ","), "wan,dmz")
  wan:route("lan")
  t:assert_eq(table.concat(wan:routes(), ","), "lan")
end)
"#,
        )],
        &["."],
    );
    assert_all_passed(code, &v, &err);
    assert_eq!(err.matches("records the route only").count(), 2, "{err}");
    assert!(err.contains("bridge:route on `lan`"), "{err}");
    assert!(err.contains("bridge:route on `wan`"), "{err}");
}

#[test]
fn a_bridge_capture_blocks_snapshots_of_the_vms_on_it() {
    let (code, v, err) = run_lua(
        &[
            (
                "capture.test.lua",
                r#"
test("bridge capture blocks vm and lab snapshots", function(t)
  local lan = provium:bridge("lan")
  local a = provium:vm("a", "linux")
  local other = provium:vm("other", "linux"):boot()
  lan:attach(a)
  a:boot()
  local cap = lan:capture()
  t:assert_contains(t:assert_raises(function() a:snapshot() end), "vm:snapshot() refused")
  t:assert_contains(t:assert_raises(function() a:snapshot() end), "capture(\"bridge lan\")")
  t:assert_contains(t:assert_raises(function() provium:snapshot() end), "lab:snapshot() refused")
  -- A VM on no captured bridge is not blocked.
  other:snapshot():delete()
  cap:close()
end)
"#,
            ),
            (
                "reset.test.lua",
                r#"
provium.reset_between_tests = true
local lan = provium:bridge("lan")
local a = provium:vm("a", "linux")
lan:attach(a)
a:boot()
local cap = lan:capture()
test("never runs: the baseline is refused", function(t) end)
"#,
            ),
        ],
        &["capture.test.lua", "reset.test.lua"],
    );
    assert_ne!(code, 0, "{v}\n{err}");
    let text = format!("{v}{err}");
    assert!(
        text.contains("reset_between_tests would auto-snapshot a live stream"),
        "{text}"
    );
    let tests = v["tests"].as_array().unwrap();
    let first = tests
        .iter()
        .find(|t| t["name"] == "bridge capture blocks vm and lab snapshots")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(first["status"], "passed", "{first}\n{err}");
}

#[test]
fn push_file_resolves_against_the_calling_file_and_checks_its_opts() {
    let (code, v, err) = run_lua(
        &[
            (
                "helpers/pusher.lua",
                r#"
local M = {}
function M.push(vm)
  -- Relative to this helper's directory, as the fixture-key scanner reads it.
  vm:push_file("payload.txt", "/srv/from-helper")
end
return M
"#,
            ),
            ("helpers/payload.txt", "helper payload"),
            ("suite/local.txt", "test payload"),
            (
                "suite/push.test.lua",
                r#"
local pusher = require("helpers.pusher")
test("push_file", function(t)
  local vm = provium:vm("pf", "linux"):boot()
  pusher.push(vm)
  t:assert_eq(vm:read_file("/srv/from-helper"), "helper payload")
  vm:push_file("local.txt", "/srv/local", {auto_dep = false})
  t:assert_eq(vm:read_file("/srv/local"), "test payload")
  t:assert_contains(t:assert_raises(function() vm:push_file("local.txt", "/srv/x", {auto_deps = false}) end),
    "push_file: unknown option `auto_deps` (accepted: auto_dep)")
  t:assert_contains(t:assert_raises(function() vm:push_file("local.txt", "/srv/x", {auto_dep = "no"}) end),
    "`auto_dep` must be a boolean")
end)
"#,
            ),
        ],
        &["suite"],
    );
    assert_all_passed(code, &v, &err);
}

#[test]
fn a_runner_panic_marks_the_rest_of_the_file_poisoned() {
    let (code, v, err) = run_lua(
        &[(
            "poison.test.lua",
            r#"
test("before", function(t) end)
test("crashes the runner", function(t)
  local vm = provium:vm("p", "linux"):boot()
  _provium_test_panic("injected runner panic")
end)
test("after", function(t) error("must not run") end)
test("after too", function(t) error("must not run") end)
"#,
        )],
        &["."],
    );
    assert_ne!(code, 0, "{v}\n{err}");
    let tests = v["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 4, "{v}");
    assert_eq!(tests[0]["status"], "passed", "{v}");
    assert_eq!(tests[1]["status"], "failed", "{v}");
    assert!(
        tests[1]["message"]
            .as_str()
            .unwrap()
            .contains("the runner panicked: injected runner panic"),
        "{v}"
    );
    for t in &tests[2..] {
        assert_eq!(t["status"], "failed", "{t}");
        assert!(
            t["message"]
                .as_str()
                .unwrap()
                .starts_with("failed-due-to-poisoned-state: not run"),
            "{t}"
        );
    }
    let chunk = v["files"][0]["chunk_error"].as_str().unwrap_or_default();
    assert!(chunk.contains("injected runner panic"), "{v}");
}

#[test]
fn coverage_marks_its_own_temp_file_and_removes_both() {
    ensure_agent();
    let dir = tempfile::tempdir().unwrap();
    let (bin, tmp) = (dir.path().join("bin"), dir.path().join("tmp"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    let hook = bin.join("provium-coverage");
    std::fs::write(
        &hook,
        "#!/bin/sh\n{ echo \"marker=$PROVIUM_COVERAGE_MARKER\"; echo \"tmp=$PROVIUM_COVERAGE_TMP\"; test -f \"$PROVIUM_COVERAGE_MARKER\" && echo present; } > \"$COV_LOG\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.path().join("a.test.lua"),
        "test(\"a\", function(t) end)\n",
    )
    .unwrap();
    let log = dir.path().join("cov.log");
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "--coverage", "a.test.lua"])
        .current_dir(dir.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("TMPDIR", &tmp)
        .env("COV_LOG", &log)
        .env("PROVIUM_RERUN_STATE", dir.path().join("rerun.json"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let logged = std::fs::read_to_string(&log).unwrap();
    let marker = logged
        .lines()
        .find_map(|l| l.strip_prefix("marker="))
        .unwrap_or_default()
        .to_string();
    assert!(marker.ends_with(".msgpack.provium-marker"), "{logged}");
    assert!(
        logged.contains("\npresent\n"),
        "the marker existed during the hook: {logged}"
    );
    assert!(!Path::new(&marker).exists(), "marker left behind");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        !left
            .iter()
            .any(|p| p.to_string_lossy().contains("provium-coverage-")),
        "{left:?}"
    );
}

#[test]
fn relative_profile_paths_that_the_reference_reads_elsewhere_are_warned_about() {
    ensure_agent();
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite");
    std::fs::create_dir_all(&suite).unwrap();
    std::fs::write(
        suite.join("provium.toml"),
        "[profiles.linux]\ncmdline_file = \"boot/cmdline\"\nbuild = \"true\"\n",
    )
    .unwrap();
    std::fs::write(suite.join("a.test.lua"), "test(\"a\", function(t) end)\n").unwrap();
    // Only under the current directory, as the reference would read it.
    std::fs::create_dir_all(dir.path().join("boot")).unwrap();
    std::fs::write(dir.path().join("boot/cmdline"), "init=/x").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args([
            "--vmm",
            "local",
            "--config",
            "suite/provium.toml",
            "suite/a.test.lua",
        ])
        .current_dir(dir.path())
        .env("PROVIUM_RERUN_STATE", dir.path().join("rerun.json"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("provium: warning: profile `linux`: cmdline_file `boot/cmdline` is resolved against the directory of"),
        "{err}"
    );
    assert!(err.contains("its build command runs in"), "{err}");
}

#[test]
fn lab_snapshot_returns_the_reference_value_and_restores_the_topology() {
    let (code, v, err) = run_lua(
        &[(
            "topology.test.lua",
            r#"
local function pairs_of(b)
  local out = {}
  for _, p in ipairs(b:partitions()) do out[#out + 1] = p.from .. ">" .. p.to end
  return table.concat(out, ",")
end

test("lab snapshot topology", function(t)
  local lan = provium:bridge("lan")
  local dc = provium:lab("dc1")
  local core = dc:bridge("core")
  local vm = provium:vm("solo", "linux"):boot()
  vm:write_file("/srv/who", "solo")
  lan:attach({"a", "b", "c"})
  core:attach({"x", "y"})
  lan:partition("a", "b")
  core:partition("x", "y")
  lan:isolate("c")
  lan:add_latency(50)
  lan:drop_rate(12.5)
  core:bandwidth_limit(1000000)
  lan:route(core)

  -- The reference's return values: a path string for an explicit dir,
  -- a LabSnapshot for a temp one.
  local dir = os.tmpname()
  os.remove(dir)
  local ret = provium:snapshot(dir)
  t:assert_eq(type(ret), "string")
  t:assert_eq(ret, dir)
  local ls = provium:snapshot()
  t:assert_eq(type(ls), "userdata")
  t:assert(ls:size() > 0)

  -- Change every element, then restore.
  lan:restore_all()
  core:restore_all()
  lan:unisolate("c")
  lan:reset()
  core:reset()
  lan:route("wan")
  lan:detach("b")
  vm:write_file("/srv/who", "changed")
  provium:restore(ret)
  t:assert_eq(table.concat(lan:members(), ","), "a,b,c")
  t:assert_eq(pairs_of(lan), "a>b,b>a")
  t:assert_eq(pairs_of(core), "x>y,y>x")
  t:assert_eq(table.concat(lan:isolated(), ","), "c")
  t:assert_eq(lan:latency_ms(), 50)
  t:assert_eq(lan:drop_rate_pct(), 12.5)
  t:assert_eq(core:bandwidth_bps(), 1000000)
  t:assert_eq(table.concat(lan:routes(), ","), "core")
  t:assert_eq(vm:read_file("/srv/who"), "solo")

  -- Into a lab that has none of it: bridges come back with their state.
  local fresh = provium:lab("elsewhere")
  fresh:restore(ls)
  local flan = fresh:bridge("lan")
  t:assert_eq(table.concat(flan:members(), ","), "a,b,c")
  t:assert_eq(pairs_of(flan), "a>b,b>a")
  t:assert_eq(flan:latency_ms(), 50)
  t:assert_eq(pairs_of(fresh.dc1:bridge("core")), "x>y,y>x")
  t:assert_eq(fresh:vm("solo"):read_file("/srv/who"), "solo")
  os.execute("rm -rf '" .. dir .. "'")
end)

-- Per-pair impairments and one-way partitions, each on one ordered pair of
-- booted VMs: the lab snapshot gives back exactly those, in their
-- directions only.
test("lab snapshot per-pair impairments", function(t)
  local lan = provium:bridge("pl")
  local a = provium:vm("pa", "linux")
  local b = provium:vm("pb", "linux")
  local c = provium:vm("pc", "linux")
  lan:attach({a, b, c})
  a:boot()
  b:boot()
  c:boot()
  local function check(what)
    local ac = lan:pair_impairment(a, c)
    t:assert_eq(ac.ms, what and 30 or nil)
    t:assert_eq(ac.p, nil)
    local ca = lan:pair_impairment(c, a)
    t:assert_eq(ca.p, what and 40 or nil)
    t:assert_eq(ca.ms, nil)
    t:assert_eq(lan:pair_impairment(b, a).bps, what and 8000 or nil)
    t:assert_eq(lan:pair_impairment(a, b).bps, nil)
    t:assert_eq(lan:is_partitioned(b, c), what)
    t:assert(not lan:is_partitioned(c, b), "c -> b stays open")
  end
  lan:add_latency({from = a, to = c, ms = 30})
  lan:drop_rate({from = c, to = a, p = 40})
  lan:bandwidth_limit({from = b, to = a, bps = 8000})
  lan:partition({from = b, to = c})
  check(true)
  local snap = provium:snapshot()
  lan:reset()
  check(false)
  provium:restore(snap)
  check(true)
end)
"#,
        )],
        &["."],
    );
    assert_all_passed(code, &v, &err);
}

const BRIDGED_PAIR: &str = r#"
local function setup(lan)
  local a = provium:vm("a", "linux")
  local b = provium:vm("b", "linux")
  lan:attach({a, b})
  a:boot()
  b:boot()
  a:run("ip addr add 10.9.0.1/24 dev eth0"):assert_ok()
  b:run("ip addr add 10.9.0.2/24 dev eth0 && ip route add 10.99.0.0/16 via 10.9.0.1"):assert_ok()
  return a, b
end
local function check(t, a, b)
  t:assert_contains(b:run("ip -o -4 addr show dev eth0").stdout, "10.9.0.2/24")
  t:assert_contains(b:run("ip -4 route show").stdout, "10.99.0.0/16 via 10.9.0.1 dev eth0")
  b:run("ping -c 1 -W 5 10.9.0.1"):assert_ok()
  a:run("ping -c 1 -W 5 10.9.0.2"):assert_ok()
end
"#;

#[test]
fn a_bridged_local_sandbox_snapshots_and_restores_its_interfaces() {
    let (code, v, err) = run_lua(
        &[
            (
                "vm.test.lua",
                &format!(
                    "{BRIDGED_PAIR}\n{}",
                    r#"
test("vm snapshot and restore of a bridged sandbox", function(t)
  local lan = provium:bridge("lan")
  local a, b = setup(lan)
  check(t, a, b)
  local snap = b:snapshot()
  b:write_file("/tmp/mark", "after")
  b:shutdown()
  b:restore(snap)
  t:assert_eq(b:run("cat /tmp/mark 2>/dev/null || echo gone").stdout, "gone\n")
  check(t, a, b)
end)
"#
                ),
            ),
            (
                "reset.test.lua",
                &format!(
                    "{BRIDGED_PAIR}\n{}",
                    r#"
provium.reset_between_tests = true
local lan = provium:bridge("lan")
local a, b = setup(lan)
test("first test changes the network", function(t)
  check(t, a, b)
  b:run("ip addr flush dev eth0"):assert_ok()
end)
test("the next starts from the baseline", function(t)
  check(t, a, b)
end)
"#
                ),
            ),
            (
                "fixtures/pair.fixture.lua",
                &format!(
                    "{BRIDGED_PAIR}\n{}",
                    r#"
setup(provium:bridge("lan"))
return provium:snapshot()
"#
                ),
            ),
            (
                "fixture.test.lua",
                &format!(
                    "{BRIDGED_PAIR}\n{}",
                    r#"
test("a lab fixture with a bridge", function(t)
  local l = provium:lab_fixture("fixtures/pair")
  check(t, l:vm("a"), l:vm("b"))
  t:assert_eq(table.concat(l:bridge("lan"):members(), ","), "a,b")
end)
"#
                ),
            ),
        ],
        &["vm.test.lua", "reset.test.lua", "fixture.test.lua"],
    );
    assert_all_passed(code, &v, &err);
}
