//! The networking Lua suite (`tests/lua/network`) end to end on the local
//! backend: real sandboxes with TAPs on the userspace switch, pinging each
//! other through partitions, impairments, captures and link changes.
//!
//! Needs root (as in CI), `/dev/net/tun`, `ping` (Debian: iputils-ping),
//! `ip` and `ss` (iproute2) and `perl` (perl-base, on every Debian system: the
//! bandwidth test's TCP transfer). Without them these tests fail, saying
//! which is missing: this is the tier that proves bridges really carry
//! traffic.
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
    let on_path = |tool: &str| {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false)
    };
    for (tool, why) in [
        (
            "ping",
            "apt-get install iputils-ping (the suite pings between sandboxes)",
        ),
        (
            "ss",
            "apt-get install iproute2 (the suite waits for a listening socket)",
        ),
        (
            "perl",
            "apt-get install perl-base (the bandwidth test transfers over TCP with perl)",
        ),
    ] {
        assert!(on_path(tool), "`{tool}` is not installed: {why}");
    }
}

/// `provium --vmm local <args>` from the repository root.
fn provium(args: &[&str], seed_env: Option<&str>) -> Output {
    provium_command(args, seed_env)
        .output()
        .expect("run provium")
}

/// The command [`provium`] runs, not yet started.
fn provium_command(args: &[&str], seed_env: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_provium"));
    cmd.args(["--vmm", "local", "--no-build", "-v"])
        .args(args)
        .current_dir(repo_root())
        .env("PROVIUM_AGENT", agent())
        .env_remove("PROVIUM_SEED");
    if let Some(s) = seed_env {
        cmd.env("PROVIUM_SEED", s);
    }
    cmd
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
        "statistics.test.lua",
        "kernel_path.test.lua",
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

/// The `seeded-drops:` line that statistics.test.lua prints: the run seed
/// and the icmp_seq of the requests and replies the switch dropped.
fn seeded_drops_line(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .find(|l| l.starts_with("seeded-drops: "))
        .unwrap_or_else(|| panic!("no seeded-drops line:\n{}", show(o)))
        .to_string()
}

/// Reproduction across runs, which the Lua test cannot see from inside one
/// run: the same `--seed` drops the same pings in separate processes (with
/// fresh switches, sandboxes and interleavings), and another seed drops
/// others. The three runs go in parallel to keep the wall time down.
#[test]
fn the_same_seed_drops_the_same_packets_across_runs() {
    require_environment();
    let file = "tests/lua/network/statistics.test.lua";
    let args = |seed: &'static str| {
        [
            "--config",
            "tests/lua/provium.toml",
            "--tag",
            "seeded-drops",
            "--seed",
            seed,
            file,
        ]
    };
    let runs: Vec<_> = ["4242", "4242", "4243"]
        .into_iter()
        .map(|seed| {
            provium_command(&args(seed), None)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start provium")
        })
        .collect();
    let outs: Vec<Output> = runs
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait for provium"))
        .collect();
    for o in &outs {
        assert_eq!(o.status.code(), Some(0), "{}", show(o));
        assert!(
            String::from_utf8_lossy(&o.stdout)
                .contains("PASS the same seed drops the same packets"),
            "{}",
            show(o)
        );
    }
    let first = seeded_drops_line(&outs[0]);
    assert!(first.starts_with("seeded-drops: run seed 4242 "), "{first}");
    assert_eq!(
        seeded_drops_line(&outs[1]),
        first,
        "the same seed dropped other packets in another run"
    );
    let other = seeded_drops_line(&outs[2]);
    assert!(other.starts_with("seeded-drops: run seed 4243 "), "{other}");
    let lists = |l: &str| l.split_once(" lost ").map(|(_, rest)| rest.to_string());
    assert_ne!(
        lists(&other),
        lists(&first),
        "seeds 4242 and 4243 dropped the same packets: the seed does not reach the drops"
    );
}
