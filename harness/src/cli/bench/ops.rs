//! `provium bench ops`: agent round trips (exec, file I/O) against one
//! local sandbox, or (`--vmm kvm`) against the profile's guest booted once
//! per agent channel (vsock, the virtio-console port), booted through the
//! backend boundary.

use std::time::Instant;

use serde_json::json;

use super::args::{OpsArgs, OpsChannel};
use super::host::host_info;
use super::render::Report;
use super::stats::{Phase, Unit};
use crate::backend::{self, BackendError, BackendKind, Guest, MachineSpec};
use crate::cli::RunArgs;
use crate::cli::{choose_backend, load_config};
use crate::client::{AgentOps, ClientError};
use crate::config::profile::AgentChannel;
use crate::config::ConfigError;

/// Why `bench ops` failed: each names the step; causes are sources.
#[derive(Debug, thiserror::Error)]
pub enum OpsBenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("bench ops --vmm kvm boots a guest: name a profile (`provium bench ops <profile> --vmm kvm`)")]
    NoProfile,
    #[error("bench ops: profile `{0}` is not in provium.toml")]
    UnknownProfile(String),
    #[error("bench ops")]
    Boot(#[source] BackendError),
    #[error("bench ops")]
    Connect(#[source] BackendError),
    #[error("bench ops: {what}")]
    Op {
        what: &'static str,
        #[source]
        source: ClientError,
    },
    #[error("bench ops: `true` failed in the guest: {result}")]
    TrueFailed { result: String },
    #[error("bench ops: read {len_bytes} bytes, wanted 4096")]
    ShortRead { len_bytes: usize },
    #[error("bench ops: the 1 MiB read back differs from what was written")]
    ReadBackDiffers,
}

pub(super) fn bench_ops(args: &RunArgs, o: &OpsArgs) -> Result<Report, OpsBenchError> {
    let config = load_config(&args.config, &args.settings)?;
    if choose_backend(o.vmm, &config) == BackendKind::Kvm {
        return bench_ops_kvm(&config, o);
    }
    let profile_name = o.profile.clone().unwrap_or_else(|| "default".into());
    let spec = MachineSpec {
        settings: config.settings.clone(),
        ..MachineSpec::for_profile(
            &format!("bench-ops-{}", std::process::id()),
            &profile_name,
            config.profiles.get(&profile_name).cloned(),
            crate::lua::vm::DEFAULT_MEMORY_BYTES,
            1,
        )
    };
    let runs = o.common.runs.unwrap_or(200).max(1);
    let warmup = o.common.warmup.unwrap_or(10);
    let guest = backend::for_kind(BackendKind::Local)
        .boot(&spec)
        .map_err(OpsBenchError::Boot)?;
    let result = run_ops(guest.as_ref(), runs, warmup);
    guest.kill();
    let phases = result?;
    let agent = backend::locate_local_agent(&config.settings)
        .map(|p| p.display().to_string())
        .ok();
    Ok(Report {
        bench: "ops",
        target: "local".into(),
        runs,
        warmup,
        host: host_info(o.common.pin),
        guest: json!({
            "backend": "local",
            "profile": o.profile,
            "agent": agent,
            "transport": "unix socket (local sandbox)",
        }),
        phases,
    })
}

/// The phase name `name` with the channel's prefix (`vsock_ping`).
fn channel_phase(channel: AgentChannel, name: &'static str) -> &'static str {
    const NAMES: [(&str, &str, &str); 4] = [
        ("ping", "vsock_ping", "console_ping"),
        ("run_true", "vsock_run_true", "console_run_true"),
        ("read_4k", "vsock_read_4k", "console_read_4k"),
        (
            "write_read_1m",
            "vsock_write_read_1m",
            "console_write_read_1m",
        ),
    ];
    NAMES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map_or(name, |(_, v, c)| match channel {
            AgentChannel::Console => c,
            _ => v,
        })
}

/// `bench ops --vmm kvm`: the profile's guest, booted once per channel,
/// the same round trips on each; phases prefixed with the channel.
fn bench_ops_kvm(config: &crate::config::Config, o: &OpsArgs) -> Result<Report, OpsBenchError> {
    let name = o.profile.clone().ok_or(OpsBenchError::NoProfile)?;
    let profile = config
        .profiles
        .get(&name)
        .cloned()
        .ok_or_else(|| OpsBenchError::UnknownProfile(name.clone()))?;
    // A guest's run is a fork+exec in its kernel: fewer runs by default.
    let runs = o.common.runs.unwrap_or(20).max(1);
    let warmup = o.common.warmup.unwrap_or(2);
    let channels: &[AgentChannel] = match o.channel {
        OpsChannel::Vsock => &[AgentChannel::Vsock],
        OpsChannel::Console => &[AgentChannel::Console],
        OpsChannel::Both => &[AgentChannel::Vsock, AgentChannel::Console],
    };
    let mut phases = Vec::new();
    for &channel in channels {
        let mut p = profile.clone();
        p.agent_channel = channel;
        let spec = MachineSpec {
            settings: config.settings.clone(),
            ..MachineSpec::for_profile(
                &format!("bench-ops-{}", std::process::id()),
                &name,
                Some(p),
                crate::lua::vm::DEFAULT_MEMORY_BYTES,
                1,
            )
        };
        let guest = backend::for_kind(BackendKind::Kvm)
            .boot(&spec)
            .map_err(OpsBenchError::Boot)?;
        let result = run_ops(guest.as_ref(), runs, warmup);
        guest.kill();
        for mut phase in result? {
            phase.name = channel_phase(channel, phase.name);
            phases.push(phase);
        }
    }
    let words: Vec<&str> = channels
        .iter()
        .map(|c| match c {
            AgentChannel::Console => "console",
            _ => "vsock",
        })
        .collect();
    Ok(Report {
        bench: "ops",
        target: "kvm".into(),
        runs,
        warmup,
        host: host_info(o.common.pin),
        guest: json!({
            "backend": "kvm",
            "profile": name,
            "kernel": profile.kernel.as_ref().map(|k| k.display().to_string()),
            "channels": words,
            "transport": "vsock: virtio-vsock port 1024; console: virtio-console port org.provium.agent",
        }),
        phases,
    })
}

fn run_ops(guest: &dyn Guest, runs: usize, warmup: usize) -> Result<Vec<Phase>, OpsBenchError> {
    let c = guest.connect().map_err(OpsBenchError::Connect)?;
    let e = |what: &'static str| move |source: ClientError| OpsBenchError::Op { what, source };
    let time = |phase: &mut Phase,
                f: &mut dyn FnMut() -> Result<(), OpsBenchError>|
     -> Result<(), OpsBenchError> {
        for _ in 0..warmup {
            f()?;
        }
        for _ in 0..runs {
            let t = Instant::now();
            f()?;
            phase.push_duration(Some(t.elapsed()));
        }
        Ok(())
    };
    let mut ping = Phase::new("ping", "a no-op agent round trip", "harness", Unit::Ns);
    time(&mut ping, &mut || c.ping().map_err(e("ping")))?;
    let mut run_true = Phase::new(
        "run_true",
        "vm:run(\"true\"): spawn /bin/sh -c true in the guest and wait for it",
        "harness",
        Unit::Ns,
    );
    time(&mut run_true, &mut || {
        let r = c.run("true").map_err(e("run true"))?;
        if r.success() {
            Ok(())
        } else {
            Err(OpsBenchError::TrueFailed {
                result: format!("{r:?}"),
            })
        }
    })?;
    let four_k = vec![0x5au8; 4096];
    let path_4k = "/tmp/provium-bench-4k";
    c.write_file(path_4k, &four_k).map_err(e("write 4 KiB"))?;
    let mut read_4k = Phase::new("read_4k", "read_file of a 4 KiB file", "harness", Unit::Ns);
    time(&mut read_4k, &mut || {
        let d = c.read_file(path_4k).map_err(e("read 4 KiB"))?;
        if d.len() == 4096 {
            Ok(())
        } else {
            Err(OpsBenchError::ShortRead { len_bytes: d.len() })
        }
    })?;
    let one_m: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let path_1m = "/tmp/provium-bench-1m";
    let mut wr_1m = Phase::new(
        "write_read_1m",
        "write_file then read_file of 1 MiB",
        "harness",
        Unit::Ns,
    );
    time(&mut wr_1m, &mut || {
        c.write_file(path_1m, &one_m).map_err(e("write 1 MiB"))?;
        let d = c.read_file(path_1m).map_err(e("read 1 MiB"))?;
        if d == one_m {
            Ok(())
        } else {
            Err(OpsBenchError::ReadBackDiffers)
        }
    })?;
    Ok(vec![ping, run_true, read_4k, wr_1m])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::{parse_bench, BenchOp};

    #[test]
    fn kvm_needs_a_profile_before_anything_boots() {
        let (run, op) = parse_bench(&["bench", "ops", "--vmm", "kvm"]);
        let BenchOp::Ops(o) = op else {
            panic!("not bench ops")
        };
        assert_eq!(o.channel, OpsChannel::Both);
        let e = bench_ops(&run, &o).err().expect("no profile named");
        assert!(matches!(e, OpsBenchError::NoProfile), "{e}");
        let (run, op) = parse_bench(&[
            "bench",
            "ops",
            "nope",
            "--vmm",
            "kvm",
            "--channel",
            "console",
        ]);
        let BenchOp::Ops(o) = op else {
            panic!("not bench ops")
        };
        assert_eq!(o.channel, OpsChannel::Console);
        let e = bench_ops(&run, &o).err().expect("unknown profile");
        assert!(e.to_string().contains("profile `nope`"), "{e}");
    }

    #[test]
    fn phases_are_named_by_channel() {
        assert_eq!(channel_phase(AgentChannel::Vsock, "ping"), "vsock_ping");
        assert_eq!(
            channel_phase(AgentChannel::Console, "write_read_1m"),
            "console_write_read_1m"
        );
    }

    #[test]
    fn an_agent_error_names_the_op_once() {
        let e = OpsBenchError::Op {
            what: "read 4 KiB",
            source: ClientError::ConnectionClosed {
                reason: "gone".into(),
            },
        };
        let flat = crate::error_chain::flatten(&e);
        assert!(flat.starts_with("bench ops: read 4 KiB: "), "{flat}");
        assert_eq!(flat.matches("bench ops").count(), 1, "{flat}");
    }
}
