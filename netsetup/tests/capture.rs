//! Captures parsed by an independent pcap reader (pcap-parser).

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use pcap_parser::{Linktype, PcapCapture};
use provium_netsetup::{CaptureScope, MacAddr, ManualClock, Switch, SwitchConfig, Timer};

fn frame(dst: MacAddr, src: MacAddr, tag: u8, len: usize) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x08, 0x00, tag]);
    f.resize(len, tag);
    f
}

fn setup(config: SwitchConfig) -> (Switch, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new());
    (
        Switch::with_clock("lan", config, clock.clone(), Timer::Manual),
        clock,
    )
}

#[test]
fn bridge_capture_is_valid_pcap_with_frames_in_order() {
    let (sw, clock) = setup(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let mut cap = sw.capture("lan.test.lua:7");
    assert!(cap.is_live());
    assert_eq!(cap.label(), "lan.test.lua:7");
    assert_eq!(cap.scope(), &CaptureScope::Bridge);
    assert_eq!(sw.live_captures(), ["lan.test.lua:7"]);

    let f1 = frame(MacAddr::BROADCAST, MacAddr::local(1), 1, 60);
    let f2 = frame(MacAddr::local(1), MacAddr::local(2), 2, 98);
    let f3 = frame(MacAddr::local(2), MacAddr::local(1), 3, 1500);
    clock.set(Duration::new(1_700_000_000, 250_000_000));
    a.send(&f1).unwrap();
    clock.advance(Duration::from_micros(1500));
    b.send(&f2).unwrap();
    // A partitioned frame was still sent by a: the bridge capture sees it.
    sw.partition("a", "b");
    a.send(&f3).unwrap();

    // Read incrementally: header + first part now, the rest later.
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 10];
    let n = cap.read(&mut chunk).unwrap();
    assert_eq!(n, 10);
    bytes.extend_from_slice(&chunk[..n]);
    bytes.extend(cap.read_available());
    cap.close();
    assert!(!cap.is_live());
    assert!(sw.live_captures().is_empty());

    let pcap = PcapCapture::from_file(&bytes).expect("valid pcap");
    assert_eq!(pcap.header.magic_number, 0xa1b2_c3d4);
    assert_eq!(
        (pcap.header.version_major, pcap.header.version_minor),
        (2, 4)
    );
    assert_eq!(pcap.header.snaplen, 65_535);
    assert_eq!(pcap.header.network, Linktype::ETHERNET);
    let blocks = &pcap.blocks;
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[0].data, &f1[..]);
    assert_eq!(blocks[1].data, &f2[..]);
    assert_eq!(blocks[2].data, &f3[..]);
    assert_eq!(
        (blocks[0].ts_sec, blocks[0].ts_usec),
        (1_700_000_000, 250_000)
    );
    assert_eq!(
        (blocks[1].ts_sec, blocks[1].ts_usec),
        (1_700_000_000, 251_500)
    );
    for (blk, f) in blocks.iter().zip([&f1, &f2, &f3]) {
        assert_eq!(blk.caplen as usize, f.len());
        assert_eq!(blk.origlen as usize, f.len());
    }
}

#[test]
fn port_capture_sees_both_directions_at_delivery_time() {
    let (sw, clock) = setup(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let c = sw.attach("c", MacAddr::local(3)).unwrap();
    let mut cap = sw.capture_port("b", "nic b").unwrap();
    assert_eq!(cap.scope(), &CaptureScope::Port("b".into()));
    assert!(sw.capture_port("ghost", "x").is_err());

    sw.set_pair_latency("a", "b", Duration::from_millis(100));
    let to_b = frame(MacAddr::local(2), MacAddr::local(1), 1, 60);
    let from_b = frame(MacAddr::local(1), MacAddr::local(2), 2, 60);
    let c_to_a = frame(MacAddr::local(1), MacAddr::local(3), 3, 60);
    a.send(&to_b).unwrap(); // delivered to b at t = 100 ms
    clock.set(Duration::from_millis(10));
    b.send(&from_b).unwrap(); // sent by b at t = 10 ms
    c.send(&c_to_a).unwrap(); // not b's traffic
    clock.set(Duration::from_millis(100));
    sw.release_due();
    assert!(b.try_recv().is_some());
    drop(c);
    drop(a);
    cap.close();

    let mut bytes = Vec::new();
    cap.read_to_end(&mut bytes).unwrap();
    let pcap = PcapCapture::from_file(&bytes).expect("valid pcap");
    let got: Vec<(&[u8], u32)> = pcap.blocks.iter().map(|b| (b.data, b.ts_usec)).collect();
    assert_eq!(got, [(&from_b[..], 10_000), (&to_b[..], 100_000)]);
}

#[test]
fn slow_consumer_loses_records_not_memory() {
    let (sw, _clock) = setup(SwitchConfig {
        capture_buffer_bytes: 10 * (16 + 60),
        ..SwitchConfig::default()
    });
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let _b = sw.attach("b", MacAddr::local(2)).unwrap();
    let cap = sw.capture("slow");
    for t in 0..100u8 {
        a.send(&frame(MacAddr::BROADCAST, MacAddr::local(1), t, 60))
            .unwrap();
    }
    assert_eq!(cap.records(), 10);
    assert_eq!(cap.dropped_records(), 90);
    let bytes = cap.read_available();
    let pcap = PcapCapture::from_file(&bytes).expect("still a valid pcap");
    let tags: Vec<u8> = pcap.blocks.iter().map(|b| b.data[14]).collect();
    assert_eq!(tags, (0..10).collect::<Vec<_>>());
    // Once drained, recording resumes.
    a.send(&frame(MacAddr::BROADCAST, MacAddr::local(1), 200, 60))
        .unwrap();
    assert_eq!(cap.records(), 11);
    drop(cap);
    assert!(sw.live_captures().is_empty());
}

#[test]
fn snaplen_cuts_oversize_records() {
    let (sw, _clock) = setup(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let _b = sw.attach("b", MacAddr::local(2)).unwrap();
    let cap = sw.capture("big");
    let f = frame(MacAddr::BROADCAST, MacAddr::local(1), 9, 65_549);
    a.send(&f).unwrap();
    let bytes = cap.read_available();
    let pcap = PcapCapture::from_file(&bytes).expect("valid pcap");
    assert_eq!(pcap.blocks[0].caplen, 65_535);
    assert_eq!(pcap.blocks[0].origlen, 65_549);
    assert_eq!(pcap.blocks[0].data, &f[..65_535]);
}

#[test]
fn port_capture_records_what_was_delivered_not_what_was_dropped() {
    let (sw, _clock) = setup(SwitchConfig::default());
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let bridge = sw.capture("bridge");
    let nic_b = sw.capture_port("b", "nic b").unwrap();
    sw.set_pair_drop_rate("a", "b", 100.0).unwrap();
    let dropped = frame(MacAddr::local(2), MacAddr::local(1), 1, 60);
    a.send(&dropped).unwrap();
    sw.set_pair_drop_rate("a", "b", 0.0).unwrap();
    let kept = frame(MacAddr::local(2), MacAddr::local(1), 2, 60);
    a.send(&kept).unwrap();
    assert_eq!(b.try_recv(), Some(kept.clone()));
    let blocks = |cap: &provium_netsetup::Capture| {
        let bytes = cap.read_available();
        PcapCapture::from_file(&bytes)
            .expect("valid pcap")
            .blocks
            .iter()
            .map(|b| b.data.to_vec())
            .collect::<Vec<_>>()
    };
    // The bridge records at ingress (what a sent); b's NIC what reached b.
    assert_eq!(blocks(&bridge), [dropped, kept.clone()]);
    assert_eq!(blocks(&nic_b), [kept]);
}
