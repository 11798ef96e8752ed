//! Impaired traffic: our switch against a Linux bridge with `tc netem`.
//!
//! A pair with a latency, a drop rate or a bandwidth cap always takes the
//! userspace switch (the kernel path carries plain directions only), so its
//! fair peer is what the reference used: a Linux bridge whose egress toward
//! the receiver carries a `netem` qdisc with the same impairment. Both get
//! it on one direction only, a → b: ours through
//! `Switch::set_pair_{latency,drop_rate,bandwidth}("a", "b", ..)` on the
//! switch whose kernel path is off (`ours_switch`), the bridge as `netem`
//! on the host end of b's veth (frames the bridge sends toward b).
//!
//! Per impairment (1 ms, 1 %, 1 Gbit/s, one at a time): TCP throughput with
//! one stream a → b, `reps` runs per path alternating, and the ratio of the
//! medians. Then the exactness of each side:
//! - latency: the RTT distribution of `pings` pings minus the same path's
//!   unimpaired p50 (one direction delayed: +1 ms, not +2), and how many
//!   frames our switch delayed against the echo requests sent (replies
//!   b → a must not wait);
//! - drop: echoes lost against the expectation; for ours, the exact count
//!   the seed gives: the pair's drop stream (`DropRng::for_pair`) replayed
//!   over every frame that went a → b in the window must drop exactly the
//!   frames the switch counted as dropped;
//! - bandwidth: wire bytes per second toward b over a steady window of a
//!   TCP stream, against the cap: ours from b's port counter (`rx_bytes`),
//!   netem from its qdisc's `Sent` bytes.
//!
//! The drop rate is measured a second time like for like, on the paths
//! whose sandboxes send MTU-sized frames (TSO, GSO and GRO off: our
//! `ours_no_offload` switch, the `bridge_no_offload` bridge). Ours drops
//! wire packets; a kernel peer (netem's `loss`, or the BPF filter) drops
//! skbs, and with offloads on a TCP skb is a whole super-frame of ~45 wire
//! packets, so on the offloaded paths the peer loses far fewer packets
//! than the rate says and TCP runs faster for it. With MTU-sized skbs both
//! lose 1 % of wire packets.
//!
//! No figure here is asserted: this is a bench; docs/networking.md records
//! the runs.

use std::time::{Duration, Instant};

use provium::client::AgentClient;
use provium_netsetup::impair::{DropRng, Effective};
use provium_netsetup::{Impairment, Switch};

use super::common::nearest_rank;
use super::{fail, iperf, median, rtts_us, run_ok};

/// The one-way latency, drop rate and cap of issue 29, one at a time.
const LATENCY: Duration = Duration::from_millis(1);
const DROP_PCT: f64 = 1.0;
const CAP_BPS: u64 = 1_000_000_000;

/// Where the two paths are and how big a run is.
pub struct Peers<'a> {
    /// Sandbox a's agent (the sender).
    pub client: &'a AgentClient,
    /// Our switch with the kernel path off, and the bridge, offloads on.
    pub offloaded: PathPair<'a>,
    /// Our switch and the bridge whose sandbox ends have TSO, GSO and GRO
    /// off (MTU-sized frames): the drop rate's like-for-like comparison.
    pub mtu_frames: PathPair<'a>,
    pub seconds: usize,
    pub reps: usize,
    pub pings: usize,
}

/// One of our switches and one Linux bridge between the same sandboxes.
pub struct PathPair<'a> {
    /// Our switch; ports `a` and `b`. An impaired pair takes its own path
    /// even where the switch offers the kernel path.
    pub switch: &'a Switch,
    /// b's address on our switch.
    pub ours_addr: &'a str,
    /// b's address on the Linux bridge.
    pub bridge_addr: &'a str,
    /// The bridge's port toward b (host end of b's veth): netem goes there.
    pub netem_dev: &'a str,
}

#[derive(Clone, Copy)]
enum Kind {
    Latency,
    Drop,
    Bandwidth,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Latency => "latency_1ms",
            Kind::Drop => "drop_1pct",
            Kind::Bandwidth => "bandwidth_1gbit",
        }
    }

    fn netem(self) -> &'static str {
        match self {
            Kind::Latency => "delay 1ms",
            Kind::Drop => "loss 1%",
            Kind::Bandwidth => "rate 1gbit",
        }
    }

    fn impairment(self) -> Impairment {
        match self {
            Kind::Latency => Impairment {
                latency: Some(LATENCY),
                ..Impairment::default()
            },
            Kind::Drop => Impairment {
                drop_pct: Some(DROP_PCT),
                ..Impairment::default()
            },
            Kind::Bandwidth => Impairment {
                bandwidth_bps: Some(CAP_BPS),
                ..Impairment::default()
            },
        }
    }

    /// Sets (or clears) the impairment on both paths of `p`.
    fn apply(self, p: &PathPair<'_>, peer: Peer, on: bool) {
        match self {
            Kind::Latency => {
                let d = if on { LATENCY } else { Duration::ZERO };
                p.switch.set_pair_latency("a", "b", d);
            }
            Kind::Drop => {
                let pct = if on { DROP_PCT } else { 0.0 };
                p.switch
                    .set_pair_drop_rate("a", "b", pct)
                    .unwrap_or_else(|e| fail(&format!("drop rate: {e}")));
            }
            Kind::Bandwidth => {
                let bps = if on { CAP_BPS } else { 0 };
                p.switch.set_pair_bandwidth("a", "b", bps);
            }
        }
        let dev = p.netem_dev;
        let tc = match (on, peer, self) {
            (false, Peer::None, _) => return,
            (false, Peer::Drop, _) => {
                format!("tc qdisc del dev {dev} clsact; ip link del {BLACKHOLE}")
            }
            (false, _, _) => format!("tc qdisc del dev {dev} root"),
            (true, Peer::Netem, _) => {
                format!("tc qdisc replace dev {dev} root netem {}", self.netem())
            }
            // Matches the switch's bucket: 10 ms of burst at the cap.
            (true, Peer::Tbf, _) => format!(
                "tc qdisc replace dev {dev} root tbf rate 1gbit burst {} latency 50ms",
                CAP_BPS / 100 / 8
            ),
            (true, Peer::Drop, _) => format!(
                "ip link add {BLACKHOLE} type veth peer name {BLACKHOLE}p && \
                 tc qdisc add dev {dev} clsact && \
                 tc filter add dev {dev} egress bpf bytecode '{DROP_1PCT_CBPF}' \
                 action mirred egress redirect dev {BLACKHOLE}"
            ),
            (true, Peer::None, _) => return,
        };
        sh(&tc);
    }

    /// The kernel peer this host has for the impairment: netem where the
    /// kernel has it (the reference's), else the closest qdisc or filter.
    fn peer(self, netem: bool) -> Peer {
        match (netem, self) {
            (true, _) => Peer::Netem,
            (false, Kind::Latency) => Peer::None,
            (false, Kind::Drop) => Peer::Drop,
            (false, Kind::Bandwidth) => Peer::Tbf,
        }
    }
}

/// The kernel-side peer of one impairment.
#[derive(Clone, Copy)]
enum Peer {
    /// `tc qdisc ... netem`, as the reference did.
    Netem,
    /// `tbf rate 1gbit` (no netem in this kernel).
    Tbf,
    /// A classic BPF filter on the egress hook that matches 1 % of packets
    /// at random (`ld rand`) and redirects them to a veth that is down,
    /// where `mirred` drops them (no netem nor gact in this kernel).
    Drop,
    /// Nothing in this kernel delays frames without netem (no `fq` for
    /// departure times either).
    None,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Netem => "bridge_netem",
            Peer::Tbf => "bridge_tbf",
            Peer::Drop => "bridge_bpf_drop",
            Peer::None => "bridge_unimpaired",
        }
    }
}

/// A veth left down: frames redirected to it are dropped by `mirred`.
const BLACKHOLE: &str = "pvbench-drop";

/// `ld rand; jge #(1 % of 2^32) -> no match; ret -1 (match); ret 0`, in
/// `tc ... bpf bytecode` form. `ld rand` is the ancillary load
/// SKF_AD_OFF + SKF_AD_RANDOM = -4096 + 56.
const DROP_1PCT_CBPF: &str = "4,32 0 0 4294963256,53 1 0 42949673,6 0 0 4294967295,6 0 0 0";

/// Runs a host command line; fails the bench with its stderr.
fn sh(line: &str) -> String {
    let o = std::process::Command::new("sh")
        .args(["-c", line])
        .output()
        .unwrap_or_else(|e| fail(&format!("`{line}`: {e}")));
    if !o.status.success() {
        fail(&format!(
            "`{line}`: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Bytes netem has sent toward b so far (`tc -s qdisc`: "Sent N bytes").
fn netem_sent_bytes(dev: &str) -> u64 {
    let out = sh(&format!("tc -s qdisc show dev {dev} root"));
    out.split("Sent ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| fail(&format!("no `Sent N bytes` in tc -s qdisc: {out}")))
}

fn rx_bytes_b(sw: &Switch) -> u64 {
    sw.counters("b")
        .unwrap_or_else(|e| fail(&format!("counters of b: {e}")))
        .rx_bytes
}

fn rx_packets_b(sw: &Switch) -> u64 {
    sw.counters("b")
        .unwrap_or_else(|e| fail(&format!("counters of b: {e}")))
        .rx_packets
}

/// Wire bits per second toward b over `seconds` of a steady TCP stream,
/// read by `bytes` before and after (the stream's first second is left out).
fn wire_rate(p: &Peers<'_>, addr: &str, bytes: &dyn Fn() -> u64) -> f64 {
    let total = p.seconds + 2;
    run_ok(
        p.client,
        &format!("(iperf3 -c {addr} -t {total} >/dev/null 2>&1 &)"),
    );
    std::thread::sleep(Duration::from_secs(1));
    let (b0, t0) = (bytes(), Instant::now());
    std::thread::sleep(Duration::from_secs(p.seconds as u64));
    let (b1, t1) = (bytes(), Instant::now());
    // Let the stream end before the next test asks the server.
    std::thread::sleep(Duration::from_millis(1500));
    (b1.saturating_sub(b0)) as f64 * 8.0 / (t1 - t0).as_secs_f64()
}

/// Packets the kernel sent out of `dev` so far (its `tx_packets`).
fn tx_packets(dev: &str) -> u64 {
    let path = format!("/sys/class/net/{dev}/statistics/tx_packets");
    std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| fail(&format!("no packet count in {path}")))
}

/// Packets the BPF drop peer's filter matched (and `mirred` dropped) on
/// `dev` so far: the action's `Sent N bytes M pkt`.
fn bpf_dropped(dev: &str) -> u64 {
    let out = sh(&format!("tc -s filter show dev {dev} egress"));
    out.split("Sent ")
        .nth(1)
        .and_then(|s| s.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| fail(&format!("no `Sent N bytes M pkt` in tc -s filter: {out}")))
}

/// Packets netem has dropped on `dev` so far (`tc -s qdisc`: "(dropped N,").
fn netem_dropped(dev: &str) -> u64 {
    let out = sh(&format!("tc -s qdisc show dev {dev} root"));
    out.split("(dropped ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| fail(&format!("no `(dropped N,` in tc -s qdisc: {out}")))
}

/// Wire packets toward b that a path dropped and let through so far.
fn drop_counts(pair: &PathPair<'_>, path: Path, peer: Peer) -> (u64, u64) {
    match (path, peer) {
        (Path::Ours, _) => (
            pair.switch.stats().dropped_impairment,
            rx_packets_b(pair.switch),
        ),
        (Path::Bridge, Peer::Drop) => (bpf_dropped(pair.netem_dev), tx_packets(pair.netem_dev)),
        (Path::Bridge, _) => (netem_dropped(pair.netem_dev), tx_packets(pair.netem_dev)),
    }
}

#[derive(Clone, Copy)]
enum Path {
    Ours,
    Bridge,
}

/// What [`throughput`] reports besides the rates.
#[derive(Clone, Copy, PartialEq)]
enum Report {
    Rates,
    /// Also the share of wire packets each path dropped. Only where every
    /// frame is one wire packet (offloads off): with TSO the switch counts
    /// a super-frame as one packet received but its wire packets as drops,
    /// and the kernel counts skbs sent but segments matched.
    RatesAndDrops,
}

/// TCP one stream a → b on both paths of `pair`, `reps` runs alternating;
/// prints each run and the medians' ratio (none without a kernel peer).
fn throughput(
    p: &Peers<'_>,
    pair: &PathPair<'_>,
    label: &str,
    names: (&str, &str),
    peer: Peer,
    report: Report,
) {
    let (oname, pname) = names;
    let (mut ours, mut bridge) = (Vec::new(), Vec::new());
    let (mut lost, mut passed) = ([0u64; 2], [0u64; 2]);
    let counts = |path| match report {
        Report::Rates => (0, 0),
        Report::RatesAndDrops => drop_counts(pair, path, peer),
    };
    for rep in 0..p.reps {
        let mut timed = |path: Path, addr: &str, slot: usize| {
            let (d0, r0) = counts(path);
            let rate = iperf(p.client, addr, p.seconds, 1);
            let (d1, r1) = counts(path);
            lost[slot] += d1.saturating_sub(d0);
            passed[slot] += r1.saturating_sub(r0);
            rate
        };
        let o = timed(Path::Ours, pair.ours_addr, 0);
        let b = timed(Path::Bridge, pair.bridge_addr, 1);
        println!(
            "switch: impaired {label} run={} tcp_gbit_per_s {oname}={:.3} {pname}={:.3}",
            rep + 1,
            o / 1e9,
            b / 1e9
        );
        ours.push(o);
        bridge.push(b);
    }
    let (o, b) = (median(ours), median(bridge));
    let ratio = match peer {
        Peer::None => "none (no kernel peer; bridge unimpaired)".to_owned(),
        _ => format!("{:.2}", o / b),
    };
    println!(
        "switch: impaired {label} median tcp_gbit_per_s {oname}={:.3} {pname}={:.3} ratio={ratio}",
        o / 1e9,
        b / 1e9,
    );
    if report == Report::RatesAndDrops {
        let pct = |i: usize| 100.0 * lost[i] as f64 / (lost[i] + passed[i]).max(1) as f64;
        println!(
            "switch: impaired {label} wire_packets_dropped_pct {oname}={:.3} ({} of {}) {pname}={:.3} ({} of {})",
            pct(0),
            lost[0],
            lost[0] + passed[0],
            pct(1),
            lost[1],
            lost[1] + passed[1]
        );
    }
}

/// How many of the first `frames` draws of the a → b stream drop.
fn seeded_drops(sw: &Switch, frames: u64) -> u64 {
    let imp = Kind::Drop.impairment();
    let eff = Effective::combine(&Impairment::default(), Some(&imp));
    let mut rng = DropRng::for_pair(sw.seed(), "a", "b");
    (0..frames).filter(|_| rng.drop_frame(&eff)).count() as u64
}

fn quantiles(v: &[f64], base: f64) -> String {
    let q = |x| nearest_rank(v, x) - base;
    format!(
        "min_us={:.0} p1_us={:.0} p50_us={:.0} p99_us={:.0} max_us={:.0}",
        v[0] - base,
        q(0.01),
        q(0.5),
        q(0.99),
        v[v.len() - 1] - base
    )
}

/// Measures every impairment on both paths; prints `switch: impaired ...`.
pub fn run(p: &Peers<'_>) {
    let o = &p.offloaded;
    let kinds = [Kind::Latency, Kind::Drop, Kind::Bandwidth];
    // Is netem in this kernel? (CONFIG_NET_SCH_NETEM; not in every build.)
    let probe = format!("tc qdisc replace dev {} root netem delay 0ms", o.netem_dev);
    let netem = std::process::Command::new("sh")
        .args(["-c", &probe])
        .output()
        .is_ok_and(|o| o.status.success());
    if netem {
        sh(&format!("tc qdisc del dev {} root", o.netem_dev));
    }
    println!("switch: impaired netem_in_kernel={netem}");
    // Unimpaired RTT per path, the base the latency is read against.
    let base_ours = nearest_rank(&rtts_us(p.client, o.ours_addr, p.pings), 0.5);
    let base_bridge = nearest_rank(&rtts_us(p.client, o.bridge_addr, p.pings), 0.5);
    println!("switch: impaired base rtt_p50_us ours_switch={base_ours:.0} bridge={base_bridge:.0}");
    for kind in kinds {
        let peer = kind.peer(netem);
        kind.apply(o, peer, true);
        let name = kind.name();
        let pname = peer.name();
        match kind {
            Kind::Latency => {
                let delayed0 = o.switch.stats().delayed;
                let v = rtts_us(p.client, o.ours_addr, p.pings);
                let delayed = o.switch.stats().delayed - delayed0;
                println!(
                    "switch: impaired {name} path=ours_switch rtt_minus_base {} frames_delayed={delayed} echo_requests={}",
                    quantiles(&v, base_ours),
                    p.pings
                );
                let v = rtts_us(p.client, o.bridge_addr, p.pings);
                println!(
                    "switch: impaired {name} path={pname} rtt_minus_base {}",
                    quantiles(&v, base_bridge)
                );
            }
            Kind::Drop => {
                let (rx0, d0) = (rx_packets_b(o.switch), o.switch.stats().dropped_impairment);
                let answered = rtts_us(p.client, o.ours_addr, p.pings).len();
                let (rx1, d1) = (rx_packets_b(o.switch), o.switch.stats().dropped_impairment);
                // Every draw so far: the stream started when the rate was set.
                let frames = (rx1 - rx0) + (d1 - d0);
                println!(
                    "switch: impaired {name} path=ours_switch echoes_lost={} of {} frames_a_to_b={frames} dropped={} seed_expects={}",
                    p.pings - answered,
                    p.pings,
                    d1 - d0,
                    seeded_drops(o.switch, frames)
                );
                let answered = rtts_us(p.client, o.bridge_addr, p.pings).len();
                println!(
                    "switch: impaired {name} path={pname} echoes_lost={} of {} expected_mean={:.1}",
                    p.pings - answered,
                    p.pings,
                    p.pings as f64 * DROP_PCT / 100.0
                );
            }
            Kind::Bandwidth => {
                let ours = wire_rate(p, o.ours_addr, &|| rx_bytes_b(o.switch));
                let peer_rate = wire_rate(p, o.bridge_addr, &|| netem_sent_bytes(o.netem_dev));
                println!(
                    "switch: impaired {name} wire_bits_per_s_over_cap ours_switch={:.4} {pname}={:.4}",
                    ours / CAP_BPS as f64,
                    peer_rate / CAP_BPS as f64
                );
            }
        }
        // Throughput: with no kernel peer, the bridge runs unimpaired and
        // no ratio is printed (it would compare unlike things).
        throughput(p, o, name, ("ours_switch", pname), peer, Report::Rates);
        kind.apply(o, peer, false);
    }
    // The drop rate like for like: MTU-sized frames on both paths, so the
    // kernel peer's per-skb drop is a per-wire-packet drop too.
    let m = &p.mtu_frames;
    let peer = Kind::Drop.peer(netem);
    Kind::Drop.apply(m, peer, true);
    let pname = format!(
        "bridge_no_offload_{}",
        peer.name().trim_start_matches("bridge_")
    );
    throughput(
        p,
        m,
        "drop_1pct_mtu_frames",
        ("ours_no_offload", &pname),
        peer,
        Report::RatesAndDrops,
    );
    Kind::Drop.apply(m, peer, false);
}
