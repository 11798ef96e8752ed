//! Switch behaviour through the public API, on a manual clock: every
//! latency/bandwidth assertion is about release order and exact release times,
//! never about wall-clock time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use provium_netsetup::{
    MacAddr, ManualClock, Port, SendError, Switch, SwitchConfig, Timer, MAX_FRAME_BYTES,
};

fn mac(n: u32) -> MacAddr {
    MacAddr::local(n)
}

/// A 60-byte frame dst <- src whose payload starts with `tag` (big-endian).
fn frame(dst: MacAddr, src: MacAddr, tag: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x88, 0xb5]);
    f.extend_from_slice(&tag.to_be_bytes());
    f.resize(60, 0);
    f
}

fn tag(f: &[u8]) -> u32 {
    u32::from_be_bytes([f[14], f[15], f[16], f[17]])
}

fn drain(p: &Port) -> Vec<u32> {
    std::iter::from_fn(|| p.try_recv())
        .map(|f| tag(&f))
        .collect()
}

struct Lab {
    sw: Switch,
    clock: Arc<ManualClock>,
}

fn lab_with(config: SwitchConfig) -> Lab {
    let clock = Arc::new(ManualClock::new());
    Lab {
        sw: Switch::with_clock("lan", config, clock.clone(), Timer::Manual),
        clock,
    }
}

fn lab() -> Lab {
    lab_with(SwitchConfig::default())
}

/// Ports a, b, c with MACs 1, 2, 3, each announced once by a broadcast so the
/// switch has learned them; queues drained.
fn abc(l: &Lab) -> (Port, Port, Port) {
    let a = l.sw.attach("a", mac(1)).unwrap();
    let b = l.sw.attach("b", mac(2)).unwrap();
    let c = l.sw.attach("c", mac(3)).unwrap();
    for (p, m) in [(&a, 1), (&b, 2), (&c, 3)] {
        p.send(&frame(MacAddr::BROADCAST, mac(m), 0)).unwrap();
    }
    for p in [&a, &b, &c] {
        drain(p);
    }
    (a, b, c)
}

#[test]
fn learning_and_flooding() {
    let l = lab();
    let a = l.sw.attach("a", mac(1)).unwrap();
    let b = l.sw.attach("b", mac(2)).unwrap();
    let c = l.sw.attach("c", mac(3)).unwrap();

    // Unknown unicast floods to everyone but the sender.
    a.send(&frame(mac(2), mac(1), 1)).unwrap();
    assert_eq!(drain(&a), Vec::<u32>::new());
    assert_eq!(drain(&b), [1]);
    assert_eq!(drain(&c), [1]);
    assert_eq!(l.sw.lookup_mac(mac(1)).as_deref(), Some("a"));
    assert_eq!(l.sw.lookup_mac(mac(2)), None);

    // b answers a: a is learned, so only a gets it; b is now learned.
    b.send(&frame(mac(1), mac(2), 2)).unwrap();
    assert_eq!(drain(&a), [2]);
    assert_eq!(drain(&c), Vec::<u32>::new());

    // a -> b is now unicast.
    a.send(&frame(mac(2), mac(1), 3)).unwrap();
    assert_eq!(drain(&b), [3]);
    assert_eq!(drain(&c), Vec::<u32>::new());

    // Broadcast and multicast always flood.
    a.send(&frame(MacAddr::BROADCAST, mac(1), 4)).unwrap();
    a.send(&frame(MacAddr([0x01, 0, 0x5e, 0, 0, 1]), mac(1), 5))
        .unwrap();
    assert_eq!(drain(&b), [4, 5]);
    assert_eq!(drain(&c), [4, 5]);

    // A MAC that moves is re-learned on its new port.
    c.send(&frame(MacAddr::BROADCAST, mac(2), 6)).unwrap();
    assert_eq!(l.sw.lookup_mac(mac(2)).as_deref(), Some("c"));
    drain(&a);
    drain(&b);
    a.send(&frame(mac(2), mac(1), 7)).unwrap();
    assert_eq!(drain(&c), [7]);
    assert_eq!(drain(&b), Vec::<u32>::new());

    // Entries age out: after the ageing time, unicast floods again.
    l.clock.advance(Duration::from_secs(301));
    assert_eq!(l.sw.lookup_mac(mac(2)), None);
    a.send(&frame(mac(2), mac(1), 8)).unwrap();
    assert_eq!(drain(&b), [8]);
    assert_eq!(drain(&c), [8]);
}

#[test]
fn symmetric_partition_blocks_both_ways_only_for_that_pair() {
    let l = lab();
    let (a, b, c) = abc(&l);
    l.sw.partition("a", "b");
    assert!(l.sw.is_partitioned("a", "b"));
    assert!(l.sw.is_partitioned("b", "a"));
    assert!(!l.sw.is_partitioned("a", "c"));
    a.send(&frame(mac(2), mac(1), 1)).unwrap();
    b.send(&frame(mac(1), mac(2), 2)).unwrap();
    a.send(&frame(mac(3), mac(1), 3)).unwrap();
    c.send(&frame(mac(2), mac(3), 4)).unwrap();
    assert_eq!(drain(&b), [4]);
    assert_eq!(drain(&a), Vec::<u32>::new());
    assert_eq!(drain(&c), [3]);
    assert_eq!(l.sw.stats().dropped_partition, 2);

    l.sw.unpartition("b", "a");
    assert!(!l.sw.is_partitioned("a", "b"));
    a.send(&frame(mac(2), mac(1), 5)).unwrap();
    b.send(&frame(mac(1), mac(2), 6)).unwrap();
    assert_eq!(drain(&b), [5]);
    assert_eq!(drain(&a), [6]);
}

#[test]
fn directional_partition_exactly_as_declared() {
    let l = lab();
    let (a, b, c) = abc(&l);
    l.sw.partition_directional("a", "b").unwrap();
    assert!(l.sw.is_partitioned("a", "b"));
    assert!(!l.sw.is_partitioned("b", "a"));
    assert_eq!(l.sw.partitions(), [("a".to_owned(), "b".to_owned())]);

    a.send(&frame(mac(2), mac(1), 1)).unwrap(); // blocked
    b.send(&frame(mac(1), mac(2), 2)).unwrap(); // flows
    a.send(&frame(mac(3), mac(1), 3)).unwrap(); // a's other pairs untouched
    assert_eq!(drain(&b), Vec::<u32>::new());
    assert_eq!(drain(&a), [2]);
    assert_eq!(drain(&c), [3]);

    // A broadcast from a reaches c but not b.
    a.send(&frame(MacAddr::BROADCAST, mac(1), 4)).unwrap();
    assert_eq!(drain(&b), Vec::<u32>::new());
    assert_eq!(drain(&c), [4]);

    // Directional needs attached endpoints; unpartition never errors.
    assert!(l.sw.partition_directional("a", "ghost").is_err());
    l.sw.unpartition_directional("ghost", "a");
    l.sw.unpartition_directional("a", "b");
    a.send(&frame(mac(2), mac(1), 5)).unwrap();
    assert_eq!(drain(&b), [5]);
}

#[test]
fn partition_all_and_restore_all() {
    let l = lab();
    let (a, b, c) = abc(&l);
    l.sw.partition_all();
    assert_eq!(l.sw.partitions().len(), 6);
    for (p, m) in [(&a, 1), (&b, 2), (&c, 3)] {
        p.send(&frame(MacAddr::BROADCAST, mac(m), m)).unwrap();
    }
    for p in [&a, &b, &c] {
        assert_eq!(drain(p), Vec::<u32>::new());
    }
    l.sw.restore_all();
    assert!(l.sw.partitions().is_empty());
    a.send(&frame(MacAddr::BROADCAST, mac(1), 9)).unwrap();
    assert_eq!(drain(&b), [9]);
    assert_eq!(drain(&c), [9]);
}

#[test]
fn isolation_and_reset_keeps_it() {
    let l = lab();
    let (a, b, c) = abc(&l);
    l.sw.isolate("a");
    assert!(l.sw.is_isolated("a"));
    a.send(&frame(MacAddr::BROADCAST, mac(1), 1)).unwrap();
    b.send(&frame(mac(1), mac(2), 2)).unwrap();
    b.send(&frame(mac(3), mac(2), 3)).unwrap();
    assert_eq!(drain(&a), Vec::<u32>::new());
    assert_eq!(drain(&b), Vec::<u32>::new());
    assert_eq!(drain(&c), [3]);

    l.sw.partition("b", "c");
    l.sw.set_latency(Duration::from_millis(5));
    l.sw.reset();
    assert!(l.sw.is_isolated("a"), "reset keeps isolation");
    assert!(!l.sw.is_partitioned("b", "c"), "reset lifts partitions");
    assert_eq!(l.sw.latency(), None, "reset lifts impairments");
    b.send(&frame(mac(1), mac(2), 4)).unwrap();
    assert_eq!(drain(&a), Vec::<u32>::new());

    l.sw.unisolate("a");
    assert!(!l.sw.is_isolated("a"));
    b.send(&frame(mac(1), mac(2), 5)).unwrap();
    assert_eq!(drain(&a), [5]);
}

/// Sends `n` frames a->b under a drop rate and returns which arrived.
fn drop_pattern(run_seed: u64, pct: f64, n: u32) -> Vec<bool> {
    let l = lab_with(SwitchConfig {
        run_seed,
        ..SwitchConfig::default()
    });
    let (a, b, _c) = abc(&l);
    l.sw.set_pair_drop_rate("a", "b", pct).unwrap();
    let mut got = Vec::new();
    for i in 0..n {
        a.send(&frame(mac(2), mac(1), i)).unwrap();
        got.push(b.try_recv().is_some());
    }
    got
}

#[test]
fn drop_rate_is_reproducible_per_seed() {
    let p1 = drop_pattern(42, 30.0, 2000);
    let p2 = drop_pattern(42, 30.0, 2000);
    let p3 = drop_pattern(43, 30.0, 2000);
    assert_eq!(p1, p2, "same seed, same drops");
    assert_ne!(p1, p3, "another seed, other drops");
    let dropped = p1.iter().filter(|d| !**d).count();
    // Binomial(2000, 0.3): mean 600, sd ~20.5; ±150 is over 7 sd. The seed
    // is fixed, so this cannot flake; it guards the threshold arithmetic.
    assert!((450..=750).contains(&dropped), "dropped {dropped} of 2000");
    assert!(drop_pattern(1, 0.0, 200).iter().all(|d| *d));
    assert!(drop_pattern(1, 100.0, 200).iter().all(|d| !*d));
}

#[test]
fn drop_rate_exposes_seed_and_is_per_pair() {
    let l = lab_with(SwitchConfig {
        run_seed: 7,
        ..SwitchConfig::default()
    });
    assert_eq!(l.sw.run_seed(), 7);
    assert_eq!(l.sw.seed(), provium_netsetup::impair::bridge_seed(7, "lan"));
    let (a, b, c) = abc(&l);
    l.sw.set_pair_drop_rate("a", "b", 100.0).unwrap();
    a.send(&frame(mac(2), mac(1), 1)).unwrap();
    a.send(&frame(mac(3), mac(1), 2)).unwrap();
    b.send(&frame(mac(1), mac(2), 3)).unwrap();
    assert_eq!(drain(&b), Vec::<u32>::new());
    assert_eq!(drain(&c), [2]);
    assert_eq!(drain(&a), [3]);
    assert_eq!(l.sw.pair_impairment("a", "b").drop_pct, Some(100.0));
    assert_eq!(l.sw.pair_impairment("b", "a").drop_pct, None);
    assert!(l.sw.set_drop_rate(101.0).is_err());
    assert!(l.sw.set_pair_drop_rate("a", "b", f64::NAN).is_err());
}

/// Which of `n` frames a->b arrive under whatever drop rate is declared.
fn survivors(a: &Port, b: &Port, first_tag: u32, n: u32) -> Vec<bool> {
    (first_tag..first_tag + n)
        .map(|t| {
            a.send(&frame(mac(2), mac(1), t)).unwrap();
            b.try_recv().is_some()
        })
        .collect()
}

#[test]
fn reset_restarts_the_drop_streams_and_a_new_rate_continues_them() {
    let l = lab_with(SwitchConfig {
        run_seed: 4242,
        ..SwitchConfig::default()
    });
    let (a, b, _c) = abc(&l);
    l.sw.set_drop_rate(30.0).unwrap();
    let whole = survivors(&a, &b, 0, 400);
    // After reset the pair's stream starts again from the bridge seed: the
    // same frames meet the same fates (what a test relies on to compare two
    // runs of one sequence inside one file).
    l.sw.reset();
    l.sw.set_drop_rate(30.0).unwrap();
    let first = survivors(&a, &b, 0, 200);
    assert_eq!(first, whole[..200]);
    // Re-declaring a rate without a reset keeps drawing from the same
    // stream: frames 200..400 of the one sequence, not a restart.
    l.sw.set_drop_rate(30.0).unwrap();
    let rest = survivors(&a, &b, 200, 200);
    assert_eq!(rest, whole[200..]);
    assert_ne!(rest, first, "a restarted stream would repeat the first 200");
}

#[test]
fn whole_bridge_drops_of_a_pair_ignore_other_pairs_traffic() {
    let pattern = |interleave: bool| {
        let l = lab_with(SwitchConfig {
            run_seed: 11,
            ..SwitchConfig::default()
        });
        let (a, b, c) = abc(&l);
        l.sw.set_drop_rate(30.0).unwrap();
        let mut got = Vec::new();
        for t in 0..300 {
            if interleave {
                // Other pairs' frames between a's: c->b, b->a, a->c.
                c.send(&frame(mac(2), mac(3), 10_000 + t)).unwrap();
                b.send(&frame(mac(1), mac(2), 20_000 + t)).unwrap();
                a.send(&frame(mac(3), mac(1), 30_000 + t)).unwrap();
            }
            a.send(&frame(mac(2), mac(1), t)).unwrap();
            got.extend(drain(&b).into_iter().filter(|t| *t < 10_000));
        }
        let dropped = l.sw.stats().dropped_impairment;
        (got, dropped)
    };
    let (alone, dropped_alone) = pattern(false);
    let (mixed, dropped_mixed) = pattern(true);
    assert_eq!(mixed, alone, "the n-th frame a->b has one fate per seed");
    assert!(
        dropped_mixed > dropped_alone,
        "the other pairs were impaired too"
    );
    // Binomial(300, 0.3) kept 210 on average; the seed is fixed, so this
    // cannot flake: it guards that a whole-bridge rate applies to the pair.
    assert!((150..=270).contains(&alone.len()), "kept {}", alone.len());
}

#[test]
fn whole_bridge_bandwidth_gives_every_pair_its_own_bucket() {
    // 80_000 bit/s = 10_000 bytes/s on the whole bridge; burst one frame.
    let l = lab_with(SwitchConfig {
        bandwidth_burst_bits: Some(1514 * 8),
        ..SwitchConfig::default()
    });
    let (a, b, c) = abc(&l);
    l.sw.set_bandwidth(80_000);
    let big = |dst: u32, src: u32, t: u32| {
        let mut f = frame(mac(dst), mac(src), t);
        f.resize(1000, 0);
        f
    };
    // a->b, a->c and b->a each send three 1000-byte frames at t = 0.
    for t in 0..3 {
        a.send(&big(2, 1, t)).unwrap();
        a.send(&big(3, 1, 10 + t)).unwrap();
        b.send(&big(1, 2, 20 + t)).unwrap();
    }
    // Each pair: frame 0 within the burst, then 48.6 ms and 148.6 ms, as if
    // it were alone (a shared bucket would push the later ones back).
    assert_eq!(drain(&b), [0]);
    assert_eq!(drain(&c), [10]);
    assert_eq!(drain(&a), [20]);
    for (us, k) in [(48_600u64, 1u32), (148_600, 2)] {
        l.clock.set(Duration::from_micros(us));
        l.sw.release_due();
        assert_eq!(drain(&b), [k]);
        assert_eq!(drain(&c), [10 + k]);
        assert_eq!(drain(&a), [20 + k]);
    }
    assert_eq!(l.sw.delayed_frames(), 0);
}

#[test]
fn latency_releases_in_order_at_the_declared_time() {
    let l = lab();
    let (a, b, c) = abc(&l);
    l.sw.set_pair_latency("a", "b", Duration::from_millis(100));
    assert_eq!(
        l.sw.pair_impairment("a", "b").latency,
        Some(Duration::from_millis(100))
    );
    a.send(&frame(mac(2), mac(1), 1)).unwrap();
    l.clock.advance(Duration::from_millis(30));
    a.send(&frame(mac(2), mac(1), 2)).unwrap();
    a.send(&frame(mac(3), mac(1), 3)).unwrap(); // a->c is not delayed
    assert_eq!(drain(&c), [3]);
    assert_eq!(drain(&b), Vec::<u32>::new());
    assert_eq!(l.sw.next_release(), Some(Duration::from_millis(100)));
    assert_eq!(l.sw.delayed_frames(), 2);

    l.clock.set(Duration::from_millis(99));
    assert_eq!(l.sw.release_due(), 0);
    l.clock.set(Duration::from_millis(100));
    assert_eq!(l.sw.release_due(), 1);
    assert_eq!(drain(&b), [1]);
    assert_eq!(l.sw.next_release(), Some(Duration::from_millis(130)));
    l.clock.set(Duration::from_millis(130));
    l.sw.release_due();
    assert_eq!(drain(&b), [2]);
    // b -> a flows without delay: per pair, exactly as declared.
    b.send(&frame(mac(1), mac(2), 4)).unwrap();
    assert_eq!(drain(&a), [4]);

    // Whole-bridge latency adds to the pair's.
    l.sw.set_latency(Duration::from_millis(10));
    assert_eq!(l.sw.latency(), Some(Duration::from_millis(10)));
    a.send(&frame(mac(2), mac(1), 5)).unwrap();
    b.send(&frame(mac(1), mac(2), 6)).unwrap();
    assert_eq!(l.sw.next_release(), Some(Duration::from_millis(140)));
    l.clock.set(Duration::from_millis(140));
    l.sw.release_due();
    assert_eq!(drain(&a), [6]);
    assert_eq!(drain(&b), Vec::<u32>::new());
    l.clock.set(Duration::from_millis(240));
    l.sw.release_due();
    assert_eq!(drain(&b), [5]);
}

#[test]
fn bandwidth_token_bucket_paces_at_the_declared_rate() {
    // 80_000 bit/s = 10_000 bytes/s; burst one 1514-byte frame's worth.
    let l = lab_with(SwitchConfig {
        bandwidth_burst_bits: Some(1514 * 8),
        ..SwitchConfig::default()
    });
    let (a, b, _c) = abc(&l);
    l.sw.set_pair_bandwidth("a", "b", 80_000);
    assert_eq!(l.sw.pair_impairment("a", "b").bandwidth_bps, Some(80_000));
    let big = |t| {
        let mut f = frame(mac(2), mac(1), t);
        f.resize(1000, 0);
        f
    };
    for t in 0..5 {
        a.send(&big(t)).unwrap();
    }
    // Frame 0 fits the burst (514 bytes of tokens remain); frame 1 needs 486
    // more bytes = 48.6 ms; each later one 100 ms more.
    assert_eq!(drain(&b), [0]);
    let expect = [48_600u64, 148_600, 248_600, 348_600];
    for (i, us) in expect.iter().enumerate() {
        let at = Duration::from_micros(*us);
        assert_eq!(l.sw.next_release(), Some(at), "frame {}", i + 1);
        l.clock.set(at - Duration::from_micros(1));
        l.sw.release_due();
        assert_eq!(drain(&b), Vec::<u32>::new());
        l.clock.set(at);
        l.sw.release_due();
        assert_eq!(drain(&b), [u32::try_from(i).unwrap() + 1]);
    }
    // Over the whole run: 5000 bytes in 0.3486 s after the 1514-byte burst
    // = (5000 - 1514) bytes / 0.3486 s = 10_000 bytes/s exactly.
}

#[test]
fn combined_impairments_whole_bridge_and_per_pair() {
    let l = lab_with(SwitchConfig {
        run_seed: 99,
        bandwidth_burst_bits: Some(60 * 8),
        ..SwitchConfig::default()
    });
    let (a, b, c) = abc(&l);
    // Whole bridge: 10 ms latency, 480 kbit/s (60 bytes per ms).
    l.sw.set_latency(Duration::from_millis(10));
    l.sw.set_bandwidth(480_000);
    // a->b additionally: 5 ms, 50 % drop, 240 kbit/s (60 bytes per 2 ms).
    l.sw.set_pair_latency("a", "b", Duration::from_millis(5));
    l.sw.set_pair_drop_rate("a", "b", 50.0).unwrap();
    l.sw.set_pair_bandwidth("a", "b", 240_000);
    // b->a partitioned at the same time.
    l.sw.partition_directional("b", "a").unwrap();
    assert_eq!(l.sw.bandwidth_bps(), Some(480_000));
    assert_eq!(l.sw.pair_impairments().len(), 1);

    for t in 0..40 {
        a.send(&frame(mac(2), mac(1), t)).unwrap();
        a.send(&frame(mac(3), mac(1), 100 + t)).unwrap();
    }
    b.send(&frame(mac(1), mac(2), 999)).unwrap();
    l.clock.set(Duration::from_secs(10));
    l.sw.release_due();
    let got_b = drain(&b);
    let got_c = drain(&c);
    assert_eq!(drain(&a), Vec::<u32>::new(), "b->a partitioned");
    assert_eq!(
        got_c,
        (100..140).collect::<Vec<_>>(),
        "a->c: no drops, in order"
    );
    assert!(got_b.windows(2).all(|w| w[0] < w[1]), "a->b in order");
    assert!(
        (5..=35).contains(&got_b.len()),
        "about half of 40 dropped: {got_b:?}"
    );
    let stats = l.sw.stats();
    assert_eq!(stats.dropped_impairment, 40 - got_b.len() as u64);
    assert_eq!(stats.dropped_partition, 1);
    // Same seed, same survivors.
    let l2 = lab_with(SwitchConfig {
        run_seed: 99,
        bandwidth_burst_bits: Some(60 * 8),
        ..SwitchConfig::default()
    });
    let (a2, b2, _c2) = abc(&l2);
    l2.sw.set_pair_drop_rate("a", "b", 50.0).unwrap();
    for t in 0..40 {
        a2.send(&frame(mac(2), mac(1), t)).unwrap();
    }
    assert_eq!(drain(&b2), got_b);
}

#[test]
fn combined_release_times_follow_the_rule() {
    let l = lab_with(SwitchConfig {
        bandwidth_burst_bits: Some(60 * 8),
        ..SwitchConfig::default()
    });
    let (a, b, _c) = abc(&l);
    l.sw.set_latency(Duration::from_millis(10));
    l.sw.set_bandwidth(480_000); // 60 bytes/ms
    l.sw.set_pair_latency("a", "b", Duration::from_millis(5));
    l.sw.set_pair_bandwidth("a", "b", 240_000); // min wins: 60 bytes / 2 ms
    for t in 0..3 {
        a.send(&frame(mac(2), mac(1), t)).unwrap();
    }
    // Departures 0, 2, 4 ms; + 15 ms latency.
    for (i, ms) in [15u64, 17, 19].iter().enumerate() {
        assert_eq!(l.sw.next_release(), Some(Duration::from_millis(*ms)));
        l.clock.set(Duration::from_millis(*ms));
        l.sw.release_due();
        assert_eq!(drain(&b), [u32::try_from(i).unwrap()]);
    }
}

#[test]
fn reset_releases_delayed_frames_now() {
    let l = lab();
    let (a, b, _c) = abc(&l);
    l.sw.set_latency(Duration::from_secs(3600));
    a.send(&frame(mac(2), mac(1), 1)).unwrap();
    a.send(&frame(mac(2), mac(1), 2)).unwrap();
    assert_eq!(drain(&b), Vec::<u32>::new());
    l.sw.reset();
    assert_eq!(drain(&b), [1, 2]);
    assert_eq!(l.sw.delayed_frames(), 0);
}

#[test]
fn an_absurd_latency_holds_frames_until_a_reset_without_overflow() {
    let l = lab();
    let (a, b, _c) = abc(&l);
    // Whole-bridge plus pair latency would overflow a Duration if added
    // plainly, and so would the release time: both saturate instead.
    l.sw.set_latency(Duration::MAX);
    l.sw.set_pair_latency("a", "b", Duration::MAX);
    a.send(&frame(mac(2), mac(1), 1)).unwrap();
    assert_eq!(l.sw.delayed_frames(), 1);
    l.clock.advance(Duration::from_secs(365 * 24 * 3600));
    l.sw.release_due();
    assert_eq!(drain(&b), Vec::<u32>::new(), "still held a year later");
    l.sw.reset();
    assert_eq!(drain(&b), [1]);
    assert_eq!(l.sw.delayed_frames(), 0);
}

#[test]
fn counters_from_the_guest_perspective() {
    let l = lab();
    let a = l.sw.attach("a", mac(1)).unwrap();
    let b = l.sw.attach("b", mac(2)).unwrap();
    a.send(&frame(MacAddr::BROADCAST, mac(1), 1)).unwrap();
    a.send(&frame(mac(2), mac(1), 2)).unwrap();
    let ca = l.sw.counters("a").unwrap();
    let cb = b.counters();
    assert_eq!((ca.tx_packets, ca.tx_bytes), (2, 120));
    assert_eq!((ca.rx_packets, ca.rx_bytes), (0, 0));
    assert_eq!((cb.rx_packets, cb.rx_bytes), (2, 120));
    assert_eq!((cb.tx_packets, cb.tx_bytes), (0, 0));
    assert_eq!(a.send(&[0u8; 10]), Err(SendError::Runt(10)));
    let ca = a.counters();
    assert_eq!((ca.errors, ca.tx_dropped, ca.tx_packets), (1, 1, 2));
    assert!(l.sw.counters("ghost").is_err());
}

#[test]
fn disconnect_and_reconnect() {
    let l = lab();
    let (a, b, _c) = abc(&l);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    a.set_link_watcher(Some(Arc::new(move |up| s2.lock().unwrap().push(up))));

    b.send(&frame(mac(1), mac(2), 1)).unwrap(); // queued for a
    l.sw.disconnect("a").unwrap();
    assert!(!a.is_link_up());
    assert!(!l.sw.is_connected("a").unwrap());
    assert_eq!(
        a.try_recv(),
        None,
        "queued frames are discarded on link down"
    );
    assert_eq!(a.send(&frame(mac(2), mac(1), 2)), Err(SendError::LinkDown));
    b.send(&frame(mac(1), mac(2), 3)).unwrap();
    assert_eq!(drain(&a), Vec::<u32>::new());
    assert_eq!(drain(&b), Vec::<u32>::new());
    let ca = a.counters();
    assert_eq!(ca.tx_dropped, 1);
    assert_eq!(ca.rx_dropped, 2);
    l.sw.disconnect("a").unwrap(); // idempotent, no second callback

    l.sw.reconnect("a").unwrap();
    assert!(a.is_link_up());
    a.send(&frame(mac(2), mac(1), 4)).unwrap();
    b.send(&frame(mac(1), mac(2), 5)).unwrap();
    assert_eq!(drain(&b), [4]);
    assert_eq!(drain(&a), [5]);
    assert_eq!(*seen.lock().unwrap(), [false, true]);
    assert!(l.sw.disconnect("ghost").is_err());
}

#[test]
fn rx_waker_runs_after_queueing() {
    let l = lab();
    let (a, b, _c) = abc(&l);
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = Arc::clone(&n);
    b.set_rx_waker(Some(Arc::new(move || {
        n2.fetch_add(1, Ordering::SeqCst);
    })));
    a.send(&frame(mac(2), mac(1), 1)).unwrap();
    a.send(&frame(mac(3), mac(1), 2)).unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 1);
    assert_eq!(b.pending(), 1);
}

#[test]
fn untrusted_input_is_bounded() {
    let l = lab_with(SwitchConfig {
        rx_queue_frames: 16,
        rx_queue_bytes: 1 << 20,
        delay_queue_bytes: 10 * 60,
        mac_entries_per_port: 8,
        ..SwitchConfig::default()
    });
    let (a, b, c) = abc(&l);

    // Oversized and malformed frames are refused and counted.
    let huge = vec![0u8; MAX_FRAME_BYTES + 1];
    assert_eq!(
        a.send(&huge),
        Err(SendError::Oversized(MAX_FRAME_BYTES + 1))
    );
    let mut max = frame(mac(2), mac(1), 1);
    max.resize(MAX_FRAME_BYTES, 0);
    assert_eq!(a.send(&max), Ok(()));
    assert_eq!(
        a.send(&frame(mac(2), MacAddr::BROADCAST, 1)),
        Err(SendError::BadSource(MacAddr::BROADCAST))
    );
    assert_eq!(a.send(&[]), Err(SendError::Runt(0)));
    assert_eq!(a.counters().errors, 3);
    drain(&b);

    // A flood toward a guest that never reads: the queue holds 16.
    for t in 0..10_000 {
        a.send(&frame(mac(2), mac(1), t)).unwrap();
    }
    assert_eq!(b.pending(), 16);
    assert_eq!(b.counters().rx_dropped, 10_000 - 16);
    assert_eq!(l.sw.stats().dropped_rx_queue_full, 10_000 - 16);

    // Spoofed source MACs: a owns at most 8 entries; b's and c's survive.
    for n in 1000..6000 {
        a.send(&frame(mac(3), mac(n), 0)).unwrap();
    }
    assert_eq!(l.sw.lookup_mac(mac(2)).as_deref(), Some("b"));
    assert_eq!(l.sw.lookup_mac(mac(3)).as_deref(), Some("c"));
    assert_eq!(
        l.sw.lookup_mac(mac(1)),
        None,
        "a's oldest entry was evicted"
    );
    assert!(l.sw.stats().mac_evictions >= 5000 - 8);
    drain(&c);

    // Delayed frames: the delay queue holds 600 bytes = 10 frames.
    l.sw.set_latency(Duration::from_secs(1));
    for t in 0..100 {
        c.send(&frame(mac(2), mac(3), t)).unwrap();
    }
    assert_eq!(l.sw.delayed_frames(), 10);
    assert_eq!(l.sw.stats().dropped_delay_queue_full, 90);
}

#[test]
fn detached_ports_and_declared_state() {
    let l = lab();
    let (a, b, _c) = abc(&l);
    l.sw.partition("a", "b");
    l.sw.isolate("b");
    drop(b);
    assert_eq!(l.sw.members(), ["a", "c"]);
    // Declared state stays by name and applies to a re-attached port.
    assert!(l.sw.is_partitioned("a", "b"));
    let b = l.sw.attach("b", mac(2)).unwrap();
    a.send(&frame(MacAddr::BROADCAST, mac(1), 1)).unwrap();
    assert_eq!(drain(&b), Vec::<u32>::new());
    l.sw.unisolate("b");
    l.sw.unpartition("a", "b");
    a.send(&frame(MacAddr::BROADCAST, mac(1), 2)).unwrap();
    assert_eq!(drain(&b), [2]);
    b.detach();
    assert_eq!(b.send(&frame(mac(1), mac(2), 3)), Err(SendError::Detached));
}

#[test]
fn system_clock_timer_thread_releases_delayed_frames() {
    // The real timer thread: assert delivery happens (no timing assertion),
    // polling with a generous deadline.
    let sw = Switch::new("lan", SwitchConfig::default());
    let a = sw.attach("a", mac(1)).unwrap();
    let b = sw.attach("b", mac(2)).unwrap();
    sw.set_latency(Duration::from_millis(20));
    a.send(&frame(MacAddr::BROADCAST, mac(1), 1)).unwrap();
    let f = b
        .recv_timeout(Duration::from_secs(30))
        .expect("released by the timer");
    assert_eq!(tag(&f), 1);
    assert_eq!(sw.stats().delayed, 1);
}

/// Senders on two ports and a control-plane thread run at once: every
/// frame is accounted for exactly once (delivered or partitioned), in
/// order per pair, and nothing deadlocks.
#[test]
fn concurrent_senders_and_control_changes_account_for_every_frame() {
    const FRAMES: u32 = 4000;
    let l = lab_with(SwitchConfig {
        rx_queue_frames: 2 * FRAMES as usize,
        rx_queue_bytes: 64 << 20,
        ..SwitchConfig::default()
    });
    let (a, b, _c) = abc(&l);
    let before = l.sw.stats();
    let (a, b) = (Arc::new(a), Arc::new(b));
    let done = Arc::new(AtomicUsize::new(0));
    // Senders start together with the control loop.
    let start = Arc::new(std::sync::Barrier::new(3));
    let senders: Vec<_> = [(Arc::clone(&a), 2, 1), (Arc::clone(&b), 1, 2)]
        .into_iter()
        .map(|(p, to, from)| {
            let (done, start) = (Arc::clone(&done), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for t in 0..FRAMES {
                    let _ = p.send(&frame(mac(to), mac(from), t));
                }
                done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    let mut changes = 0u32;
    start.wait();
    while done.load(Ordering::SeqCst) < 2 {
        l.sw.partition("a", "b");
        l.sw.set_pair_drop_rate("c", "a", 10.0).unwrap();
        let e = l.sw.attach("e", mac(5)).unwrap();
        l.sw.unpartition("a", "b");
        l.sw.isolate("nobody");
        drop(e);
        l.sw.reset();
        changes += 1;
    }
    for s in senders {
        s.join().unwrap();
    }
    let after = l.sw.stats();
    let total = u64::from(2 * FRAMES);
    assert_eq!(after.frames_in - before.frames_in, total);
    let delivered = after.delivered - before.delivered;
    let partitioned = after.dropped_partition - before.dropped_partition;
    assert_eq!(
        delivered + partitioned,
        total,
        "after {changes} control changes"
    );
    let (got_b, got_a) = (drain(&b), drain(&a));
    assert_eq!((got_a.len() + got_b.len()) as u64, delivered);
    for got in [got_a, got_b] {
        assert!(got.windows(2).all(|w| w[0] < w[1]), "per-pair order kept");
    }
}
