//! Offloaded (GSO and checksum-pending) frames through the switch: whole
//! between ports that take them, wire packets everywhere else, every packet
//! checked by an independent parser (etherparse, pcap-parser).

use std::sync::Arc;
use std::time::Duration;

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use pcap_parser::PcapCapture;
use provium_netsetup::offload::{F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6};
use provium_netsetup::{
    MacAddr, ManualClock, OffloadError, Offloads, Port, SendError, Switch, SwitchConfig, Timer,
    VnetHdr,
};

const MSS: u16 = 1448;
const PAYLOAD: usize = 10_000; // 7 segments of at most 1448 bytes

fn manual(config: SwitchConfig) -> (Switch, Arc<ManualClock>) {
    let c = Arc::new(ManualClock::new());
    (
        Switch::with_clock("lan", config, c.clone(), Timer::Manual),
        c,
    )
}

/// A TCP super-frame from `src` as a TSO-capable sender hands it over; the
/// checksum field holds garbage the switch must not trust.
fn gso_frame(src: MacAddr, v6: bool, seq: u32) -> (VnetHdr, Vec<u8>) {
    let body: Vec<u8> = (0..PAYLOAD).map(|i| (i % 251) as u8).collect();
    let b = PacketBuilder::ethernet2(src.0, MacAddr::BROADCAST.0);
    let b = if v6 {
        b.ipv6([0xfd; 16], [0xfe; 16], 64)
    } else {
        b.ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
    };
    let mut f = Vec::new();
    b.tcp(40000, 5201, seq, 64240)
        .ack(1)
        .psh()
        .write(&mut f, &body)
        .unwrap();
    let l4 = if v6 { 54 } else { 34 };
    f[l4 + 16] = 0xde;
    f[l4 + 17] = 0xad;
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
        hdr_len: (l4 + 20) as u16,
        gso_size: MSS,
        csum_start: l4 as u16,
        csum_offset: 16,
    };
    (hdr, f)
}

/// Parses a wire packet; checks the IPv4 and TCP checksums and the size
/// bound; returns (sequence number, payload).
fn wire(seg: &[u8]) -> (u32, Vec<u8>) {
    let p = SlicedPacket::from_ethernet(seg).expect("etherparse parses the packet");
    let TransportSlice::Tcp(t) = p.transport.expect("tcp") else {
        panic!("not tcp")
    };
    let h = t.to_header();
    let want = match p.net.expect("ip") {
        NetSlice::Ipv4(s) => {
            let ip = s.header().to_header();
            assert_eq!(
                ip.header_checksum,
                ip.calc_header_checksum(),
                "ipv4 checksum"
            );
            h.calc_checksum_ipv4(&ip, t.payload()).unwrap()
        }
        NetSlice::Ipv6(s) => h
            .calc_checksum_ipv6(&s.header().to_header(), t.payload())
            .unwrap(),
        _ => panic!("not ip"),
    };
    assert_eq!(h.checksum, want, "tcp checksum");
    assert!(t.payload().len() <= usize::from(MSS));
    (h.sequence_number, t.payload().to_vec())
}

fn drain(p: &Port) -> Vec<(VnetHdr, Vec<u8>)> {
    std::iter::from_fn(|| p.try_recv_offload()).collect()
}

#[test]
fn gso_frame_crosses_whole_between_offload_ports_and_segmented_to_others() {
    for v6 in [false, true] {
        let (sw, _) = manual(SwitchConfig::default());
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        let b = sw.attach("b", MacAddr::local(2)).unwrap();
        let c = sw.attach("c", MacAddr::local(3)).unwrap();
        a.set_offloads(Offloads::ALL);
        b.set_offloads(Offloads::ALL);
        assert_eq!(b.offloads(), Offloads::ALL);
        let (hdr, f) = gso_frame(MacAddr::local(1), v6, 1_000_000);
        a.send_offload(hdr, &f).unwrap();

        // b takes TSO: one frame, header and bytes as sent.
        assert_eq!(drain(&b), [(hdr, f.clone())]);
        // c takes nothing: seven wire packets, checksums valid, payload whole.
        let segs = drain(&c);
        assert_eq!(segs.len(), 7);
        let mut payload = Vec::new();
        for (i, (h, s)) in segs.iter().enumerate() {
            assert_eq!(*h, VnetHdr::default(), "wire packets carry no offload");
            let (seq, p) = wire(s);
            assert_eq!(seq, 1_000_000 + i as u32 * u32::from(MSS));
            payload.extend(p);
        }
        let l4_end = if v6 { 74 } else { 54 };
        assert_eq!(payload, f[l4_end..]);
        let st = sw.stats();
        assert_eq!((st.offloaded, st.segmented, st.segments), (1, 1, 7));
        assert_eq!(c.counters().rx_packets, 7);
        assert_eq!(b.counters().rx_packets, 1);
        assert_eq!(a.counters().tx_packets, 1);
    }
}

#[test]
fn tso4_only_port_gets_tcp6_segmented() {
    let (sw, _) = manual(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    b.set_offloads(Offloads {
        csum: true,
        tso4: true,
        tso6: false,
        uso: false,
    });
    let (h4, f4) = gso_frame(MacAddr::local(1), false, 1);
    let (h6, f6) = gso_frame(MacAddr::local(1), true, 1);
    a.send_offload(h4, &f4).unwrap();
    a.send_offload(h6, &f6).unwrap();
    let got = drain(&b);
    assert_eq!(got.len(), 1 + 7);
    assert_eq!(got[0], (h4, f4));
    for (_, s) in &got[1..] {
        wire(s);
    }
}

#[test]
fn captures_record_wire_packets_and_a_captured_port_gets_them() {
    let (sw, _) = manual(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    a.set_offloads(Offloads::ALL);
    b.set_offloads(Offloads::ALL);
    let bridge = sw.capture("bridge");
    let (hdr, f) = gso_frame(MacAddr::local(1), false, 5);
    a.send_offload(hdr, &f).unwrap();
    // A bridge capture sees wire packets; b (not itself captured) the frame.
    assert_eq!(drain(&b), [(hdr, f.clone())]);
    let bytes = bridge.read_available();
    let pcap = PcapCapture::from_file(&bytes).expect("valid pcap");
    assert_eq!(pcap.blocks.len(), 7);
    for blk in &pcap.blocks {
        wire(blk.data);
    }
    bridge.close();

    // With b's own traffic captured, b gets the wire packets too.
    let port_cap = sw.capture_port("b", "b").unwrap();
    a.send_offload(hdr, &f).unwrap();
    let got = drain(&b);
    assert_eq!(got.len(), 7);
    let pcap_bytes = port_cap.read_available();
    let pcap = PcapCapture::from_file(&pcap_bytes).expect("valid pcap");
    assert_eq!(pcap.blocks.len(), 7);
    for (blk, (_, s)) in pcap.blocks.iter().zip(&got) {
        assert_eq!(blk.data, &s[..]);
        wire(s);
    }
}

/// What b received over an impaired a→b, in wire packets.
struct Received {
    /// Sequence numbers of the wire packets, in arrival order; a super-frame
    /// that arrived whole counts as its seven.
    seqs: Vec<u32>,
    /// Super-frames that arrived whole (as sent, offload header and all).
    whole: usize,
    /// The switch's drop count.
    dropped: u64,
}

/// Sends `frames` super-frames (7 wire packets each; frame i's sequence
/// numbers start at i * 100 000) over a→b with a drop rate of `pct`.
fn drops_with_seed(seed: u64, pct: f64, frames: u32) -> Received {
    let (sw, _) = manual(SwitchConfig {
        run_seed: seed,
        ..SwitchConfig::default()
    });
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    a.set_offloads(Offloads::ALL);
    b.set_offloads(Offloads::ALL);
    sw.set_pair_drop_rate("a", "b", pct).unwrap();
    let mut sent = Vec::new();
    for i in 0..frames {
        let (hdr, f) = gso_frame(MacAddr::local(1), false, i * 100_000);
        a.send_offload(hdr, &f).unwrap();
        sent.push((hdr, f));
    }
    let mut got = Received {
        seqs: Vec::new(),
        whole: 0,
        dropped: sw.stats().dropped_impairment,
    };
    for (h, s) in drain(&b) {
        if h == VnetHdr::default() {
            got.seqs.push(wire(&s).0);
            continue;
        }
        // Whole: exactly one of the frames sent, untouched.
        let p = SlicedPacket::from_ethernet(&s).expect("etherparse parses the frame");
        let Some(TransportSlice::Tcp(t)) = p.transport else {
            panic!("not tcp")
        };
        let seq0 = t.sequence_number();
        assert!(
            sent.contains(&(h, s.clone())),
            "a whole frame arrives as sent"
        );
        got.whole += 1;
        got.seqs
            .extend((0..7u32).map(|k| seq0 + k * u32::from(MSS)));
    }
    got
}

/// The wire packets the pair's seeded drop stream keeps when each of the
/// `frames` super-frames' 7 packets is drawn once, in wire order.
fn kept_by_seed(sw_seed: u64, pct: f64, frames: u32) -> Vec<u32> {
    use provium_netsetup::impair::{DropRng, Effective};
    let imp = provium_netsetup::Impairment {
        drop_pct: Some(pct),
        ..Default::default()
    };
    let eff = Effective::combine(&Default::default(), Some(&imp));
    let mut rng = DropRng::for_pair(sw_seed, "a", "b");
    (0..frames)
        .flat_map(|i| (0..7u32).map(move |k| i * 100_000 + k * u32::from(MSS)))
        .filter(|_| !rng.drop_frame(&eff))
        .collect()
}

fn bridge_seed(run_seed: u64) -> u64 {
    provium_netsetup::impair::bridge_seed(run_seed, "lan")
}

#[test]
fn drops_over_segmented_traffic_follow_the_seed() {
    let got = drops_with_seed(42, 30.0, 20);
    let dropped = got.dropped;
    assert_eq!(
        got.seqs.len() as u64 + dropped,
        140,
        "each wire packet drawn once"
    );
    assert!(
        (20..=70).contains(&dropped),
        "30% of 140 packets, got {dropped}"
    );
    // Exactly the packets the seed keeps, whatever went whole or cut.
    assert_eq!(got.seqs, kept_by_seed(bridge_seed(42), 30.0, 20));
    // Drops hit single segments, not whole super-frames: some frame lost
    // only part of its segments.
    let partial = (0..20u32).any(|i| {
        let n = got.seqs.iter().filter(|s| **s / 100_000 == i).count();
        n > 0 && n < 7
    });
    assert!(partial, "drops are per segment");
    let again = drops_with_seed(42, 30.0, 20);
    assert_eq!(
        (again.seqs, again.dropped),
        (got.seqs.clone(), dropped),
        "same seed, same drops"
    );
    assert_ne!(
        drops_with_seed(43, 30.0, 20).seqs,
        got.seqs,
        "another seed, other drops"
    );
}

#[test]
fn a_drop_rate_leaves_undropped_super_frames_whole() {
    // At 2 %, most 7-packet frames draw no drop: they cross whole (one
    // write for the receiving TAP), the others are cut at their first drop.
    let got = drops_with_seed(7, 2.0, 60);
    assert_eq!(got.seqs, kept_by_seed(bridge_seed(7), 2.0, 60));
    assert_eq!(got.seqs.len() as u64 + got.dropped, 420);
    assert!(got.dropped > 0, "2 % of 420 packets: some drop");
    assert!(
        got.whole > 0 && got.whole < 60,
        "{} of 60 frames whole",
        got.whole
    );
}

#[test]
fn a_latency_holds_a_super_frame_whole() {
    let (sw, clock) = manual(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let c = sw.attach("c", MacAddr::local(3)).unwrap();
    a.set_offloads(Offloads::ALL);
    b.set_offloads(Offloads::ALL);
    sw.set_pair_latency("a", "b", Duration::from_millis(1));
    sw.set_pair_latency("a", "c", Duration::from_millis(1));
    let (hdr, f) = gso_frame(MacAddr::local(1), false, 0);
    a.send_offload(hdr, &f).unwrap();
    // b takes TSO: one frame held; c takes nothing: its seven packets.
    assert_eq!(sw.delayed_frames(), 8);
    clock.set(Duration::from_micros(999));
    sw.release_due();
    assert!(drain(&b).is_empty(), "not before the latency");
    clock.set(Duration::from_millis(1));
    sw.release_due();
    assert_eq!(drain(&b), [(hdr, f)]);
    assert_eq!(drain(&c).len(), 7);
}

#[test]
fn bandwidth_caps_charge_wire_bytes() {
    // 8 Mbit/s is one byte per microsecond; a burst of one bit.
    let (sw, clock) = manual(SwitchConfig {
        bandwidth_burst_bits: Some(1),
        ..SwitchConfig::default()
    });
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    a.set_offloads(Offloads::ALL);
    b.set_offloads(Offloads::ALL);
    sw.set_pair_bandwidth("a", "b", 8_000_000);
    let (hdr, f) = gso_frame(MacAddr::local(1), false, 0);
    a.send_offload(hdr, &f).unwrap();
    // Seven packets each repeat the 54 header bytes: 10000 + 7 * 54 bytes.
    let wire_bytes: u64 = 10_000 + 7 * 54;
    assert_eq!(sw.delayed_frames(), 7);
    // When the super-frame's own length has gone by, a packet is still due.
    clock.set(Duration::from_micros(f.len() as u64 + 1));
    sw.release_due();
    assert!(
        sw.delayed_frames() >= 1,
        "headers of every packet are charged"
    );
    clock.set(Duration::from_micros(wire_bytes));
    sw.release_due();
    assert_eq!(sw.delayed_frames(), 0);
    let got = drain(&b);
    assert_eq!(got.len(), 7);
    assert_eq!(
        got.iter().map(|(_, s)| s.len() as u64).sum::<u64>(),
        wire_bytes
    );
}

#[test]
fn bogus_offload_headers_are_dropped_and_counted_per_port() {
    let (sw, _) = manual(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let c = sw.attach("c", MacAddr::local(3)).unwrap();
    b.set_offloads(Offloads::ALL);
    let (good, f) = gso_frame(MacAddr::local(1), false, 0);
    let bogus = [
        VnetHdr {
            gso_type: 0x42,
            ..good
        },
        VnetHdr {
            gso_size: 0,
            ..good
        },
        VnetHdr {
            hdr_len: 60_000,
            ..good
        },
        VnetHdr {
            csum_start: 20_000,
            ..good
        },
        VnetHdr {
            csum_offset: 0xfff0,
            ..good
        },
    ];
    for h in bogus {
        assert!(matches!(
            a.send_offload(h, &f),
            Err(SendError::BadOffload(_))
        ));
    }
    assert_eq!(
        a.send_offload(
            VnetHdr {
                gso_size: 0,
                ..good
            },
            &f
        ),
        Err(SendError::BadOffload(OffloadError::ZeroGsoSize))
    );
    let ca = a.counters();
    assert_eq!(
        (ca.offload_errors, ca.errors, ca.tx_dropped, ca.tx_packets),
        (6, 6, 6, 0)
    );
    assert_eq!(c.counters().offload_errors, 0, "counted on the sender only");
    assert!(
        drain(&b).is_empty() && drain(&c).is_empty(),
        "nothing forwarded"
    );
    // The port keeps working.
    a.send_offload(good, &f).unwrap();
    assert_eq!(drain(&b).len(), 1);
    assert_eq!(drain(&c).len(), 7);
}
