//! vCPUs: boot configuration (CPUID through the CPU template, MSRs, registers,
//! FPU, LAPIC) and one thread per vCPU running `KVM_RUN`.
//!
//! Pausing follows Firecracker: the controller sets the wanted state, then
//! kicks every vCPU thread with a real-time signal. The signal handler sets
//! `kvm_run.immediate_exit` for the interrupted thread, so a kick that lands
//! between the state check and the next `KVM_RUN` makes that `KVM_RUN` return
//! `EINTR` at once instead of being lost; a kick during `KVM_RUN` interrupts
//! it. The thread then parks on a condvar until resumed or stopped. Kicks are
//! repeated until every vCPU acknowledges, so no ordering race can leave one
//! running.

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::{Msrs, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use super::kvm::KvmContext;
use crate::arch::cpuid::{apply_template, set_vcpu_leaves, CpuTemplate};
use crate::arch::{interrupts, msr, regs};
use crate::devices::bus::Bus;

/// Offset from SIGRTMIN of the signal that kicks vCPUs out of `KVM_RUN`.
pub const VCPU_KICK_SIGNAL_OFFSET: i32 = 0;

/// An error configuring or running vCPUs.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A vCPU configuration ioctl failed.
    #[error("{ioctl} on vCPU {index} failed")]
    Configure {
        /// The ioctl.
        ioctl: &'static str,
        /// vCPU index.
        index: u8,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// KVM_SET_MSRS accepted only some MSRs.
    #[error("KVM_SET_MSRS on vCPU {index} stopped at MSR {msr:#x} (not supported by this KVM)")]
    Msr {
        /// vCPU index.
        index: u8,
        /// First MSR that was not set.
        msr: u32,
    },
    /// CPUID list manipulation failed.
    #[error("cannot build the CPUID list for vCPU {0}")]
    Cpuid(u8),
    /// Registering the kick signal handler failed.
    #[error("cannot install the vCPU kick signal handler")]
    Signal(#[source] io::Error),
    /// Spawning a vCPU thread failed.
    #[error("cannot spawn the thread for vCPU {index}")]
    Spawn {
        /// vCPU index.
        index: u8,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Not every vCPU stopped in time.
    #[error("{pending} vCPU(s) did not {what} within {timeout_ms} ms (a vCPU stuck in the host?)")]
    Timeout {
        /// What was waited for ("pause", "stop").
        what: &'static str,
        /// vCPUs still running.
        pending: usize,
        /// The wait.
        timeout_ms: u128,
    },
}

fn cfg_err(ioctl: &'static str, index: u8) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
    move |e| VcpuError::Configure {
        ioctl,
        index,
        source: io::Error::from_raw_os_error(e.errno()),
    }
}

/// Boot configuration of one vCPU.
pub struct VcpuBootConfig {
    /// vCPU index, also its APIC ID.
    pub index: u8,
    /// Number of vCPUs in the VM.
    pub count: u8,
    /// CPU template to filter KVM's supported CPUID with.
    pub template: CpuTemplate,
    /// For the boot vCPU: the 64-bit entry point. Application processors wait
    /// for INIT/SIPI from the guest (the in-kernel LAPIC starts them so).
    pub entry_gpa: Option<u64>,
}

/// Applies the boot configuration to `fd`.
pub fn configure_vcpu(
    fd: &VcpuFd,
    kvm: &KvmContext,
    cfg: &VcpuBootConfig,
) -> Result<(), VcpuError> {
    let i = cfg.index;
    let mut cpuid = kvm.supported_cpuid.clone();
    apply_template(&mut cpuid, cfg.template);
    set_vcpu_leaves(&mut cpuid, i, cfg.count);
    fd.set_cpuid2(&cpuid)
        .map_err(cfg_err("KVM_SET_CPUID2", i))?;

    let entries = msr::boot_msr_entries();
    let msrs = Msrs::from_entries(&entries).map_err(|_| VcpuError::Cpuid(i))?;
    let n = fd.set_msrs(&msrs).map_err(cfg_err("KVM_SET_MSRS", i))?;
    if n != entries.len() {
        return Err(VcpuError::Msr {
            index: i,
            msr: entries.get(n).map_or(0, |e| e.index),
        });
    }

    if let Some(entry) = cfg.entry_gpa {
        fd.set_regs(&regs::boot_regs(entry))
            .map_err(cfg_err("KVM_SET_REGS", i))?;
        let sregs = fd.get_sregs().map_err(cfg_err("KVM_GET_SREGS", i))?;
        fd.set_sregs(&regs::boot_sregs(sregs))
            .map_err(cfg_err("KVM_SET_SREGS", i))?;
        fd.set_fpu(&regs::boot_fpu())
            .map_err(cfg_err("KVM_SET_FPU", i))?;
    }

    let lapic = fd.get_lapic().map_err(cfg_err("KVM_GET_LAPIC", i))?;
    fd.set_lapic(&interrupts::set_lint(lapic))
        .map_err(cfg_err("KVM_SET_LAPIC", i))?;
    Ok(())
}

thread_local! {
    /// This thread's `kvm_run.immediate_exit`, for the kick signal handler.
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Async-signal-safe: a const thread-local read and a volatile byte store.
    let p = IMMEDIATE_EXIT.with(Cell::get);
    if !p.is_null() {
        // SAFETY: the pointer is set by this thread to its own vCPU's mmapped
        // kvm_run while the VcpuFd is alive, and cleared before it is dropped.
        unsafe { std::ptr::write_volatile(p, 1) };
    }
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// The kick signal number.
pub fn kick_signal() -> i32 {
    SIGRTMIN() + VCPU_KICK_SIGNAL_OFFSET
}

static SIGNAL_SETUP: Once = Once::new();

/// Installs the kick handler once per process (signal setup is the one
/// process-wide thing the VMM does).
fn install_kick_handler() -> Result<(), VcpuError> {
    let mut result = Ok(());
    SIGNAL_SETUP.call_once(|| {
        result = register_signal_handler(kick_signal(), kick_handler)
            .map_err(|e| VcpuError::Signal(io::Error::from_raw_os_error(e.errno())));
    });
    result
}

/// Why a vCPU stopped running guest code on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuStop {
    /// KVM_EXIT_SHUTDOWN: a triple fault.
    TripleFault,
    /// KVM_SYSTEM_EVENT_RESET.
    SystemReset,
    /// KVM_SYSTEM_EVENT_SHUTDOWN.
    SystemShutdown,
    /// Any failure to run the guest (the text names the exit or errno).
    Failed(String),
}

/// Told when a vCPU stops on its own. Called on the vCPU thread; must not block.
pub trait VcpuStopSink: Send + Sync {
    /// vCPU `index` stopped for `why`.
    fn vcpu_stopped(&self, index: u8, why: VcpuStop);
}

const WANT_RUN: u8 = 0;
const WANT_PAUSE: u8 = 1;
const WANT_STOP: u8 = 2;

#[derive(Default)]
struct Counts {
    /// vCPUs parked (paused, or stopped by the guest and waiting for STOP).
    parked: usize,
    /// vCPU threads that returned.
    exited: usize,
}

/// Shared between the controller and the vCPU threads of one machine.
struct Control {
    want: AtomicU8,
    counts: Mutex<Counts>,
    cond: Condvar,
}

impl Control {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_want(&self, w: u8) {
        let _g = self.lock();
        self.want.store(w, Ordering::SeqCst);
        self.cond.notify_all();
    }

    /// Parks the calling vCPU while the controller wants PAUSE (or forever
    /// until STOP when `until_stop`). Returns true when it should exit.
    fn park(&self, until_stop: bool) -> bool {
        let mut g = self.lock();
        g.parked += 1;
        self.cond.notify_all();
        loop {
            let w = self.want.load(Ordering::SeqCst);
            if w == WANT_STOP {
                g.parked -= 1;
                return true;
            }
            if w == WANT_RUN && !until_stop {
                g.parked -= 1;
                return false;
            }
            g = self.cond.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What a vCPU thread needs besides its fd.
#[derive(Clone)]
pub struct VcpuIo {
    /// Port I/O devices.
    pub pio: Arc<Bus>,
    /// MMIO devices.
    pub mmio: Arc<Bus>,
    /// Where self-stops are reported.
    pub stops: Arc<dyn VcpuStopSink>,
    /// Stamped when vCPU 0 first enters `KVM_RUN`.
    pub boot_timer: Option<crate::boot_timer::BootTimer>,
}

/// Handles to a machine's running vCPU threads.
pub struct VcpuSet {
    control: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
}

impl VcpuSet {
    /// Starts one thread per configured vCPU fd, all running.
    pub fn start(fds: Vec<VcpuFd>, io: VcpuIo) -> Result<VcpuSet, VcpuError> {
        install_kick_handler()?;
        let control = Arc::new(Control {
            want: AtomicU8::new(WANT_RUN),
            counts: Mutex::new(Counts::default()),
            cond: Condvar::new(),
        });
        let mut set = VcpuSet {
            control,
            threads: Vec::new(),
        };
        for (i, fd) in fds.into_iter().enumerate() {
            let index = u8::try_from(i).expect("vCPU count is a u8");
            let control = set.control.clone();
            let io = io.clone();
            let t = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || run_vcpu(fd, index, &control, &io));
            match t {
                Ok(t) => set.threads.push(t),
                Err(source) => {
                    // Stop what did start; the error says why.
                    let _ = set.stop(Duration::from_secs(5));
                    return Err(VcpuError::Spawn { index, source });
                }
            }
        }
        Ok(set)
    }

    fn kick_all(&self) {
        for t in &self.threads {
            if !t.is_finished() {
                // ESRCH (thread just finished) is fine.
                let _ = t.kill(kick_signal());
            }
        }
    }

    fn wait_parked(&self, what: &'static str, timeout: Duration) -> Result<(), VcpuError> {
        let n = self.threads.len();
        let deadline = Instant::now() + timeout;
        loop {
            self.kick_all();
            let g = self.control.lock();
            let (g, _) = self
                .control
                .cond
                .wait_timeout_while(g, Duration::from_millis(5), |c| c.parked + c.exited < n)
                .unwrap_or_else(|e| e.into_inner());
            if g.parked + g.exited >= n {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(VcpuError::Timeout {
                    what,
                    pending: n - g.parked - g.exited,
                    timeout_ms: timeout.as_millis(),
                });
            }
        }
    }

    /// Stops every vCPU out of `KVM_RUN` and parks it. On error the vCPUs
    /// that did park stay parked; `resume` or `stop` them.
    pub fn pause(&self, timeout: Duration) -> Result<(), VcpuError> {
        self.control.set_want(WANT_PAUSE);
        self.wait_parked("pause", timeout)
    }

    /// Lets paused vCPUs run again.
    pub fn resume(&self) {
        self.control.set_want(WANT_RUN);
    }

    /// Stops and joins every vCPU thread.
    pub fn stop(&mut self, timeout: Duration) -> Result<(), VcpuError> {
        self.control.set_want(WANT_STOP);
        let deadline = Instant::now() + timeout;
        while self.threads.iter().any(|t| !t.is_finished()) {
            if Instant::now() >= deadline {
                return Err(VcpuError::Timeout {
                    what: "stop",
                    pending: self.threads.iter().filter(|t| !t.is_finished()).count(),
                    timeout_ms: timeout.as_millis(),
                });
            }
            self.kick_all();
            let g = self.control.lock();
            let _ = self
                .control
                .cond
                .wait_timeout(g, Duration::from_millis(5))
                .unwrap_or_else(|e| e.into_inner());
        }
        for t in self.threads.drain(..) {
            // A panicking vCPU thread has already reported through its sink or
            // crashed on a bug; either way there is nothing left to join for.
            let _ = t.join();
        }
        Ok(())
    }

    /// Number of vCPU threads.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Whether there are no vCPU threads.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }
}

impl Drop for VcpuSet {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.stop(Duration::from_secs(5));
        }
    }
}

/// Outcome of handling one exit.
enum Handled {
    Continue,
    Stopped(VcpuStop),
}

fn handle_exit(exit: VcpuExit<'_>, io: &VcpuIo) -> Handled {
    match exit {
        VcpuExit::IoIn(port, data) => {
            io.pio.read(u64::from(port), data);
        }
        VcpuExit::IoOut(port, data) => {
            io.pio.write(u64::from(port), data);
        }
        VcpuExit::MmioRead(addr, data) => {
            io.mmio.read(addr, data);
        }
        VcpuExit::MmioWrite(addr, data) => {
            io.mmio.write(addr, data);
        }
        // With the in-kernel LAPIC, HLT is handled in KVM; if it does exit, re-enter.
        VcpuExit::Hlt | VcpuExit::Intr | VcpuExit::IrqWindowOpen => {}
        VcpuExit::Shutdown => return Handled::Stopped(VcpuStop::TripleFault),
        VcpuExit::SystemEvent(t, _) if t == KVM_SYSTEM_EVENT_RESET => {
            return Handled::Stopped(VcpuStop::SystemReset)
        }
        VcpuExit::SystemEvent(t, _) if t == KVM_SYSTEM_EVENT_SHUTDOWN => {
            return Handled::Stopped(VcpuStop::SystemShutdown)
        }
        VcpuExit::FailEntry(reason, cpu) => {
            return Handled::Stopped(VcpuStop::Failed(format!(
                "KVM_EXIT_FAIL_ENTRY (hardware reason {reason:#x}, cpu {cpu})"
            )))
        }
        other => return Handled::Stopped(VcpuStop::Failed(format!("unexpected exit {other:?}"))),
    }
    Handled::Continue
}

fn run_vcpu(mut fd: VcpuFd, index: u8, control: &Control, io: &VcpuIo) {
    let p: *mut u8 = &mut fd.get_kvm_run().immediate_exit;
    IMMEDIATE_EXIT.with(|c| c.set(p));
    // The kick signal must reach this thread even if the spawner blocked it.
    let _ = vmm_sys_util::signal::unblock_signal(kick_signal());
    let mut first_run = index == 0;
    loop {
        if control.want.load(Ordering::SeqCst) != WANT_RUN && control.park(false) {
            break;
        }
        if std::mem::take(&mut first_run) {
            if let Some(t) = &io.boot_timer {
                t.mark(crate::boot_timer::BootMark::FirstKvmRun);
            }
        }
        let handled = match fd.run() {
            Ok(exit) => handle_exit(exit, io),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                fd.set_kvm_immediate_exit(0);
                Handled::Continue
            }
            Err(e) => Handled::Stopped(VcpuStop::Failed(format!(
                "KVM_RUN failed: {}",
                io::Error::from_raw_os_error(e.errno())
            ))),
        };
        if let Handled::Stopped(why) = handled {
            io.stops.vcpu_stopped(index, why);
            // Never run this guest again; wait for the controller to stop us.
            control.park(true);
            break;
        }
    }
    IMMEDIATE_EXIT.with(|c| c.set(std::ptr::null_mut()));
    let mut g = control.lock();
    g.exited += 1;
    control.cond.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn park_counts_and_releases() {
        let c = Arc::new(Control {
            want: AtomicU8::new(WANT_PAUSE),
            counts: Mutex::new(Counts::default()),
            cond: Condvar::new(),
        });
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.park(false));
        {
            let g = c.lock();
            let (g, _) = c
                .cond
                .wait_timeout_while(g, Duration::from_secs(5), |g| g.parked == 0)
                .expect("not poisoned");
            assert_eq!(g.parked, 1);
        }
        c.set_want(WANT_RUN);
        assert!(!t.join().expect("no panic"), "resumed, not stopped");
        assert_eq!(c.lock().parked, 0);
    }

    #[test]
    fn parked_for_good_leaves_only_on_stop() {
        let c = Arc::new(Control {
            want: AtomicU8::new(WANT_RUN),
            counts: Mutex::new(Counts::default()),
            cond: Condvar::new(),
        });
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.park(true));
        std::thread::yield_now();
        c.set_want(WANT_PAUSE);
        c.set_want(WANT_RUN);
        assert!(!t.is_finished() || c.want.load(Ordering::SeqCst) == WANT_STOP);
        c.set_want(WANT_STOP);
        assert!(t.join().expect("no panic"));
    }
}
