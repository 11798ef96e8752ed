//! The VM lifecycle: `Vm` with the reference's state machine
//! (`Created → Booted ⇄ Paused`, `reset` stays `Booted`, anything `→ Shutdown`,
//! `Dead` when the guest or a vCPU failed), host requests from the API and
//! guest requests (i8042 reset, power-off, triple fault) handled by a monitor
//! thread per VM.
//!
//! A reset re-runs the whole boot path (`builder::build_and_start`) on fresh
//! KVM objects and fresh RAM; the console (log and input queue) carries over.
//! Guest requests carry the generation of the boot that made them, so a stale
//! request (a second vCPU asking to reset the boot that is already gone) is
//! ignored. A guest request that arrives while the VM is paused waits for
//! `resume`.

use std::fmt;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use crate::builder::{build_and_start, BootInfo, BuildError, Machine};
use crate::console::Console;
use crate::devices::{GuestRequest, GuestRequestSink};
use crate::vmm_config::VmConfig;
use crate::vstate::internal_error::{InternalErrorExit, VcpuExitError};
use crate::vstate::kvm::{KvmContext, KvmError};
use crate::vstate::vcpu::{VcpuError, VcpuStop, VcpuStopSink};

/// Console lines a vCPU failure report ends with, and the most bytes of
/// the log they are taken from.
pub const REPORT_CONSOLE_LINES: usize = 10;
/// See [`REPORT_CONSOLE_LINES`].
pub const REPORT_CONSOLE_BYTES: usize = 4096;

/// How long pause and stop wait for every vCPU to leave `KVM_RUN`.
pub const VCPU_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which power button [`Vm::power_button`] pressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerButton {
    /// An ACPI power-button event through the GED (the guest's ACPI GED
    /// driver had taken the GED's interrupt).
    Acpi,
    /// Ctrl+Alt+Del on the i8042 (a guest without ACPI).
    CtrlAltDel,
}

/// A VM's state (`vm:state()` in the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    /// Configured, not booted.
    Created,
    /// Running.
    Booted,
    /// vCPUs stopped.
    Paused,
    /// Torn down (host shutdown or guest power-off).
    Shutdown,
    /// The guest or a vCPU failed; `stop_reason` says how.
    Dead,
}

impl VmState {
    /// Every state.
    pub const ALL: [VmState; 5] = [
        VmState::Created,
        VmState::Booted,
        VmState::Paused,
        VmState::Shutdown,
        VmState::Dead,
    ];

    /// The reference's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Created => "created",
            VmState::Booted => "booted",
            VmState::Paused => "paused",
            VmState::Shutdown => "shutdown",
            VmState::Dead => "dead",
        }
    }
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a VM left `Booted` for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `Vm::shutdown` was called.
    HostShutdown,
    /// The guest powered off.
    GuestPowerOff,
    /// A vCPU triple-faulted.
    TripleFault {
        /// The vCPU.
        vcpu: u8,
    },
    /// A vCPU could not run.
    VcpuFailed {
        /// The vCPU.
        vcpu: u8,
        /// What happened.
        reason: String,
    },
    /// KVM could not go on with the guest (KVM_EXIT_INTERNAL_ERROR): the
    /// report has the suberror, RIP, instruction bytes and console tail.
    InternalError(Box<VcpuExitError>),
    /// A warm reset could not rebuild the machine.
    ResetFailed(String),
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::HostShutdown => write!(f, "shut down by the host"),
            StopReason::GuestPowerOff => write!(f, "the guest powered off"),
            StopReason::TripleFault { vcpu } => write!(f, "vCPU {vcpu} triple-faulted"),
            StopReason::VcpuFailed { vcpu, reason } => write!(f, "vCPU {vcpu} failed: {reason}"),
            StopReason::InternalError(e) => write!(f, "{e}"),
            StopReason::ResetFailed(r) => write!(f, "reset failed: {r}"),
        }
    }
}

/// A lifecycle error.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The operation is not allowed in the current state.
    #[error("cannot {op}: {}", state_hint(*.state))]
    WrongState {
        /// The operation.
        op: &'static str,
        /// The state the VM was in.
        state: VmState,
    },
    /// /dev/kvm is not usable.
    #[error("KVM is not available")]
    Kvm(#[source] KvmError),
    /// Building the machine failed.
    #[error("cannot build the VM")]
    Build(#[source] BuildError),
    /// vCPUs did not pause or stop.
    #[error("vCPU control failed")]
    Vcpu(#[source] VcpuError),
    /// A guest memory access out of range.
    #[error("guest memory {gpa:#x}+{len_bytes} is not RAM of this VM")]
    GuestMemory {
        /// Address.
        gpa: u64,
        /// Length.
        len_bytes: usize,
    },
    /// Taking a snapshot failed (the VM runs on as before).
    #[error("cannot snapshot the VM to {path}")]
    Snapshot {
        /// Where it was being written.
        path: String,
        /// Why.
        #[source]
        source: crate::persist::PersistError,
    },
    /// Restoring a snapshot failed (the VM stays as it was).
    #[error("cannot restore the VM from {path}")]
    Restore {
        /// The snapshot.
        path: String,
        /// Why.
        #[source]
        source: crate::persist::PersistError,
    },
    /// The power button could not be pressed.
    #[error("cannot press the power button")]
    PowerButton(#[source] crate::devices::legacy::i8042::I8042Error),
    /// The ACPI power-button event could not be raised.
    #[error("cannot press the ACPI power button")]
    PowerButtonAcpi(#[source] crate::devices::acpi::ged::GedError),
    /// Reading the IOAPIC (does the guest handle ACPI GED events?) failed.
    #[error("cannot tell whether the guest handles ACPI events (reading its IOAPIC failed)")]
    PowerButtonAcpiState(#[source] crate::vstate::vm::KvmVmError),
    /// The monitor thread could not be started.
    #[error("cannot start the VM monitor thread")]
    Monitor(#[source] std::io::Error),
}

fn state_hint(s: VmState) -> &'static str {
    match s {
        VmState::Created => "VM not booted",
        VmState::Booted => "VM is booted (not paused)",
        VmState::Paused => "VM is paused; use resume()",
        VmState::Shutdown => "VM is shutdown; create a new one",
        VmState::Dead => "VM is dead; see its stop reason, then create a new one",
    }
}

enum MonitorMsg {
    Guest {
        generation: u64,
        req: GuestRequest,
    },
    Vcpu {
        generation: u64,
        index: u8,
        why: VcpuStop,
    },
    Exit,
}

/// The sink each boot's devices and vCPUs report to.
struct BootEvents {
    generation: u64,
    tx: Sender<MonitorMsg>,
}

impl GuestRequestSink for BootEvents {
    fn request(&self, req: GuestRequest) {
        // The monitor only goes away with the Vm; a send error then is moot.
        let _ = self.tx.send(MonitorMsg::Guest {
            generation: self.generation,
            req,
        });
    }
}

impl VcpuStopSink for BootEvents {
    fn vcpu_stopped(&self, index: u8, why: VcpuStop) {
        let _ = self.tx.send(MonitorMsg::Vcpu {
            generation: self.generation,
            index,
            why,
        });
    }
}

/// What the monitor does with a guest event.
#[derive(Clone, Debug, PartialEq, Eq)]
enum GuestAction {
    Reset,
    PowerOff,
    Die(StopReason),
}

struct Inner {
    state: VmState,
    machine: Option<Machine>,
    generation: u64,
    boots: u64,
    stop_reason: Option<StopReason>,
    /// A guest request that arrived while paused.
    pending: Option<GuestAction>,
}

struct Shared {
    config: VmConfig,
    kvm: KvmContext,
    console: Arc<Console>,
    tx: Mutex<Sender<MonitorMsg>>,
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sender(&self) -> Sender<MonitorMsg> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn next_events(&self, g: &mut Inner) -> Arc<BootEvents> {
        g.generation += 1;
        Arc::new(BootEvents {
            generation: g.generation,
            tx: self.sender(),
        })
    }

    fn start_machine(&self, g: &mut Inner) -> Result<(), BuildError> {
        let events = self.next_events(g);
        let m = build_and_start(
            &self.kvm,
            &self.config,
            &self.console,
            events.clone(),
            events,
        )?;
        g.machine = Some(m);
        g.boots += 1;
        Ok(())
    }

    /// Stops the vCPUs and drops the machine.
    fn teardown(&self, g: &mut Inner) -> Result<(), VcpuError> {
        let r = match g.machine.as_mut() {
            Some(m) => m.vcpus.stop(VCPU_WAIT_TIMEOUT),
            None => Ok(()),
        };
        // Dropping the machine closes the VM fd and unmaps RAM only once no
        // vCPU thread runs; on a stop timeout keep it (leaked) rather than
        // pull memory from under a thread.
        if r.is_ok() {
            g.machine = None;
        } else if let Some(m) = g.machine.take() {
            std::mem::forget(m);
        }
        self.console.close_subscribers();
        r
    }

    fn set_state(&self, g: &mut Inner, s: VmState) {
        g.state = s;
        self.changed.notify_all();
    }

    fn reset(&self, g: &mut Inner) -> Result<(), VmError> {
        if let Err(e) = self.teardown(g) {
            g.stop_reason = Some(StopReason::ResetFailed(flatten(&e)));
            self.set_state(g, VmState::Dead);
            return Err(VmError::Vcpu(e));
        }
        g.pending = None;
        if let Err(e) = self.start_machine(g) {
            g.stop_reason = Some(StopReason::ResetFailed(flatten(&e)));
            self.set_state(g, VmState::Dead);
            return Err(VmError::Build(e));
        }
        self.set_state(g, VmState::Booted);
        Ok(())
    }

    fn end(&self, g: &mut Inner, state: VmState, reason: StopReason) -> Result<(), VmError> {
        let r = self.teardown(g);
        g.pending = None;
        g.stop_reason = Some(reason);
        self.set_state(g, state);
        r.map_err(VmError::Vcpu)
    }

    fn apply(&self, g: &mut Inner, action: GuestAction) {
        // Errors here are recorded in the state and stop reason; nobody to return them to.
        let _ = match action {
            GuestAction::Reset => self.reset(g),
            GuestAction::PowerOff => self.end(g, VmState::Shutdown, StopReason::GuestPowerOff),
            GuestAction::Die(reason) => self.end(g, VmState::Dead, reason),
        };
    }

    /// The report of KVM_EXIT_INTERNAL_ERROR on `vcpu` of boot
    /// `generation`: the instruction bytes come from KVM or, failing that,
    /// from that boot's RAM (none for a stale generation: the event is
    /// ignored then anyway), the tail from the console.
    fn internal_error_report(
        &self,
        generation: u64,
        vcpu: u8,
        exit: &InternalErrorExit,
    ) -> VcpuExitError {
        let tail = self
            .console
            .last_lines(REPORT_CONSOLE_LINES, REPORT_CONSOLE_BYTES);
        let g = self.lock();
        let ram = g
            .machine
            .as_ref()
            .filter(|_| g.generation == generation)
            .map(|m| &m.ram.memory);
        VcpuExitError::internal(
            vcpu,
            exit,
            |gpa, buf| ram.is_some_and(|m| m.read_slice(buf, GuestAddress(gpa)).is_ok()),
            tail,
        )
    }

    fn on_guest_event(&self, generation: u64, action: GuestAction) {
        let mut g = self.lock();
        if generation != g.generation {
            return;
        }
        match g.state {
            VmState::Booted => self.apply(&mut g, action),
            VmState::Paused => {
                // Keep the first request; a reset then power-off keeps the reset.
                g.pending.get_or_insert(action);
            }
            _ => {}
        }
    }
}

fn flatten(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

fn monitor(shared: Arc<Shared>, rx: Receiver<MonitorMsg>) {
    for msg in rx {
        match msg {
            MonitorMsg::Exit => break,
            MonitorMsg::Guest { generation, req } => {
                let action = match req {
                    GuestRequest::Reset => GuestAction::Reset,
                    GuestRequest::PowerOff => GuestAction::PowerOff,
                };
                shared.on_guest_event(generation, action);
            }
            MonitorMsg::Vcpu {
                generation,
                index,
                why,
            } => {
                let action = match why {
                    VcpuStop::SystemReset => GuestAction::Reset,
                    VcpuStop::SystemShutdown => GuestAction::PowerOff,
                    VcpuStop::TripleFault => {
                        GuestAction::Die(StopReason::TripleFault { vcpu: index })
                    }
                    VcpuStop::InternalError(exit) => GuestAction::Die(StopReason::InternalError(
                        Box::new(shared.internal_error_report(generation, index, &exit)),
                    )),
                    VcpuStop::Failed(reason) => GuestAction::Die(StopReason::VcpuFailed {
                        vcpu: index,
                        reason,
                    }),
                };
                shared.on_guest_event(generation, action);
            }
        }
    }
}

/// A microVM.
pub struct Vm {
    shared: Arc<Shared>,
    monitor: Option<JoinHandle<()>>,
}

impl Vm {
    /// Opens KVM and prepares a VM in `Created`. Nothing runs until `boot`.
    pub fn new(config: VmConfig) -> Result<Vm, VmError> {
        config
            .machine
            .validate()
            .map_err(|e| VmError::Build(BuildError::Machine(e)))?;
        let kvm = KvmContext::open().map_err(VmError::Kvm)?;
        let console = Console::new(config.console_log_bytes);
        let (tx, rx) = channel();
        let shared = Arc::new(Shared {
            config,
            kvm,
            console,
            tx: Mutex::new(tx),
            inner: Mutex::new(Inner {
                state: VmState::Created,
                machine: None,
                generation: 0,
                boots: 0,
                stop_reason: None,
                pending: None,
            }),
            changed: Condvar::new(),
        });
        let s = shared.clone();
        let monitor = std::thread::Builder::new()
            .name("vm-monitor".into())
            .spawn(move || monitor(s, rx))
            .map_err(VmError::Monitor)?;
        Ok(Vm {
            shared,
            monitor: Some(monitor),
        })
    }

    fn require(g: &Inner, op: &'static str, ok: &[VmState]) -> Result<(), VmError> {
        if ok.contains(&g.state) {
            Ok(())
        } else {
            Err(VmError::WrongState { op, state: g.state })
        }
    }

    /// `Created → Booted`: builds the machine and starts the vCPUs.
    pub fn boot(&self) -> Result<(), VmError> {
        let s = &self.shared;
        let mut g = s.lock();
        Self::require(&g, "boot", &[VmState::Created])?;
        s.start_machine(&mut g).map_err(VmError::Build)?;
        s.set_state(&mut g, VmState::Booted);
        Ok(())
    }

    /// Snapshots the VM to `path` (see `persist`): from `Booted` or
    /// `Paused`, and leaves it in the same state. The vCPUs are paused for
    /// the duration.
    pub fn snapshot(
        &self,
        path: &std::path::Path,
    ) -> Result<crate::persist::SnapshotStats, VmError> {
        self.snapshot_with(path, &[])
    }

    /// [`Vm::snapshot`] with the caller's own `extra` sections (name, bytes)
    /// in the file.
    pub fn snapshot_with(
        &self,
        path: &std::path::Path,
        extra: &[(&str, Vec<u8>)],
    ) -> Result<crate::persist::SnapshotStats, VmError> {
        let s = &self.shared;
        let mut g = s.lock();
        Self::require(&g, "snapshot", &[VmState::Booted, VmState::Paused])?;
        let running = g.state == VmState::Booted;
        let m = g
            .machine
            .as_mut()
            .expect("a booted or paused VM has a machine");
        if running {
            if let Err(e) = m.vcpus.pause(VCPU_WAIT_TIMEOUT) {
                m.vcpus.resume();
                return Err(VmError::Vcpu(e));
            }
        }
        let r = crate::persist::save_machine(m, &s.kvm, &s.config, &s.console, path, extra);
        if running {
            m.vcpus.resume();
        }
        r.map_err(|source| VmError::Snapshot {
            path: path.display().to_string(),
            source,
        })
    }

    /// `Created`/`Shutdown → Booted` from the snapshot at `path`: a new
    /// machine with this VM's config and the snapshot's state, running.
    /// The console log becomes the snapshot's tail and continues. Its RAM
    /// is a copy of the restore image of its own; restores that should
    /// share one copy go through [`Vm::restore_sharing`].
    pub fn restore(&self, path: &std::path::Path) -> Result<(), VmError> {
        self.restore_sharing(path, &crate::vstate::memory::RestoreRamCache::new())
    }

    /// [`Vm::restore`] with guest RAM from `ram_cache`: the restore image's
    /// sealed copy made by the first restore of it through that cache,
    /// mapped copy-on-write (a run's VMs restored from one fixture hold its
    /// pages once).
    pub fn restore_sharing(
        &self,
        path: &std::path::Path,
        ram_cache: &crate::vstate::memory::RestoreRamCache,
    ) -> Result<(), VmError> {
        let s = &self.shared;
        let mut g = s.lock();
        Self::require(&g, "restore", &[VmState::Created, VmState::Shutdown])?;
        let events = s.next_events(&mut g);
        let m = crate::persist::restore_and_start(
            &s.kvm,
            &s.config,
            &s.console,
            events.clone(),
            events,
            path,
            ram_cache,
        )
        .map_err(|source| VmError::Restore {
            path: path.display().to_string(),
            source,
        })?;
        g.machine = Some(m);
        g.boots += 1;
        g.stop_reason = None;
        g.pending = None;
        s.set_state(&mut g, VmState::Booted);
        Ok(())
    }

    /// `Booted → Paused`: every vCPU is out of `KVM_RUN` and parked on return.
    pub fn pause(&self) -> Result<(), VmError> {
        let s = &self.shared;
        let mut g = s.lock();
        Self::require(&g, "pause", &[VmState::Booted])?;
        let m = g.machine.as_ref().expect("a booted VM has a machine");
        if let Err(e) = m.vcpus.pause(VCPU_WAIT_TIMEOUT) {
            m.vcpus.resume();
            return Err(VmError::Vcpu(e));
        }
        s.set_state(&mut g, VmState::Paused);
        Ok(())
    }

    /// `Paused → Booted`. A guest request that arrived while paused (reset,
    /// power-off, failure) takes effect now instead.
    pub fn resume(&self) -> Result<(), VmError> {
        let s = &self.shared;
        let mut g = s.lock();
        Self::require(&g, "resume", &[VmState::Paused])?;
        s.set_state(&mut g, VmState::Booted);
        if let Some(action) = g.pending.take() {
            s.apply(&mut g, action);
            return Ok(());
        }
        g.machine
            .as_ref()
            .expect("a paused VM has a machine")
            .vcpus
            .resume();
        Ok(())
    }

    /// Warm reset from `Booted`: tear down and boot again through the boot path.
    pub fn reset(&self) -> Result<(), VmError> {
        let s = &self.shared;
        let mut g = s.lock();
        Self::require(&g, "reset", &[VmState::Booted])?;
        s.reset(&mut g)
    }

    /// Presses the power button from `Booted` (docs/vmm.md, "Power
    /// button"). A guest whose ACPI GED driver took the GED's interrupt
    /// (IOAPIC pin 23 unmasked) gets an ACPI power-button event: the GED
    /// raises it and its `_EVT` notifies `\_SB.PWRB`. Any other guest gets
    /// Ctrl+Alt+Del on the i8042 with IRQ 1. Either way the guest decides:
    /// the VM stays `Booted` until the guest powers off
    /// (`wait_for_state(Shutdown, ..)`), or resets if its init left C-A-D
    /// on. Returns which button was pressed.
    pub fn power_button(&self) -> Result<PowerButton, VmError> {
        let s = &self.shared;
        let g = s.lock();
        Self::require(&g, "press the power button", &[VmState::Booted])?;
        let m = g.machine.as_ref().expect("a booted VM has a machine");
        let acpi =
            m.vm.ioapic_pin_unmasked(crate::devices::acpi::ged::GED_IRQ)
                .map_err(VmError::PowerButtonAcpiState)?;
        if acpi {
            let mut ged = m.acpi.ged.lock().unwrap_or_else(|e| e.into_inner());
            ged.press_power_button().map_err(VmError::PowerButtonAcpi)?;
            return Ok(PowerButton::Acpi);
        }
        let mut kbd = m.legacy.i8042.lock().unwrap_or_else(|e| e.into_inner());
        kbd.trigger_ctrl_alt_del().map_err(VmError::PowerButton)?;
        Ok(PowerButton::CtrlAltDel)
    }

    /// Any state `→ Shutdown`. Idempotent.
    pub fn shutdown(&self) -> Result<(), VmError> {
        let s = &self.shared;
        let mut g = s.lock();
        if g.state == VmState::Shutdown {
            return Ok(());
        }
        let reason = g.stop_reason.clone().unwrap_or(StopReason::HostShutdown);
        s.end(&mut g, VmState::Shutdown, reason)
    }

    /// The current state.
    pub fn state(&self) -> VmState {
        self.shared.lock().state
    }

    /// Waits until the state is `want` or `timeout` passes; returns the state then.
    pub fn wait_for_state(&self, want: VmState, timeout: Duration) -> VmState {
        let deadline = Instant::now() + timeout;
        let s = &self.shared;
        let mut g = s.lock();
        while g.state != want {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = s
                .changed
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        g.state
    }

    /// Why the VM stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.shared.lock().stop_reason.clone()
    }

    /// How many times the machine was built (1 after boot, +1 per reset).
    pub fn boot_count(&self) -> u64 {
        self.shared.lock().boots
    }

    /// Where the current boot loaded things.
    pub fn boot_info(&self) -> Option<BootInfo> {
        self.shared.lock().machine.as_ref().map(|m| m.boot.clone())
    }

    /// The console (survives resets).
    pub fn console(&self) -> Arc<Console> {
        self.shared.console.clone()
    }

    /// Reads guest RAM of the current boot.
    pub fn read_guest_memory(&self, gpa: u64, buf: &mut [u8]) -> Result<(), VmError> {
        let g = self.shared.lock();
        let len_bytes = buf.len();
        let bad = || VmError::GuestMemory { gpa, len_bytes };
        let m = g.machine.as_ref().ok_or_else(|| VmError::WrongState {
            op: "read guest memory",
            state: g.state,
        })?;
        m.ram
            .memory
            .read_slice(buf, GuestAddress(gpa))
            .map_err(|_| bad())
    }

    /// The device status register (virtio 1.2, 2.1) of the `index`th
    /// virtio device of the current boot (attach order: disks, rng, vsock,
    /// nets), on either transport, as the guest's driver last wrote it:
    /// `DRIVER_OK` (4) means its driver probed and started the device.
    /// `None` when not booted or no such device.
    pub fn virtio_status(&self, index: u32) -> Option<u32> {
        let g = self.shared.lock();
        let m = g.machine.as_ref()?;
        let slot = m.virtio.get(usize::try_from(index).ok()?)?;
        Some(slot.status())
    }

    /// Accesses (vCPU exits) the current boot's (PIO, MMIO) buses have
    /// dispatched.
    pub fn bus_accesses(&self) -> Option<(u64, u64)> {
        let g = self.shared.lock();
        let m = g.machine.as_ref()?;
        Some((m.pio.accesses(), m.mmio.accesses()))
    }

    /// The PCI root complex's refused-access counters, when the current
    /// boot has one.
    pub fn pci_counters(&self) -> Option<crate::devices::pci::root::PciCounters> {
        let g = self.shared.lock();
        let root = g.machine.as_ref()?.pci.as_ref()?;
        let c = root.lock().unwrap_or_else(|e| e.into_inner()).counters();
        Some(c)
    }

    /// The ACPI GED's events the guest has not read yet (its `_EVT` reads
    /// and clears them), `None` without a machine: after an ACPI power
    /// button press, 0 again means the guest's AML ran. For tests.
    pub fn acpi_events_pending(&self) -> Option<u32> {
        let g = self.shared.lock();
        let m = g.machine.as_ref()?;
        let ged = m.acpi.ged.lock().unwrap_or_else(|e| e.into_inner());
        Some(ged.pending())
    }

    /// Writes guest RAM of the current boot, as a device doing DMA would
    /// (tests and tools that play the guest's driver).
    pub fn write_guest_memory(&self, gpa: u64, data: &[u8]) -> Result<(), VmError> {
        let g = self.shared.lock();
        let len_bytes = data.len();
        let m = g.machine.as_ref().ok_or(VmError::WrongState {
            op: "write guest memory",
            state: g.state,
        })?;
        m.ram
            .memory
            .write_slice(data, GuestAddress(gpa))
            .map_err(|_| VmError::GuestMemory { gpa, len_bytes })
    }

    /// An MMIO access at `gpa` as a vCPU would make it (tests and tools
    /// that play the guest's driver): a write when `write`, else a read
    /// into `data`. Returns whether a device owns the address.
    pub fn mmio_access(&self, gpa: u64, data: &mut [u8], write: bool) -> bool {
        let g = self.shared.lock();
        let Some(m) = g.machine.as_ref() else {
            return false;
        };
        let bus = m.mmio.clone();
        // Not under the VM lock: a device may signal or take its own locks.
        drop(g);
        if write {
            bus.write(gpa, data)
        } else {
            bus.read(gpa, data)
        }
    }

    /// The host address ranges `(start, len_bytes)` of the current boot's
    /// guest RAM mappings, for measuring a VM's resident memory (its
    /// entries in /proc/self/smaps). Empty when not booted.
    pub fn ram_host_ranges(&self) -> Vec<(u64, u64)> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        let g = self.shared.lock();
        let Some(m) = g.machine.as_ref() else {
            return Vec::new();
        };
        m.ram
            .memory
            .iter()
            .map(|r| (r.as_ptr() as u64, r.len()))
            .collect()
    }

    /// Reads a little-endian u64 from guest RAM.
    pub fn read_guest_u64(&self, gpa: u64) -> Result<u64, VmError> {
        let mut b = [0u8; 8];
        self.read_guest_memory(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.shutdown();
        let _ = self.shared.sender().send(MonitorMsg::Exit);
        if let Some(t) = self.monitor.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_match_the_reference() {
        let names: Vec<&str> = VmState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["created", "booted", "paused", "shutdown", "dead"]);
    }

    #[test]
    fn wrong_state_messages_give_the_hint() {
        let e = VmError::WrongState {
            op: "pause",
            state: VmState::Paused,
        };
        assert_eq!(e.to_string(), "cannot pause: VM is paused; use resume()");
        let e = VmError::WrongState {
            op: "reset",
            state: VmState::Created,
        };
        assert_eq!(e.to_string(), "cannot reset: VM not booted");
        let e = VmError::WrongState {
            op: "boot",
            state: VmState::Shutdown,
        };
        assert_eq!(
            e.to_string(),
            "cannot boot: VM is shutdown; create a new one"
        );
    }

    #[test]
    fn flatten_joins_the_chain() {
        let e = VmError::Kvm(KvmError::Open(std::io::Error::from_raw_os_error(
            libc::EBUSY,
        )));
        let s = flatten(&e);
        assert!(
            s.starts_with("KVM is not available: cannot open /dev/kvm: "),
            "{s}"
        );
    }
}
