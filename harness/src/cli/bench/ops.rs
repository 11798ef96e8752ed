//! `provium bench ops`: agent round trips (exec, file I/O) against one
//! local sandbox, booted through the backend boundary.

use std::time::Instant;

use serde_json::json;

use super::args::OpsArgs;
use super::host::host_info;
use super::render::Report;
use super::stats::{Phase, Unit};
use super::VmmChoice;
use crate::backend::{self, BackendError, BackendKind, Guest, MachineSpec};
use crate::cli::RunArgs;
use crate::cli::{choose_backend, load_config};
use crate::client::{AgentOps, ClientError};
use crate::config::ConfigError;

/// Why `bench ops` failed: each names the step; causes are sources.
#[derive(Debug, thiserror::Error)]
pub enum OpsBenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "bench {what}: runs on the local backend only for now (on kvm it would time the agent \
         inside a Linux guest, which this bench does not boot yet); run with --vmm local"
    )]
    LocalOnly { what: &'static str },
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

/// Refuses a bench that runs on the local backend only when `choice` picks kvm.
fn local_backend(
    choice: VmmChoice,
    config: &crate::config::Config,
    what: &'static str,
) -> Result<(), OpsBenchError> {
    match choose_backend(choice, config) {
        BackendKind::Local => Ok(()),
        BackendKind::Kvm => Err(OpsBenchError::LocalOnly { what }),
    }
}

pub(super) fn bench_ops(args: &RunArgs, o: &OpsArgs) -> Result<Report, OpsBenchError> {
    let config = load_config(&args.config, &args.settings)?;
    local_backend(o.vmm, &config, "ops")?;
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
    fn kvm_is_refused_before_anything_boots() {
        let (run, op) = parse_bench(&["bench", "ops", "--vmm", "kvm"]);
        let BenchOp::Ops(o) = op else {
            panic!("not bench ops")
        };
        let e = bench_ops(&run, &o).err().expect("ops is local-only");
        let e = e.to_string();
        assert!(
            e.starts_with("bench ops: runs on the local backend only"),
            "{e}"
        );
    }

    #[test]
    fn local_only_benches_refuse_kvm_by_name() {
        let config = crate::config::Config::default();
        assert!(local_backend(VmmChoice::Local, &config, "ops").is_ok());
        let e = local_backend(VmmChoice::Kvm, &config, "ops")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bench ops: runs on the local backend only"),
            "{e}"
        );
        assert!(e.ends_with("run with --vmm local"), "{e}");
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
