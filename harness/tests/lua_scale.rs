//! Scale on the local backend (issue 31): forty sandboxes on one bridge
//! (`tests/lua/scale`), every member reaching the first, and closing the
//! bridge leaving no kernel-path wire, filter or tc action in any member
//! nor any wire end on the host. No timing is asserted; the figures are
//! `benches/scale.sh`'s (docs/benchmarking.md, "Scale").
//!
//! A test binary of its own: cargo runs binaries one after another, so the
//! forty boots do not load the machine under the networking suite's
//! statistics tests. Needs root, `/dev/net/tun`, `ping`, `ip` and `tc`, as
//! `lua_network.rs`.
mod common;

use common::{agent, repo_root};

use std::process::Command;

#[test]
fn forty_sandboxes_on_one_bridge_reach_the_first_and_leave_nothing() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "local sandboxes and TAPs need root; run the tests as root, as CI does"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "--no-build", "-v"])
        .args(["--config", "tests/lua/provium.toml", "tests/lua/scale"])
        .current_dir(repo_root())
        .env("PROVIUM_AGENT", agent())
        .output()
        .expect("run provium");
    let show = format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(0), "{show}");
    assert!(
        show.contains("forty_on_one_bridge.test.lua"),
        "the file did not run:\n{show}"
    );
    // Wire ends live in the sandboxes' namespaces, never on the host.
    let host_links: Vec<String> = std::fs::read_dir("/sys/class/net")
        .expect("list /sys/class/net")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("pvk"))
        .collect();
    assert!(
        host_links.is_empty(),
        "wire ends on the host: {host_links:?}"
    );
}
