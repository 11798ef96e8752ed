//! Hostile-port fuzzing of the userspace switch's offload path.
//!
//! The input declares three ports (each with input-chosen offloads), a pair
//! impairment, a capture, then a list of frames, each from an input-chosen
//! port with an input-chosen virtio-net header: raw bytes, or a TCP/UDP
//! super-frame over IPv4/IPv6 built from input-chosen sizes and then mutated
//! at an input-chosen offset, so validation and segmentation both run deep.
//! Checked: nothing panics; a port that takes no offload only ever receives
//! plain wire packets (zero header, at most a header plus MSS beyond the
//! original headers, never beyond the frame bound); every frame refused for
//! its header is counted on its sender; a capture parses as pcap records.

#![no_main]

use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use provium_netsetup::offload::{F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4};
use provium_netsetup::{
    MacAddr, ManualClock, Offloads, Port, SendError, Switch, SwitchConfig, Timer, VnetHdr,
    MAX_FRAME_BYTES,
};

const MAX_FRAMES: usize = 64;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn offloads(b: u8) -> Offloads {
    Offloads {
        csum: b & 1 != 0,
        tso4: b & 2 != 0,
        tso6: b & 4 != 0,
        uso: b & 8 != 0,
    }
}

/// A well-formed super-frame (Ethernet, IPv4 or IPv6, TCP or UDP) and the
/// header a sender would give it.
fn super_frame(input: &mut Input<'_>, src: MacAddr) -> (VnetHdr, Vec<u8>) {
    let kind = input.u8().unwrap_or(0);
    let v6 = kind & 1 != 0;
    let udp = kind & 2 != 0;
    let payload = usize::from(input.u16().unwrap_or(0)) % 64_000;
    let mss = input.u16().unwrap_or(1448);
    let mut f = MacAddr::BROADCAST.0.to_vec();
    f.extend_from_slice(&src.0);
    let l4_len = if udp { 8 } else { 20 };
    let proto = if udp { 17 } else { 6 };
    if v6 {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&((l4_len + payload) as u16).to_be_bytes());
        f.extend_from_slice(&[proto, 64]);
        f.extend_from_slice(&[0xfd; 32]);
    } else {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&((20 + l4_len + payload) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    }
    let l4 = f.len();
    if udp {
        f.extend_from_slice(&[0x03, 0xe8, 0x07, 0xd0]);
        f.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
    } else {
        f.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x19]);
        f.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
    }
    f.resize(f.len() + payload, 0x5a);
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: match (udp, v6) {
            (true, _) => GSO_UDP_L4,
            (false, false) => GSO_TCPV4,
            (false, true) => GSO_TCPV6,
        },
        hdr_len: (l4 + l4_len) as u16,
        gso_size: mss,
        csum_start: l4 as u16,
        csum_offset: if udp { 6 } else { 16 },
    };
    (hdr, f)
}

fn run(data: &[u8]) {
    let mut input = Input(data);
    let clock = Arc::new(ManualClock::new());
    let config = SwitchConfig {
        run_seed: u64::from(input.u8().unwrap_or(0)),
        ..SwitchConfig::default()
    };
    let sw = Switch::with_clock("fuzz", config, clock.clone(), Timer::Manual);
    let ports: Vec<Port> = (0..3u8)
        .map(|i| {
            let p = sw
                .attach(&format!("p{i}"), MacAddr::local(u32::from(i) + 1))
                .expect("attach");
            p.set_offloads(offloads(input.u8().unwrap_or(0)));
            p
        })
        .collect();
    let imp = input.u8().unwrap_or(0);
    if imp & 1 != 0 {
        let _ = sw.set_pair_drop_rate("p0", "p1", f64::from(imp >> 1) / 1.28);
    }
    if imp & 2 != 0 {
        sw.set_pair_bandwidth("p0", "p2", 1_000_000 + u64::from(imp) * 10_000);
    }
    if imp & 4 != 0 {
        sw.set_pair_latency("p1", "p0", Duration::from_micros(u64::from(imp)));
    }
    let cap = (imp & 8 != 0).then(|| sw.capture("fuzz"));
    let port_cap = (imp & 16 != 0).then(|| sw.capture_port("p2", "fuzz-p2").expect("capture"));

    let mut refused = [0u64; 3];
    for _ in 0..MAX_FRAMES {
        let Some(op) = input.u8() else { break };
        let from = usize::from(op % 3);
        let src = MacAddr::local(from as u32 + 1);
        let (hdr, mut frame) = if op & 0x80 != 0 {
            let (mut hdr, mut f) = super_frame(&mut input, src);
            // Mutate one header field and one byte.
            match input.u8().unwrap_or(0) % 8 {
                0 => hdr.gso_type = input.u8().unwrap_or(0),
                1 => hdr.hdr_len = input.u16().unwrap_or(0),
                2 => hdr.csum_start = input.u16().unwrap_or(0),
                3 => hdr.csum_offset = input.u16().unwrap_or(0),
                4 => hdr.flags = input.u8().unwrap_or(0),
                5 => {
                    let at = usize::from(input.u16().unwrap_or(0));
                    let b = input.u8().unwrap_or(0);
                    let len = f.len().max(1);
                    if let Some(x) = f.get_mut(at % len) {
                        *x = b;
                    }
                }
                6 => f.truncate(usize::from(input.u16().unwrap_or(0))),
                _ => {}
            }
            (hdr, f)
        } else {
            let hdr = VnetHdr::from_bytes(input.bytes(10)).unwrap_or_default();
            let len = usize::from(input.u16().unwrap_or(0));
            let mut f = MacAddr::BROADCAST.0.to_vec();
            f.extend_from_slice(&src.0);
            f.extend_from_slice(input.bytes(len));
            (hdr, f)
        };
        if op & 0x40 != 0 {
            frame.resize(MAX_FRAME_BYTES + 1, 0);
        }
        match ports[from].send_offload(hdr, &frame) {
            Err(SendError::BadOffload(_)) => refused[from] += 1,
            Err(_) | Ok(()) => {}
        }
        clock.advance(Duration::from_micros(u64::from(op)));
        sw.release_due();
    }
    clock.advance(Duration::from_secs(60));
    sw.release_due();

    for (i, p) in ports.iter().enumerate() {
        assert_eq!(
            p.counters().offload_errors,
            refused[i],
            "port {i}'s refusals"
        );
        let takes = p.offloads();
        while let Some((h, f)) = p.try_recv_offload() {
            assert!(f.len() <= MAX_FRAME_BYTES);
            if takes == Offloads::default() {
                assert_eq!(h, VnetHdr::default(), "a plain port got an offloaded frame");
            }
        }
    }
    for c in [cap, port_cap].into_iter().flatten() {
        let bytes = c.read_available();
        // 24-byte global header, then records with 16-byte headers.
        let mut at = 24;
        while at + 16 <= bytes.len() {
            let incl =
                u32::from_le_bytes([bytes[at + 8], bytes[at + 9], bytes[at + 10], bytes[at + 11]]);
            assert!(incl as usize <= MAX_FRAME_BYTES);
            at += 16 + incl as usize;
        }
        assert!(
            at <= bytes.len() || bytes.is_empty(),
            "pcap records are whole"
        );
    }
}

fuzz_target!(|data: &[u8]| run(data));
