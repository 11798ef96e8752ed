//! `provium bench boot`: VM creation to the agent's Hello, phase by phase,
//! on a profile's kernel (through the backend boundary: the kvm backend)
//! or the built-in tiny guest (a bare VM on the VMM, which has no profile
//! and no agent: it times the VMM itself).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use provium_vmm::boot_timer::{BootMarks, BootTimer, BOOT_TIMER_PORT, GUEST_READY};
use provium_vmm::{tiny_guest, BootSource, Console, KernelImage, Vm, VmConfig, VmError, VmState};

use super::args::{BootArgs, Until};
use super::host::{host_info, kvm_kind};
use super::render::Report;
use super::stats::{Phase, Unit};
use super::{console_tail, RUN_INIT_TEXT};
use crate::backend::{self, Backend, BackendError, BackendKind, Guest, MachineSpec};
use crate::cli::load_config;
use crate::cli::RunArgs;
use crate::config::ConfigError;

/// Why `bench boot` failed: each names the target and step; causes are
/// sources.
#[derive(Debug, thiserror::Error)]
pub enum BootBenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("bench boot: no profile `{name}` in {config} (profiles: {known})")]
    NoProfile {
        name: String,
        config: String,
        known: String,
    },
    #[error("bench boot: profile `{name}` has no kernel")]
    NoKernel { name: String },
    #[error("bench boot: profile `{name}`: kernel {kernel} does not exist")]
    KernelMissing { name: String, kernel: String },
    #[error("bench boot: profile `{name}`")]
    Profile {
        name: String,
        #[source]
        source: Box<BackendError>,
    },
    #[error("bench boot")]
    Create(#[source] Box<BackendError>),
    #[error("bench boot")]
    CreateTiny(#[source] Box<VmError>),
    #[error("bench boot")]
    Start(#[source] Box<BackendError>),
    #[error("bench boot")]
    StartTiny(#[source] Box<VmError>),
    #[error("bench boot {target}: the VM stopped before {until:?} ({why}); console tail:\n{console_tail}")]
    Stopped {
        target: String,
        until: Until,
        why: String,
        console_tail: String,
    },
    #[error("bench boot {target}: no {until:?} mark within {timeout_s} s (--timeout); console tail:\n{console_tail}")]
    NoMark {
        target: String,
        until: Until,
        timeout_s: u64,
        console_tail: String,
    },
    #[error("bench boot {target}")]
    Hello {
        target: String,
        #[source]
        source: Box<BackendError>,
    },
    #[error("bench boot: shutdown")]
    Shutdown(#[source] Box<VmError>),
    #[error(
        "bench boot --tiny-guest: the tiny guest is not Linux and prints no \"Run /init\"; \
         use --until ready (the default) or console"
    )]
    TinyUntilInit,
    #[error("warm-up boot {number}")]
    WarmUp {
        number: usize,
        #[source]
        source: Box<BootBenchError>,
    },
    #[error("boot {number}")]
    Sample {
        number: usize,
        #[source]
        source: Box<BootBenchError>,
    },
}

struct BootTarget {
    name: String,
    /// What is booted (for a profile: as the kvm backend builds it, agent
    /// and `provium.boot_timer=` included when injected).
    boot: BootSource,
    /// A profile boots through the backend boundary (the backend and the
    /// spec each boot is made from); the tiny guest is booted directly.
    kvm: Option<(Arc<dyn Backend>, MachineSpec)>,
    /// Why no agent is in the guest (a profile with `inject_agent = false`,
    /// or no agent binary found); None when it is injected.
    no_agent: Option<String>,
    linux: bool,
    mem_mib: u64,
    shown_kernel: String,
    /// The tiny guest's pool of prepared VMs (`provium_vmm::PreparedVms`),
    /// one for the whole bench as for a test run; `None` with
    /// `--no-prepared`. A profile's boots use its backend's own.
    prepared: Option<provium_vmm::PreparedVms>,
}

fn boot_target(args: &RunArgs, b: &BootArgs) -> Result<BootTarget, BootBenchError> {
    if b.tiny_guest {
        return Ok(BootTarget {
            name: "tiny-guest".into(),
            boot: BootSource {
                kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
                initrd: None,
                cmdline: b
                    .cmdline
                    .clone()
                    .unwrap_or_else(|| "console=ttyS0".to_string()),
            },
            kvm: None,
            no_agent: Some("the tiny guest has no agent".into()),
            linux: false,
            mem_mib: b.mem.unwrap_or(32),
            shown_kernel: format!(
                "tiny guest ({} bytes, built into provium-vmm)",
                tiny_guest::BZIMAGE.len()
            ),
            prepared: (!b.no_prepared).then(provium_vmm::PreparedVms::new),
        });
    }
    let name = b.profile.clone().expect("clap requires a profile");
    let config = load_config(&args.config, &args.settings)?;
    let Some(p) = config.profiles.get(&name) else {
        let known: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
        return Err(BootBenchError::NoProfile {
            name,
            config: args.config.display().to_string(),
            known: if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            },
        });
    };
    let Some(kernel) = p.kernel.clone() else {
        return Err(BootBenchError::NoKernel { name });
    };
    if !kernel.is_file() {
        return Err(BootBenchError::KernelMissing {
            name,
            kernel: kernel.display().to_string(),
        });
    }
    let mem_mib = b.mem.unwrap_or(256);
    // The agent goes in when the profile asks for it and one is found; a
    // missing agent binary still lets the kernel phases be measured.
    let (inject_agent, no_agent) = if !p.inject_agent {
        (
            false,
            Some("the profile has inject_agent = false".to_string()),
        )
    } else {
        match backend::locate_guest_agent(&config.settings) {
            Ok(_) => (true, None),
            Err(e) => (
                false,
                Some(format!(
                    "no agent to inject: {}",
                    crate::error_chain::flatten(&e)
                )),
            ),
        }
    };
    let spec = MachineSpec {
        kernel_cmdline: b.cmdline.clone(),
        inject_agent,
        agent_timeout: Some(Duration::from_secs(b.ready_timeout)),
        settings: config.settings.clone(),
        ..MachineSpec::for_profile(
            &name,
            &name,
            Some(p.clone()),
            mem_mib << 20,
            u32::from(b.cpus),
        )
    };
    // One backend for the whole bench. What is booted is built here only
    // to report it; every boot builds its own (same builder, fresh vsock).
    let kvm = backend::for_kind(BackendKind::Kvm);
    let boot = kvm
        .boot_source(&spec)
        .map_err(|source| BootBenchError::Profile {
            name: name.clone(),
            source: Box::new(source),
        })?
        .expect("the kvm backend boots a kernel");
    Ok(BootTarget {
        name,
        boot,
        kvm: Some((kvm, spec)),
        no_agent,
        linux: true,
        mem_mib,
        shown_kernel: kernel.display().to_string(),
        prepared: None,
    })
}

/// Per-boot samples.
struct BootSample {
    vm_create: Duration,
    marks: BootMarks,
    start: Instant,
    /// Whether the ready wait gave up (Linux guest, no boot-timer write).
    ready_gave_up: bool,
    /// First KVM_RUN to the agent's Hello completing (agent injected and
    /// its ready mark seen).
    hello: Option<Duration>,
}

fn one_boot(
    t: &BootTarget,
    b: &BootArgs,
    until: Until,
    kernel_version: &mut Option<String>,
) -> Result<BootSample, BootBenchError> {
    let timer = BootTimer::new();
    timer.watch_console(RUN_INIT_TEXT);
    let start = Instant::now();
    let machine = match &t.kvm {
        Some((backend, spec)) => {
            let spec = MachineSpec {
                boot_timer: Some(timer.clone()),
                ..spec.clone()
            };
            Booted::Guest(
                backend
                    .create(&spec)
                    .map_err(|e| BootBenchError::Create(Box::new(e)))?,
            )
        }
        None => {
            let mut cfg = VmConfig::new(t.boot.clone());
            cfg.machine.mem_size_mib = t.mem_mib;
            cfg.machine.vcpu_count = b.cpus;
            cfg.boot_timer = Some(timer.clone());
            cfg.prepared = t.prepared.clone();
            Booted::Vm(Vm::new(cfg).map_err(|e| BootBenchError::CreateTiny(Box::new(e)))?)
        }
    };
    let vm_create = start.elapsed();
    machine.start()?;
    let deadline = Instant::now() + Duration::from_secs(b.timeout);
    let reached = |m: &BootMarks| match until {
        Until::Console => m.first_console_byte.is_some(),
        Until::Init => m.console_at(RUN_INIT_TEXT).is_some() || m.guest_ready.is_some(),
        Until::Ready => m.guest_ready.is_some(),
    };
    let ready_grace = Duration::from_secs(b.ready_timeout);
    let mut ready_gave_up = false;
    let marks = loop {
        // Never look at the VM inside the predicate: it runs under the
        // timer's lock, which vCPU threads take while the VM's lock may be
        // held by a teardown waiting for them.
        let m = timer.wait(Duration::from_millis(200), |m| reached(m));
        if reached(&m) {
            break m;
        }
        if until == Until::Ready && t.linux {
            if let Some(init) = m.console_at(RUN_INIT_TEXT) {
                if init.elapsed() >= ready_grace {
                    ready_gave_up = true;
                    break m;
                }
            }
        }
        if let Some(why) = machine.stopped() {
            return Err(BootBenchError::Stopped {
                target: t.name.clone(),
                until,
                why,
                console_tail: console_tail(&machine.console()),
            });
        }
        if Instant::now() >= deadline {
            return Err(BootBenchError::NoMark {
                target: t.name.clone(),
                until,
                timeout_s: b.timeout,
                console_tail: console_tail(&machine.console()),
            });
        }
    };
    // The agent's Hello: only with --until ready and once it marked ready
    // (so it is listening), through the backend's own connect (vsock,
    // retries, handshake), so the number is what a test's boot waits for.
    let mut hello = None;
    if let (Booted::Guest(guest), Some(_)) = (&machine, marks.guest_ready) {
        if t.no_agent.is_none() && until == Until::Ready {
            guest.connect().map_err(|source| BootBenchError::Hello {
                target: t.name.clone(),
                source: Box::new(source),
            })?;
            hello = marks.first_kvm_run.map(|k| k.elapsed());
        }
    }
    if kernel_version.is_none() {
        let log = machine.console().log_string();
        *kernel_version = log
            .lines()
            .find_map(|l| l.find("Linux version ").map(|i| l[i..].trim().to_string()))
            .or_else(|| log.lines().next().map(|l| l.trim().to_string()));
    }
    machine.shutdown()?;
    Ok(BootSample {
        vm_create,
        marks,
        start,
        ready_gave_up,
        hello,
    })
}

/// What one boot runs: a guest of the backend (profiles) or a bare Vm
/// (the tiny guest).
enum Booted {
    Guest(Box<dyn Guest>),
    Vm(Vm),
}

impl Booted {
    fn start(&self) -> Result<(), BootBenchError> {
        match self {
            Booted::Guest(g) => g.start().map_err(|e| BootBenchError::Start(Box::new(e))),
            Booted::Vm(v) => v.boot().map_err(|e| BootBenchError::StartTiny(Box::new(e))),
        }
    }

    /// `None` while it runs; else its stop reason (or state).
    fn stopped(&self) -> Option<String> {
        match self {
            Booted::Guest(g) => g.stopped().map(|s| s.why),
            Booted::Vm(v) => {
                let state = v.state();
                matches!(state, VmState::Dead | VmState::Shutdown).then(|| {
                    v.stop_reason()
                        .map_or_else(|| state.to_string(), |r| r.to_string())
                })
            }
        }
    }

    fn console(&self) -> Arc<Console> {
        match self {
            Booted::Guest(g) => g.console().expect("a kvm guest has a serial console"),
            Booted::Vm(v) => v.console(),
        }
    }

    fn shutdown(&self) -> Result<(), BootBenchError> {
        match self {
            Booted::Guest(g) => {
                g.kill();
                Ok(())
            }
            Booted::Vm(v) => v
                .shutdown()
                .map_err(|e| BootBenchError::Shutdown(Box::new(e))),
        }
    }
}

pub(super) fn bench_boot(args: &RunArgs, b: &BootArgs) -> Result<Report, BootBenchError> {
    let t = boot_target(args, b)?;
    let runs = b.common.runs.unwrap_or(10).max(1);
    let warmup = b.common.warmup.unwrap_or(1);
    let kvm = kvm_kind();
    let kvm_pvm = kvm == "kvm_pvm";
    // On kvm_pvm each emulated boot takes minutes to reach init, and more to
    // user space: stop at init unless asked for more.
    let until = b.until.unwrap_or(if t.linux && kvm_pvm {
        Until::Init
    } else {
        Until::Ready
    });
    if !t.linux && until == Until::Init {
        return Err(BootBenchError::TinyUntilInit);
    }
    let mut kernel_version = None;
    for i in 0..warmup {
        one_boot(&t, b, until, &mut kernel_version).map_err(|e| BootBenchError::WarmUp {
            number: i + 1,
            source: Box::new(e),
        })?;
    }
    let before_samples = t.prepared.as_ref().map(|p| p.hits_and_misses());
    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs {
        samples.push(one_boot(&t, b, until, &mut kernel_version).map_err(|e| {
            BootBenchError::Sample {
                number: i + 1,
                source: Box::new(e),
            }
        })?);
    }

    let mut vm_create = Phase::new(
        "vm_create",
        "Vm::new: open /dev/kvm, check capabilities, start the monitor thread",
        "harness",
        Unit::Ns,
    );
    let mut vmm_setup = Phase::new(
        "vmm_setup",
        "boot() to vCPU 0's first KVM_RUN: RAM, KVM VM, kernel and initrd load, boot params, devices, vCPUs",
        "vmm",
        Unit::Ns,
    );
    let mut to_console = Phase::new(
        "kernel_to_console",
        "first KVM_RUN (kernel entry) to the guest's first console byte",
        "vmm",
        Unit::Ns,
    );
    let mut to_init = Phase::new(
        "kernel_to_init",
        "first KVM_RUN to the console line \"Run /init as init process\"",
        "vmm",
        Unit::Ns,
    );
    let mut to_ready = Phase::new(
        "kernel_to_ready",
        "first KVM_RUN to the guest writing 123 to the boot-timer port 0x440",
        "vmm",
        Unit::Ns,
    );
    let mut to_hello = Phase::new(
        "kernel_to_agent_hello",
        "first KVM_RUN to the harness's Hello handshake with the agent over vsock completing",
        // The start is the VMM's mark, the end the harness's clock.
        "harness+vmm",
        Unit::Ns,
    );
    let mut start_to_console = Phase::new(
        "start_to_console",
        "before Vm::new to the first console byte (what QEMU's start-to-first-serial-byte measures)",
        "harness+vmm",
        Unit::Ns,
    );
    let mut gave_up = 0;
    for s in &samples {
        let m = &s.marks;
        vm_create.push_duration(Some(s.vm_create));
        vmm_setup.push_duration(BootMarks::between(m.build_start, m.first_kvm_run));
        to_console.push_duration(BootMarks::between(m.first_kvm_run, m.first_console_byte));
        to_init.push_duration(BootMarks::between(
            m.first_kvm_run,
            m.console_at(RUN_INIT_TEXT),
        ));
        to_ready.push_duration(BootMarks::between(m.first_kvm_run, m.guest_ready));
        to_hello.push_duration(s.hello);
        start_to_console.push_duration(BootMarks::between(Some(s.start), m.first_console_byte));
        gave_up += usize::from(s.ready_gave_up);
    }
    if !t.linux {
        to_init.unless_measured("the tiny guest is not Linux: it prints no \"Run /init\"");
    } else if until == Until::Console {
        to_init.unless_measured("not waited for (--until console)");
    } else {
        to_init.unless_measured("the kernel never printed \"Run /init as init process\"");
    }
    let ready_why = if !t.linux {
        "not waited for (--until console)".to_string()
    } else if kvm_pvm && until != Until::Ready {
        format!(
            "not waited for (--until {}): this host's KVM is kvm_pvm, where guest kernel code is \
             emulated and slow; --until ready waits for the agent's {GUEST_READY} on port \
             {BOOT_TIMER_PORT:#x} (the kernel needs the kvm_pvm shims, scripts/probe-kernel/)",
            format!("{until:?}").to_lowercase()
        )
    } else if until != Until::Ready {
        format!("not waited for (--until {until:?})").to_lowercase()
    } else if let (true, Some(why)) = (gave_up > 0, &t.no_agent) {
        format!(
            "the guest wrote nothing to port {BOOT_TIMER_PORT:#x} within {} s of \"Run /init\" \
             (only the provium agent writes it, and {why})",
            b.ready_timeout
        )
    } else if gave_up > 0 {
        format!(
            "the guest wrote nothing to port {BOOT_TIMER_PORT:#x} within {} s of \"Run /init\" \
             (the injected agent never marked ready: see its stderr on the console)",
            b.ready_timeout
        )
    } else {
        "no boot-timer write".to_string()
    };
    to_ready.unless_measured(ready_why);
    to_hello.unless_measured(if !t.linux {
        "the tiny guest has no agent".to_string()
    } else if let Some(why) = &t.no_agent {
        format!("no agent Hello to wait for: {why}")
    } else if kvm_pvm && until != Until::Ready {
        format!(
            "the Hello is only awaited with --until ready, not --until {} (the default on kvm_pvm, \
             where guest kernel code is emulated and slow)",
            format!("{until:?}").to_lowercase()
        )
    } else if until != Until::Ready {
        format!(
            "the Hello is only awaited with --until ready, not --until {}",
            format!("{until:?}").to_lowercase()
        )
    } else {
        "the agent never marked ready, so its Hello was not awaited".to_string()
    });
    let (kernel, initrd) = (t.shown_kernel.clone(), t.boot.initrd.clone());
    Ok(Report {
        bench: "boot",
        target: t.name.clone(),
        runs,
        warmup,
        host: host_info(b.common.pin),
        guest: json!({
            "kernel": kernel,
            "kernel_version": kernel_version,
            "initrd": initrd.map(|p| p.display().to_string()),
            "cmdline": t.boot.cmdline,
            "mem_mib": t.mem_mib,
            "vcpus": b.cpus,
            "until": format!("{until:?}").to_lowercase(),
            "prepared_vms": prepared_vms(&t, before_samples),
        }),
        phases: vec![
            vm_create,
            vmm_setup,
            to_console,
            to_init,
            to_ready,
            to_hello,
            start_to_console,
        ],
    })
}

/// What the sampled boots took from the tiny guest's pool of prepared VMs:
/// how many found one ready (the rest built their own, as without a pool).
fn prepared_vms(t: &BootTarget, before_samples: Option<(u64, u64)>) -> serde_json::Value {
    match (&t.prepared, before_samples) {
        (Some(pool), Some((hits_before, misses_before))) => {
            let (hits, misses) = pool.hits_and_misses();
            json!({
                "used": true,
                "sampled_boots_prepared": hits - hits_before,
                "sampled_boots_built": misses - misses_before,
                "stopped_because": pool.failure().map(|e| crate::error_chain::flatten(&*e)),
            })
        }
        _ if t.kvm.is_some() => json!({ "used": true, "note": "the backend's own pool" }),
        _ => json!({ "used": false }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::{parse_bench, BenchOp};

    fn boot_args(args: &[&str]) -> (RunArgs, BootArgs) {
        match parse_bench(args) {
            (run, BenchOp::Boot(b)) => (run, b),
            _ => panic!("not bench boot"),
        }
    }

    #[test]
    fn the_tiny_guest_boots_bare_with_its_own_defaults() {
        let (run, b) = boot_args(&["bench", "boot", "--tiny-guest"]);
        let t = boot_target(&run, &b).unwrap();
        assert_eq!(t.name, "tiny-guest");
        assert!(t.kvm.is_none(), "no kvm backend for the tiny guest");
        assert!(!t.linux);
        assert_eq!(t.mem_mib, 32);
        assert_eq!(t.boot.cmdline, "console=ttyS0");
        assert_eq!(t.no_agent.as_deref(), Some("the tiny guest has no agent"));
        assert!(
            t.shown_kernel.starts_with("tiny guest ("),
            "{}",
            t.shown_kernel
        );
    }

    #[test]
    fn an_unknown_profile_lists_the_known_ones() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("provium.toml");
        std::fs::write(&config, "[profiles.a]\ncmdline = \"q\"\n").unwrap();
        let config = config.to_str().unwrap();
        let (run, b) = boot_args(&["bench", "boot", "nope", "--config", config]);
        let e = boot_target(&run, &b)
            .err()
            .expect("no such profile")
            .to_string();
        assert!(e.starts_with("bench boot: no profile `nope` in "), "{e}");
        assert!(e.ends_with("(profiles: a)"), "{e}");
        let (run, b) = boot_args(&["bench", "boot", "a", "--config", config]);
        let e = boot_target(&run, &b).err().expect("no kernel").to_string();
        assert_eq!(e, "bench boot: profile `a` has no kernel");
    }

    #[test]
    fn a_failed_boot_names_its_number_then_its_cause_once() {
        let e = BootBenchError::WarmUp {
            number: 1,
            source: Box::new(BootBenchError::NoMark {
                target: "tiny-guest".into(),
                until: Until::Ready,
                timeout_s: 5,
                console_tail: "READY?".into(),
            }),
        };
        assert_eq!(
            crate::error_chain::flatten(&e),
            "warm-up boot 1: bench boot tiny-guest: no Ready mark within 5 s (--timeout); \
             console tail:\nREADY?"
        );
    }

    #[test]
    fn a_profile_boot_is_a_spec_for_the_backend_with_the_ready_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("bzImage");
        std::fs::write(&kernel, b"not a kernel").unwrap();
        let config = dir.path().join("provium.toml");
        std::fs::write(
            &config,
            format!(
                "[profiles.a]\nkernel = {:?}\ncmdline = \"q\"\ninject_agent = false\n",
                kernel.display().to_string()
            ),
        )
        .unwrap();
        let config = config.to_str().unwrap();
        let (run, b) = boot_args(&[
            "bench",
            "boot",
            "a",
            "--config",
            config,
            "--ready-timeout",
            "7",
        ]);
        let t = boot_target(&run, &b).unwrap();
        let (backend, spec) = t.kvm.as_ref().expect("a profile boots through a backend");
        assert_eq!(backend.capabilities().backend, "kvm");
        assert_eq!(
            (spec.vm_name.as_str(), spec.profile_name.as_str()),
            ("a", "a")
        );
        assert_eq!(spec.agent_timeout, Some(Duration::from_secs(7)));
        assert_eq!(spec.memory_bytes, 256 << 20);
        assert!(!spec.inject_agent && spec.boot_timer.is_none());
        assert_eq!(
            t.no_agent.as_deref(),
            Some("the profile has inject_agent = false")
        );
        assert!(t.boot.cmdline.contains('q'), "{}", t.boot.cmdline);
    }
}
