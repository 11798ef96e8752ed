//! Steady-state forwarding allocates nothing: a counting global allocator
//! counts the heap allocations made on this thread while frames (plain,
//! checksum-pending and GSO super-frames that are segmented) cross the
//! switch and receivers hand their buffers back.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use etherparse::PacketBuilder;
use provium_netsetup::offload::{F_NEEDS_CSUM, GSO_TCPV4};
use provium_netsetup::{
    MacAddr, ManualClock, Offloads, Port, Switch, SwitchConfig, Timer, VnetHdr,
};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator; counting has no effect on it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCS.load(Ordering::Relaxed) - before
}

fn tcp(src: MacAddr, dst: MacAddr, payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(src.0, dst.0)
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .tcp(1, 2, 3, 4)
        .write(&mut f, &vec![0x5a; payload])
        .unwrap();
    f
}

fn drain(p: &Port) -> usize {
    let mut n = 0;
    while let Some((_, buf)) = p.try_recv_offload() {
        p.recycle(buf);
        n += 1;
    }
    n
}

/// A switch with a and b (both offload-capable) and c (none); b and c
/// learned, every queue drained.
fn lab() -> (Switch, Port, Port, Port) {
    let clock = Arc::new(ManualClock::new());
    let sw = Switch::with_clock("lan", SwitchConfig::default(), clock, Timer::Manual);
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let c = sw.attach("c", MacAddr::local(3)).unwrap();
    a.set_offloads(Offloads::ALL);
    b.set_offloads(Offloads::ALL);
    // Learn b and c, so unicast goes to one port.
    b.send(&tcp(MacAddr::local(2), MacAddr::local(1), 10))
        .unwrap();
    c.send(&tcp(MacAddr::local(3), MacAddr::local(1), 10))
        .unwrap();
    drain(&a);
    drain(&b);
    drain(&c);
    (sw, a, b, c)
}

/// A TCPv4 super-frame's header: 1448-byte segments, checksum pending.
const GSO: VnetHdr = VnetHdr {
    flags: F_NEEDS_CSUM,
    gso_type: GSO_TCPV4,
    hdr_len: 54,
    gso_size: 1448,
    csum_start: 34,
    csum_offset: 16,
};

#[test]
fn steady_state_forwarding_allocates_nothing() {
    let (sw, a, b, c) = lab();

    let small = tcp(MacAddr::local(1), MacAddr::local(2), 100);
    let gso_to_c = tcp(MacAddr::local(1), MacAddr::local(3), 20_000);
    let gso_to_b = tcp(MacAddr::local(1), MacAddr::local(2), 20_000);
    let gso = GSO;
    let round = || {
        a.send(&small).unwrap();
        a.send_offload(gso, &gso_to_b).unwrap();
        a.send_offload(gso, &gso_to_c).unwrap();
        a.send_batch([(VnetHdr::default(), &small[..]), (gso, &gso_to_c[..])]);
        (drain(&b), drain(&c))
    };
    // Warm-up: queues, pools and the segment buffer reach their sizes.
    for _ in 0..50 {
        assert_eq!(round(), (3, 28));
    }
    let mut got = (0, 0);
    let n = counted(|| {
        for _ in 0..1000 {
            got = round();
        }
    });
    assert_eq!(
        got,
        (3, 28),
        "b: small twice + one super-frame; c: 2 x 14 segments"
    );
    assert_eq!(n, 0, "allocations during 1000 steady-state rounds");
    assert!(sw.stats().segments >= 28 * 1000);
}

/// The direct path (a destination's device written from the sender's
/// thread while its queue is idle) allocates nothing either, and mixes with
/// queued delivery to another port.
#[test]
fn steady_state_direct_path_allocates_nothing() {
    let (sw, a, b, c) = lab();
    // Draining b with try_recv marked its consumer busy; idle it.
    while b.try_recv_or_idle().is_some() {}
    let written = Arc::new(AtomicU64::new(0));
    let written_bytes = Arc::new(AtomicU64::new(0));
    {
        let (n, bytes) = (Arc::clone(&written), Arc::clone(&written_bytes));
        b.set_direct_writer(Some(Arc::new(move |_, frame: &[u8]| {
            n.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(frame.len() as u64, Ordering::Relaxed);
            true
        })));
    }
    let small = tcp(MacAddr::local(1), MacAddr::local(2), 100);
    let gso_to_b = tcp(MacAddr::local(1), MacAddr::local(2), 20_000);
    let gso_to_c = tcp(MacAddr::local(1), MacAddr::local(3), 20_000);
    let gso = GSO;
    let round = || {
        a.send(&small).unwrap();
        a.send_offload(gso, &gso_to_b).unwrap();
        a.send_batch([(VnetHdr::default(), &small[..]), (gso, &gso_to_c[..])]);
        (b.pending(), drain(&c))
    };
    for _ in 0..50 {
        assert_eq!(round(), (0, 14));
    }
    let before = written.load(Ordering::Relaxed);
    let n = counted(|| {
        for _ in 0..1000 {
            assert_eq!(round(), (0, 14));
        }
    });
    assert_eq!(n, 0, "allocations during 1000 steady-state rounds");
    assert_eq!(
        written.load(Ordering::Relaxed) - before,
        3000,
        "every frame for b went straight to its device, the super-frame whole"
    );
    // c's flooded learning frame, then three per round.
    assert_eq!(sw.counters("b").unwrap().rx_packets, 1 + 3 * 1050);
    assert!(written_bytes.load(Ordering::Relaxed) > 20_000 * 1050);
}
