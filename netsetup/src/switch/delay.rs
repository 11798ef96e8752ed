//! The delay queues: frames held for latency or a bandwidth backlog, one
//! queue per destination port, and the timer that releases them.
//!
//! # No lock shared by all ports
//! Each destination port has its own [`PortDelay`](super::port_delay::PortDelay) (in its `PortShared`,
//! next to its receive queue), so the senders that share a delay lock are
//! exactly those that already share the destination's receive-queue lock.
//! What the queues have in common is lock-free ([`DelayShared`]):
//! - the order: every frame takes a sequence number from one atomic, and
//!   frames leave in (release time, sequence) order across all ports, so the
//!   frames of one pair keep their order and a manual-clock release is
//!   deterministic;
//! - the byte bound ([`SwitchConfig::delay_queue_bytes`]): a frame reserves
//!   its bytes with a compare-exchange before it is queued, so the bound
//!   holds exactly however many senders race for it;
//! - the timer's wake-up protocol (see [`DelayShared`]).
//!
//! Releasers (the timer thread, [`Switch::release_due`], [`Switch::reset`])
//! take one more lock, `releasing`, so that two of them never interleave
//! their deliveries; senders never take it.
//!
//! # Detach
//! Detaching a port closes its queue under the queue's lock and drops the
//! frames in it (they would be dropped at delivery anyway), giving their
//! bytes back to the bound. A sender whose snapshot still shows the port
//! finds the queue closed and gives its reservation back, so no bytes leak.
//!
//! [`SwitchConfig::delay_queue_bytes`]: super::SwitchConfig::delay_queue_bytes
//! [`Switch::release_due`]: super::Switch::release_due
//! [`Switch::reset`]: super::Switch::reset

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use super::counters::{add, bump};
use super::forward::{After, Direct};
use super::port_delay::{Delayed, Release, NOTHING_PENDING_NS};
use super::topology::{PortShared, Topology};
use super::Inner;
use crate::clock::duration_ns;
use crate::offload::VnetHdr;

/// What every port's delay queue shares; senders touch only its atomics.
///
/// # The timer's wake-up protocol
/// The timer thread loops: store `deadline_ns = NOTHING_PENDING_NS`
/// ("scanning"), release what is due, load every port's `next_release_ns`
/// for the minimum, store `deadline_ns = min`, then park until `min` (or
/// until unparked). A sender, after publishing its queue's new earliest
/// release, loads `deadline_ns` and unparks the timer when its frame is
/// due earlier.
///
/// All three are SeqCst, so the stores and loads fall in one total order
/// that agrees with each thread's program order. Suppose the timer's scan
/// missed a sender's publication P. Then the scan's load came before P,
/// hence after the timer's "scanning" store S; the sender's deadline load L
/// comes after P. So L reads S (and unparks), or the `min` stored after
/// the scan (and unparks if its frame is earlier, or else the timer wakes
/// at `min`, no later than the frame, and rescans), or a later iteration's
/// store, to which the same argument applies. A port the scan did not see
/// at all (attached after the timer's snapshot) is the same case: the
/// sender read a snapshot published after the timer's, so the "scanning"
/// store happens before its deadline load. An unpark that comes before
/// the park leaves a token that makes the park return at once. So no
/// frame waits past its release for want of a wake-up; at worst the timer
/// scans once more than it needs to.
pub(super) struct DelayShared {
    /// The next frame's sequence number, switch-wide.
    next_seq: AtomicU64,
    /// Bytes held in all ports' delay queues (and reserved by senders
    /// about to queue).
    held_bytes: AtomicUsize,
    /// [`SwitchConfig::delay_queue_bytes`](super::SwitchConfig::delay_queue_bytes).
    limit_bytes: usize,
    /// When the timer thread will next look, in nanoseconds on the switch
    /// clock; [`NOTHING_PENDING_NS`] while it scans (or with no thread).
    deadline_ns: AtomicU64,
    /// Set when the switch is dropped; the timer thread exits.
    closed: AtomicBool,
    /// The timer thread, set once right after it is spawned.
    timer: OnceLock<Thread>,
    /// Held by whoever releases frames (timer, `release_due`, `reset`) so
    /// that releases do not interleave; never by senders.
    pub(super) releasing: Mutex<()>,
}

impl DelayShared {
    pub(super) fn new(limit_bytes: usize) -> DelayShared {
        DelayShared {
            next_seq: AtomicU64::new(0),
            held_bytes: AtomicUsize::new(0),
            limit_bytes,
            deadline_ns: AtomicU64::new(NOTHING_PENDING_NS),
            closed: AtomicBool::new(false),
            timer: OnceLock::new(),
            releasing: Mutex::new(()),
        }
    }

    /// Registers the timer thread that senders unpark.
    pub(super) fn set_timer(&self, thread: Thread) {
        // Only `Switch::with_clock` sets it, once.
        let _ = self.timer.set(thread);
    }

    /// Stops the timer thread (it exits at its next look).
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(t) = self.timer.get() {
            t.unpark();
        }
    }

    /// Reserves `len` bytes of the bound; false when they do not fit.
    fn reserve(&self, len: usize) -> bool {
        // A compare-exchange loop: the bound holds exactly, never
        // overshot by racing senders. Relaxed is enough: the counter
        // orders nothing but itself.
        self.held_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(len).filter(|n| *n <= self.limit_bytes)
            })
            .is_ok()
    }

    /// Returns `len` bytes to the bound.
    fn give_back(&self, len: usize) {
        if len > 0 {
            self.held_bytes.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// The timer's current deadline (tests wait for it to sleep).
    #[cfg(test)]
    pub(super) fn deadline(&self) -> Option<Duration> {
        Some(self.deadline_ns.load(Ordering::SeqCst))
            .filter(|ns| *ns != NOTHING_PENDING_NS)
            .map(Duration::from_nanos)
    }
}

impl Inner {
    /// Holds `frame` (with `hdr`, the offload it still carries) for port
    /// `to` until `release`, if the bound allows.
    pub(super) fn hold(&self, to: &PortShared, release: Duration, hdr: VnetHdr, frame: &[u8]) {
        let shared = &self.delay;
        if !shared.reserve(frame.len()) {
            bump(&self.stats.dropped_delay_queue_full);
            return;
        }
        // Relaxed: a pair's frames are queued under its sending port's
        // sender lock, which orders their increments (happens-before
        // implies modification order), so they keep their order.
        let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
        let held = Delayed {
            release,
            seq,
            hdr,
            frame: frame.to_vec(),
        };
        if let Err(refused) = to.delay.push(held) {
            // Detached since our snapshot: dropped (and counted) as at
            // delivery.
            shared.give_back(refused.frame.len());
            bump(&self.stats.dropped_link_down);
            return;
        }
        bump(&self.stats.delayed);
        // SeqCst: see the protocol on `DelayShared`.
        if duration_ns(release) < shared.deadline_ns.load(Ordering::SeqCst) {
            if let Some(t) = shared.timer.get() {
                t.unpark();
            }
        }
    }

    /// Drops the frames held for a port being detached, counted as
    /// dropped for a link that went down.
    pub(super) fn drop_held(&self, port: &PortShared) {
        let (bytes, frames) = port.delay.close();
        self.delay.give_back(bytes);
        add(&self.stats.dropped_link_down, frames as u64);
    }

    /// Delivers the delayed frames `which` names, in (release, seq) order
    /// across all ports; returns how many were handed over (delivered or
    /// dropped at the destination).
    pub(super) fn release(&self, which: Release, after: &mut After) -> usize {
        let _releasing = self
            .delay
            .releasing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let topo = self.snapshot();
        let mut due = Vec::new();
        let mut bytes = 0;
        for (id, view) in &topo.ports {
            bytes += view.shared.delay.take(which, *id, &mut due);
        }
        self.delay.give_back(bytes);
        due.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        let n = due.len();
        for (d, to) in due {
            let stamp = match which {
                Release::Due(_) => d.release,
                Release::All { now } => now,
            };
            self.deliver(&topo, to, d.hdr, &d.frame, stamp, Direct::Never, after);
        }
        n
    }

    /// The earliest release over all ports.
    pub(super) fn next_release(&self) -> Option<Duration> {
        let topo = self.snapshot();
        topo.ports
            .values()
            .filter_map(|v| v.shared.delay.next_release())
            .min()
    }

    /// Frames held over all ports.
    pub(super) fn delayed_frames(&self) -> usize {
        let topo = self.snapshot();
        topo.ports.values().map(|v| v.shared.delay.len()).sum()
    }

    /// The earliest release published by any port, for the timer.
    fn earliest_published_ns(topo: &Topology) -> u64 {
        topo.ports
            .values()
            .map(|v| v.shared.delay.next_release_ns.load(Ordering::SeqCst))
            .min()
            .unwrap_or(NOTHING_PENDING_NS)
    }

    /// The [`Timer::Thread`](super::Timer::Thread) loop (see the protocol
    /// on [`DelayShared`]).
    pub(super) fn timer_loop(&self) {
        let shared = &self.delay;
        while !shared.closed.load(Ordering::SeqCst) {
            shared
                .deadline_ns
                .store(NOTHING_PENDING_NS, Ordering::SeqCst);
            let mut after = After::default();
            self.release(Release::Due(self.clock.now()), &mut after);
            after.run();
            // A fresh snapshot, so that ports attached since are scanned.
            let next = Inner::earliest_published_ns(&self.snapshot());
            shared.deadline_ns.store(next, Ordering::SeqCst);
            if shared.closed.load(Ordering::SeqCst) {
                return;
            }
            if next == NOTHING_PENDING_NS {
                std::thread::park();
            } else {
                let wait = Duration::from_nanos(next).saturating_sub(self.clock.now());
                std::thread::park_timeout(wait);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::super::tests::{frame, manual, manual_with};
    use super::super::{Port, PortShared, Switch, SwitchConfig};
    use crate::mac::MacAddr;
    use crate::offload::VnetHdr;

    const FRAME_BYTES: usize = 60;

    /// The switch's shared state of the port `p`.
    fn shared(sw: &Switch, p: &Port) -> Arc<PortShared> {
        let topo = sw.inner.snapshot();
        Arc::clone(&topo.ports[&p.id].shared)
    }

    fn drain(p: &Port) -> Vec<u8> {
        std::iter::from_fn(|| p.try_recv()).map(|f| f[20]).collect()
    }

    /// Ports a, b, c with every MAC learned and every queue empty.
    fn abc(sw: &Switch) -> (Port, Port, Port) {
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        let b = sw.attach("b", MacAddr::local(2)).unwrap();
        let c = sw.attach("c", MacAddr::local(3)).unwrap();
        for (p, n) in [(&a, 1), (&b, 2), (&c, 3)] {
            p.send(&frame(MacAddr::BROADCAST, MacAddr::local(n), 0))
                .unwrap();
        }
        for p in [&a, &b, &c] {
            drain(p);
        }
        (a, b, c)
    }

    #[test]
    fn senders_to_different_destinations_share_no_delay_lock() {
        let (sw, clock) = manual();
        let (a, b, c) = abc(&sw);
        sw.set_latency(Duration::from_millis(10));
        let (b_shared, c_shared) = (shared(&sw, &b), shared(&sw, &c));
        // A third party holds b's delay lock; a frame a -> c must still be
        // queued and released.
        let held = b_shared.delay.lock();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                a.send(&frame(MacAddr::local(3), MacAddr::local(1), 7))
                    .unwrap();
                let queued = c_shared.delay.len();
                clock.advance(Duration::from_millis(10));
                let released = sw.release_due();
                done_tx.send((queued, released)).unwrap();
            });
            let outcome = done_rx.recv_timeout(Duration::from_secs(30));
            drop(held);
            assert_eq!(
                outcome,
                Ok((1, 1)),
                "a frame to c waited for b's delay lock"
            );
        });
        assert_eq!(drain(&c), [7]);
        assert_eq!(sw.stats().delayed, 1);
    }

    #[test]
    fn the_byte_bound_holds_across_destinations() {
        let (sw, clock) = manual_with(SwitchConfig {
            delay_queue_bytes: 5 * FRAME_BYTES,
            ..SwitchConfig::default()
        });
        let (a, b, c) = abc(&sw);
        sw.set_latency(Duration::from_millis(10));
        for tag in 1..=3 {
            a.send(&frame(MacAddr::local(2), MacAddr::local(1), tag))
                .unwrap();
        }
        for tag in 4..=6 {
            a.send(&frame(MacAddr::local(3), MacAddr::local(1), tag))
                .unwrap();
        }
        assert_eq!(sw.delayed_frames(), 5);
        assert_eq!(sw.inner.delay.held_bytes(), 5 * FRAME_BYTES);
        assert_eq!(sw.stats().delayed, 5);
        assert_eq!(sw.stats().dropped_delay_queue_full, 1);
        clock.advance(Duration::from_millis(10));
        assert_eq!(sw.release_due(), 5);
        assert_eq!(sw.inner.delay.held_bytes(), 0);
        assert_eq!((drain(&b), drain(&c)), (vec![1, 2, 3], vec![4, 5]));
    }

    #[test]
    fn detach_gives_the_held_bytes_back() {
        let (sw, clock) = manual_with(SwitchConfig {
            delay_queue_bytes: 4 * FRAME_BYTES,
            ..SwitchConfig::default()
        });
        let (a, b, c) = abc(&sw);
        sw.set_latency(Duration::from_millis(10));
        let to_b = |tag| frame(MacAddr::local(2), MacAddr::local(1), tag);
        let to_c = |tag| frame(MacAddr::local(3), MacAddr::local(1), tag);
        for tag in 1..=2 {
            a.send(&to_b(tag)).unwrap();
            a.send(&to_c(tag)).unwrap();
        }
        a.send(&to_c(3)).unwrap();
        assert_eq!(sw.stats().dropped_delay_queue_full, 1, "the bound is hit");

        let b_shared = shared(&sw, &b);
        let link_down_before = sw.stats().dropped_link_down;
        drop(b);
        assert_eq!(sw.delayed_frames(), 2);
        assert_eq!(sw.inner.delay.held_bytes(), 2 * FRAME_BYTES);
        assert_eq!(
            sw.stats().dropped_link_down - link_down_before,
            2,
            "b's two held frames are counted as dropped"
        );
        // A sender whose snapshot still shows b queues nothing for it and
        // keeps no bytes.
        sw.inner.hold(
            &b_shared,
            Duration::from_millis(10),
            VnetHdr::default(),
            &to_b(9),
        );
        assert_eq!(b_shared.delay.len(), 0);
        assert_eq!(sw.inner.delay.held_bytes(), 2 * FRAME_BYTES);
        assert_eq!(sw.stats().dropped_link_down - link_down_before, 3);

        for tag in 4..=5 {
            a.send(&to_c(tag)).unwrap();
        }
        assert_eq!(sw.stats().dropped_delay_queue_full, 1, "they fit again");
        clock.advance(Duration::from_millis(10));
        assert_eq!(sw.release_due(), 4);
        assert_eq!(drain(&c), [1, 2, 4, 5]);
        assert_eq!(sw.inner.delay.held_bytes(), 0);
    }

    /// Polls `done` until it holds or `limit` passes.
    fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while !done() {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    #[test]
    fn the_timer_thread_releases_and_is_woken_for_an_earlier_frame() {
        // The real timer thread on the system clock: delivery is asserted,
        // never a timing; the limits are generous.
        let limit = Duration::from_secs(5);
        let sw = Switch::new("lan", SwitchConfig::default());
        let (a, b, c) = abc(&sw);
        sw.set_pair_latency("a", "b", Duration::from_millis(20));
        a.send(&frame(MacAddr::local(2), MacAddr::local(1), 1))
            .unwrap();
        let f = b.recv_timeout(limit).expect("released by the timer");
        assert_eq!(f[20], 1);

        // The timer goes to sleep on a frame an hour away...
        sw.set_pair_latency("a", "c", Duration::from_secs(3600));
        a.send(&frame(MacAddr::local(3), MacAddr::local(1), 2))
            .unwrap();
        let far = sw.next_release().expect("the frame to c is held");
        assert!(
            wait_until(limit, || sw.inner.delay.deadline() == Some(far)),
            "the timer never settled on the far deadline"
        );
        // ...and a frame due earlier must wake it.
        a.send(&frame(MacAddr::local(2), MacAddr::local(1), 3))
            .unwrap();
        let f = b.recv_timeout(limit).expect("the timer was unparked");
        assert_eq!(f[20], 3);
        assert_eq!(sw.delayed_frames(), 1, "the frame to c still waits");
        assert_eq!(drain(&c), Vec::<u8>::new());
        // Dropping the switch wakes the sleeping timer so it can exit.
        drop(sw);
    }
}
