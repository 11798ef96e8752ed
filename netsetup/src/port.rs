//! The receive side of a switch port: a bounded frame queue plus hooks.
//!
//! Every port (in-process or TAP) owns one [`RxQueue`]; the switch pushes
//! frames into it and the port's consumer (the VMM's virtio-net RX path, a TAP
//! writer thread, a test) pops them. Both a frame count and a byte count bound
//! it; a push that would exceed either is refused and the caller counts the
//! drop, so a guest that never reads its RX ring costs at most the bound.
//!
//! # The direct path
//! A port whose device can take a frame without blocking (a TAP fd) installs
//! a [`DirectWriter`]. When the queue is empty and its consumer is idle
//! (not between popping a frame and writing it), the switch hands an
//! unimpaired frame to the writer in the sender's thread instead of queuing
//! it: no thread hand-off and no copy into a queue buffer. Order holds
//! because the write happens under the queue's lock and only when nothing
//! queued or popped is still unwritten; a writer that would block returns
//! false and the frame is queued as usual.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::offload::VnetHdr;

/// Spare frame buffers a queue keeps for reuse ([`RxQueue::recycle`]).
const POOL_BUFFERS: usize = 256;

/// A callback run (outside the switch's locks) after a frame is queued for a
/// port: the VMM writes its RX eventfd here. It must not block.
pub type RxWaker = Arc<dyn Fn() + Send + Sync>;

/// A callback run (outside the switch's locks) when a port's link goes down
/// (`false`) or up (`true`): virtio-net sets its link status and raises a
/// config interrupt; a TAP port sets the carrier. It must not block.
pub type LinkWatcher = Arc<dyn Fn(bool) + Send + Sync>;

/// Writes one frame (with the offload header it carries) straight into a
/// port's device from the sender's thread. It must not block: it returns
/// false when the device would block (EAGAIN), and the frame is then queued;
/// true once the frame is written or refused for good (count that yourself).
/// It runs under the port's queue lock, so it must not call into the switch.
pub type DirectWriter = Arc<dyn Fn(&VnetHdr, &[u8]) -> bool + Send + Sync>;

#[derive(Default)]
struct Inner {
    frames: VecDeque<(VnetHdr, Vec<u8>)>,
    /// Emptied buffers handed back by the consumer, reused by the next push.
    pool: Vec<Vec<u8>>,
    bytes: usize,
    closed: bool,
    /// Takes frames in the sender's thread while the queue is idle.
    direct: Option<DirectWriter>,
    /// The consumer popped a frame and has not said it is idle since
    /// ([`RxQueue::pop_or_idle`]); a direct write now could overtake it.
    consumer_busy: bool,
    /// Consumers blocked in [`RxQueue::pop_until`]. A push notifies the
    /// condition variable only when one is (std's `notify_one` is a futex
    /// syscall whether or not anyone waits, and a VM's device worker or a
    /// busy TAP writer takes frames without ever waiting there). Read and
    /// written under the lock, which a waiter holds until it sleeps, so no
    /// wake-up is lost.
    waiters: usize,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("frames", &self.frames.len())
            .field("bytes", &self.bytes)
            .field("closed", &self.closed)
            .field("direct", &self.direct.is_some())
            .finish()
    }
}

/// A bounded FIFO of frames for one port.
pub(crate) struct RxQueue {
    inner: Mutex<Inner>,
    ready: Condvar,
    max_frames: usize,
    max_bytes: usize,
    waker: Mutex<Option<RxWaker>>,
}

impl RxQueue {
    pub(crate) fn new(max_frames: usize, max_bytes: usize) -> RxQueue {
        RxQueue {
            inner: Mutex::new(Inner::default()),
            ready: Condvar::new(),
            max_frames: max_frames.max(1),
            max_bytes,
            waker: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a copy of `frame` with its offload header, in a pooled buffer
    /// when one is spare; false (frame not queued) when full or closed.
    pub(crate) fn push(&self, hdr: VnetHdr, frame: &[u8]) -> bool {
        self.push_locked(self.lock(), hdr, frame)
    }

    fn push_locked(&self, mut q: MutexGuard<'_, Inner>, hdr: VnetHdr, frame: &[u8]) -> bool {
        if q.closed
            || q.frames.len() >= self.max_frames
            || q.bytes.saturating_add(frame.len()) > self.max_bytes
        {
            return false;
        }
        let mut buf = q.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        q.bytes += frame.len();
        q.frames.push_back((hdr, buf));
        let waiting = q.waiters > 0;
        drop(q);
        if waiting {
            self.ready.notify_one();
        }
        true
    }

    /// The forwarding path's push: hands the frame to the direct writer when
    /// the queue is idle, else queues it. `Some(true)` when queued (wake the
    /// consumer), `Some(false)` when written directly, `None` when refused.
    pub(crate) fn push_or_write(&self, hdr: VnetHdr, frame: &[u8]) -> Option<bool> {
        let q = self.lock();
        if q.closed {
            return None;
        }
        if q.frames.is_empty() && !q.consumer_busy {
            if let Some(w) = &q.direct {
                if w(&hdr, frame) {
                    return Some(false);
                }
            }
        }
        self.push_locked(q, hdr, frame).then_some(true)
    }

    /// Installs (or removes) the direct writer.
    pub(crate) fn set_direct(&self, w: Option<DirectWriter>) {
        let mut q = self.lock();
        if !q.closed {
            q.direct = w;
        }
    }

    /// The next frame; when there is none, marks the consumer idle, so the
    /// direct path may write again. A consumer that writes to the same
    /// device as the direct writer pops with this once it has written what
    /// it popped.
    pub(crate) fn pop_or_idle(&self) -> Option<(VnetHdr, Vec<u8>)> {
        let mut q = self.lock();
        match q.frames.pop_front() {
            Some(f) => {
                q.bytes -= f.1.len();
                Some(f)
            }
            None => {
                q.consumer_busy = false;
                None
            }
        }
    }

    /// Takes back a buffer the consumer is done with, for the next push.
    pub(crate) fn recycle(&self, buf: Vec<u8>) {
        let mut q = self.lock();
        if q.pool.len() < POOL_BUFFERS && buf.capacity() > 0 {
            q.pool.push(buf);
        }
    }

    pub(crate) fn try_pop(&self) -> Option<(VnetHdr, Vec<u8>)> {
        let mut q = self.lock();
        let f = q.frames.pop_front()?;
        q.bytes -= f.1.len();
        q.consumer_busy = true;
        Some(f)
    }

    /// Waits for a frame until `deadline` (forever with `None`); `None` on
    /// timeout or once closed and empty.
    pub(crate) fn pop_until(&self, deadline: Option<Instant>) -> Option<(VnetHdr, Vec<u8>)> {
        let mut q = self.lock();
        loop {
            if let Some(f) = q.frames.pop_front() {
                q.bytes -= f.1.len();
                q.consumer_busy = true;
                return Some(f);
            }
            if q.closed {
                return None;
            }
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    Some(d - now)
                }
            };
            q.waiters += 1;
            q = match timeout {
                None => self.ready.wait(q).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    self.ready
                        .wait_timeout(q, t)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
            q.waiters -= 1;
        }
    }

    pub(crate) fn pop_timeout(&self, timeout: Duration) -> Option<(VnetHdr, Vec<u8>)> {
        self.pop_until(Some(Instant::now() + timeout))
    }

    /// Empties the queue; returns how many frames were discarded.
    pub(crate) fn clear(&self) -> usize {
        let mut q = self.lock();
        let n = q.frames.len();
        q.frames.clear();
        q.bytes = 0;
        n
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().frames.len()
    }

    /// Refuses further pushes and wakes every waiter.
    pub(crate) fn close(&self) {
        let mut q = self.lock();
        q.closed = true;
        // The writer may own the device (a TAP fd); stale snapshots that
        // still reach this queue must not keep it open.
        let direct = q.direct.take();
        drop(q);
        drop(direct);
        self.ready.notify_all();
    }

    /// Whether [`RxQueue::close`] ran: its port left the switch.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub(crate) fn set_waker(&self, w: Option<RxWaker>) {
        *self.waker.lock().unwrap_or_else(|e| e.into_inner()) = w;
    }

    pub(crate) fn wake(&self) {
        let w = self.waker.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(w) = w {
            w();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn bounded_by_frames_and_bytes() {
        let q = RxQueue::new(3, 100);
        let h = VnetHdr::default();
        assert!(q.push(h, &[0; 10]));
        assert!(q.push(h, &[0; 10]));
        assert!(q.push(h, &[0; 10]));
        assert!(!q.push(h, &[0; 10]), "frame bound");
        assert_eq!(q.try_pop().map(|f| f.1.len()), Some(10));
        assert!(!q.push(h, &[0; 81]), "byte bound: 20 + 81 > 100");
        assert!(q.push(h, &[0; 80]));
        assert_eq!(q.len(), 3);
        assert_eq!(q.clear(), 3);
        assert_eq!(q.try_pop(), None);
    }

    #[test]
    fn a_push_wakes_a_blocked_consumer_every_time() {
        // The notify is skipped when no consumer waits; one that waits
        // must still be woken by every push (no lost wake-up), here 2000
        // hand-overs in a row, each waited for without a deadline.
        let q = Arc::new(RxQueue::new(4096, 1 << 24));
        let consumer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                (0..2000u32)
                    .map(|_| q.pop_until(None).map(|f| f.1.len()))
                    .collect::<Vec<_>>()
            })
        };
        for i in 0..2000usize {
            // Alternate between pushing at once and after the consumer
            // has had time to block.
            if i % 2 == 0 {
                std::thread::yield_now();
            }
            assert!(q.push(VnetHdr::default(), &vec![0; 1 + i % 7]));
        }
        let got = consumer.join().expect("consumer");
        let want: Vec<_> = (0..2000usize).map(|i| Some(1 + i % 7)).collect();
        assert_eq!(got, want);
        assert_eq!(q.lock().waiters, 0, "every waiter counted itself out");
    }

    #[test]
    fn close_wakes_waiters_and_refuses() {
        let q = Arc::new(RxQueue::new(4, 1000));
        let q2 = Arc::clone(&q);
        let t = std::thread::spawn(move || q2.pop_until(None));
        q.close();
        assert_eq!(t.join().unwrap(), None);
        assert!(!q.push(VnetHdr::default(), &[1]));
        assert_eq!(q.pop_timeout(Duration::from_millis(1)), None);
    }

    #[test]
    fn recycled_buffers_are_reused() {
        let q = RxQueue::new(4, 1 << 20);
        assert!(q.push(VnetHdr::default(), &[7; 1500]));
        let (_, f) = q.try_pop().unwrap();
        let ptr = f.as_ptr();
        q.recycle(f);
        assert!(q.push(VnetHdr::default(), &[8; 60]));
        let (_, g) = q.try_pop().unwrap();
        assert_eq!(
            g.as_ptr(),
            ptr,
            "the recycled buffer carried the next frame"
        );
        assert_eq!(g, vec![8; 60]);
    }

    #[test]
    fn waker_runs() {
        let q = RxQueue::new(4, 1000);
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = Arc::clone(&n);
        q.set_waker(Some(Arc::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        })));
        q.wake();
        q.wake();
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }

    fn counting_writer(
        accept: Arc<std::sync::atomic::AtomicBool>,
    ) -> (DirectWriter, Arc<Mutex<Vec<u8>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        let w: DirectWriter = Arc::new(move |_, f: &[u8]| {
            if !accept.load(Ordering::SeqCst) {
                return false;
            }
            s2.lock().unwrap().push(f[0]);
            true
        });
        (w, seen)
    }

    #[test]
    fn direct_writes_only_while_idle_and_in_order() {
        let q = RxQueue::new(8, 1 << 20);
        let h = VnetHdr::default();
        let accept = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (w, seen) = counting_writer(Arc::clone(&accept));
        q.set_direct(Some(w));
        assert_eq!(q.push_or_write(h, &[1]), Some(false), "idle: written");
        // The device would block: queued instead.
        accept.store(false, Ordering::SeqCst);
        assert_eq!(q.push_or_write(h, &[2]), Some(true));
        accept.store(true, Ordering::SeqCst);
        // Frame 2 is queued, so 3 must queue behind it.
        assert_eq!(q.push_or_write(h, &[3]), Some(true));
        assert_eq!(q.try_pop().map(|f| f.1), Some(vec![2]));
        // Popped but not yet written: 4 must not overtake it.
        assert_eq!(q.push_or_write(h, &[4]), Some(true));
        assert_eq!(q.pop_or_idle().map(|f| f.1), Some(vec![3]));
        assert_eq!(q.pop_or_idle().map(|f| f.1), Some(vec![4]));
        assert_eq!(q.pop_or_idle(), None, "drained: idle again");
        assert_eq!(q.push_or_write(h, &[5]), Some(false));
        assert_eq!(*seen.lock().unwrap(), [1, 5]);
    }

    #[test]
    fn close_drops_the_direct_writer() {
        let q = RxQueue::new(8, 1 << 20);
        let accept = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (w, _) = counting_writer(accept);
        let weak = Arc::downgrade(&w);
        q.set_direct(Some(w));
        q.close();
        assert!(
            weak.upgrade().is_none(),
            "the writer (and its fd) is released"
        );
        assert_eq!(q.push_or_write(VnetHdr::default(), &[1]), None);
    }
}
