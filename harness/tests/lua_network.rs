//! The networking Lua suite (`tests/lua/network`) end to end on the local
//! backend: real sandboxes with TAPs on the userspace switch, pinging each
//! other through partitions, impairments, captures and link changes.
//!
//! Needs root (as in CI), `/dev/net/tun` and `ping` (Debian: iputils-ping).
//! Without them these tests fail, saying which is missing: this is the tier
//! that proves bridges really carry traffic.
mod common;

use common::{agent, repo_root};

use std::path::Path;
use std::process::{Command, Output};

fn require_environment() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the networking suite needs root (local sandboxes and TAPs); run the tests as root, as CI does"
    );
    assert!(
        Path::new("/dev/net/tun").exists(),
        "/dev/net/tun is missing: load the `tun` module (modprobe tun)"
    );
    let has_ping = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("ping").is_file()))
        .unwrap_or(false);
    assert!(
        has_ping,
        "`ping` is not installed: apt-get install iputils-ping (the suite pings between sandboxes)"
    );
}

/// `provium --vmm local <args>` from the repository root.
fn provium(args: &[&str], seed_env: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_provium"));
    cmd.args(["--vmm", "local", "--no-build", "-v"])
        .args(args)
        .current_dir(repo_root())
        .env("PROVIUM_AGENT", agent())
        .env_remove("PROVIUM_SEED");
    if let Some(s) = seed_env {
        cmd.env("PROVIUM_SEED", s);
    }
    cmd.output().expect("run provium")
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn network_suite_passes() {
    require_environment();
    // The suites' config: profile `linux` is declared there (the local
    // backend reads no kernel from it).
    let o = provium(
        &["--config", "tests/lua/provium.toml", "tests/lua/network"],
        Some("4242"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for file in [
        "ping.test.lua",
        "partitions.test.lua",
        "impairments.test.lua",
        "scope.test.lua",
    ] {
        assert!(out.contains(file), "{file} did not run:\n{}", show(&o));
    }
}

#[test]
fn a_wrong_expectation_fails_and_prints_the_seed() {
    require_environment();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("wrong.test.lua"),
        r#"
local lan = provium:bridge("lan")
local a = provium:vm("a", "linux"):boot()
local b = provium:vm("b", "linux"):boot()
lan:attach({a, b})
a:run("ip addr add 10.0.0.1/24 dev eth0"):assert_ok()
b:run("ip addr add 10.0.0.2/24 dev eth0"):assert_ok()

test("ping works before the partition", function(t)
  t:assert(a:run("ping -c 1 -W 1 10.0.0.2"):ok())
end)

test("WRONG: ping through a symmetric partition", function(t)
  lan:partition(a, b)
  a:run("ping -c 1 -W 1 10.0.0.2"):assert_ok()
end)
"#,
    )
    .expect("write the test file");
    let path = dir.path().to_str().expect("utf-8 temp path");
    let o = provium(&["--seed", "7", path], None);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let all = show(&o);
    assert!(
        all.contains("WRONG: ping through a symmetric partition"),
        "{all}"
    );
    assert!(
        all.contains("run seed 7"),
        "the seed is printed on failure: {all}"
    );
    // The first test passed: the failure is the partition, not the setup.
    assert!(all.contains("ping works before the partition"), "{all}");
}
