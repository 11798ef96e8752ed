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

use kvm_bindings::{
    kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave, Msrs, KVM_MP_STATE_RUNNABLE, KVM_MP_STATE_UNINITIALIZED,
    KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use serde::{Deserialize, Serialize};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use super::internal_error::InternalErrorExit;
use super::kvm::KvmContext;
use crate::arch::cpuid::{apply_template, set_vcpu_leaves, CpuTemplate};
use crate::arch::{interrupts, msr, regs};
use crate::bus::Bus;

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
    /// A vCPU thread panicked, so its fd is gone.
    #[error("the thread of vCPU {0} panicked; its state cannot be saved")]
    Lost(u8),
    /// The snapshot's state for a vCPU is unusable.
    #[error("the snapshot's state for vCPU {index} is invalid: {detail}")]
    BadState {
        /// vCPU index.
        index: u8,
        /// What is wrong.
        detail: String,
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
    // The boot vCPU runs from its entry point; application processors wait
    // in "uninitialized" until the guest's INIT/SIPI, which the in-kernel
    // LAPIC turns into a start at the SIPI vector (real mode). KVM picks the
    // same states at creation; setting them says so and holds on any KVM
    // whose default differs.
    let mp_state = kvm_mp_state {
        mp_state: if cfg.entry_gpa.is_some() {
            KVM_MP_STATE_RUNNABLE
        } else {
            KVM_MP_STATE_UNINITIALIZED
        },
    };
    fd.set_mp_state(mp_state)
        .map_err(cfg_err("KVM_SET_MP_STATE", i))?;
    Ok(())
}

/// Most MSRs one vCPU's state may carry (KVM's save list is a few dozen):
/// bounds what a snapshot file can make restore allocate and set.
pub const MAX_SAVED_MSRS: usize = 256;

/// Everything KVM holds for one vCPU, as a snapshot stores it. The kvm
/// structs serialize as their raw bytes (kvm-bindings' `serde`); their
/// contents come from a file on restore, and KVM validates each set ioctl.
///
/// Not saved: CPUID (rebuilt from the CPU template, which the VM's shape
/// fixes) and the legacy `kvm_fpu` (XSAVE carries x87/SSE state).
#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    /// General-purpose registers.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers.
    pub sregs: kvm_sregs,
    /// x87/SSE/AVX state (the 4 KiB legacy XSAVE area).
    pub xsave: kvm_xsave,
    /// Extended control registers (XCR0).
    pub xcrs: kvm_xcrs,
    /// The in-kernel local APIC's registers.
    pub lapic: kvm_lapic_state,
    /// The MSRs KVM reports as saveable that this vCPU could read.
    pub msrs: Vec<kvm_msr_entry>,
    /// Pending exceptions, interrupts, NMIs and SMIs.
    pub events: kvm_vcpu_events,
    /// Runnable, halted, waiting for SIPI.
    pub mp_state: kvm_mp_state,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
}

/// Reads the saveable MSRs of `fd` from `indices` (KVM_GET_MSR_INDEX_LIST),
/// skipping any this KVM lists but refuses to read.
fn read_msrs(fd: &VcpuFd, index: u8, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, VcpuError> {
    let mut out = Vec::with_capacity(indices.len());
    let mut rest: Vec<u32> = indices.iter().copied().take(MAX_SAVED_MSRS).collect();
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&i| kvm_msr_entry {
                index: i,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| VcpuError::Cpuid(index))?;
        let n = fd
            .get_msrs(&mut msrs)
            .map_err(cfg_err("KVM_GET_MSRS", index))?;
        out.extend_from_slice(&msrs.as_slice()[..n]);
        // KVM stops at the first MSR it cannot read: skip that one, go on.
        rest.drain(..(n + 1).min(rest.len()));
    }
    Ok(out)
}

/// Saves `fd`'s state. The vCPU's thread must be stopped (the fd is not in
/// `KVM_RUN`). A `KVM_RUN` with `immediate_exit` set first completes any
/// port or MMIO access the last exit left half done, so the saved RIP is
/// after it (KVM's documented way to reach a consistent state).
pub fn save_vcpu(fd: &mut VcpuFd, index: u8, msr_indices: &[u32]) -> Result<VcpuState, VcpuError> {
    fd.set_kvm_immediate_exit(1);
    // An exit here (rather than EINTR) means KVM had an exit to report
    // first; the completed access is what mattered.
    let errno = fd.run().err().map(|e| e.errno());
    fd.set_kvm_immediate_exit(0);
    if let Some(errno) = errno.filter(|e| *e != libc::EINTR && *e != libc::EAGAIN) {
        return Err(VcpuError::Configure {
            ioctl: "KVM_RUN (immediate exit)",
            index,
            source: io::Error::from_raw_os_error(errno),
        });
    }
    Ok(VcpuState {
        mp_state: fd
            .get_mp_state()
            .map_err(cfg_err("KVM_GET_MP_STATE", index))?,
        regs: fd.get_regs().map_err(cfg_err("KVM_GET_REGS", index))?,
        sregs: fd.get_sregs().map_err(cfg_err("KVM_GET_SREGS", index))?,
        xsave: fd.get_xsave().map_err(cfg_err("KVM_GET_XSAVE", index))?,
        xcrs: fd.get_xcrs().map_err(cfg_err("KVM_GET_XCRS", index))?,
        debugregs: fd
            .get_debug_regs()
            .map_err(cfg_err("KVM_GET_DEBUGREGS", index))?,
        lapic: fd.get_lapic().map_err(cfg_err("KVM_GET_LAPIC", index))?,
        msrs: read_msrs(fd, index, msr_indices)?,
        events: fd
            .get_vcpu_events()
            .map_err(cfg_err("KVM_GET_VCPU_EVENTS", index))?,
    })
}

/// Loads `state` (from a snapshot file) into a freshly created and
/// configured vCPU, in the order KVM needs: MP state, registers, XSAVE,
/// XCRs, debug registers, LAPIC, MSRs, then pending events last (they
/// depend on the rest).
pub fn restore_vcpu(fd: &VcpuFd, index: u8, state: &VcpuState) -> Result<(), VcpuError> {
    if state.msrs.len() > MAX_SAVED_MSRS {
        return Err(VcpuError::BadState {
            index,
            detail: format!("{} MSRs (at most {MAX_SAVED_MSRS})", state.msrs.len()),
        });
    }
    fd.set_mp_state(state.mp_state)
        .map_err(cfg_err("KVM_SET_MP_STATE", index))?;
    fd.set_regs(&state.regs)
        .map_err(cfg_err("KVM_SET_REGS", index))?;
    fd.set_sregs(&state.sregs)
        .map_err(cfg_err("KVM_SET_SREGS", index))?;
    // SAFETY: `kvm_xsave` is the fixed 4 KiB legacy area and this VMM never
    // enables dynamically sized XSAVE features (KVM_CAP_XSAVE2), so KVM
    // reads exactly the struct's size.
    unsafe { fd.set_xsave(&state.xsave) }.map_err(cfg_err("KVM_SET_XSAVE", index))?;
    fd.set_xcrs(&state.xcrs)
        .map_err(cfg_err("KVM_SET_XCRS", index))?;
    fd.set_debug_regs(&state.debugregs)
        .map_err(cfg_err("KVM_SET_DEBUGREGS", index))?;
    fd.set_lapic(&state.lapic)
        .map_err(cfg_err("KVM_SET_LAPIC", index))?;
    let msrs = Msrs::from_entries(&state.msrs).map_err(|_| VcpuError::Cpuid(index))?;
    let n = fd.set_msrs(&msrs).map_err(cfg_err("KVM_SET_MSRS", index))?;
    if n != state.msrs.len() {
        return Err(VcpuError::Msr {
            index,
            msr: state.msrs.get(n).map_or(0, |e| e.index),
        });
    }
    fd.set_vcpu_events(&state.events)
        .map_err(cfg_err("KVM_SET_VCPU_EVENTS", index))?;
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
    /// KVM_EXIT_INTERNAL_ERROR (e.g. an instruction KVM's emulator lacks),
    /// with the exit's data and registers; the lifecycle adds guest memory
    /// and the console tail to report it.
    InternalError(Box<InternalErrorExit>),
    /// Any other failure to run the guest (the text names the exit or errno).
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
    /// Guest RAM, where an emulation failure's instruction is read when
    /// KVM did not carry its bytes (`emulation_fixup`).
    pub memory: crate::guest_memory::GuestMemoryMmap,
}

/// Handles to a machine's running vCPU threads. Each thread hands its fd
/// back when it ends, so a snapshot can stop the threads, save the fds'
/// state and start new threads on the same fds.
pub struct VcpuSet {
    control: Arc<Control>,
    threads: Vec<JoinHandle<VcpuFd>>,
    io: VcpuIo,
}

impl VcpuSet {
    /// Starts one thread per configured vCPU fd, all running.
    pub fn start(fds: Vec<VcpuFd>, io: VcpuIo) -> Result<VcpuSet, VcpuError> {
        VcpuSet::start_in(fds, io, false)
    }

    /// Starts one thread per vCPU fd, parked (as after `pause`) when
    /// `paused`: `resume` lets them run.
    pub fn start_in(fds: Vec<VcpuFd>, io: VcpuIo, paused: bool) -> Result<VcpuSet, VcpuError> {
        install_kick_handler()?;
        let control = Arc::new(Control {
            want: AtomicU8::new(if paused { WANT_PAUSE } else { WANT_RUN }),
            counts: Mutex::new(Counts::default()),
            cond: Condvar::new(),
        });
        let mut set = VcpuSet {
            control,
            threads: Vec::new(),
            io: io.clone(),
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
        self.stop_and_take(timeout).map(drop)
    }

    /// The I/O wiring the threads run with (for `start_in` after a snapshot).
    pub fn io(&self) -> &VcpuIo {
        &self.io
    }

    /// Stops and joins every vCPU thread and returns their fds in index
    /// order (`None` for a thread that panicked).
    pub fn stop_and_take(&mut self, timeout: Duration) -> Result<Vec<Option<VcpuFd>>, VcpuError> {
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
        // A panicking vCPU thread has already reported through its sink or
        // crashed on a bug; its fd is gone with it.
        Ok(self.threads.drain(..).map(|t| t.join().ok()).collect())
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
    /// KVM_EXIT_INTERNAL_ERROR: the caller reads the details from the fd
    /// once the exit's borrow of `kvm_run` has ended.
    InternalError,
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
        VcpuExit::InternalError => return Handled::InternalError,
        other => return Handled::Stopped(VcpuStop::Failed(format!("unexpected exit {other:?}"))),
    }
    Handled::Continue
}

fn run_vcpu(mut fd: VcpuFd, index: u8, control: &Control, io: &VcpuIo) -> VcpuFd {
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
        let stopped = match handled {
            Handled::Continue => None,
            Handled::Stopped(why) => Some(why),
            Handled::InternalError => {
                let exit = InternalErrorExit::capture(&mut fd);
                match super::emulation_fixup::try_fixup(&fd, &exit, &io.memory) {
                    Some(_) => None,
                    None => Some(VcpuStop::InternalError(Box::new(exit))),
                }
            }
        };
        if let Some(why) = stopped {
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
    drop(g);
    fd
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
