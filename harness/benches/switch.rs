//! The userspace switch against the kernel bridge, between the same two local
//! sandboxes, in one run.
//!
//!   bash benches/switch.sh      (root; installs iperf3 with apt-get if missing)
//!   cargo bench -p provium --bench switch
//!
//! Each of two sandboxes gets five NICs: `eth0`, a TAP on our switch
//! (exactly as the local backend wires a bridge member: `open_tap_in_netns` +
//! `TapPort` + `offer_kernel_path`, so with the vnet header, TSO/checksum
//! offloads on and the kernel path for the plain directions);
//! `eth3`, the same on a second switch with TSO, GSO and GRO turned off
//! inside the sandbox (ethtool), so it carries MTU-sized frames; `eth4`, as
//! `eth0` on a switch with the kernel path off, so every frame passes the
//! userspace switch (what a pair with an impairment or a capture takes,
//! and what every pair took before the kernel path); `eth1`, one
//! end of a veth pair whose host end is a port of a Linux bridge; and `eth2`,
//! the same on a second bridge with TSO, GSO and GRO off. Same namespaces,
//! same processes, same tools; only the path between them differs, and the
//! paths are measured in turn, rep by rep, so that other load on the machine
//! falls on all of them alike.
//!
//! - TCP throughput: `iperf3 -c` for SWITCH_BENCH_SECONDS (default 5) per run,
//!   one stream and four (`-P 4`), SWITCH_BENCH_REPS (default 3) runs per
//!   path, median.
//! - Small packets: `iperf3 -u -l 64 -b 0` (64-byte UDP payloads, as fast as
//!   the sender goes): packets per second received.
//! - Round-trip time: `ping` every 5 ms, SWITCH_BENCH_PINGS (default 1000)
//!   echoes per path; p50 and p99 of the per-echo times.
//! - Impaired traffic (`switch_impaired/`): `ours_switch` with a latency,
//!   a drop rate or a bandwidth cap on a -> b against `bridge` with `tc
//!   netem` carrying the same on its egress toward b; TCP throughput and
//!   how exactly each side applies the impairment.
//!
//! SWITCH_BENCH_PATHS (a comma-separated subset of ours, bridge,
//! ours_no_offload, bridge_no_offload, ours_switch) and
//! SWITCH_BENCH_MEASURE (of tcp1, tcp4, udp, rtt, impaired) narrow a run to what a
//! profile should see; what is left out prints as NaN.
//!
//! Prints `switch: ...` lines per measurement, then the ratios (ours /
//! bridge) and the latency the switch adds at p50 (ours - bridge). The switch
//! runs in this process, built with the bench (release) profile, as in a
//! release `provium`.

mod common;
mod switch_impaired;

use std::path::PathBuf;
use std::process::Command;

use provium::backend::local::net::open_tap_in_netns;
use provium::backend::local::{LocalOptions, LocalSandbox};
use provium::client::{AgentClient, AgentOps};
use provium_netsetup::{MacAddr, Switch, SwitchConfig, TapPoller, TapPort};

/// Host links this bench created, deleted by [`fail`] (which exits without
/// running destructors) as well as by [`KernelBridge`]'s drop.
static HOST_LINKS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn delete_host_links() {
    let links = std::mem::take(&mut *HOST_LINKS.lock().unwrap_or_else(|e| e.into_inner()));
    for l in links.iter().rev() {
        let _ = Command::new("ip").args(["link", "del", l]).status();
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("switch: {msg}");
    delete_host_links();
    std::process::exit(2);
}

fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| fail(&format!("{name}=`{v}`: not a positive whole number"))),
        Err(_) => default,
    }
}

/// The paths, in measuring order (see `main`).
const PATH_NAMES: [&str; 5] = [
    "ours",
    "bridge",
    "ours_no_offload",
    "bridge_no_offload",
    "ours_switch",
];
const MEASUREMENTS: [&str; 5] = ["tcp1", "tcp4", "udp", "rtt", "impaired"];

/// A comma-separated subset of `known` from `name`, or all of `known`.
fn env_list(name: &str, known: &[&'static str]) -> Vec<&'static str> {
    let Ok(v) = std::env::var(name) else {
        return known.to_vec();
    };
    v.split(',')
        .map(|item| {
            known
                .iter()
                .copied()
                .find(|k| *k == item.trim())
                .unwrap_or_else(|| {
                    fail(&format!(
                        "{name}: `{item}` is not one of {}",
                        known.join(", ")
                    ))
                })
        })
        .collect()
}

/// Runs `ip ARGS` on the host; fails the bench with its stderr.
fn ip(args: &[&str]) {
    let o = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| fail(&format!("run ip: {e} (apt-get install iproute2)")));
    if !o.status.success() {
        fail(&format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
}

/// The host side of one kernel path: a bridge and the host ends of the
/// veth pairs into it, removed on drop (the sandbox ends go with their
/// namespaces).
struct KernelBridge {
    bridge: String,
    veths: Vec<String>,
}

impl KernelBridge {
    /// Bridge `name` with one veth per sandbox, whose sandbox end `ifname`
    /// is up with the sandbox's address; with `offloads` false, TSO, GSO and
    /// GRO are turned off on those ends (ethtool), so the kernel path carries
    /// MTU-sized frames as the TAPs do.
    fn new(
        name: String,
        ifname: &str,
        offloads: bool,
        sandboxes: &[(&LocalSandbox, &AgentClient, String)],
    ) -> KernelBridge {
        let mut kb = KernelBridge {
            bridge: name,
            veths: Vec::new(),
        };
        ip(&["link", "add", &kb.bridge, "type", "bridge"]);
        track(&kb.bridge);
        for (i, (sb, c, addr)) in sandboxes.iter().enumerate() {
            let host_end = format!("{}v{i}", kb.bridge);
            let pid = sb.init_pid().to_string();
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", ifname, "netns", &pid,
            ]);
            track(&host_end);
            kb.veths.push(host_end.clone());
            ip(&["link", "set", &host_end, "master", &kb.bridge, "up"]);
            run_ok(
                c,
                &format!("ip addr add {addr}/24 dev {ifname} && ip link set {ifname} up"),
            );
            if !offloads {
                run_ok(c, &format!("ethtool -K {ifname} tso off gso off gro off"));
            }
        }
        ip(&["link", "set", &kb.bridge, "up"]);
        kb
    }
}

impl Drop for KernelBridge {
    fn drop(&mut self) {
        let mut links = HOST_LINKS.lock().unwrap_or_else(|e| e.into_inner());
        for l in self.veths.iter().chain([&self.bridge]) {
            let _ = Command::new("ip").args(["link", "del", l]).status();
            links.retain(|x| x != l);
        }
    }
}

fn track(link: &str) {
    HOST_LINKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(link.to_owned());
}

/// Runs a shell script in a sandbox; fails the bench unless it succeeds.
fn run_ok(c: &AgentClient, script: &str) -> String {
    let r = c
        .run(script)
        .unwrap_or_else(|e| fail(&format!("`{script}`: {e}")));
    if !r.success() {
        fail(&format!(
            "`{script}` failed: {}{}",
            r.stdout_str(),
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    r.stdout_str()
}

/// One iperf3 TCP run from `c` to `addr`: received bits per second. The
/// server takes a moment to finish the previous test after its client has
/// exited, and refuses a new one meanwhile ("busy"): that is retried.
fn iperf(c: &AgentClient, addr: &str, seconds: usize, streams: usize) -> f64 {
    for _ in 0..50 {
        let r = c
            .run(&format!("iperf3 -J -c {addr} -t {seconds} -P {streams}"))
            .unwrap_or_else(|e| fail(&format!("iperf3 -c {addr}: {e}")));
        let out = r.stdout_str();
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| fail(&format!("iperf3 -J output is not JSON ({e}): {out}")));
        if v["error"].as_str().is_some_and(|e| e.contains("busy")) {
            std::thread::sleep(std::time::Duration::from_millis(200));
            continue;
        }
        if let Some(bps) = v["end"]["sum_received"]["bits_per_second"].as_f64() {
            return bps;
        }
        fail(&format!("no end.sum_received.bits_per_second in: {out}"));
    }
    fail(&format!("the iperf3 server at {addr} stayed busy"))
}

/// One iperf3 UDP run of 64-byte datagrams, unlimited rate: datagrams
/// received per second.
fn udp_pps(c: &AgentClient, addr: &str, seconds: usize) -> f64 {
    for _ in 0..50 {
        let r = c
            .run(&format!("iperf3 -J -u -l 64 -b 0 -c {addr} -t {seconds}"))
            .unwrap_or_else(|e| fail(&format!("iperf3 -u -c {addr}: {e}")));
        let out = r.stdout_str();
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| fail(&format!("iperf3 -J output is not JSON ({e}): {out}")));
        if v["error"].as_str().is_some_and(|e| e.contains("busy")) {
            std::thread::sleep(std::time::Duration::from_millis(200));
            continue;
        }
        let sum = &v["end"]["sum"];
        if let (Some(p), Some(l), Some(s)) = (
            sum["packets"].as_f64(),
            sum["lost_packets"].as_f64(),
            sum["seconds"].as_f64(),
        ) {
            return (p - l).max(0.0) / s.max(1e-9);
        }
        fail(&format!(
            "no end.sum packets/lost_packets/seconds in: {out}"
        ));
    }
    fail(&format!("the iperf3 server at {addr} stayed busy"))
}

/// Per-echo RTTs in microseconds, ascending, from `pings` pings to `addr`.
fn rtts_us(c: &AgentClient, addr: &str, pings: usize) -> Vec<f64> {
    let out = run_ok(c, &format!("ping -n -c {pings} -i 0.005 {addr}"));
    let mut v: Vec<f64> = out
        .split("time=")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ms| ms * 1000.0)
        .collect();
    if v.len() < pings / 2 {
        fail(&format!(
            "only {} of {pings} pings answered: {out}",
            v.len()
        ));
    }
    v.sort_by(f64::total_cmp);
    v
}

/// Times the switch's TAP threads (pollers `tap-poll-*`, writers
/// `tap-tx-*`) have gone to sleep so far: each is a wake-up later.
fn sleeps_of_tap_threads() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            comm.starts_with("tap-")
                .then(|| std::fs::read_to_string(dir.join("status")).ok())?
        })
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The machine's busy CPU time so far, in seconds: user, nice, system, irq
/// and softirq of `/proc/stat`'s `cpu` line, all CPUs together. Idle,
/// iowait and steal (time the host gave this VM's vCPUs to something else)
/// are not work done here.
fn machine_busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| ticks.get(i)).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    busy as f64 / hz as f64
}

/// What one measurement cost the whole machine: the share of all CPUs busy
/// while it ran, and busy CPU seconds per unit it moved (per Gbit for
/// TCP, per million packets for UDP). A path's rate is its busy CPU
/// seconds per second over its CPU per unit, and busy CPUs cannot exceed
/// the machine's: at its measured CPU per unit, ours could at most move
/// `cpus / ours_per_unit` a second, however it spread its work over
/// threads. Over the bridge's rate in the same run that is the ceiling of
/// ours / bridge on this machine: `bridge_per_unit / (ours_per_unit *
/// bridge_busy_share)`.
#[derive(Clone, Copy)]
struct CpuCost {
    busy_share: f64,
    cpu_s_per_unit: f64,
}

/// The unit a measurement's CPU cost is counted per: its name in the
/// bench's lines, and how many of the rate's units (bits, packets) it is.
struct CostUnit {
    name: &'static str,
    size: f64,
}

const PER_GBIT: CostUnit = CostUnit {
    name: "gbit",
    size: 1e9,
};
const PER_MPACKET: CostUnit = CostUnit {
    name: "mpacket",
    size: 1e6,
};

/// The median; NaN for a path that was not measured.
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    common::nearest_rank(&v, 0.5)
}

fn main() {
    if std::env::args().skip(1).any(|a| a != "--bench") {
        fail("takes no arguments (SWITCH_BENCH_SECONDS, SWITCH_BENCH_REPS, SWITCH_BENCH_PINGS set the sizes)");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        fail("needs root: sandboxes, TAPs, veths and a bridge");
    }
    let seconds = env_count("SWITCH_BENCH_SECONDS", 5);
    let reps = env_count("SWITCH_BENCH_REPS", 3);
    let pings = env_count("SWITCH_BENCH_PINGS", 1000);
    // For a profile of one path and one measurement (perf record -a):
    // SWITCH_BENCH_PATHS=ours,bridge and SWITCH_BENCH_MEASURE=tcp4.
    let only_paths = env_list("SWITCH_BENCH_PATHS", &PATH_NAMES);
    let measure = env_list("SWITCH_BENCH_MEASURE", &MEASUREMENTS);
    let agent = common::release_agent().unwrap_or_else(|e| fail(&e));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "switch: host nproc={cpus} kernel={} loadavg=\"{}\" agent={}",
        common::first_line("/proc/sys/kernel/osrelease"),
        common::first_line("/proc/loadavg"),
        agent.display()
    );

    let tag = std::process::id();
    let runtime = PathBuf::from(format!("/run/provium-bench/switch-{tag}"));
    let mut opts = LocalOptions::new(agent);
    opts.runtime_dir = runtime.clone();
    let mut sa = LocalSandbox::start("bench-a", &opts)
        .unwrap_or_else(|e| fail(&format!("start sandbox a: {e}")));
    let mut sb = LocalSandbox::start("bench-b", &opts)
        .unwrap_or_else(|e| fail(&format!("start sandbox b: {e}")));
    let ca = sa
        .connect()
        .unwrap_or_else(|e| fail(&format!("connect a: {e}")));
    let cb = sb
        .connect()
        .unwrap_or_else(|e| fail(&format!("connect b: {e}")));
    for c in [&ca, &cb] {
        if !c
            .run("command -v iperf3 && command -v ethtool && command -v ping")
            .is_ok_and(|r| r.success())
        {
            fail("iperf3, ethtool or ping is not installed (benches/switch.sh installs them: apt-get install iperf3 ethtool iputils-ping)");
        }
    }

    // Our paths: eth0, a TAP on the userspace switch, as bridge:attach does
    // (vnet header, offloads on, one poller thread for the bridge's TAPs,
    // the kernel path offered); eth3, the same on a second switch with
    // TSO/GSO/GRO off inside the sandbox; eth4, as eth0 on a switch with
    // the kernel path off, so every frame passes our switch.
    let sw = Switch::new("bench", SwitchConfig::default());
    let sw_plain = Switch::new("bench-plain", SwitchConfig::default());
    let switch_only = SwitchConfig {
        kernel_path: false,
        ..SwitchConfig::default()
    };
    let sw_switch = Switch::new("bench-switch", switch_only);
    let poller = TapPoller::new("bench").unwrap_or_else(|e| fail(&format!("tap poller: {e}")));
    let poller_plain =
        TapPoller::new("bench-plain").unwrap_or_else(|e| fail(&format!("tap poller: {e}")));
    let poller_switch =
        TapPoller::new("bench-switch").unwrap_or_else(|e| fail(&format!("tap poller: {e}")));
    let mut ports = Vec::new();
    for (sw, poller, ifname, net, offloads) in [
        (&sw, &poller, "eth0", 0, true),
        (&sw_plain, &poller_plain, "eth3", 3, false),
        (&sw_switch, &poller_switch, "eth4", 4, true),
    ] {
        for (name, sandbox, c, n) in [("a", &sa, &ca, 1u32), ("b", &sb, &cb, 2)] {
            let mac = MacAddr::local(n + 16 * net);
            let fd = open_tap_in_netns(sandbox.init_pid(), ifname, mac)
                .unwrap_or_else(|e| fail(&format!("tap {ifname} in sandbox {name}: {e}")));
            let port = TapPort::attach_on(poller, sw, name, mac, fd)
                .unwrap_or_else(|e| fail(&format!("attach {name}: {e}")));
            port.offer_kernel_path()
                .unwrap_or_else(|e| fail(&format!("kernel path for {name}: {e}")));
            ports.push(port);
            run_ok(c, &format!("ip addr add 10.0.{net}.{n}/24 dev {ifname}"));
            if !offloads {
                run_ok(c, &format!("ethtool -K {ifname} tso off gso off gro off"));
            }
        }
    }
    // The peers: eth1, a veth pair into a Linux bridge with the default
    // offloads (TSO/GSO: the TCP stack hands 64 KiB segments through); eth2,
    // the same with offloads off, so that it too carries MTU-sized frames,
    // as our TAPs (no vnet header) do.
    let kernels: Vec<KernelBridge> = [("eth1", 1, true), ("eth2", 2, false)]
        .into_iter()
        .map(|(ifname, net, offloads)| {
            KernelBridge::new(
                format!("pvbr{tag}{net}"),
                ifname,
                offloads,
                &[
                    (&sa, &ca, format!("10.0.{net}.1")),
                    (&sb, &cb, format!("10.0.{net}.2")),
                ],
            )
        })
        .collect();
    let nf = common::first_line("/proc/sys/net/bridge/bridge-nf-call-iptables");
    let tap_off = run_ok(&ca, "ethtool -k eth0 | grep -E '^(tcp-segmentation-offload|tx-checksumming|generic-receive-offload):' | tr '\\n' ' '");
    println!(
        "switch: kernel bridges {} (offloads on) and {} (tso/gso/gro off), bridge-nf-call-iptables={nf}; ours: one TAP per sandbox, MTU 1500, eth0 offloads: {}; eth3 tso/gso/gro off; eth4 as eth0 with the kernel path off",
        kernels[0].bridge, kernels[1].bridge, tap_off.trim()
    );

    // One iperf3 server in b serves every path.
    run_ok(&cb, "iperf3 -s -D");
    let paths = PATH_NAMES.map(|name| {
        let addr = match name {
            "ours" => "10.0.0.2",
            "bridge" => "10.0.1.2",
            "ours_no_offload" => "10.0.3.2",
            "bridge_no_offload" => "10.0.2.2",
            _ => "10.0.4.2",
        };
        (name, addr)
    });
    const PATHS: usize = PATH_NAMES.len();
    let selected = |name: &str| only_paths.contains(&name);
    for (_, addr) in paths.iter().filter(|(name, _)| selected(name)) {
        // Until the daemon listens, and to warm ARP and caches on each path.
        let mut up = false;
        for _ in 0..50 {
            if ca
                .run(&format!("iperf3 -c {addr} -t 1 >/dev/null 2>&1"))
                .is_ok_and(|r| r.success())
            {
                up = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !up {
            fail(&format!("no iperf3 answer from {addr}"));
        }
    }

    // Per path: TCP 1 stream, TCP 4 streams (bits/s), UDP 64 B (packets/s).
    let mut tcp1: [Vec<f64>; PATHS] = Default::default();
    let mut tcp4: [Vec<f64>; PATHS] = Default::default();
    let mut udp: [Vec<f64>; PATHS] = Default::default();
    // CPU seconds per unit of each, per path, and the busy share of all CPUs.
    let mut cpu1: [Vec<CpuCost>; PATHS] = Default::default();
    let mut cpu4: [Vec<CpuCost>; PATHS] = Default::default();
    let mut cpuu: [Vec<CpuCost>; PATHS] = Default::default();
    // A measurement left out (SWITCH_BENCH_MEASURE) reads NaN.
    let wanted = |m: &str| measure.contains(&m);
    for rep in 0..reps {
        for (i, (name, addr)) in paths.iter().enumerate() {
            if !selected(name) {
                continue;
            }
            // Per measurement on our paths: frames our switch took in and
            // how often our TAP threads slept meanwhile (each sleep is a
            // wake-up later): where a profile says wake-ups cost.
            let ours_sw = match *name {
                "ours" => Some(&sw),
                "ours_no_offload" => Some(&sw_plain),
                "ours_switch" => Some(&sw_switch),
                _ => None,
            };
            // The rate, and what it cost all CPUs per `unit`.
            let measured = |m: &str,
                            unit: CostUnit,
                            f: &dyn Fn() -> f64|
             -> (f64, Option<CpuCost>) {
                if !wanted(m) {
                    return (f64::NAN, None);
                }
                let (stats0, sleeps0) = (ours_sw.map(|s| s.stats()), sleeps_of_tap_threads());
                let (busy0, started) = (machine_busy_s(), std::time::Instant::now());
                let v = f();
                let (busy, wall) = (machine_busy_s() - busy0, started.elapsed().as_secs_f64());
                let cost = CpuCost {
                    busy_share: busy / (cpus.max(1) as f64 * wall),
                    // The rate held over the iperf3 run; the busy time also
                    // covers its start and the agent's round trip (well
                    // under a second against `seconds`).
                    cpu_s_per_unit: busy / (v / unit.size * seconds as f64),
                };
                println!(
                    "switch: cpu run={} path={name} measure={m} busy_share_of_{cpus}_cpus={:.2} cpu_s_per_{}={:.3}",
                    rep + 1,
                    cost.busy_share,
                    unit.name,
                    cost.cpu_s_per_unit
                );
                if let (Some(s), Some(s0)) = (ours_sw, stats0) {
                    let s1 = s.stats();
                    let frames = s1.frames_in - s0.frames_in;
                    let sleeps = sleeps_of_tap_threads() - sleeps0;
                    println!(
                        "switch: load run={} path={name} measure={m} switch_frames_in={frames} tap_thread_sleeps={sleeps} sleeps_per_frame={:.3} dropped_rx_queue_full={}",
                        rep + 1,
                        sleeps as f64 / frames.max(1) as f64,
                        s1.dropped_rx_queue_full - s0.dropped_rx_queue_full
                    );
                }
                (v, Some(cost))
            };
            let (b, c1) = measured("tcp1", PER_GBIT, &|| iperf(&ca, addr, seconds, 1));
            let (b4, c4) = measured("tcp4", PER_GBIT, &|| iperf(&ca, addr, seconds, 4));
            let (pps, cu) = measured("udp", PER_MPACKET, &|| udp_pps(&ca, addr, seconds));
            cpu1[i].extend(c1);
            cpu4[i].extend(c4);
            cpuu[i].extend(cu);
            println!(
                "switch: run={} path={name} seconds={seconds} tcp_gbit_per_s={:.3} tcp4_gbit_per_s={:.3} udp64_kpps={:.1}",
                rep + 1,
                b / 1e9,
                b4 / 1e9,
                pps / 1e3
            );
            tcp1[i].push(b);
            tcp4[i].push(b4);
            udp[i].push(pps);
        }
    }
    let mut p50 = [f64::NAN; PATHS];
    for (i, (name, addr)) in paths.iter().enumerate() {
        if !selected(name) || !wanted("rtt") {
            continue;
        }
        let sleeps = sleeps_of_tap_threads();
        let v = rtts_us(&ca, addr, pings);
        // Per echo: how often a TAP thread of ours slept and had to be
        // woken (0 for the bridge's paths).
        let sleeps_per_echo = (sleeps_of_tap_threads() - sleeps) as f64 / v.len() as f64;
        let (q50, q99) = (
            common::nearest_rank(&v, 0.5),
            common::nearest_rank(&v, 0.99),
        );
        println!(
            "switch: rtt path={name} n={} p50_us={q50:.0} p99_us={q99:.0} tap_thread_sleeps_per_echo={sleeps_per_echo:.2}",
            v.len()
        );
        p50[i] = q50;
    }
    let (t1, t4, u) = (tcp1.map(median), tcp4.map(median), udp.map(median));
    for (i, (name, _)) in paths.iter().enumerate() {
        if !selected(name) {
            continue;
        }
        println!(
            "switch: median path={name} tcp_gbit_per_s={:.3} tcp4_gbit_per_s={:.3} udp64_kpps={:.1} rtt_p50_us={:.0}",
            t1[i] / 1e9,
            t4[i] / 1e9,
            u[i] / 1e3,
            p50[i]
        );
    }
    // Never report a path that was not taken: the kernel path must have
    // carried eth0's and eth3's traffic, and none of eth4's.
    // A switch whose path was left out (SWITCH_BENCH_PATHS) is not judged.
    for (sw, path, wanted) in [
        (&sw, "ours", true),
        (&sw_plain, "ours_no_offload", true),
        (&sw_switch, "ours_switch", false),
    ] {
        if !selected(path) {
            continue;
        }
        let carried = sw.stats().kernel_path;
        println!(
            "switch: {} kernel_path_packets={carried} kernel_directions={:?}",
            sw.name(),
            sw.kernel_directions()
        );
        if (carried > 0) != wanted {
            fail(&format!(
                "{}: the kernel path carried {carried} packets",
                sw.name()
            ));
        }
    }
    // ours / bridge (offloads on both), ours_no_offload / bridge_no_offload,
    // the userspace switch alone against the bridge, and the kernel path
    // against the userspace switch.
    for (ours, kernel) in [(0, 1), (2, 3), (4, 1), (0, 4)] {
        if !selected(paths[ours].0) || !selected(paths[kernel].0) {
            continue;
        }
        println!(
            "switch: ratio {}/{} tcp={:.2} tcp4={:.2} udp64_pps={:.2} rtt_p50_added_us={:.0}",
            paths[ours].0,
            paths[kernel].0,
            t1[ours] / t1[kernel],
            t4[ours] / t4[kernel],
            u[ours] / u[kernel],
            p50[ours] - p50[kernel]
        );
        // The ceiling of each ratio at ours' CPU per unit (see CpuCost),
        // beside how much of the machine each path kept busy.
        let cpu_line: Vec<String> = [("tcp", &cpu1), ("tcp4", &cpu4), ("udp64_pps", &cpuu)]
            .into_iter()
            .filter(|(_, c)| !c[ours].is_empty() && !c[kernel].is_empty())
            .map(|(m, c)| {
                let per_unit = |i: usize| median(c[i].iter().map(|c| c.cpu_s_per_unit).collect());
                let busy = |i: usize| median(c[i].iter().map(|c| c.busy_share).collect());
                format!(
                    "{m}={:.2} (cpu_s_per_unit {:.3}/{:.3}, busy {:.2}/{:.2})",
                    per_unit(kernel) / (per_unit(ours) * busy(kernel)),
                    per_unit(ours),
                    per_unit(kernel),
                    busy(ours),
                    busy(kernel)
                )
            })
            .collect();
        if !cpu_line.is_empty() {
            println!(
                "switch: cpu_ceiling {}/{} {}",
                paths[ours].0,
                paths[kernel].0,
                cpu_line.join(" ")
            );
        }
    }
    // Impaired traffic: ours_switch with an impairment on a -> b against the
    // bridge with netem on its egress toward b (see switch_impaired.rs).
    if wanted("impaired") && selected("ours_switch") && selected("bridge") {
        switch_impaired::run(&switch_impaired::Peers {
            client: &ca,
            offloaded: switch_impaired::PathPair {
                switch: &sw_switch,
                ours_addr: paths[4].1,
                bridge_addr: paths[1].1,
                netem_dev: &kernels[0].veths[1],
            },
            mtu_frames: switch_impaired::PathPair {
                switch: &sw_plain,
                ours_addr: paths[2].1,
                bridge_addr: paths[3].1,
                netem_dev: &kernels[1].veths[1],
            },
            seconds,
            reps,
            pings,
        });
    }
    println!(
        "switch: loadavg at the end \"{}\"",
        common::first_line("/proc/loadavg")
    );

    drop(kernels);
    drop(ports);
    drop(sw);
    drop(sw_plain);
    drop(sw_switch);
    drop((poller, poller_plain, poller_switch));
    drop((ca, cb));
    let _ = sa.shutdown();
    let _ = sb.shutdown();
    let _ = std::fs::remove_dir_all(&runtime);
}
