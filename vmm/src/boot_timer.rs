//! Boot timing recorded by the VMM itself (`provium bench boot`, docs/benchmarking.md).
//!
//! A `BootTimer` is a handle the caller puts in `VmConfig::boot_timer` and
//! keeps a clone of (like `VsockHost`). Each boot (the first and every reset)
//! starts a fresh set of marks; every mark is a monotonic `Instant` taken on
//! the thread where the event happens, first occurrence wins:
//!
//! - `build_start`: `build_and_start` began (RAM, KVM VM, kernel, devices);
//! - `setup_done`: everything is built, just before the vCPU threads start;
//! - `first_kvm_run`: vCPU 0 is about to enter `KVM_RUN` for the first time,
//!   i.e. the kernel's entry point is the next guest instruction;
//! - `first_console_byte`: the guest's first byte reached the console (on the
//!   vCPU thread that wrote the UART, before anyone reads it);
//! - console texts: each text registered with `watch_console` (e.g. Linux's
//!   `" as init process"`), stamped when the byte completing its first
//!   occurrence reaches the console. That is the VMM seeing the guest's output
//!   as it is written, not a time parsed out of the log afterwards;
//! - `guest_ready`: the guest wrote `GUEST_READY` (123, the value Firecracker's
//!   boot timer uses) to the boot-timer port.
//!
//! The boot-timer port is PIO `BOOT_TIMER_PORT` (0x440), one byte wide: a
//! guest writes any byte to it (`outb`; a Linux user-space agent needs
//! `ioperm(0x440, 1, 1)`, which PID 1 as root has). Every write is recorded
//! with its value (the first 64 per boot); 123 also sets `guest_ready`. Reads
//! return 0xff, as an empty port does. Nothing else in the VMM's port map or
//! a PC's legacy devices uses 0x440 (COM1 0x3f8, i8042 0x60/0x64, PM1a 0x604).
//! Firecracker puts its boot timer in MMIO; a port is cheaper to reach from
//! both the tiny guest and a Linux agent, and an `out` is one exit either way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::bus::BusDevice;

/// The boot-timer port (PIO).
pub const BOOT_TIMER_PORT: u64 = 0x440;
/// Its width in bytes.
pub const BOOT_TIMER_PORT_LEN: u64 = 1;
/// The value a guest writes when it is ready (Firecracker's
/// `MAGIC_VALUE_SIGNAL_GUEST_BOOT_COMPLETE`).
pub const GUEST_READY: u8 = 123;
/// Most guest writes kept per boot.
pub const MAX_GUEST_WRITES: usize = 64;
/// Longest text `watch_console` accepts.
pub const MAX_WATCH_BYTES: usize = 256;

/// A VMM-side event of one boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootMark {
    /// `build_and_start` began.
    BuildStart,
    /// The machine is built; vCPU threads start next.
    SetupDone,
    /// vCPU 0 enters `KVM_RUN` for the first time.
    FirstKvmRun,
    /// The guest's first console byte.
    FirstConsoleByte,
    /// The guest wrote `GUEST_READY` to the boot-timer port.
    GuestReady,
}

/// The marks of one boot (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct BootMarks {
    /// Which boot of the VM these are (1 = first, +1 per reset).
    pub boot: u64,
    /// `build_and_start` began.
    pub build_start: Option<Instant>,
    /// Everything built, before the vCPU threads start.
    pub setup_done: Option<Instant>,
    /// vCPU 0's first `KVM_RUN`.
    pub first_kvm_run: Option<Instant>,
    /// The first console byte.
    pub first_console_byte: Option<Instant>,
    /// The `GUEST_READY` write.
    pub guest_ready: Option<Instant>,
    /// Each watched console text and when it first appeared in this boot.
    pub console: Vec<(String, Option<Instant>)>,
    /// Bytes the guest wrote to the boot-timer port, with their times.
    pub guest_writes: Vec<(u8, Instant)>,
    /// Console bytes seen in this boot.
    pub console_bytes: u64,
}

impl BootMarks {
    /// The time of `mark`, if it happened.
    pub fn get(&self, mark: BootMark) -> Option<Instant> {
        match mark {
            BootMark::BuildStart => self.build_start,
            BootMark::SetupDone => self.setup_done,
            BootMark::FirstKvmRun => self.first_kvm_run,
            BootMark::FirstConsoleByte => self.first_console_byte,
            BootMark::GuestReady => self.guest_ready,
        }
    }

    fn slot(&mut self, mark: BootMark) -> &mut Option<Instant> {
        match mark {
            BootMark::BuildStart => &mut self.build_start,
            BootMark::SetupDone => &mut self.setup_done,
            BootMark::FirstKvmRun => &mut self.first_kvm_run,
            BootMark::FirstConsoleByte => &mut self.first_console_byte,
            BootMark::GuestReady => &mut self.guest_ready,
        }
    }

    /// When the watched console text `text` first appeared.
    pub fn console_at(&self, text: &str) -> Option<Instant> {
        self.console
            .iter()
            .find(|(t, _)| t == text)
            .and_then(|(_, at)| *at)
    }

    /// `to - from`, when both happened.
    pub fn between(from: Option<Instant>, to: Option<Instant>) -> Option<Duration> {
        Some(to?.checked_duration_since(from?).unwrap_or_default())
    }
}

struct State {
    marks: BootMarks,
    /// The last bytes of output, so a text split across writes is found.
    tail: Vec<u8>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Set once the first byte is in and every watched text was found, so
    /// the rest of the boot's output costs one atomic load per write.
    console_done: AtomicBool,
    /// Console bytes of the current boot.
    console_bytes: AtomicU64,
}

/// The boot timer of one VM (cheap to clone; clones share the marks).
#[derive(Clone)]
pub struct BootTimer(Arc<Shared>);

impl std::fmt::Debug for BootTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BootTimer").field(&self.marks()).finish()
    }
}

impl Default for BootTimer {
    fn default() -> Self {
        BootTimer::new()
    }
}

impl BootTimer {
    /// A timer with no marks and no watched texts.
    pub fn new() -> BootTimer {
        BootTimer(Arc::new(Shared {
            state: Mutex::new(State {
                marks: BootMarks::default(),
                tail: Vec::new(),
            }),
            changed: Condvar::new(),
            console_done: AtomicBool::new(false),
            console_bytes: AtomicU64::new(0),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stamps the first occurrence of `text` on the console from the next
    /// byte on (and in every later boot). Texts longer than
    /// `MAX_WATCH_BYTES` are cut to that length.
    pub fn watch_console(&self, text: &str) {
        let mut t = text.as_bytes();
        if t.len() > MAX_WATCH_BYTES {
            t = &t[..MAX_WATCH_BYTES];
        }
        let text = String::from_utf8_lossy(t).into_owned();
        let mut g = self.lock();
        if !g.marks.console.iter().any(|(w, _)| *w == text) && !text.is_empty() {
            g.marks.console.push((text, None));
            self.0.console_done.store(false, Ordering::SeqCst);
        }
    }

    /// Starts a new boot: clears every mark (keeping the watched texts) and
    /// stamps `build_start`. Called by the builder.
    pub fn begin_boot(&self) {
        let now = Instant::now();
        let mut g = self.lock();
        let m = &mut g.marks;
        *m = BootMarks {
            boot: m.boot + 1,
            build_start: Some(now),
            console: m.console.iter().map(|(t, _)| (t.clone(), None)).collect(),
            ..BootMarks::default()
        };
        g.tail.clear();
        self.0.console_done.store(false, Ordering::SeqCst);
        self.0.console_bytes.store(0, Ordering::SeqCst);
        self.0.changed.notify_all();
    }

    /// Stamps `mark` now unless it already happened in this boot.
    pub fn mark(&self, mark: BootMark) {
        let now = Instant::now();
        let mut g = self.lock();
        let slot = g.marks.slot(mark);
        if slot.is_none() {
            *slot = Some(now);
            self.0.changed.notify_all();
        }
    }

    /// Guest output reached the console (called on the writing vCPU thread).
    pub fn console_output(&self, bytes: &[u8]) {
        self.0
            .console_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if bytes.is_empty() || self.0.console_done.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let mut g = self.lock();
        let State { marks, tail } = &mut *g;
        marks.first_console_byte.get_or_insert(now);
        tail.extend_from_slice(bytes);
        let mut longest = 0;
        for (text, at) in marks.console.iter_mut() {
            longest = longest.max(text.len());
            if at.is_none() && contains(tail, text.as_bytes()) {
                *at = Some(now);
            }
        }
        let keep = longest.saturating_sub(1);
        let cut = tail.len().saturating_sub(keep);
        tail.drain(..cut);
        if marks.console.iter().all(|(_, at)| at.is_some()) {
            self.0.console_done.store(true, Ordering::SeqCst);
        }
        self.0.changed.notify_all();
    }

    /// The guest wrote `value` to the boot-timer port.
    pub fn guest_write(&self, value: u8) {
        let now = Instant::now();
        let mut g = self.lock();
        if g.marks.guest_writes.len() < MAX_GUEST_WRITES {
            g.marks.guest_writes.push((value, now));
        }
        if value == GUEST_READY {
            g.marks.guest_ready.get_or_insert(now);
        }
        self.0.changed.notify_all();
    }

    /// The marks of the current (latest) boot.
    pub fn marks(&self) -> BootMarks {
        let g = self.lock();
        self.snapshot(&g)
    }

    fn snapshot(&self, g: &State) -> BootMarks {
        let mut m = g.marks.clone();
        m.console_bytes = self.0.console_bytes.load(Ordering::Relaxed);
        m
    }

    /// Waits until `done(&marks)` holds or `timeout` passes; returns the
    /// marks then (check them: the wait may have timed out).
    pub fn wait(&self, timeout: Duration, done: impl Fn(&BootMarks) -> bool) -> BootMarks {
        let deadline = Instant::now() + timeout;
        let mut g = self.lock();
        loop {
            let m = self.snapshot(&g);
            if done(&m) {
                return m;
            }
            let now = Instant::now();
            if now >= deadline {
                return m;
            }
            g = self
                .0
                .changed
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The port device that records guest writes into this timer.
    pub fn device(&self) -> BootTimerDevice {
        BootTimerDevice {
            timer: self.clone(),
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// The boot-timer port on the PIO bus.
pub struct BootTimerDevice {
    timer: BootTimer,
}

impl BusDevice for BootTimerDevice {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == 0 {
            if let Some(v) = data.first() {
                self.timer.guest_write(*v);
            }
        }
    }
}

/// Lets the console report output to a boot timer.
impl crate::console::ConsoleObserver for BootTimer {
    fn console_output(&self, bytes: &[u8]) {
        BootTimer::console_output(self, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_first_wins_and_reset_per_boot() {
        let t = BootTimer::new();
        t.begin_boot();
        let m0 = t.marks();
        assert_eq!(m0.boot, 1);
        assert!(m0.build_start.is_some());
        t.mark(BootMark::SetupDone);
        let first = t.marks().setup_done;
        std::thread::sleep(Duration::from_millis(2));
        t.mark(BootMark::SetupDone);
        assert_eq!(t.marks().setup_done, first, "first stamp wins");
        t.begin_boot();
        let m = t.marks();
        assert_eq!(m.boot, 2);
        assert!(m.setup_done.is_none());
        assert_eq!(m.get(BootMark::BuildStart), m.build_start);
    }

    #[test]
    fn watched_text_split_across_writes_is_found_once() {
        let t = BootTimer::new();
        t.watch_console(" as init process");
        t.watch_console("never");
        t.begin_boot();
        assert!(t.marks().first_console_byte.is_none());
        for b in b"[ 1.0] Run /init as init pro" {
            t.console_output(&[*b]);
        }
        let m = t.marks();
        assert!(m.first_console_byte.is_some());
        assert!(m.console_at(" as init process").is_none());
        t.console_output(b"cess\n");
        let at = t.marks().console_at(" as init process");
        assert!(at.is_some());
        t.console_output(b"Run /init as init process\n");
        assert_eq!(t.marks().console_at(" as init process"), at);
        assert!(t.marks().console_at("never").is_none());
        assert_eq!(t.marks().console_bytes, 28 + 5 + 26);
        // A new boot forgets the stamps, keeps the texts.
        t.begin_boot();
        let m = t.marks();
        assert_eq!(m.console.len(), 2);
        assert!(m.console_at(" as init process").is_none());
    }

    #[test]
    fn port_writes_are_recorded_and_123_is_ready() {
        let t = BootTimer::new();
        t.begin_boot();
        let mut d = t.device();
        d.write(0, &[7]);
        assert!(t.marks().guest_ready.is_none());
        d.write(0, &[GUEST_READY, 0, 0, 0]);
        d.write(1, &[GUEST_READY]); // not the port's offset 0: ignored
        let m = t.marks();
        assert!(m.guest_ready.is_some());
        assert_eq!(
            m.guest_writes.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
            [7, GUEST_READY]
        );
        let mut b = [0u8; 2];
        d.read(0, &mut b);
        assert_eq!(b, [0xff, 0xff]);
        for _ in 0..2 * MAX_GUEST_WRITES {
            d.write(0, &[1]);
        }
        assert_eq!(t.marks().guest_writes.len(), MAX_GUEST_WRITES);
    }

    #[test]
    fn wait_returns_when_the_mark_lands_or_times_out() {
        let t = BootTimer::new();
        t.begin_boot();
        let m = t.wait(Duration::from_millis(5), |m| m.guest_ready.is_some());
        assert!(m.guest_ready.is_none());
        let t2 = t.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            t2.guest_write(GUEST_READY);
        });
        let m = t.wait(Duration::from_secs(30), |m| m.guest_ready.is_some());
        assert!(m.guest_ready.is_some());
        h.join().expect("writer");
    }

    #[test]
    fn between_is_none_unless_both_happened() {
        let a = Instant::now();
        let b = a + Duration::from_millis(3);
        assert_eq!(
            BootMarks::between(Some(a), Some(b)),
            Some(Duration::from_millis(3))
        );
        assert_eq!(BootMarks::between(Some(b), Some(a)), Some(Duration::ZERO));
        assert_eq!(BootMarks::between(None, Some(a)), None);
        assert_eq!(BootMarks::between(Some(a), None), None);
    }
}
