//! `provium exec --kernel PATH [--initrd PATH] [--memory SIZE] [--cpus N]
//! [--modules DIR] -- CMD ARGS...`: boot a kernel, run one command in it
//! through the agent, stream its stdout and stderr, exit with its exit code
//! (a signal `s` exits 128+s). No provium.toml: the kernel makes a profile
//! of its own (`exec`), booted through the same backend path and errors as
//! `vm:boot` (harness/src/backend). Without `--initrd` the initrd is the
//! agent alone (as PID 1 it mounts /proc, /sys and /dev, and loads the
//! kernel's modules it needs, docs/kernels.md). `--vmm local` runs the
//! command in a sandbox on the host instead: a quick try without a kernel.
//!
//! Exit codes: the command's; 2 when nothing could run (no kernel, a boot
//! that failed, no agent), with the reason.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use provium_protocol::op::SpawnSpec;
use provium_protocol::result::ExitStatus;

use super::VmmChoice;
use crate::backend::{self, BackendError, BackendKind, MachineSpec};
use crate::client::{AgentOps, ClientError, StreamReader};
use crate::config::{parse_size, Profile, SizeError};
use crate::settings::Settings;

/// `provium exec`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// The kernel to boot (a bzImage or ELF vmlinux); not with --vmm local.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// The initrd (default: the agent alone).
    #[arg(long, value_name = "PATH", requires = "kernel")]
    pub initrd: Option<PathBuf>,
    /// The kernel's module tree, when it is not where Provium looks.
    #[arg(long, value_name = "DIR", requires = "kernel")]
    pub modules: Option<PathBuf>,
    /// Guest memory, e.g. 512M or 1G.
    #[arg(long, default_value = "512M")]
    pub memory: String,
    /// vCPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u32,
    /// Extra kernel command-line words (console=ttyS0 is always there).
    #[arg(long, default_value = "")]
    pub cmdline: String,
    /// kvm (boot --kernel; the default with --kernel) or local (a sandbox).
    #[arg(long = "vmm", value_enum, default_value = "auto")]
    pub vmm: VmmChoice,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// Why nothing ran (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("exec: --memory {value:?}")]
    Memory {
        value: String,
        #[source]
        source: SizeError,
    },
    #[error("exec: --kernel is needed to boot a VM (or use --vmm local to run in a sandbox)")]
    NoKernel,
    #[error("exec: --vmm local runs no kernel: drop --kernel/--initrd, or use --vmm kvm")]
    KernelWithLocal,
    #[error("exec: cannot start the guest")]
    Boot(#[source] BackendError),
    #[error("exec: no agent")]
    Connect(#[source] BackendError),
    #[error("exec: `{command}`")]
    Run {
        command: String,
        #[source]
        source: ClientError,
    },
}

/// The profile `exec` boots: `args`' kernel, initrd and modules, the agent
/// injected, `console=ttyS0` plus `--cmdline`.
pub fn exec_profile(args: &ExecArgs, kernel: PathBuf) -> Profile {
    Profile {
        name: "exec".into(),
        kernel: Some(kernel),
        initrd: args.initrd.clone(),
        cmdline: format!("console=ttyS0 {}", args.cmdline).trim().to_string(),
        cmdline_file: None,
        guest_os: "linux".into(),
        transport: Default::default(),
        inject_agent: true,
        agent_overlay_path: None,
        agent_channel: Default::default(),
        modules: args.modules.clone(),
        build: None,
        build_out: std::env::temp_dir(),
        // One command, no Lua to attach anything later: no slots, no
        // empty devices in the guest.
        disk_slots: 0,
        nic_slots: 0,
    }
}

/// Which backend runs the command.
fn backend_kind(args: &ExecArgs) -> Result<BackendKind, ExecError> {
    match (args.vmm, &args.kernel) {
        (VmmChoice::Local, Some(_)) => Err(ExecError::KernelWithLocal),
        (VmmChoice::Local, None) => Ok(BackendKind::Local),
        (_, Some(_)) => Ok(BackendKind::Kvm),
        (VmmChoice::Kvm, None) => Err(ExecError::NoKernel),
        (VmmChoice::Auto, None) => Err(ExecError::NoKernel),
    }
}

/// Runs `provium exec`; returns the command's exit code.
pub fn run(args: &ExecArgs, settings: &Settings) -> Result<i32, ExecError> {
    let memory_bytes = parse_size(&args.memory).map_err(|source| ExecError::Memory {
        value: args.memory.clone(),
        source,
    })?;
    let kind = backend_kind(args)?;
    let profile = args.kernel.clone().map(|k| exec_profile(args, k));
    let spec = MachineSpec {
        settings: settings.clone(),
        ..MachineSpec::for_profile(
            &format!("exec-{}", std::process::id()),
            "exec",
            profile,
            memory_bytes,
            args.cpus,
        )
    };
    let guest = backend::for_kind(kind)
        .boot(&spec)
        .map_err(ExecError::Boot)?;
    let result = guest
        .connect()
        .map_err(ExecError::Connect)
        .and_then(|client| run_streaming(&client, &args.command));
    guest.kill();
    result
}

/// Spawns `command` (argv), copies its stdout and stderr to ours as they
/// come, and returns its exit code (128+signal when killed).
fn run_streaming(
    client: &crate::client::AgentClient,
    command: &[String],
) -> Result<i32, ExecError> {
    let err = |source| ExecError::Run {
        command: command.join(" "),
        source,
    };
    let (program, rest) = command.split_first().expect("clap requires a command");
    let ops: &dyn AgentOps = client;
    let mut process = ops.spawn(SpawnSpec::argv(program, rest)).map_err(err)?;
    let copy = |mut reader: StreamReader, to_stderr: bool| {
        move || -> Result<(), ClientError> {
            while !reader.is_eof() {
                if let Some(chunk) = reader.next(Duration::from_millis(200))? {
                    // A closed host pipe is not the command's failure.
                    let _ = if to_stderr {
                        std::io::stderr().write_all(&chunk)
                    } else {
                        let mut out = std::io::stdout();
                        out.write_all(&chunk).and_then(|()| out.flush())
                    };
                }
            }
            Ok(())
        }
    };
    let stderr = std::thread::spawn(copy(process.stderr(), true));
    let stdout = copy(process.stdout(), false)();
    let stderr = stderr.join().unwrap_or(Ok(()));
    stdout.and(stderr).map_err(err)?;
    let done = process.wait(None).map_err(err)?;
    // Whatever the readers did not take (nothing, normally).
    let _ = std::io::stdout().write_all(&done.stdout);
    let _ = std::io::stderr().write_all(&done.stderr);
    Ok(exit_code(&done.exit))
}

/// The shell's convention: the exit code, or 128+signal.
pub fn exit_code(exit: &provium_protocol::result::ExitInfo) -> i32 {
    match (exit.status, exit.signal) {
        (ExitStatus::Exited, _) => exit.exit_code,
        (_, Some(sig)) => 128 + sig,
        _ => 128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::result::ExitInfo;

    fn parse(args: &[&str]) -> ExecArgs {
        let (_d, cli) = super::super::parse_in_project("", args);
        match cli.command {
            Some(super::super::Command::Exec(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arguments_and_backend_choice() {
        let a = parse(&[
            "exec", "--kernel", "/k", "--cpus", "2", "--", "ls", "-l", "/",
        ]);
        assert_eq!(a.command, ["ls", "-l", "/"]);
        assert_eq!(backend_kind(&a).unwrap(), BackendKind::Kvm);
        let p = exec_profile(&a, "/k".into());
        assert_eq!(p.cmdline, "console=ttyS0");
        assert!(p.inject_agent && p.initrd.is_none());
        let local = parse(&["exec", "--vmm", "local", "--", "true"]);
        assert_eq!(backend_kind(&local).unwrap(), BackendKind::Local);
        assert!(matches!(
            backend_kind(&parse(&["exec", "--", "true"])),
            Err(ExecError::NoKernel)
        ));
        assert!(matches!(
            backend_kind(&parse(&[
                "exec", "--vmm", "local", "--kernel", "/k", "--", "true"
            ])),
            Err(ExecError::KernelWithLocal)
        ));
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(&ExitInfo::exited(3)), 3);
        let killed = ExitInfo {
            status: ExitStatus::Signalled,
            exit_code: ExitInfo::SIGNALLED_EXIT_CODE,
            signal: Some(9),
        };
        assert_eq!(exit_code(&killed), 137);
    }
}
