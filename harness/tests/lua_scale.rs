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
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests here run one at a time: the SIGKILL test tells namespaces
/// apart by their inode numbers, which the kernel reuses, and the other
/// test makes forty.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn forty_sandboxes_on_one_bridge_reach_the_first_and_leave_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert_root();
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
    assert_no_wire_end_on_the_host();
}

fn assert_no_wire_end_on_the_host() {
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

/// The host's named network namespaces (`ip netns`).
fn named_namespaces() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "local sandboxes and TAPs need root; run the tests as root, as CI does"
    );
}

/// `readlink /proc/PID/ns/net` of every process: the network namespaces
/// some process is still in.
fn live_net_namespaces() -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("list /proc")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read_link(e.path().join("ns/net")).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .collect()
}

/// A run killed with its forty sandboxes' wires built leaves none of them:
/// the sandboxes die with provium (PDEATHSIG), and with their network
/// namespaces go every wire end and tc action in them; nothing was ever on
/// the host.
#[test]
fn sigkill_with_forty_wired_sandboxes_leaves_no_namespace_or_wire() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("wired");
    std::fs::copy(
        repo_root().join("tests/lua/provium.toml"),
        dir.path().join("provium.toml"),
    )
    .expect("copy the suites' config");
    std::fs::write(
        dir.path().join("wired.test.lua"),
        format!(
            r#"
local n = 40
local lan = provium:bridge("lan")
local vms = {{}}
for i = 1, n do vms[i] = provium:vm("m" .. i, "linux"):boot() end
lan:attach(vms)
for i = 1, n do
  vms[i]:run("ip addr add 10.32.0." .. i .. "/24 dev eth0 && ip link set eth0 up"):assert_ok()
end
for i = 2, n do vms[i]:run("ping -c 1 -W 2 10.32.0.1"):assert_ok() end
lan:stats() -- settles the wires the pings asked for
local lines = {{}}
for i = 1, n do
  lines[i] = (vms[i]:run("readlink /proc/self/ns/net"):assert_ok().stdout:gsub("%s", ""))
end
local wires = vms[1]:run("ip -o link show | grep -c ' pvk'").stdout:gsub("%s", "")
local f = io.open({marker:?}, "w")
f:write("wires " .. wires .. "\n" .. table.concat(lines, "\n") .. "\n")
f:close()
vms[1]:run("sleep 300")
test("unreached", function(t) end)
"#
        ),
    )
    .expect("write the test file");
    let named_before = named_namespaces();
    let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(["--vmm", "local", "--no-build", "wired.test.lua"])
        .current_dir(dir.path())
        .env("PROVIUM_AGENT", agent())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run provium");
    let deadline = Instant::now() + Duration::from_secs(300);
    let written = loop {
        if let Ok(s) = std::fs::read_to_string(&marker) {
            if s.ends_with('\n') && s.lines().count() > 40 {
                break s;
            }
        }
        if let Some(status) = child.try_wait().expect("poll provium") {
            panic!("provium exited ({status}) before its sandboxes were wired");
        }
        assert!(Instant::now() < deadline, "no marker after 300 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut lines = written.lines();
    let wires: usize = lines
        .next()
        .and_then(|l| l.strip_prefix("wires "))
        .and_then(|n| n.parse().ok())
        .expect("the wire count line");
    assert_eq!(wires, 39, "m1 had a wire to each other member");
    let namespaces: Vec<String> = lines.map(str::to_owned).collect();
    // SAFETY: kill of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().expect("reap provium");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = live_net_namespaces();
        let left: Vec<&String> = namespaces.iter().filter(|n| live.contains(n)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox namespaces (and the wires in them) outlived the SIGKILL: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let named_after = named_namespaces();
    let new: Vec<&String> = named_after
        .iter()
        .filter(|n| !named_before.contains(n))
        .collect();
    assert!(new.is_empty(), "named namespaces appeared: {new:?}");
    assert_no_wire_end_on_the_host();
}
