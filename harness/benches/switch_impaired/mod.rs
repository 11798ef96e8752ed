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
    /// Our switch with the kernel path off; ports `a` and `b`.
    pub switch: &'a Switch,
    /// b's address on our switch.
    pub ours_addr: &'a str,
    /// b's address on the Linux bridge.
    pub bridge_addr: &'a str,
    /// The bridge's port toward b (host end of b's veth): netem goes there.
    pub netem_dev: &'a str,
    pub seconds: usize,
    pub reps: usize,
    pub pings: usize,
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

    /// Sets (or clears) the impairment on both paths.
    fn apply(self, p: &Peers<'_>, peer: Peer, on: bool) {
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
    let kinds = [Kind::Latency, Kind::Drop, Kind::Bandwidth];
    // Is netem in this kernel? (CONFIG_NET_SCH_NETEM; not in every build.)
    let probe = format!("tc qdisc replace dev {} root netem delay 0ms", p.netem_dev);
    let netem = std::process::Command::new("sh")
        .args(["-c", &probe])
        .output()
        .is_ok_and(|o| o.status.success());
    if netem {
        sh(&format!("tc qdisc del dev {} root", p.netem_dev));
    }
    println!("switch: impaired netem_in_kernel={netem}");
    // Unimpaired RTT per path, the base the latency is read against.
    let base_ours = nearest_rank(&rtts_us(p.client, p.ours_addr, p.pings), 0.5);
    let base_bridge = nearest_rank(&rtts_us(p.client, p.bridge_addr, p.pings), 0.5);
    println!("switch: impaired base rtt_p50_us ours_switch={base_ours:.0} bridge={base_bridge:.0}");
    for kind in kinds {
        let peer = kind.peer(netem);
        kind.apply(p, peer, true);
        let name = kind.name();
        let pname = peer.name();
        match kind {
            Kind::Latency => {
                let delayed0 = p.switch.stats().delayed;
                let v = rtts_us(p.client, p.ours_addr, p.pings);
                let delayed = p.switch.stats().delayed - delayed0;
                println!(
                    "switch: impaired {name} path=ours_switch rtt_minus_base {} frames_delayed={delayed} echo_requests={}",
                    quantiles(&v, base_ours),
                    p.pings
                );
                let v = rtts_us(p.client, p.bridge_addr, p.pings);
                println!(
                    "switch: impaired {name} path={pname} rtt_minus_base {}",
                    quantiles(&v, base_bridge)
                );
            }
            Kind::Drop => {
                let (rx0, d0) = (rx_packets_b(p.switch), p.switch.stats().dropped_impairment);
                let answered = rtts_us(p.client, p.ours_addr, p.pings).len();
                let (rx1, d1) = (rx_packets_b(p.switch), p.switch.stats().dropped_impairment);
                // Every draw so far: the stream started when the rate was set.
                let frames = (rx1 - rx0) + (d1 - d0);
                println!(
                    "switch: impaired {name} path=ours_switch echoes_lost={} of {} frames_a_to_b={frames} dropped={} seed_expects={}",
                    p.pings - answered,
                    p.pings,
                    d1 - d0,
                    seeded_drops(p.switch, frames)
                );
                let answered = rtts_us(p.client, p.bridge_addr, p.pings).len();
                println!(
                    "switch: impaired {name} path={pname} echoes_lost={} of {} expected_mean={:.1}",
                    p.pings - answered,
                    p.pings,
                    p.pings as f64 * DROP_PCT / 100.0
                );
            }
            Kind::Bandwidth => {
                let ours = wire_rate(p, p.ours_addr, &|| rx_bytes_b(p.switch));
                let peer_rate = wire_rate(p, p.bridge_addr, &|| netem_sent_bytes(p.netem_dev));
                println!(
                    "switch: impaired {name} wire_bits_per_s_over_cap ours_switch={:.4} {pname}={:.4}",
                    ours / CAP_BPS as f64,
                    peer_rate / CAP_BPS as f64
                );
            }
        }
        // Throughput: with no kernel peer, the bridge runs unimpaired and
        // no ratio is printed (it would compare unlike things).
        let (mut ours, mut bridge) = (Vec::new(), Vec::new());
        for rep in 0..p.reps {
            let o = iperf(p.client, p.ours_addr, p.seconds, 1);
            let b = iperf(p.client, p.bridge_addr, p.seconds, 1);
            println!(
                "switch: impaired {name} run={} tcp_gbit_per_s ours_switch={:.3} {pname}={:.3}",
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
            "switch: impaired {name} median tcp_gbit_per_s ours_switch={:.3} {pname}={:.3} ratio={ratio}",
            o / 1e9,
            b / 1e9,
        );
        kind.apply(p, peer, false);
    }
}
