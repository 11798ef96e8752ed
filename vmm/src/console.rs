//! The VM console: what the guest writes to COM1, kept as a bounded log and
//! fanned out to live subscribers, and what the host types, queued for the
//! guest to read.
//!
//! The console outlives a single boot: a warm reset builds a new serial device
//! but keeps this log, so a test can see the banner of every boot.
//!
//! Every buffer is bounded. The log keeps the newest `log_capacity_bytes`
//! (older bytes are counted in `dropped_bytes`); each subscriber has its own
//! bounded queue and a slow subscriber loses its oldest bytes, counted, never
//! stalling the vCPU; pending input is capped and overflow is an error to the
//! writer. Nothing the guest writes can make the host allocate without bound.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Default size of the console log.
pub const DEFAULT_LOG_CAPACITY_BYTES: usize = 1 << 20;
/// Size of each subscriber's queue.
pub const SUBSCRIBER_CAPACITY_BYTES: usize = 256 << 10;
/// Most host input that may wait for the guest to read it.
pub const INPUT_CAPACITY_BYTES: usize = 64 << 10;

/// A console error.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// Host input would exceed the pending-input bound.
    #[error(
        "console input of {len_bytes} bytes does not fit: {pending_bytes} bytes are still \
         waiting for the guest to read them (limit {INPUT_CAPACITY_BYTES}); write less or wait"
    )]
    InputFull {
        /// Bytes offered.
        len_bytes: usize,
        /// Bytes already waiting.
        pending_bytes: usize,
    },
}

/// Where host input goes once queued: the serial device of the current boot.
pub trait ConsoleInputSink: Send + Sync {
    /// Moves as much pending input as the device can take. Called without the
    /// console lock held; the sink calls back into `Console::take_input`.
    fn pump(&self);
}

/// Sees guest output as it is written (the boot timer stamps console
/// events with it). Called on the vCPU thread after the log took the bytes;
/// must be quick and must not call back into the console.
pub trait ConsoleObserver: Send + Sync {
    /// `bytes` were just written by the guest.
    fn console_output(&self, bytes: &[u8]);
}

struct SubscriberQueue {
    data: VecDeque<u8>,
    dropped_bytes: u64,
    closed: bool,
}

struct SubscriberShared {
    queue: Mutex<SubscriberQueue>,
    ready: Condvar,
}

struct ConsoleInner {
    log: VecDeque<u8>,
    log_capacity_bytes: usize,
    total_bytes: u64,
    subscribers: Vec<Weak<SubscriberShared>>,
    input: VecDeque<u8>,
    sink: Option<Weak<dyn ConsoleInputSink>>,
    observer: Option<Arc<dyn ConsoleObserver>>,
}

/// The console of one VM. Cheap to share (`Arc<Console>`).
pub struct Console {
    inner: Mutex<ConsoleInner>,
    output: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a console lock leaves plain byte buffers behind,
    // which are still consistent; keep serving them.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Console {
    /// A console keeping the newest `log_capacity_bytes` of output.
    pub fn new(log_capacity_bytes: usize) -> Arc<Console> {
        Arc::new(Console {
            inner: Mutex::new(ConsoleInner {
                log: VecDeque::new(),
                log_capacity_bytes,
                total_bytes: 0,
                subscribers: Vec::new(),
                input: VecDeque::new(),
                sink: None,
                observer: None,
            }),
            output: Condvar::new(),
        })
    }

    /// Appends guest output (called by the serial device on a vCPU thread).
    pub fn push_output(&self, bytes: &[u8]) {
        let mut g = lock(&self.inner);
        g.total_bytes += bytes.len() as u64;
        let cap = g.log_capacity_bytes;
        let keep = &bytes[bytes.len().saturating_sub(cap)..];
        let overflow = (g.log.len() + keep.len()).saturating_sub(cap);
        g.log.drain(..overflow);
        g.log.extend(keep);
        g.subscribers.retain(|w| {
            let Some(s) = w.upgrade() else { return false };
            let mut q = lock(&s.queue);
            let over = (q.data.len() + bytes.len()).saturating_sub(SUBSCRIBER_CAPACITY_BYTES);
            if over > 0 {
                let from_queue = over.min(q.data.len());
                q.data.drain(..from_queue);
                q.dropped_bytes += over as u64;
            }
            q.data
                .extend(&bytes[bytes.len().saturating_sub(SUBSCRIBER_CAPACITY_BYTES)..]);
            s.ready.notify_all();
            true
        });
        let observer = g.observer.clone();
        drop(g);
        if let Some(o) = observer {
            o.console_output(bytes);
        }
        self.output.notify_all();
    }

    /// Replaces the log with `tail` (a restored VM's console shows what the
    /// guest printed up to the snapshot, then continues). Subscribers see
    /// only output from here on.
    pub fn restore_log(&self, tail: &[u8]) {
        let mut g = lock(&self.inner);
        let keep = &tail[tail.len().saturating_sub(g.log_capacity_bytes)..];
        g.log.clear();
        g.log.extend(keep);
        g.total_bytes = keep.len() as u64;
        drop(g);
        self.output.notify_all();
    }

    /// The log as it is now (at most the newest `log_capacity_bytes`).
    pub fn log(&self) -> Vec<u8> {
        lock(&self.inner).log.iter().copied().collect()
    }

    /// The log as (lossy) UTF-8.
    pub fn log_string(&self) -> String {
        String::from_utf8_lossy(&self.log()).into_owned()
    }

    /// The newest `max_lines` lines of the log, from at most its last
    /// `max_bytes` bytes (a guest that never writes a newline cannot make an
    /// error message megabytes long), as lossy UTF-8 without `\r`s; a
    /// trailing newline does not count as an empty last line. For error
    /// reports that should show what the guest printed last.
    pub fn last_lines(&self, max_lines: usize, max_bytes: usize) -> String {
        let g = lock(&self.inner);
        let from = g.log.len().saturating_sub(max_bytes);
        let tail: Vec<u8> = g.log.range(from..).copied().collect();
        drop(g);
        let text = String::from_utf8_lossy(&tail).replace('\r', "");
        let text = text.strip_suffix('\n').unwrap_or(&text);
        let lines: Vec<&str> = text.split('\n').collect();
        lines[lines.len().saturating_sub(max_lines)..].join("\n")
    }

    /// Bytes the guest has written in total, including those rotated out of the log.
    pub fn total_bytes(&self) -> u64 {
        lock(&self.inner).total_bytes
    }

    /// Waits until `needle` occurs at least `count` times in the log, or the
    /// deadline passes. Returns whether it did.
    pub fn wait_for(&self, needle: &[u8], count: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.inner);
        loop {
            if count_occurrences(g.log.make_contiguous(), needle) >= count {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .output
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A live stream of output from now on.
    pub fn subscribe(&self) -> ConsoleSubscriber {
        let shared = Arc::new(SubscriberShared {
            queue: Mutex::new(SubscriberQueue {
                data: VecDeque::new(),
                dropped_bytes: 0,
                closed: false,
            }),
            ready: Condvar::new(),
        });
        lock(&self.inner).subscribers.push(Arc::downgrade(&shared));
        ConsoleSubscriber { shared }
    }

    /// Ends every live stream (they read EOF once drained): a reset or
    /// shutdown reads as console EOF, as the reference says.
    pub fn close_subscribers(&self) {
        let mut g = lock(&self.inner);
        for s in g.subscribers.drain(..).filter_map(|w| w.upgrade()) {
            lock(&s.queue).closed = true;
            s.ready.notify_all();
        }
    }

    /// Queues host input for the guest. All or nothing: errors if the pending
    /// input would exceed `INPUT_CAPACITY_BYTES`.
    pub fn write_input(&self, bytes: &[u8]) -> Result<(), ConsoleError> {
        let sink = {
            let mut g = lock(&self.inner);
            if g.input.len() + bytes.len() > INPUT_CAPACITY_BYTES {
                return Err(ConsoleError::InputFull {
                    len_bytes: bytes.len(),
                    pending_bytes: g.input.len(),
                });
            }
            g.input.extend(bytes);
            g.sink.as_ref().and_then(Weak::upgrade)
        };
        if let Some(sink) = sink {
            sink.pump();
        }
        Ok(())
    }

    /// Bytes of host input not yet handed to the guest's UART.
    pub fn pending_input_bytes(&self) -> usize {
        lock(&self.inner).input.len()
    }

    /// Takes up to `max` bytes of pending input (called by the sink).
    pub fn take_input(&self, max: usize) -> Vec<u8> {
        let mut g = lock(&self.inner);
        let n = max.min(g.input.len());
        g.input.drain(..n).collect()
    }

    /// Puts bytes the sink could not accept back at the front of the queue.
    pub fn unread_input(&self, bytes: &[u8]) {
        let mut g = lock(&self.inner);
        for b in bytes.iter().rev() {
            g.input.push_front(*b);
        }
    }

    /// Sets (or clears) the observer of guest output.
    pub fn set_output_observer(&self, observer: Option<Arc<dyn ConsoleObserver>>) {
        lock(&self.inner).observer = observer;
    }

    /// Sets the device that receives input (one per boot).
    pub fn set_input_sink(&self, sink: Weak<dyn ConsoleInputSink>) {
        lock(&self.inner).sink = Some(sink);
    }
}

fn count_occurrences(hay: &[u8], needle: &[u8]) -> usize {
    if needle.is_empty() {
        return usize::MAX;
    }
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// A live console stream (see `Console::subscribe`).
pub struct ConsoleSubscriber {
    shared: Arc<SubscriberShared>,
}

/// What a subscriber read.
#[derive(Debug, PartialEq, Eq)]
pub enum ConsoleRead {
    /// Output bytes (never empty).
    Data(Vec<u8>),
    /// Nothing arrived before the timeout.
    Timeout,
    /// The stream ended (reset or shutdown) and everything was read.
    Eof,
}

impl ConsoleSubscriber {
    /// Waits up to `timeout` for output.
    pub fn read_timeout(&self, timeout: Duration) -> ConsoleRead {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.shared.queue);
        loop {
            if !q.data.is_empty() {
                return ConsoleRead::Data(q.data.drain(..).collect());
            }
            if q.closed {
                return ConsoleRead::Eof;
            }
            let now = Instant::now();
            if now >= deadline {
                return ConsoleRead::Timeout;
            }
            q = self
                .shared
                .ready
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Bytes this subscriber lost because it fell behind.
    pub fn dropped_bytes(&self) -> u64 {
        lock(&self.shared.queue).dropped_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_are_the_newest_lines_bounded_in_bytes() {
        let c = Console::new(1024);
        assert_eq!(c.last_lines(3, 1024), "");
        c.push_output(b"one\r\ntwo\nthree\nfour\n");
        assert_eq!(c.last_lines(2, 1024), "three\nfour");
        assert_eq!(c.last_lines(10, 1024), "one\ntwo\nthree\nfour");
        c.push_output(b"partial");
        assert_eq!(c.last_lines(2, 1024), "four\npartial");
        // Only the last 9 bytes are looked at: "\npartial" plus one byte.
        assert_eq!(c.last_lines(10, 9), "r\npartial");
    }

    #[test]
    fn log_keeps_the_newest_bytes() {
        let c = Console::new(8);
        c.push_output(b"hello ");
        c.push_output(b"world!");
        assert_eq!(c.log(), b"o world!");
        assert_eq!(c.total_bytes(), 12);
        c.push_output(b"0123456789abcdef");
        assert_eq!(c.log(), b"89abcdef");
    }

    #[test]
    fn subscribers_see_output_after_subscribing_and_eof() {
        let c = Console::new(1024);
        c.push_output(b"before");
        let s = c.subscribe();
        c.push_output(b"after");
        assert_eq!(
            s.read_timeout(Duration::from_millis(10)),
            ConsoleRead::Data(b"after".to_vec())
        );
        assert_eq!(
            s.read_timeout(Duration::from_millis(1)),
            ConsoleRead::Timeout
        );
        c.close_subscribers();
        assert_eq!(s.read_timeout(Duration::from_millis(1)), ConsoleRead::Eof);
    }

    #[test]
    fn slow_subscriber_is_bounded() {
        let c = Console::new(16);
        let s = c.subscribe();
        let chunk = vec![b'x'; 1000];
        for _ in 0..(SUBSCRIBER_CAPACITY_BYTES / 1000 + 10) {
            c.push_output(&chunk);
        }
        match s.read_timeout(Duration::ZERO) {
            ConsoleRead::Data(d) => assert_eq!(d.len(), SUBSCRIBER_CAPACITY_BYTES),
            other => panic!("expected data, got {other:?}"),
        }
        assert!(s.dropped_bytes() > 0);
    }

    #[test]
    fn dropped_subscriber_is_forgotten() {
        let c = Console::new(16);
        drop(c.subscribe());
        c.push_output(b"x");
        assert!(lock(&c.inner).subscribers.is_empty());
    }

    #[test]
    fn wait_for_counts_occurrences() {
        let c = Console::new(1024);
        c.push_output(b"BANNER\nBANNER\n");
        assert!(c.wait_for(b"BANNER", 2, Duration::ZERO));
        assert!(!c.wait_for(b"BANNER", 3, Duration::from_millis(5)));
    }

    #[test]
    fn input_is_bounded_and_ordered() {
        let c = Console::new(16);
        c.write_input(b"abc").expect("fits");
        assert_eq!(c.take_input(2), b"ab");
        c.unread_input(b"b");
        assert_eq!(c.take_input(10), b"bc");
        let big = vec![0; INPUT_CAPACITY_BYTES + 1];
        assert!(matches!(
            c.write_input(&big),
            Err(ConsoleError::InputFull { .. })
        ));
        assert_eq!(c.pending_input_bytes(), 0);
    }
}
