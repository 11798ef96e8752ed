//! A real TAP attached to the switch, inside a fresh network namespace
//! (root only; skipped with a printed reason otherwise). The kernel side of
//! the TAP is driven with an AF_PACKET socket bound to the interface.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::{in_fresh_netns, sh};
use provium_netsetup::{
    offload, tap, MacAddr, Offloads, Switch, SwitchConfig, Tap, TapPoller, TapPort, VnetHdr,
};

const ETHERTYPE: [u8; 2] = [0x88, 0xb5];

fn frame(dst: MacAddr, src: MacAddr, tag: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ETHERTYPE);
    f.extend_from_slice(&tag.to_be_bytes());
    f.resize(64, 0xee);
    f
}

fn is_ours(f: &[u8], tag: u32) -> bool {
    f.len() >= 18 && f[12..14] == ETHERTYPE && f[14..18] == tag.to_be_bytes()
}

/// An AF_PACKET socket bound to `ifname`, with a 200 ms receive timeout.
fn packet_socket(ifname: &str) -> OwnedFd {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); checked below.
    let s = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    assert!(
        s >= 0,
        "AF_PACKET socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fresh fd, ours.
    let fd = unsafe { OwnedFd::from_raw_fd(s) };
    let cname = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    assert!(ifindex > 0, "no interface {ifname}");
    // SAFETY: zeroed sockaddr_ll is valid; fields set below.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = i32::try_from(ifindex).unwrap();
    // SAFETY: bind with a sockaddr_ll of the right size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            u32::try_from(std::mem::size_of::<libc::sockaddr_ll>()).unwrap(),
        )
    };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 200_000,
    };
    // SAFETY: SO_RCVTIMEO takes a timeval.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            u32::try_from(std::mem::size_of::<libc::timeval>()).unwrap(),
        )
    };
    fd
}

fn psend(fd: &OwnedFd, f: &[u8]) {
    // SAFETY: send from the frame's bytes.
    let n = unsafe { libc::send(fd.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
    assert_eq!(
        n,
        isize::try_from(f.len()).unwrap(),
        "send: {}",
        std::io::Error::last_os_error()
    );
}

/// Receives until a frame with `tag` arrives, or `deadline`.
fn precv_tag(fd: &OwnedFd, tag: u32, deadline: Instant) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 70_000];
    while Instant::now() < deadline {
        // SAFETY: recv into our buffer.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if let Ok(n) = usize::try_from(n) {
            if is_ours(&buf[..n], tag) {
                return Some(buf[..n].to_vec());
            }
        }
    }
    None
}

#[test]
fn tap_frames_flow_both_ways_and_carrier_follows_link() {
    in_fresh_netns("tap_frames_flow_both_ways", || {
        let t = Tap::open("ptap0").expect("open tap");
        assert_eq!(t.name(), "ptap0");
        assert_eq!(
            tap::tap_name(std::os::fd::AsFd::as_fd(&t)).unwrap(),
            "ptap0"
        );
        tap::set_link_up("ptap0").expect("link up");
        let pkt = packet_socket("ptap0");

        let sw = Switch::new("lan", SwitchConfig::default());
        let vm = sw.attach("vm", MacAddr::local(1)).unwrap();
        let sbx = TapPort::attach(&sw, "sbx", MacAddr::local(2), t.into_fd()).unwrap();
        let deadline = || Instant::now() + Duration::from_secs(20);

        // Switch -> TAP: the kernel side receives the frame.
        let out = frame(MacAddr::BROADCAST, MacAddr::local(1), 0xa1);
        vm.send(&out).unwrap();
        let got = precv_tag(&pkt, 0xa1, deadline()).expect("frame reached the tap");
        assert_eq!(got, out);

        // TAP -> switch: a frame the kernel sends out of the TAP reaches vm.
        let back = frame(MacAddr::local(1), MacAddr::local(2), 0xb2);
        psend(&pkt, &back);
        let d = deadline();
        let mut seen = None;
        while Instant::now() < d {
            if let Some(f) = vm.recv_timeout(Duration::from_millis(200)) {
                if is_ours(&f, 0xb2) {
                    seen = Some(f);
                    break;
                }
            }
        }
        assert_eq!(
            seen.as_deref(),
            Some(&back[..]),
            "frame from the tap reached vm"
        );
        assert!(sbx.port().counters().tx_packets >= 1);
        assert!(sbx.port().counters().rx_packets >= 1);
        assert_eq!(sw.lookup_mac(MacAddr::local(2)).as_deref(), Some("sbx"));

        // Link down: carrier goes off on the TAP; up again restores it.
        sw.disconnect("sbx").unwrap();
        assert!(sh("ip -o link show ptap0").contains("NO-CARRIER"));
        vm.send(&frame(MacAddr::local(2), MacAddr::local(1), 0xc3))
            .unwrap();
        assert!(sw.counters("sbx").unwrap().rx_dropped >= 1);
        sw.reconnect("sbx").unwrap();
        assert!(!sh("ip -o link show ptap0").contains("NO-CARRIER"));
        let again = frame(MacAddr::BROADCAST, MacAddr::local(1), 0xd4);
        vm.send(&again).unwrap();
        assert_eq!(precv_tag(&pkt, 0xd4, deadline()), Some(again));

        // Dropping the TapPort stops its threads and detaches it.
        drop(sbx);
        assert_eq!(sw.members(), ["vm"]);
    });
}

/// Threads of this process whose name is `comm`.
fn threads_named(comm: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end() == comm)
        .count()
}

#[test]
fn one_poller_reads_every_tap_of_a_bridge() {
    in_fresh_netns("one_poller_reads_every_tap", || {
        let sw = Switch::new("lan", SwitchConfig::default());
        let poller = TapPoller::new("lan").expect("poller");
        let mut taps = Vec::new();
        let mut sockets = Vec::new();
        for i in 1..=2u32 {
            let name = format!("ptap{i}");
            let t = Tap::open(&name).expect("open tap");
            tap::set_link_up(&name).expect("link up");
            sockets.push(packet_socket(&name));
            let mac = MacAddr::local(i);
            taps.push(TapPort::attach_on(&poller, &sw, &name, mac, t.into_fd()).unwrap());
        }
        assert_eq!(threads_named("tap-poll-lan"), 1, "one thread serves both");
        let deadline = || Instant::now() + Duration::from_secs(20);
        // Each direction: sent by one TAP's kernel side, read by the shared
        // poller, forwarded to the other TAP.
        for (from, to, tag) in [(0usize, 1usize, 0x11u32), (1, 0, 0x22)] {
            let f = frame(
                MacAddr::local(u32::try_from(to).unwrap() + 1),
                MacAddr::local(u32::try_from(from).unwrap() + 1),
                tag,
            );
            psend(&sockets[from], &f);
            assert_eq!(
                precv_tag(&sockets[to], tag, deadline()).as_deref(),
                Some(&f[..]),
                "ptap{} -> ptap{}",
                from + 1,
                to + 1
            );
        }
        // Dropping one TapPort takes its fd off the poller and closes it
        // (the TAP interface goes away); the other keeps flowing.
        drop(taps.remove(0));
        assert!(
            !std::path::Path::new("/sys/class/net/ptap1").exists(),
            "the dropped port's TAP fd was closed"
        );
        assert_eq!(sw.members(), ["ptap2"]);
        let vm = sw.attach("vm", MacAddr::local(9)).unwrap();
        let f = frame(MacAddr::local(9), MacAddr::local(2), 0x33);
        psend(&sockets[1], &f);
        let d = deadline();
        let mut seen = None;
        while seen.is_none() && Instant::now() < d {
            seen = vm
                .recv_timeout(Duration::from_millis(200))
                .filter(|g| is_ours(g, 0x33));
        }
        assert_eq!(seen.as_deref(), Some(&f[..]), "ptap2 still read");
        // The thread ends with the last handle: ours and the TapPort's.
        drop(taps);
        drop(poller);
        assert_eq!(threads_named("tap-poll-lan"), 0, "poller thread joined");
    });
}

#[test]
fn tap_open_needs_a_valid_name() {
    assert!(Tap::open("this-name-is-too-long").is_err());
}

/// A TCP super-frame (10000 payload bytes, MSS 1448) with its virtio-net
/// header, from `src`.
fn gso_frame(src: MacAddr, seq: u32) -> (VnetHdr, Vec<u8>) {
    let body: Vec<u8> = (0..10_000).map(|i| (i % 251) as u8).collect();
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(src.0, MacAddr::BROADCAST.0)
        .ipv4([10, 9, 0, 1], [10, 9, 0, 2], 64)
        .tcp(40000, 5201, seq, 64240)
        .ack(1)
        .write(&mut f, &body)
        .unwrap();
    let hdr = VnetHdr {
        flags: offload::F_NEEDS_CSUM,
        gso_type: offload::GSO_TCPV4,
        hdr_len: 54,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
    };
    (hdr, f)
}

fn tcp_seq(f: &[u8]) -> Option<u32> {
    let p = etherparse::SlicedPacket::from_ethernet(f).ok()?;
    match p.transport? {
        etherparse::TransportSlice::Tcp(t) => Some(t.sequence_number()),
        _ => None,
    }
}

/// Checks a wire packet's IPv4 and TCP checksums with etherparse.
fn assert_valid_wire(f: &[u8]) {
    let p = etherparse::SlicedPacket::from_ethernet(f).expect("parses");
    let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
        panic!("not ipv4")
    };
    let ip = ip.header().to_header();
    assert_eq!(ip.header_checksum, ip.calc_header_checksum());
    let Some(etherparse::TransportSlice::Tcp(t)) = p.transport else {
        panic!("not tcp")
    };
    let h = t.to_header();
    assert_eq!(h.checksum, h.calc_checksum_ipv4(&ip, t.payload()).unwrap());
    assert!(t.payload().len() <= 1448);
}

#[test]
fn tap_gso_frames_cross_whole_and_are_segmented_for_plain_ports() {
    in_fresh_netns("tap_gso_frames", || {
        let t = Tap::open("ptap1").expect("open tap");
        tap::set_link_up("ptap1").expect("link up");
        let pkt = packet_socket("ptap1");
        let sw = Switch::new("lan", SwitchConfig::default());
        let vm = sw.attach("vm", MacAddr::local(1)).unwrap();
        vm.set_offloads(Offloads::ALL);
        let plain = sw.attach("plain", MacAddr::local(3)).unwrap();
        let sbx = TapPort::attach(&sw, "sbx", MacAddr::local(2), t.into_fd()).unwrap();
        let off = sbx.port().offloads();
        assert!(off.csum && off.tso4 && off.tso6, "tap offloads on: {off:?}");
        let deadline = || Instant::now() + Duration::from_secs(20);

        // vm -> TAP: the kernel receives the 10054-byte super-frame as one.
        let (hdr, f) = gso_frame(MacAddr::local(1), 7_000);
        vm.send_offload(hdr, &f).unwrap();
        let mut buf = vec![0u8; 70_000];
        let d = deadline();
        let mut whole = None;
        while Instant::now() < d && whole.is_none() {
            // SAFETY: recv into our buffer.
            let n = unsafe { libc::recv(pkt.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if let Ok(n) = usize::try_from(n) {
                if tcp_seq(&buf[..n]) == Some(7_000) {
                    whole = Some(n);
                }
            }
        }
        assert_eq!(
            whole,
            Some(f.len()),
            "one frame of the super-frame's length on the tap"
        );
        assert_eq!(buf[..f.len()], f[..]);
        // The plain port got the same frame as seven valid wire packets.
        // (The kernel's own traffic, IPv6 neighbour discovery, is skipped.)
        let segs: Vec<Vec<u8>> = std::iter::from_fn(|| plain.try_recv())
            .filter(|s| tcp_seq(s).is_some())
            .collect();
        assert_eq!(segs.len(), 7);
        segs.iter().for_each(|s| assert_valid_wire(s));

        // TAP -> switch: a super-frame the kernel sends out of the TAP (an
        // AF_PACKET socket with PACKET_VNET_HDR) reaches vm whole and
        // plain as wire packets.
        const PACKET_VNET_HDR: libc::c_int = 15;
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with an int.
        let r = unsafe {
            libc::setsockopt(
                pkt.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_VNET_HDR,
                (&raw const on).cast(),
                4,
            )
        };
        assert_eq!(r, 0, "PACKET_VNET_HDR: {}", std::io::Error::last_os_error());
        let (hdr, f) = gso_frame(MacAddr::local(9), 9_000);
        let mut out = hdr.to_bytes().to_vec();
        out.extend_from_slice(&f);
        psend(&pkt, &out);
        let d = deadline();
        let mut got_vm = None;
        while Instant::now() < d && got_vm.is_none() {
            if let Some((h, g)) = vm.recv_offload_timeout(Duration::from_millis(200)) {
                if tcp_seq(&g) == Some(9_000) {
                    got_vm = Some((h, g));
                }
            }
        }
        let (h, g) = got_vm.expect("the super-frame reached vm");
        assert_eq!(
            h.gso_type & 0x7f,
            offload::GSO_TCPV4,
            "still one GSO frame: {h:?}"
        );
        assert_eq!(g.len(), f.len());
        let mut segs = Vec::new();
        let d = deadline();
        while Instant::now() < d && segs.len() < 7 {
            if let Some(s) = plain.recv_timeout(Duration::from_millis(200)) {
                if tcp_seq(&s).is_some_and(|q| q >= 9_000) {
                    segs.push(s);
                }
            }
        }
        assert_eq!(segs.len(), 7);
        segs.iter().for_each(|s| assert_valid_wire(s));
        assert_eq!(sbx.port().counters().offload_errors, 0);
    });
}

/// Whether an interface named `name` exists in the calling thread's
/// network namespace.
fn interface_exists(name: &str) -> bool {
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated name.
    unsafe { libc::if_nametoindex(cname.as_ptr()) != 0 }
}

#[test]
fn a_dropped_port_returns_once_its_interface_is_gone_though_a_child_held_its_fd() {
    in_fresh_netns("a_dropped_port_waits_for_its_interface", || {
        let t = Tap::open("pgone0").expect("open tap");
        let sw = Switch::new("lan", SwitchConfig::default());
        let port = TapPort::attach(&sw, "sbx", MacAddr::local(2), t.into_fd()).unwrap();
        // A child holding a copy of the TAP's descriptor, as a process
        // another thread forks holds every descriptor until it execs: here
        // for as long as it sleeps.
        // SAFETY: dup of a descriptor the port owns; the copy (without
        // close-on-exec) is closed below, once the child has inherited it.
        let copy = unsafe { libc::dup(port.fd().as_raw_fd()) };
        assert!(copy >= 0, "dup: {}", std::io::Error::last_os_error());
        let mut holder = std::process::Command::new("sleep")
            .arg("0.5")
            .spawn()
            .expect("spawn sleep");
        // SAFETY: `copy` is ours and closed once.
        unsafe { libc::close(copy) };
        assert!(interface_exists("pgone0"));
        drop(port);
        assert!(
            !interface_exists("pgone0"),
            "the interface outlived its port's drop"
        );
        assert!(holder.wait().expect("wait for sleep").success());
    });
}

/// The interface index of `name` in the calling thread's namespace (0 when
/// there is none).
fn ifindex(name: &str) -> u32 {
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated name.
    unsafe { libc::if_nametoindex(cname.as_ptr()) }
}

#[test]
fn a_parked_port_leaves_its_interface_without_carrier_and_a_new_open_replaces_it() {
    in_fresh_netns("a_parked_port_leaves_its_interface", || {
        let t = Tap::open("ppark0").expect("open tap");
        tap::set_link_up("ppark0").expect("link up");
        sh("ip addr add 10.9.0.1/24 dev ppark0");
        let sw = Switch::new("lan", SwitchConfig::default());
        let port = TapPort::attach(&sw, "sbx", MacAddr::local(2), t.into_fd()).unwrap();
        let parked_index = ifindex("ppark0");
        assert!(!sh("ip -o link show ppark0").contains("NO-CARRIER"));

        port.park();
        assert!(sw.members().is_empty(), "the parked port left the switch");
        assert_eq!(
            ifindex("ppark0"),
            parked_index,
            "a parked port's interface stays"
        );
        let link = sh("ip -o link show ppark0");
        assert!(
            link.contains("NO-CARRIER"),
            "parked without carrier: {link}"
        );

        // Taking the name again replaces the parked interface with a fresh
        // one: a new index, none of the old one's addresses.
        let again = Tap::open("ppark0").expect("open the parked name again");
        let fresh_index = ifindex("ppark0");
        assert!(
            fresh_index != 0 && fresh_index != parked_index,
            "a fresh interface, not the parked one ({parked_index} -> {fresh_index})"
        );
        assert!(!sh("ip -o addr show dev ppark0").contains("10.9.0.1"));
        // And it is an ordinary TAP again: its last close removes it.
        drop(again);
        assert!(
            !interface_exists("ppark0"),
            "the fresh TAP is not persistent"
        );
    });
}
