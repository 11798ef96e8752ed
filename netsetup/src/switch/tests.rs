//! Unit tests of the switch that reach into its internals, and the
//! helpers the submodules' tests share.

use super::*;
use crate::clock::ManualClock;

/// A 60-byte frame whose payload bytes are all `tag`.
pub(super) fn frame(dst: MacAddr, src: MacAddr, tag: u8) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x88, 0xb5]);
    f.resize(60, tag);
    f
}

/// A switch on a manual clock with no timer thread.
pub(super) fn manual() -> (Switch, Arc<ManualClock>) {
    manual_with(SwitchConfig::default())
}

/// [`manual`] with `config`.
pub(super) fn manual_with(config: SwitchConfig) -> (Switch, Arc<ManualClock>) {
    let c = Arc::new(ManualClock::new());
    (
        Switch::with_clock("lan", config, c.clone(), Timer::Manual),
        c,
    )
}

#[test]
fn attach_names_are_unique_and_members_ordered() {
    let (sw, _) = manual();
    let _b = sw.attach("b", MacAddr::local(2)).unwrap();
    let _a = sw.attach("a", MacAddr::local(1)).unwrap();
    assert_eq!(sw.members(), ["b", "a"]);
    assert!(matches!(
        sw.attach("a", MacAddr::local(3)),
        Err(SwitchError::NameTaken { .. })
    ));
    assert_eq!(sw.port_mac("a").unwrap(), MacAddr::local(1));
}

#[test]
fn drop_of_port_detaches() {
    let (sw, _) = manual();
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    drop(a);
    assert!(sw.members().is_empty());
    assert!(sw.attach("a", MacAddr::local(1)).is_ok());
}

#[test]
fn hairpin_unicast_dropped() {
    let (sw, _) = manual();
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    a.send(&frame(MacAddr::BROADCAST, MacAddr::local(1), 0))
        .unwrap();
    a.send(&frame(MacAddr::local(1), MacAddr::local(1), 1))
        .unwrap();
    assert_eq!(sw.stats().dropped_hairpin, 1);
    assert_eq!(b.pending(), 1);
}

#[test]
fn switch_drop_closes_ports() {
    let (sw, _) = manual();
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    drop(sw);
    assert_eq!(a.recv(), None);
    assert_eq!(
        a.send(&frame(MacAddr::BROADCAST, MacAddr::local(1), 0)),
        Err(SendError::Detached)
    );
}

#[test]
fn forwarding_proceeds_while_the_control_plane_is_held() {
    let (sw, _) = manual();
    let a = Arc::new(sw.attach("a", MacAddr::local(1)).unwrap());
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let _c = sw.attach("c", MacAddr::local(3)).unwrap();
    sw.set_pair_drop_rate("c", "a", 50.0).unwrap();
    // Both MACs learned and both senders' snapshots current.
    b.send(&frame(MacAddr::BROADCAST, MacAddr::local(2), 0))
        .unwrap();
    a.send(&frame(MacAddr::local(2), MacAddr::local(1), 0))
        .unwrap();
    while b.try_recv().is_some() {}
    // A third party holds every switch-wide lock the control plane and
    // the delay releasers use; a unicast a -> b must still cross.
    let control = sw.inner.lock();
    let published = sw.inner.published.lock().unwrap();
    let releasing = sw.inner.delay.releasing.lock().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let sender = {
        let a = Arc::clone(&a);
        std::thread::spawn(move || {
            for tag in 1..=3 {
                a.send(&frame(MacAddr::local(2), MacAddr::local(1), tag))
                    .unwrap();
            }
            done_tx.send(()).unwrap();
        })
    };
    let crossed = done_rx.recv_timeout(Duration::from_secs(30)).is_ok();
    let tags: Vec<u8> = std::iter::from_fn(|| b.try_recv()).map(|f| f[20]).collect();
    drop((control, published, releasing));
    sender.join().unwrap();
    assert!(crossed, "a send blocked on a switch-wide lock");
    assert_eq!(tags, [1, 2, 3]);
    assert_eq!(b.counters().rx_packets, 4);
}

#[test]
fn control_changes_reach_a_sender_with_a_cached_snapshot() {
    let (sw, _) = manual();
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let f = frame(MacAddr::BROADCAST, MacAddr::local(1), 0);
    a.send(&f).unwrap();
    sw.partition_directional("a", "b").unwrap();
    a.send(&f).unwrap();
    sw.unpartition_directional("a", "b");
    a.send(&f).unwrap();
    assert_eq!(b.pending(), 2);
    assert_eq!(sw.stats().dropped_partition, 1);
}

#[test]
fn a_lowered_latency_lets_new_frames_overtake_the_waiting_ones() {
    // docs/networking.md: the release time is fixed when a frame is held,
    // so frames sent after a pair's latency is lowered leave first (as
    // netem's frames in flight do); frames under one setting keep order.
    let (sw, clock) = manual();
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    b.send(&frame(MacAddr::BROADCAST, MacAddr::local(2), 0))
        .unwrap();
    sw.set_pair_latency("a", "b", Duration::from_millis(100));
    for tag in [1, 2] {
        a.send(&frame(MacAddr::local(2), MacAddr::local(1), tag))
            .unwrap();
    }
    sw.set_pair_latency("a", "b", Duration::from_millis(10));
    for tag in [3, 4] {
        a.send(&frame(MacAddr::local(2), MacAddr::local(1), tag))
            .unwrap();
    }
    sw.set_pair_latency("a", "b", Duration::ZERO);
    a.send(&frame(MacAddr::local(2), MacAddr::local(1), 5))
        .unwrap();
    let arrived = || -> Vec<u8> { std::iter::from_fn(|| b.try_recv()).map(|f| f[20]).collect() };
    assert_eq!(arrived(), [5], "an unimpaired frame crosses at once");
    clock.advance(Duration::from_millis(10));
    sw.release_due();
    assert_eq!(arrived(), [3, 4]);
    clock.advance(Duration::from_millis(90));
    sw.release_due();
    assert_eq!(arrived(), [1, 2]);
}

#[test]
fn detach_many_detaches_the_named_ports_in_one_change_and_skips_unknown_names() {
    let (sw, _) = manual();
    let a = sw.attach("a", MacAddr::local(1)).unwrap();
    let b = sw.attach("b", MacAddr::local(2)).unwrap();
    let _c = sw.attach("c", MacAddr::local(3)).unwrap();
    let before = sw.inner.generation.load(Ordering::Acquire);
    sw.detach_many(&["a", "b", "nobody"]);
    assert_eq!(sw.members(), ["c"]);
    assert_eq!(
        sw.inner.generation.load(Ordering::Acquire),
        before + 1,
        "one control change for both ports"
    );
    assert!(matches!(
        a.send(&frame(MacAddr::local(3), MacAddr::local(1), 1)),
        Err(SendError::Detached)
    ));
    // The handles' own detach (their drop) changes nothing more.
    b.detach();
    drop((a, b));
    assert_eq!(sw.inner.generation.load(Ordering::Acquire), before + 1);
    sw.detach_many(&["a"]);
    assert_eq!(sw.inner.generation.load(Ordering::Acquire), before + 1);
}

#[test]
fn a_caller_blocked_on_the_control_lock_is_seen_waiting_until_it_has_it() {
    // The kernel paths' enabling stops for such a caller (`kernel.rs`).
    let (sw, _) = manual();
    let _a = sw.attach("a", MacAddr::local(1)).unwrap();
    assert!(!sw.inner.control_wanted());
    let held = sw.inner.lock();
    std::thread::scope(|s| {
        let caller = s.spawn(|| sw.members());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !sw.inner.control_wanted() {
            assert!(
                std::time::Instant::now() < deadline,
                "the blocked caller was never seen"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        assert_eq!(caller.join().unwrap(), ["a"]);
    });
    assert!(!sw.inner.control_wanted(), "nobody waits once it has run");
}
