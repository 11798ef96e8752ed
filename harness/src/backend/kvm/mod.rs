//! The `kvm` backend: a guest on Provium's in-process microVMM (`provium-vmm`).
//!
//! `KvmMachine::boot` turns a profile and boot options into a `VmConfig`
//! (`config.rs`: kernel, initrd with the agent injected, the reference's
//! command-line rules, sizing, `rng_seed`, a virtio-vsock device with a
//! per-VM guest CID) and boots it. `connect` then reaches the agent: a host
//! connection to vsock port [`AGENT_VSOCK_PORT`] through the VMM's userspace
//! vsock (a Unix socket on the host side) and the Hello handshake, retried
//! until the agent timeout ([`AGENT_TIMEOUT_ENV`]; default 60 s, and
//! [`DEFAULT_AGENT_TIMEOUT_KVM_PVM`] on kvm_pvm, where guest kernel code is
//! emulated and a boot to init takes minutes).
//!
//! When no Hello comes the error says what the console shows: the last
//! console lines, whether the kernel reached init, and what to check. On
//! `kvm_pvm` (DESIGN.md "This machine's KVM") Linux user space runs only
//! with a guest kernel carrying the kvm_pvm shims, so that is named too (the
//! command-line words such a kernel needs there are added by `config.rs`).
//! A kernel panic ends the wait at once. Only the console output of the
//! current boot counts: after `reset` the previous boot's "Run /init" line
//! or panic says nothing about this one.
//!
//! `reset` re-runs the boot path and then reconnects (a new Hello), or fails
//! with the same reasons a boot gives. `power_button` presses the ACPI power
//! button, or Ctrl+Alt+Del for a guest without ACPI (docs/vmm.md, "Power
//! button"), and waits for the guest to power off, saying what happened
//! when it does not.

pub mod config;
pub mod devices;
pub mod disk_plan;
pub mod guest;
pub mod nic_plan;
pub mod slots;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use provium_protocol::AGENT_VSOCK_PORT;
use provium_vmm::devices::virtio::console::defs::AGENT_PORT_NAME;
use provium_vmm::devices::virtio::console::ConsoleConnectError;
use provium_vmm::devices::virtio::vsock::VsockConnectError;
use provium_vmm::vmm_config::{ConsoleHost, VsockHost};
use provium_vmm::vstate::memory::RestoreRamCache;
use provium_vmm::{Console, StopReason, Vm, VmError, VmState};

use crate::backend::MachineSpec;
use crate::client::{AgentClient, AgentOps, ClientError, ClientOptions};
use crate::config::Profile;
use crate::settings::Settings;
pub use config::vm_config;
pub use guest::KvmBackend;

/// What the kvm backend fails with.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    #[error(
        "the kvm backend boots a profile's kernel, and profile `{profile}` is not in provium.toml"
    )]
    NoProfileToBoot { profile: String },
    #[error("the kvm backend restores into profile `{profile}`, which is not in provium.toml")]
    NoProfileToRestore { profile: String },
    #[error(transparent)]
    Config(#[from] config::VmConfigError),
    #[error(
        "NIC {ifname}: cannot give the guest interface the bridge port's MAC through its agent \
         ({detail}); the guest needs `ip` (iproute2, or busybox with AF_PACKET) or `ifconfig`"
    )]
    GuestMac { ifname: String, detail: String },
    /// A device for a running guest (its slots: `slots.rs`).
    #[error(transparent)]
    Slot(#[from] slots::SlotError),
    /// The boot devices plus the slots do not fit the transport (boxed:
    /// it names a lot, and every KvmError result carries its size).
    #[error(transparent)]
    TooManyDevices(Box<DeviceCountError>),
    /// A setting from the environment is invalid (it names the variable).
    #[error(transparent)]
    Setting(#[from] AgentTimeoutError),
    /// What the VMM said (boxed: a VMM error is large, and every call
    /// here returns this).
    #[error(transparent)]
    Vmm(Box<VmError>),
    #[error("vm `{vm}` was stopped while waiting for its agent")]
    KilledWaiting { vm: String },
    /// The VM stopped on its own (`when` says during what); `hint` is what
    /// a known cause on this host needs.
    #[error(
        "the VM stopped {when} ({why}); last console lines:\n{console_tail}{}",
        hint.map(|h| format!("\n{h}")).unwrap_or_default()
    )]
    GuestStopped {
        when: &'static str,
        why: String,
        console_tail: String,
        hint: Option<&'static str>,
    },
    /// No Hello within the agent timeout: what was tried, how far the
    /// kernel got, what to check (boxed: it carries the console tail).
    #[error(transparent)]
    NoHello(Box<NoHello>),
    /// The guest kernel panicked first.
    #[error(transparent)]
    Panicked(KernelPanic),
    #[error("initial_time")]
    InitialTime(#[source] ClientError),
    /// A reset ran, and then no agent answered (the inner error says why).
    #[error("the guest was reset, but {}", crate::error_chain::flatten(.0.as_ref()))]
    ResetUnanswered(Box<KvmError>),
    #[error(
        "the guest rebooted instead of powering off: its kernel took Ctrl+Alt+Del \
         as a reboot because init left it on (an init that handles the power button \
         calls reboot(LINUX_REBOOT_CMD_CAD_OFF) and powers off on SIGINT; \
         provium-agent as PID 1 does); last console lines:\n{console_tail}"
    )]
    RebootedOnPowerButton { console_tail: String },
    #[error(
        "the guest did not power off within {timeout:?} of the power button ({button}); \
         last console lines:\n{console_tail}"
    )]
    NoPowerOff {
        timeout: Duration,
        /// Which button and what the guest needs to act on it.
        button: &'static str,
        console_tail: String,
    },
    #[error(
        "NIC {ifname}: a kvm VM's NICs are virtio-net devices, not host TAPs: a booted kvm VM \
         gets a new NIC in one of its NIC slots (Guest::add_nic), or attach the bridge before vm:boot()"
    )]
    NicAfterBoot { ifname: String },
}

/// Overrides how long `connect` waits for the agent's Hello (seconds).
pub use crate::settings::AGENT_TIMEOUT_ENV;
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(60);
/// The default agent timeout on kvm_pvm: there the emulated guest kernel
/// takes 190-350 s to reach init with a 2 MB initrd (DESIGN.md), and a
/// fork+exec costs seconds.
pub const DEFAULT_AGENT_TIMEOUT_KVM_PVM: Duration = Duration::from_secs(600);
/// Console lines an agent failure quotes.
pub const ERROR_CONSOLE_LINES: usize = 20;
/// What Linux prints in `kernel_power_off()` before it cuts the power, or,
/// with no ACPI (no `pm_power_off`), halts for good.
pub const KERNEL_POWER_DOWN: &str = "reboot: Power down";
/// What Linux prints in `kernel_halt()`. `reboot(LINUX_REBOOT_CMD_POWER_OFF)`
/// becomes a halt when the kernel has no `pm_power_off` (a kernel without
/// ACPI, or booted with `acpi=off`), so its `poweroff -f` ends here.
pub const KERNEL_HALTED: &str = "reboot: System halted";
/// How long `power_button` waits for the guest to power off.
pub const DEFAULT_POWER_OFF_TIMEOUT: Duration = Duration::from_secs(30);
/// The same on kvm_pvm, which emulates every guest kernel instruction: an
/// init's graceful shutdown (signals, its wait for processes to exit, sync,
/// the kernel's own power-off path) took over 30 s there with a build
/// running beside it.
pub const DEFAULT_POWER_OFF_TIMEOUT_KVM_PVM: Duration = Duration::from_secs(180);

/// The agent timeout: `PROVIUM_KVM_AGENT_TIMEOUT` (seconds, read once into
/// [`Settings`]), else 60 s ([`DEFAULT_AGENT_TIMEOUT_KVM_PVM`] on kvm_pvm).
pub fn agent_timeout(settings: &Settings) -> Result<Duration, AgentTimeoutError> {
    match settings.kvm_agent_timeout.as_deref() {
        None if settings.host_kvm_pvm => Ok(DEFAULT_AGENT_TIMEOUT_KVM_PVM),
        None => Ok(DEFAULT_AGENT_TIMEOUT),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| AgentTimeoutError { value: v.into() }),
    }
}

/// `PROVIUM_KVM_AGENT_TIMEOUT` is not a positive number of seconds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{AGENT_TIMEOUT_ENV}={value:?}: expected seconds, e.g. 120")]
pub struct AgentTimeoutError {
    /// The variable's value, as set.
    pub value: String,
}

impl From<VmError> for KvmError {
    fn from(e: VmError) -> Self {
        KvmError::Vmm(Box::new(e))
    }
}

/// A guest on the microVMM.
pub struct KvmMachine {
    name: String,
    vm: Vm,
    vsock: VsockHost,
    /// The console channel's host side, when the profile's agent_channel
    /// chose it (then the VM has no vsock device and `vsock` is unused).
    console: Option<ConsoleHost>,
    cid: u32,
    killed: AtomicBool,
    agent_timeout: Duration,
    power_off_timeout: Duration,
    initial_time: Option<f64>,
    /// Console bytes written before the current boot started (its output
    /// is what follows).
    boot_log_mark: AtomicU64,
    /// The environment this VM was made with (`MachineSpec::settings`).
    settings: Settings,
    /// The profile's kernel and `modules`, for `kernel check`'s verdict in
    /// the "no Hello" error.
    kernel_check: Option<(std::path::PathBuf, Option<std::path::PathBuf>)>,
    /// Its disk and NIC slots (devices given after boot, `slots.rs`).
    slots: slots::Slots,
}

/// A VM's virtio devices (boot devices plus slots) past its transport's
/// limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "vm `{vm}` needs {devices} virtio devices ({slots} of them the disk_slots and nic_slots \
     of profile `{profile}`), and the {transport} transport fits at most {max}; lower \
     `disk_slots`/`nic_slots` in [profiles.{profile}], give the VM fewer disks or NICs at \
     boot{pci_hint}"
)]
pub struct DeviceCountError {
    vm: String,
    profile: String,
    devices: usize,
    slots: usize,
    transport: &'static str,
    max: usize,
    /// `, or use transport = "pci"` on mmio.
    pci_hint: &'static str,
}

/// Refuses, before anything is built, a VM whose boot devices plus slots
/// exceed its transport's device limit (18 on virtio-mmio: one IOAPIC pin
/// each; 31 on virtio-pci), naming the profile keys that fix it: the
/// VMM's own refusal would name neither.
fn check_device_count(
    cfg: &provium_vmm::VmConfig,
    vm: &str,
    profile: &str,
) -> Result<(), KvmError> {
    let devices = cfg.virtio_device_count();
    let max = cfg.transport.max_devices();
    if devices <= max {
        return Ok(());
    }
    let mmio = cfg.transport == provium_vmm::vmm_config::VirtioTransportKind::Mmio;
    Err(KvmError::TooManyDevices(Box::new(DeviceCountError {
        vm: vm.to_string(),
        profile: profile.to_string(),
        devices,
        slots: cfg.disk_slots.len() + cfg.nic_slots.len(),
        transport: cfg.transport.name(),
        max,
        pci_hint: if mmio {
            ", or use transport = \"pci\" (31 devices) with a kernel that has virtio-pci"
        } else {
            ""
        },
    })))
}

impl KvmMachine {
    /// Its disk and NIC slots.
    pub fn slots(&self) -> &slots::Slots {
        &self.slots
    }

    /// Sets guest interface `ifname`'s MAC through the agent (`ip link set
    /// … address`: a NIC slot's MAC is fixed at probe, and copies of one
    /// fixture share it, so a slot joining a bridge takes the member's).
    pub fn set_guest_mac(
        &self,
        ifname: &str,
        mac: provium_netsetup::MacAddr,
    ) -> Result<(), KvmError> {
        use crate::client::AgentOps;
        // `ip` (iproute2, busybox) first; busybox's `ip` needs AF_PACKET
        // for an address (the probe kernel has none: "ip: socket: Address
        // family not supported by protocol"), and `ifconfig` sets it with
        // SIOCSIFHWADDR on an AF_INET socket. virtio_net takes a live
        // change (IFF_LIVE_ADDR_CHANGE).
        let script = format!(
            "ip link set dev {ifname} address {mac} 2>/dev/null || ifconfig {ifname} hw ether {mac}"
        );
        let client = self.connect()?;
        let out = client
            .exec(provium_protocol::op::ExecSpec {
                run: provium_protocol::op::CommandSpec::shell(script.clone()),
                timeout_ms: Some(120_000),
            })
            .map_err(|source| KvmError::GuestMac {
                ifname: ifname.to_string(),
                detail: crate::error_chain::flatten(&source),
            })?;
        if !out.success() {
            return Err(KvmError::GuestMac {
                ifname: ifname.to_string(),
                detail: format!(
                    "`{script}` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(())
    }

    /// Prepares the VM of `spec` on `profile` with guest CID `cid`, without
    /// running it (subscribe to its console first, then `start`, or
    /// `restore_from` a snapshot).
    /// A boot takes its RAM and KVM VM from `prepared` when one is ready
    /// there (`provium_vmm::PreparedVms`).
    pub fn build(
        spec: &MachineSpec,
        profile: &Profile,
        cid: u32,
        prepared: Option<&provium_vmm::PreparedVms>,
    ) -> Result<KvmMachine, KvmError> {
        let agent_timeout = agent_timeout(&spec.settings)?;
        let agent_timeout = spec.agent_timeout.unwrap_or(agent_timeout);
        let (mut cfg, vsock) = config::vm_config(profile, spec, cid)?;
        cfg.prepared = prepared.cloned();
        let console = cfg.console.clone();
        let (slots, disk_slots, nic_slots) = slots::Slots::new(
            &spec.vm_name,
            &profile.name,
            spec.disks.len(),
            spec.nics.len(),
            profile.disk_slots,
            profile.nic_slots,
            &spec.slot_disks,
            &spec.slot_nics,
        )?;
        cfg.disk_slots = disk_slots;
        cfg.nic_slots = nic_slots;
        check_device_count(&cfg, &spec.vm_name, &profile.name)?;
        let vm = Vm::new(cfg)?;
        Ok(KvmMachine {
            name: spec.vm_name.clone(),
            vm,
            vsock,
            console,
            cid,
            killed: AtomicBool::new(false),
            agent_timeout,
            power_off_timeout: if spec.settings.host_kvm_pvm {
                DEFAULT_POWER_OFF_TIMEOUT_KVM_PVM
            } else {
                DEFAULT_POWER_OFF_TIMEOUT
            },
            initial_time: spec.initial_time,
            boot_log_mark: AtomicU64::new(0),
            settings: spec.settings.clone(),
            kernel_check: profile.kernel.clone().map(|k| (k, profile.modules.clone())),
            slots,
        })
    }

    /// Runs the snapshot at `path` in a VM made by `build` instead of
    /// booting it (`connect` then reaches its agent anew: vsock
    /// connections do not survive a restore). Its RAM is the restore
    /// image's copy in `ram_cache`, shared with the run's other restores of
    /// that image.
    pub fn restore_from(
        &self,
        path: &std::path::Path,
        ram_cache: &RestoreRamCache,
    ) -> Result<(), KvmError> {
        Ok(self.vm.restore_sharing(path, ram_cache)?)
    }

    /// Writes a snapshot of the running VM to `path` with the caller's
    /// `extra` sections; returns its size in bytes.
    pub fn snapshot_to(
        &self,
        path: &std::path::Path,
        extra: &[(&str, Vec<u8>)],
    ) -> Result<u64, KvmError> {
        Ok(self.vm.snapshot_with(path, extra).map(|s| s.file_bytes)?)
    }

    /// Replaces the agent timeout (`PROVIUM_KVM_AGENT_TIMEOUT` otherwise).
    pub fn with_agent_timeout(mut self, t: Duration) -> KvmMachine {
        self.agent_timeout = t;
        self
    }

    /// Replaces how long `power_button` waits for the guest to power off.
    pub fn with_power_off_timeout(mut self, t: Duration) -> KvmMachine {
        self.power_off_timeout = t;
        self
    }

    /// Boots a VM made by `build`.
    pub fn start(&self) -> Result<(), KvmError> {
        Ok(self.vm.boot()?)
    }

    /// The VMM's VM (lifecycle, console, memory).
    pub fn vm(&self) -> &Vm {
        &self.vm
    }

    pub fn cid(&self) -> u32 {
        self.cid
    }

    pub fn console(&self) -> Arc<Console> {
        self.vm.console()
    }

    /// The last `max` bytes of the console log (lossy UTF-8).
    pub fn console_tail(&self, max: usize) -> String {
        let log = self.vm.console().log();
        String::from_utf8_lossy(&log[log.len().saturating_sub(max)..]).into_owned()
    }

    /// The console output of the current boot (what the log still holds of it).
    fn boot_log(&self) -> String {
        let console = self.vm.console();
        let log = console.log();
        let since = console
            .total_bytes()
            .saturating_sub(self.boot_log_mark.load(Ordering::SeqCst));
        let keep = usize::try_from(since).unwrap_or(usize::MAX).min(log.len());
        String::from_utf8_lossy(&log[log.len() - keep..]).into_owned()
    }

    fn last_lines(&self, n: usize) -> String {
        let log = self.boot_log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(n)..];
        if tail.is_empty() {
            "(the console is empty: the kernel printed nothing on ttyS0)".into()
        } else {
            tail.join("\n")
        }
    }

    /// Reaches the agent over vsock and does the handshake, retrying until
    /// the agent timeout; then applies `initial_time`.
    pub fn connect(&self) -> Result<AgentClient, KvmError> {
        let start = Instant::now();
        let deadline = start + self.agent_timeout;
        let mut init_seen: Option<String> = None;
        let mut last = String::from("no attempt yet");
        loop {
            if self.killed.load(Ordering::SeqCst) {
                return Err(KvmError::KilledWaiting {
                    vm: self.name.clone(),
                });
            }
            match self.vm.state() {
                VmState::Booted => {}
                VmState::Paused => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                s => {
                    let internal =
                        matches!(self.vm.stop_reason(), Some(StopReason::InternalError(_)));
                    let after_init = init_line(&self.boot_log()).is_some();
                    let hint = (internal && after_init && self.settings.host_kvm_pvm)
                        .then_some(KVM_PVM_INTERNAL_ERROR_HINT);
                    return Err(self.stopped("before its agent answered", s, hint));
                }
            }
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Err(KvmError::NoHello(Box::new(
                    self.no_hello(&last, init_seen.as_deref()),
                )));
            }
            match self.dial(left.min(Duration::from_secs(2))) {
                Ok(stream) => {
                    let opts = ClientOptions {
                        handshake_timeout: left
                            .clamp(Duration::from_secs(1), Duration::from_secs(10)),
                        // A guest's frame arrives as vsock packets, at the
                        // pace of its kernel (emulated on kvm_pvm) and not
                        // at all while it is paused: give a frame that long
                        // before calling it stalled.
                        frame_stall_timeout: agent_timeout(&self.settings)
                            .unwrap_or(DEFAULT_AGENT_TIMEOUT)
                            .max(Duration::from_secs(120)),
                        ..ClientOptions::default()
                    };
                    match AgentClient::handshake(stream, opts) {
                        Ok(client) => return self.after_hello(client),
                        Err(e) => last = format!("handshake: {}", crate::error_chain::flatten(&e)),
                    }
                }
                Err((e, waited)) => {
                    last = e;
                    if !waited {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
            let log = self.boot_log();
            if log.contains("Kernel panic") {
                // Let the rest of the panic message arrive.
                std::thread::sleep(Duration::from_secs(1));
                return Err(KvmError::Panicked(KernelPanic::from_boot_log(
                    &self.boot_log(),
                    self.settings.host_kvm_pvm,
                    self.last_lines(ERROR_CONSOLE_LINES),
                )));
            }
            if init_seen.is_none() {
                init_seen = init_line(&log);
            }
        }
    }

    /// One attempt to reach the agent's channel within `timeout`: the host
    /// end of a vsock connection, or of a console port session. An error
    /// says why, and whether the attempt waited its whole timeout.
    fn dial(&self, timeout: Duration) -> Result<std::os::unix::net::UnixStream, (String, bool)> {
        match &self.console {
            Some(c) => c.connect(timeout).map_err(|e| {
                let waited = matches!(e, ConsoleConnectError::Timeout { .. });
                (crate::error_chain::flatten(&e), waited)
            }),
            None => self.vsock.connect(AGENT_VSOCK_PORT, timeout).map_err(|e| {
                let waited = matches!(e, VsockConnectError::Timeout { .. });
                (e.to_string(), waited)
            }),
        }
    }

    /// The channel this VM's agent is reached on ("vsock" or "console").
    pub fn agent_channel(&self) -> &'static str {
        if self.console.is_some() {
            "console"
        } else {
            "vsock"
        }
    }

    /// The VM stopped `when`, in `state`: its stop reason and console.
    fn stopped(&self, when: &'static str, state: VmState, hint: Option<&'static str>) -> KvmError {
        KvmError::GuestStopped {
            when,
            why: self
                .vm
                .stop_reason()
                .map_or_else(|| state.to_string(), |r| r.to_string()),
            console_tail: self.last_lines(ERROR_CONSOLE_LINES),
            hint,
        }
    }

    fn no_hello(&self, last: &str, init: Option<&str>) -> NoHello {
        let kernel_verdict = self.kernel_check.as_ref().map(|(k, m)| {
            crate::kernel::check(k, m.as_deref()).map_or_else(
                |e| format!("kernel check: {}", crate::error_chain::flatten(&e)),
                |r| r.verdict(),
            )
        });
        let log = self.boot_log();
        let module_failures: Vec<String> = log
            .lines()
            .filter(|l| l.contains(MODULE_LOAD_FAILED))
            .map(str::to_string)
            .collect();
        NoHello {
            cid: self.cid,
            console: self.console.is_some(),
            last: last.to_string(),
            init: init.map(str::to_string),
            timeout: self.agent_timeout,
            kvm_pvm: self.settings.host_kvm_pvm,
            console_tail: self.last_lines(ERROR_CONSOLE_LINES),
            kernel_verdict,
            module_failures,
        }
    }

    fn after_hello(&self, client: AgentClient) -> Result<AgentClient, KvmError> {
        note_channel(self.agent_channel(), client.agent_info().channel());
        if let Some(t) = self.initial_time {
            let ns = (t * 1e9) as i64;
            let ops: &dyn AgentOps = &client;
            ops.clock_set(ns).map_err(KvmError::InitialTime)?;
        }
        Ok(client)
    }

    /// Stops the VM now; safe to call more than once, from any thread.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        let _ = self.vm.shutdown();
    }

    pub fn pause(&self) -> Result<(), KvmError> {
        Ok(self.vm.pause()?)
    }

    pub fn resume(&self) -> Result<(), KvmError> {
        Ok(self.vm.resume()?)
    }

    /// Warm reset through the boot path, then a new agent connection: the
    /// agent restarts with the guest, so the old connection is gone. Fails
    /// like `connect` (with this boot's console) when no Hello comes.
    pub fn reset(&self) -> Result<AgentClient, KvmError> {
        self.boot_log_mark
            .store(self.vm.console().total_bytes(), Ordering::SeqCst);
        self.vm.reset()?;
        self.connect()
            .map_err(|e| KvmError::ResetUnanswered(Box::new(e)))
    }

    /// `vm:power_button()`: an ACPI power-button event when the guest's
    /// ACPI took the GED's interrupt, else Ctrl+Alt+Del on the i8042
    /// (docs/vmm.md, "Power button"), then waits up to the power-off timeout
    /// for the guest to power off: a write to the ACPI sleep control
    /// register or the PM1a control port, or the kernel's "reboot: Power
    /// down" (then it halts, and the VM is shut down here).
    /// The error says what the guest did instead.
    pub fn power_button(&self) -> Result<(), KvmError> {
        let boots = self.vm.boot_count();
        let button = match self.vm.power_button()? {
            provium_vmm::PowerButton::Acpi => {
                "an ACPI power-button event through the GED: the kernel needs ACPI_BUTTON \
                 (KEY_POWER on its \"Power Button\" input device), and init must power off \
                 on it (provium-agent as PID 1 does)"
            }
            provium_vmm::PowerButton::CtrlAltDel => {
                "Ctrl+Alt+Del with IRQ 1 on the i8042: the kernel needs SERIO_I8042, \
                 KEYBOARD_ATKBD and VT, and init must power off on SIGINT"
            }
        };
        let deadline = Instant::now() + self.power_off_timeout;
        loop {
            let state = self
                .vm
                .wait_for_state(VmState::Shutdown, Duration::from_millis(50));
            match state {
                VmState::Shutdown if self.vm.stop_reason() == Some(StopReason::GuestPowerOff) => {
                    return Ok(())
                }
                VmState::Shutdown | VmState::Dead => {
                    return Err(self.stopped(
                        "after the power button without powering off",
                        state,
                        None,
                    ))
                }
                _ => {}
            }
            // A kernel without ACPI has no way to cut the power: after
            // "reboot: Power down" (or "reboot: System halted", when the
            // power-off request became a halt) it halts. That line is its
            // power-off.
            let log = self.boot_log();
            if log.contains(KERNEL_POWER_DOWN) || log.contains(KERNEL_HALTED) {
                return Ok(self.vm.shutdown()?);
            }
            if self.vm.boot_count() != boots {
                return Err(KvmError::RebootedOnPowerButton {
                    console_tail: self.last_lines(ERROR_CONSOLE_LINES),
                });
            }
            if Instant::now() >= deadline {
                return Err(KvmError::NoPowerOff {
                    timeout: self.power_off_timeout,
                    button,
                    console_tail: self.last_lines(ERROR_CONSOLE_LINES),
                });
            }
        }
    }
}

/// Says once per process and channel which channel the agent answered on
/// (and, if the agent said another, that too).
fn note_channel(used: &'static str, agent_says: Option<&str>) {
    static VSOCK: std::sync::Once = std::sync::Once::new();
    static CONSOLE: std::sync::Once = std::sync::Once::new();
    let once = if used == "console" { &CONSOLE } else { &VSOCK };
    once.call_once(|| match agent_says {
        Some(a) if a != used => {
            eprintln!("provium: agent channel: {used} (the agent says it serves on {a})")
        }
        _ => eprintln!("provium: agent channel: {used}"),
    });
}

/// The kernel's `Run <path> as init process` line, if printed.
pub fn init_line(log: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains("Run /") && l.contains(" as init process"))
        .map(|l| {
            let from = l.find("Run /").unwrap_or(0);
            l[from..].trim_end().to_string()
        })
}

/// What the kvm_pvm shims are and where they live, for error messages.
pub const KVM_PVM_SHIMS: &str =
    "a guest kernel with the kvm_pvm shims (the SYSCALL-as-#PF and FWAIT \
     patches in scripts/probe-kernel/, see docs/vmm.md; scripts/build-probe-kernel.sh builds one)";

/// Added to a KVM internal error after init started on kvm_pvm: the FWAIT
/// the emulator lacks is the known cause there.
pub const KVM_PVM_INTERNAL_ERROR_HINT: &str =
    "on this kvm_pvm host a KVM internal error after init \
     started is what a guest kernel without the FWAIT shim does at init's first exec or exit \
     (kvm_pvm's emulator has no fwait); the guest needs a kernel with the kvm_pvm shims (the \
     SYSCALL-as-#PF and FWAIT patches in scripts/probe-kernel/, see docs/vmm.md)";

/// An agent that never said Hello: what was tried, how far the kernel got,
/// what to check (on kvm_pvm: the shims), the console tail. Its message is
/// [`no_hello_message`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", no_hello_message(self))]
pub struct NoHello {
    pub cid: u32,
    /// The agent was sought on the console channel, not vsock.
    pub console: bool,
    /// The last connect or handshake error, flattened (the attempt was
    /// retried until the timeout: only the last one's words are kept).
    pub last: String,
    /// The kernel's "Run ... as init process" line, if the console has it.
    pub init: Option<String>,
    pub timeout: Duration,
    pub kvm_pvm: bool,
    /// The current boot's last console lines.
    pub console_tail: String,
    /// `kernel check`'s one-line verdict on the profile's kernel.
    pub kernel_verdict: Option<String>,
    /// The agent's console lines about modules it could not load.
    pub module_failures: Vec<String>,
}

/// How the agent's console line for a module it could not load starts
/// (agent/src/modules.rs `FAILED_PREFIX`).
pub const MODULE_LOAD_FAILED: &str = "provium-agent: cannot load module";

/// The error for an agent that never said Hello: what was tried, how far
/// the kernel got, what to check (on kvm_pvm: the shims), the console tail.
pub fn no_hello_message(n: &NoHello) -> String {
    let place = if n.console {
        format!(
            "virtio-console port {AGENT_PORT_NAME} (agent_channel = \"console\"; the kernel \
             needs CONFIG_VIRTIO_CONSOLE)"
        )
    } else {
        format!("vsock port {AGENT_VSOCK_PORT} of guest CID {}", n.cid)
    };
    let mut msg = format!(
        "no Hello from the agent on {place} (last attempt: {}) \
         within {:?} ({AGENT_TIMEOUT_ENV} to wait longer)",
        n.last, n.timeout
    );
    match (n.init.as_deref(), n.kvm_pvm) {
        (Some(line), true) => msg.push_str(&format!(
            "; the kernel reached init (\"{line}\") but the agent never answered: this host's KVM is \
             kvm_pvm, where Linux user space runs only on {KVM_PVM_SHIMS}; without them init's first \
             system call faults (a kernel panic, \"Attempted to kill init\") or the VM stops at an \
             FWAIT (KVM internal error). With such a kernel, check the agent starts in this initrd \
             (rdinit=, a static agent) and that the wait covers the emulated boot"
        )),
        (Some(line), false) => msg.push_str(&format!(
            "; the kernel reached init (\"{line}\") but the agent never answered: check the agent \
             starts in this initrd (rdinit=, a static agent)"
        )),
        (None, true) => msg.push_str(&format!(
            "; the kernel never reached init (this host's KVM is kvm_pvm, where guest kernel code is \
             emulated and a boot to init takes minutes: wait longer; Linux user space there also needs \
             {KVM_PVM_SHIMS})"
        )),
        (None, false) => msg.push_str("; the kernel never reached init"),
    }
    for f in &n.module_failures {
        msg.push_str(&format!("; {}", f.trim()));
    }
    if let Some(v) = &n.kernel_verdict {
        msg.push_str(&format!("; {v}"));
    }
    msg.push_str(&format!("; last console lines:\n{}", n.console_tail));
    msg
}

/// A guest kernel panic before the Hello. On kvm_pvm, init killed by
/// SIGSEGV (`exitcode=0x0000000b`) is how a kernel without the shims ends
/// (its init's first `syscall` faults), so the shims are named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the guest kernel panicked before its agent answered{}; last console lines:\n{console_tail}",
    sigsegv_init_hint(*.init_sigsegv_on_kvm_pvm)
)]
pub struct KernelPanic {
    /// On kvm_pvm, init was killed by SIGSEGV: the shims are missing.
    pub init_sigsegv_on_kvm_pvm: bool,
    /// The current boot's last console lines.
    pub console_tail: String,
}

fn sigsegv_init_hint(on_kvm_pvm: bool) -> String {
    if on_kvm_pvm {
        format!(
            " (init was killed by SIGSEGV: on this kvm_pvm host that is how a kernel without the \
             kvm_pvm shims ends, at init's first system call; it needs {KVM_PVM_SHIMS})"
        )
    } else {
        String::new()
    }
}

impl KernelPanic {
    /// The panic the boot log shows, on this host.
    pub fn from_boot_log(boot_log: &str, kvm_pvm: bool, console_tail: String) -> KernelPanic {
        KernelPanic {
            init_sigsegv_on_kvm_pvm: kvm_pvm
                && boot_log.contains("Attempted to kill init! exitcode=0x0000000b"),
            console_tail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CidAllocator;

    #[test]
    fn the_agent_timeout_follows_the_setting_then_the_settled_host() {
        let hardware = Settings::default();
        assert_eq!(agent_timeout(&hardware), Ok(DEFAULT_AGENT_TIMEOUT));
        let kvm_pvm = Settings {
            host_kvm_pvm: true,
            ..Settings::default()
        };
        assert_eq!(agent_timeout(&kvm_pvm), Ok(DEFAULT_AGENT_TIMEOUT_KVM_PVM));
        let set = |v: &str| Settings {
            kvm_agent_timeout: Some(v.into()),
            ..kvm_pvm.clone()
        };
        assert_eq!(agent_timeout(&set(" 9 ")), Ok(Duration::from_secs(9)));
        for bad in ["0", "-1", "inf", "soon"] {
            let e = agent_timeout(&set(bad)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("PROVIUM_KVM_AGENT_TIMEOUT={bad:?}: expected seconds, e.g. 120")
            );
        }
    }

    fn no_hello(init: Option<&str>, kvm_pvm: bool) -> String {
        no_hello_message(&NoHello {
            cid: 7,
            console: false,
            last: "connection refused".into(),
            init: init.map(str::to_string),
            timeout: Duration::from_secs(600),
            kvm_pvm,
            console_tail: "[ 1.0] last line".into(),
            kernel_verdict: None,
            module_failures: Vec::new(),
        })
    }

    #[test]
    fn no_hello_on_kvm_pvm_names_the_shims() {
        let init = Some("Run /sbin/provium-agent as init process");
        let m = no_hello(init, true);
        for want in [
            "no Hello from the agent on vsock port 1024 of guest CID 7",
            "(last attempt: connection refused)",
            "within 600s (PROVIUM_KVM_AGENT_TIMEOUT to wait longer)",
            "the kernel reached init (\"Run /sbin/provium-agent as init process\")",
            "kvm_pvm",
            "SYSCALL-as-#PF and FWAIT patches in scripts/probe-kernel/",
            "docs/vmm.md",
            "rdinit=, a static agent",
            "; last console lines:\n[ 1.0] last line",
        ] {
            assert!(m.contains(want), "missing {want:?} in {m}");
        }
        assert!(!m.contains("cannot run"), "user space does run there: {m}");
        let m = no_hello(None, true);
        assert!(m.contains("the kernel never reached init"), "{m}");
        assert!(
            m.contains("emulated") && m.contains("scripts/probe-kernel/"),
            "{m}"
        );
        assert!(m.ends_with("last console lines:\n[ 1.0] last line"), "{m}");
    }

    #[test]
    fn no_hello_on_the_console_channel_names_the_port() {
        let m = no_hello_message(&NoHello {
            cid: 7,
            console: true,
            last: "the guest did not open console port `org.provium.agent` within 2000 ms".into(),
            init: None,
            timeout: Duration::from_secs(60),
            kvm_pvm: false,
            console_tail: "x".into(),
            kernel_verdict: None,
            module_failures: Vec::new(),
        });
        assert!(
            m.starts_with(
                "no Hello from the agent on virtio-console port org.provium.agent \
                 (agent_channel = \"console\"; the kernel needs CONFIG_VIRTIO_CONSOLE)"
            ),
            "{m}"
        );
        assert!(!m.contains("CID"), "{m}");
    }

    #[test]
    fn no_hello_carries_the_kernel_verdict_and_failed_modules() {
        let failed = "provium-agent: cannot load module vsock (/lib/provium/modules/03-vsock.ko): ENOEXEC (Exec format error (os error 8))";
        let m = no_hello_message(&NoHello {
            cid: 7,
            console: false,
            last: "connection refused".into(),
            init: None,
            timeout: Duration::from_secs(60),
            kvm_pvm: false,
            console_tail: "tail".into(),
            kernel_verdict: Some("kernel check of /k (6.1): a boot cannot reach the agent (vsock + virtio transport absent)".into()),
            module_failures: vec![failed.into()],
        });
        assert!(
            m.contains(&format!(
                "; {failed}; kernel check of /k (6.1): a boot cannot reach the agent"
            )),
            "{m}"
        );
        assert!(m.ends_with("; last console lines:\ntail"), "{m}");
        assert!(failed.starts_with(MODULE_LOAD_FAILED));
    }

    #[test]
    fn no_hello_on_hardware_kvm_keeps_its_hints() {
        let m = no_hello(Some("Run /init as init process"), false);
        assert!(
            m.contains("the kernel reached init (\"Run /init as init process\") but the agent never answered: check the agent starts in this initrd (rdinit=, a static agent)"),
            "{m}"
        );
        assert!(!m.contains("kvm_pvm") && !m.contains("probe-kernel"), "{m}");
        let m = no_hello(None, false);
        assert!(m.contains("within 600s (PROVIUM_KVM_AGENT_TIMEOUT to wait longer); the kernel never reached init; last console lines:"), "{m}");
        assert!(!m.contains("kvm_pvm"), "{m}");
    }

    #[test]
    fn a_sigsegv_init_panic_on_kvm_pvm_names_the_shims() {
        let log = "Run /init as init process\nKernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b\n";
        let m = KernelPanic::from_boot_log(log, true, "tail".into()).to_string();
        assert!(
            m.starts_with(
                "the guest kernel panicked before its agent answered (init was killed by SIGSEGV"
            ),
            "{m}"
        );
        assert!(
            m.contains("scripts/probe-kernel/") && m.ends_with("; last console lines:\ntail"),
            "{m}"
        );
        for (log, kvm_pvm) in [
            (log, false),
            (
                "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000000",
                true,
            ),
        ] {
            assert_eq!(
                KernelPanic::from_boot_log(log, kvm_pvm, "tail".into()).to_string(),
                "the guest kernel panicked before its agent answered; last console lines:\ntail"
            );
        }
    }

    #[test]
    fn a_stopped_guest_says_when_why_and_what_fixes_it() {
        let e = KvmError::GuestStopped {
            when: "before its agent answered",
            why: "KVM internal error".into(),
            console_tail: "[ 1.0] last".into(),
            hint: Some("the hint"),
        };
        assert_eq!(
            e.to_string(),
            "the VM stopped before its agent answered (KVM internal error); last console \
             lines:\n[ 1.0] last\nthe hint"
        );
        let e = KvmError::NoPowerOff {
            timeout: Duration::from_secs(2),
            button: "Ctrl+Alt+Del",
            console_tail: "tail".into(),
        };
        let m = e.to_string();
        assert!(
            m.starts_with(
                "the guest did not power off within 2s of the power button (Ctrl+Alt+Del)"
            ),
            "{m}"
        );
        assert!(m.ends_with("last console lines:\ntail"), "{m}");
        let e = KvmError::ResetUnanswered(Box::new(KvmError::KilledWaiting { vm: "v".into() }));
        assert_eq!(
            e.to_string(),
            "the guest was reset, but vm `v` was stopped while waiting for its agent"
        );
    }

    #[test]
    fn init_line_is_found() {
        let log = "[ 1.0] foo\n[ 35.2] Run /sbin/provium-agent as init process\r\n[ 35.3] x\n";
        assert_eq!(
            init_line(log).as_deref(),
            Some("Run /sbin/provium-agent as init process")
        );
        assert_eq!(init_line("nothing"), None);
    }

    /// A kvm-backend VM of the tiny guest (no agent: it cannot answer one)
    /// snapshotted through the harness path and restored into a new
    /// `Machine`: what the kvm backend's vm:snapshot()/vm:restore() do
    /// before the agent reconnects (that step needs a Linux guest with user
    /// space: on kvm_pvm, a kernel with the kvm_pvm shims).
    #[test]
    fn tiny_guest_snapshot_restores_into_a_new_machine() {
        if !std::path::Path::new("/dev/kvm").exists() {
            eprintln!("SKIP tiny_guest_snapshot_restores_into_a_new_machine: no /dev/kvm");
            return;
        }
        use crate::backend::Backend;
        let d = tempfile::tempdir().unwrap();
        let kernel = d.path().join("bzImage");
        std::fs::write(&kernel, provium_vmm::tiny_guest::BZIMAGE).unwrap();
        let profile = Profile {
            disk_slots: crate::config::profile::DEFAULT_DISK_SLOTS,
            nic_slots: crate::config::profile::DEFAULT_NIC_SLOTS,
            name: "tiny".into(),
            kernel: Some(kernel),
            initrd: None,
            cmdline: "console=ttyS0".into(),
            cmdline_file: None,
            guest_os: "linux".into(),
            transport: Default::default(),
            inject_agent: false,
            agent_overlay_path: None,
            agent_channel: Default::default(),
            modules: None,
            build: None,
            build_out: d.path().into(),
        };
        let backend = KvmBackend::new(CidAllocator::new());
        let spec = MachineSpec {
            vm_name: "a".into(),
            profile_name: "tiny".into(),
            profile: Some(profile.clone()),
            memory_bytes: 32 << 20,
            cpus: 1,
            ..MachineSpec::default()
        };
        let a = backend.boot(&spec).unwrap();
        let ready = provium_vmm::tiny_guest::READY.as_bytes();
        let a_console = a.console().expect("kvm has a console");
        assert!(a_console.wait_for(ready, 1, Duration::from_secs(60)));
        let path = d.path().join("a.snap");
        let decl = crate::lua::snapshot::VmDecl {
            name: "a".into(),
            profile: "tiny".into(),
            memory_bytes: 32 << 20,
            cpus: 1,
            rng_seed: Some(7),
        };
        let extra = [(crate::lua::snapshot::VM_DECL_SECTION, decl.to_json())];
        let bytes = a.snapshot_to(&path, &extra).unwrap();
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
        a.kill();
        // The harness reads its own section back, as fixtures do.
        let back = crate::lua::snapshot::VmDecl::read(&path).unwrap();
        assert_eq!(
            back, decl,
            "the declaration reads back whole, rng_seed included"
        );

        let spec = MachineSpec {
            vm_name: "b".into(),
            ..spec
        };
        let b = backend.restore(&spec, &path).unwrap();
        assert_ne!(b.cid(), a.cid(), "a restored VM gets its own CID");
        let console = b.console().expect("kvm has a console");
        assert!(console.log_string().contains("READY"), "tail restored");
        console.write_input(b"restored-echo").unwrap();
        assert!(
            console.wait_for(b"restored-echo", 1, Duration::from_secs(60)),
            "the restored guest runs: {}",
            console.log_string()
        );
        // A second restore of the fixture in this run (this backend) maps
        // the copy of its image the first one made.
        let c = backend
            .restore(
                &MachineSpec {
                    vm_name: "c".into(),
                    ..spec.clone()
                },
                &path,
            )
            .unwrap();
        let c_console = c.console().expect("kvm has a console");
        c_console.write_input(b"c-echo").unwrap();
        assert!(c_console.wait_for(b"c-echo", 1, Duration::from_secs(60)));
        assert_eq!(
            backend.ram_cache().copies_made(),
            1,
            "two restores of one image in one run: one copy of its pages"
        );
        c.kill();
        // Another shape is refused by name.
        let bigger = MachineSpec {
            memory_bytes: 64 << 20,
            ..spec
        };
        let e = backend
            .restore(&bigger, &path)
            .err()
            .expect("64 MiB VM from a 32 MiB snapshot");
        let e = crate::error_chain::flatten(&e);
        assert!(e.contains("different VM shape"), "{e}");
        b.kill();
    }

    #[test]
    fn boot_devices_plus_slots_past_the_transport_limit_name_the_keys() {
        use provium_vmm::vmm_config::{BlockSlot, VirtioTransportKind};
        let mut cfg = provium_vmm::VmConfig::new(provium_vmm::BootSource {
            kernel: provium_vmm::KernelImage::Path("k".into()),
            initrd: None,
            cmdline: String::new(),
        });
        cfg.disk_slots = (0..18).map(|_| BlockSlot::empty()).collect();
        assert!(
            check_device_count(&cfg, "v", "linux").is_ok(),
            "18 fit on mmio"
        );
        cfg.rng = Some(Default::default());
        let e = check_device_count(&cfg, "v", "linux")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("vm `v` needs 19 virtio devices (18 of them the disk_slots")
                && e.contains("the mmio transport fits at most 18")
                && e.contains("lower `disk_slots`/`nic_slots` in [profiles.linux]")
                && e.contains("transport = \"pci\""),
            "{e}"
        );
        cfg.transport = VirtioTransportKind::Pci;
        assert!(
            check_device_count(&cfg, "v", "linux").is_ok(),
            "pci fits 31"
        );
        cfg.disk_slots = (0..31).map(|_| BlockSlot::empty()).collect();
        let e = check_device_count(&cfg, "v", "linux")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the pci transport fits at most 31") && !e.contains("use transport"),
            "{e}"
        );
    }
}
