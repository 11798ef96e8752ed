//! The kernel path between two TAP NICs in two fresh network namespaces
//! (root and iproute2 only; skipped with a printed reason otherwise): plain
//! directions are forwarded by the kernel, and every partition, impairment
//! and capture takes its direction back to the switch before the call
//! returns, so what was declared still holds for the next frame.

mod common;

use std::os::fd::OwnedFd;
use std::process::Command;
use std::sync::mpsc;

use common::{have, in_fresh_netns, sh};
use provium_netsetup::{MacAddr, Switch, SwitchConfig, Tap, TapPoller, TapPort};

/// A thread in a network namespace of its own that runs what it is sent.
struct Netns {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Netns {
    fn new() -> Netns {
        let (tx, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::spawn(move || {
            // SAFETY: unshare affects only this thread's namespaces.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            for job in rx {
                job();
            }
        });
        Netns { jobs: tx }
    }

    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .unwrap();
        rx.recv().expect("netns job panicked")
    }

    fn sh(&self, cmd: &str) -> String {
        let cmd = cmd.to_owned();
        self.run(move || sh(&cmd))
    }

    /// Whether `ping` to `ip` gets its echoes back.
    fn pings(&self, ip: &str) -> bool {
        let ip = ip.to_owned();
        self.run(move || {
            Command::new("ping")
                .args(["-c", "2", "-i", "0.2", "-W", "1", &ip])
                .output()
                .is_ok_and(|o| o.status.success())
        })
    }

    fn open_tap(&self, name: &str, mac: MacAddr, ip: &str) -> OwnedFd {
        let (name, ip) = (name.to_owned(), ip.to_owned());
        self.run(move || {
            let fd = Tap::open(&name).unwrap().into_fd();
            sh(&format!(
                "ip link set lo up && ip link set {name} address {mac} up && ip addr add {ip}/24 dev {name}"
            ));
            fd
        })
    }
}

/// Nothing of a wire is left in `ns`: no veth end, no tc action of ours
/// (indices from 0x40000000) and no egress filter on its TAPs.
fn assert_no_kernel_path_left(ns: &Netns) {
    let links = ns.sh("ip -o link show");
    assert!(!links.contains("pvk"), "a wire end is left: {links}");
    let actions = ns.sh("tc actions ls action mirred");
    let ours: Vec<&str> = actions
        .lines()
        .filter_map(|l| l.trim().strip_prefix("index "))
        .filter(|rest| {
            rest.split_whitespace()
                .next()
                .and_then(|i| i.parse::<u32>().ok())
                .is_some_and(|i| i >= 0x4000_0000)
        })
        .collect();
    assert!(ours.is_empty(), "tc actions are left: {actions}");
    // The namespace's own interfaces, from `ip`: /sys/class/net is the
    // host's sysfs (mounted in the host's namespace), whose last device
    // decided the loop's exit status.
    let filters = ns.sh(
        "for d in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do \
         tc filter show dev $d egress || exit 1; done",
    );
    assert!(
        !filters.contains("mirred"),
        "an egress redirect is left: {filters}"
    );
}

fn directions(sw: &Switch) -> Vec<(String, String)> {
    sw.kernel_directions()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

/// Two namespaces with a TAP each (10.7.0.1 and .2) on one switch made
/// with `config`; with `offer`, both ports offer the kernel path.
struct Pair {
    ns_a: Netns,
    sw: Switch,
    a: TapPort,
    b: TapPort,
    _ns_b: Netns,
    _poller: TapPoller,
}

fn pair_on(config: SwitchConfig, offer: bool) -> Pair {
    let (ns_a, ns_b) = (Netns::new(), Netns::new());
    let (mac_a, mac_b) = (MacAddr::local(0xa), MacAddr::local(0xb));
    let sw = Switch::new("lan", config);
    let poller = TapPoller::new("kp").unwrap();
    let fd_a = ns_a.open_tap("tapa", mac_a, "10.7.0.1");
    let fd_b = ns_b.open_tap("tapb", mac_b, "10.7.0.2");
    let a = TapPort::attach_on(&poller, &sw, "a", mac_a, fd_a).unwrap();
    let b = TapPort::attach_on(&poller, &sw, "b", mac_b, fd_b).unwrap();
    if offer {
        a.offer_kernel_path().unwrap();
        b.offer_kernel_path().unwrap();
    }
    Pair {
        ns_a,
        sw,
        a,
        b,
        _ns_b: ns_b,
        _poller: poller,
    }
}

fn tools_missing() -> bool {
    let missing = !have("tc") || !have("ping");
    if missing {
        eprintln!(
            "SKIP kernel_path: needs `tc` and `ping` (apt-get install iproute2 iputils-ping)"
        );
    }
    missing
}

#[test]
fn plain_directions_go_through_the_kernel_and_every_rule_takes_them_back() {
    if tools_missing() {
        return;
    }
    in_fresh_netns("kernel_path", || {
        // Every field bound: a field left to `..` would drop here.
        let Pair {
            ns_a,
            sw,
            a,
            b,
            _ns_b,
            _poller,
        } = pair_on(SwitchConfig::default(), false);
        assert!(directions(&sw).is_empty(), "no kernel NIC offered yet");
        a.offer_kernel_path().unwrap();
        b.offer_kernel_path().unwrap();
        assert!(
            directions(&sw).is_empty(),
            "no wire before the switch forwards unicast between them"
        );
        // The first echo (and the ARP reply before it) take the switch and
        // ask for the wire; reading the directions settles it.
        assert!(ns_a.pings("10.7.0.2"));
        assert_eq!(directions(&sw), [pair("a", "b"), pair("b", "a")]);
        let wires = ns_a.sh("ip -o link show type veth");
        assert!(
            wires.contains("pvk"),
            "a wire end in a's namespace: {wires}"
        );

        assert!(ns_a.pings("10.7.0.2"));
        let st = sw.stats();
        assert!(
            st.kernel_path >= 4,
            "the echoes took the kernel path: {st:?}"
        );
        let before = a.port().counters();
        assert!(
            before.tx_packets >= 2 && before.rx_packets >= 2,
            "{before:?}"
        );

        // A partition a -> b: that direction is the switch's again, and
        // the switch drops it; b -> a stays in the kernel.
        sw.partition_directional("a", "b").unwrap();
        assert_eq!(directions(&sw), [pair("b", "a")]);
        let dropped = sw.stats().dropped_partition;
        assert!(!ns_a.pings("10.7.0.2"));
        assert!(sw.stats().dropped_partition > dropped);
        // Counts of the disabled direction were kept, not lost.
        assert!(a.port().counters().tx_packets >= before.tx_packets);
        sw.unpartition_directional("a", "b");
        assert_eq!(directions(&sw).len(), 2);
        assert!(ns_a.pings("10.7.0.2"));

        // A 100 % drop rate on b -> a: the echo replies die in the switch.
        sw.set_pair_drop_rate("b", "a", 100.0).unwrap();
        assert_eq!(directions(&sw), [pair("a", "b")]);
        let dropped = sw.stats().dropped_impairment;
        assert!(!ns_a.pings("10.7.0.2"));
        assert!(sw.stats().dropped_impairment > dropped);
        sw.set_pair_drop_rate("b", "a", 0.0).unwrap();
        assert_eq!(directions(&sw).len(), 2);

        // A whole-bridge latency and a capture each take every direction.
        sw.set_latency(std::time::Duration::from_millis(1));
        assert!(directions(&sw).is_empty());
        assert!(ns_a.pings("10.7.0.2"));
        sw.reset();
        assert_eq!(directions(&sw).len(), 2);
        let cap = sw.capture("test");
        assert!(directions(&sw).is_empty());
        assert!(ns_a.pings("10.7.0.2"));
        assert!(cap.records() >= 4, "the capture saw the echoes");
        drop(cap);

        // Isolation of a, and a bandwidth cap on one direction.
        sw.isolate("a");
        assert!(directions(&sw).is_empty());
        assert!(!ns_a.pings("10.7.0.2"));
        sw.unisolate("a");
        sw.set_pair_bandwidth("a", "b", 1_000_000_000);
        assert_eq!(directions(&sw), [pair("b", "a")]);
        assert!(ns_a.pings("10.7.0.2"));

        // Link down on b: b's directions leave the kernel.
        sw.reset();
        sw.disconnect("b").unwrap();
        assert!(directions(&sw).is_empty());
        assert!(!ns_a.pings("10.7.0.2"));
        sw.reconnect("b").unwrap();
        assert_eq!(directions(&sw).len(), 2);
        assert!(ns_a.pings("10.7.0.2"));

        // Detaching b removes the wire and its ends.
        drop(b);
        assert!(directions(&sw).is_empty());
        let wires = ns_a.sh("ip -o link show type veth");
        assert!(!wires.contains("pvk"), "the wire is gone: {wires}");
        assert_no_kernel_path_left(&ns_a);
        drop(a);
    });
}

#[test]
fn with_the_kernel_path_off_every_frame_passes_the_switch() {
    if tools_missing() {
        return;
    }
    in_fresh_netns("kernel_path_off", || {
        let config = SwitchConfig {
            kernel_path: false,
            ..SwitchConfig::default()
        };
        let Pair {
            ns_a,
            sw,
            a: _a,
            b: _b,
            _ns_b,
            _poller,
        } = pair_on(config, true);
        assert!(directions(&sw).is_empty());
        assert!(ns_a.pings("10.7.0.2"));
        assert_eq!(sw.stats().kernel_path, 0);
        assert!(!ns_a.sh("ip -o link show type veth").contains("pvk"));
    });
}

/// `n` sandboxes-alike (a namespace and a TAP each, 10.8.0.1 and up) on
/// one switch, every one offering the kernel path; each pings the first.
/// Returns the wires built at attach and after the pings, and checks that
/// dropping the ports leaves nothing in any namespace.
fn star_of(n: usize) -> (usize, usize) {
    let sw = Switch::new("lan", SwitchConfig::default());
    let poller = TapPoller::new("kp").unwrap();
    let mut members = Vec::new();
    for i in 0..n {
        let ns = Netns::new();
        let mac = MacAddr::local(0x100 + i as u32);
        let fd = ns.open_tap(&format!("tap{i}"), mac, &format!("10.8.0.{}", i + 1));
        let port = TapPort::attach_on(&poller, &sw, &format!("m{i}"), mac, fd).unwrap();
        port.offer_kernel_path().unwrap();
        members.push((ns, port));
    }
    let at_attach = directions(&sw).len() / 2;
    for (i, (ns, _)) in members.iter().enumerate().skip(1) {
        assert!(ns.pings("10.8.0.1"), "m{i} reaches m0");
    }
    let wires = directions(&sw).len() / 2;
    let ends = members[0].0.sh("ip -o link show type veth");
    assert_eq!(
        ends.matches("pvk").count(),
        wires,
        "one wire end in m0's namespace per wire: {ends}"
    );
    // Drop every port (m0 first: all its wires go in one batch), then the
    // switch.
    let namespaces: Vec<Netns> = members
        .into_iter()
        .map(|(ns, port)| {
            drop(port);
            ns
        })
        .collect();
    drop(sw);
    for ns in &namespaces {
        assert_no_kernel_path_left(ns);
    }
    (at_attach, wires)
}

#[test]
fn wires_grow_with_the_pairs_that_talk_not_with_every_pair() {
    if tools_missing() {
        return;
    }
    in_fresh_netns("kernel_path_star", || {
        for n in [4, 12] {
            let (at_attach, wires) = star_of(n);
            assert_eq!(at_attach, 0, "attaching {n} builds no wire");
            // Every member talked to m0 and to no one else: n - 1 pairs,
            // where an eager build would make n(n-1)/2.
            assert_eq!(wires, n - 1, "wires after {n} members pinged the first");
        }
    });
}
