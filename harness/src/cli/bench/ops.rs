//! `provium bench ops`: agent round trips (exec, file I/O) against one
//! local sandbox.

use std::time::Instant;

use serde_json::json;

use super::args::OpsArgs;
use super::host::host_info;
use super::local_backend;
use super::render::Report;
use super::stats::{Phase, Unit};
use crate::cli::load_config;
use crate::cli::RunArgs;
use crate::client::AgentOps;
use crate::machine::{BootSpec, Machine};
use crate::runner::BackendKind;

pub(super) fn bench_ops(args: &RunArgs, o: &OpsArgs) -> Result<Report, String> {
    let config = load_config(&args.config, &args.settings)?;
    local_backend(o.vmm, &config, "ops")?;
    let profile_name = o.profile.clone().unwrap_or_else(|| "default".into());
    let spec = BootSpec {
        vm_name: format!("bench-ops-{}", std::process::id()),
        profile: config.profiles.get(&profile_name).cloned(),
        profile_name: profile_name.clone(),
        memory_bytes: crate::lua::vm::DEFAULT_MEMORY_BYTES,
        cpus: 1,
        kernel_cmdline: None,
        rng_seed: None,
        initial_time: None,
        settings: config.settings.clone(),
    };
    let runs = o.common.runs.unwrap_or(200).max(1);
    let warmup = o.common.warmup.unwrap_or(10);
    let machine =
        Machine::boot(BackendKind::Local, &spec).map_err(|e| format!("bench ops: {e}"))?;
    let result = run_ops(&machine, runs, warmup);
    machine.shutdown();
    let phases = result?;
    let agent = crate::backend::local::locate_agent(&config.settings)
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

fn run_ops(machine: &Machine, runs: usize, warmup: usize) -> Result<Vec<Phase>, String> {
    let c = machine.connect().map_err(|e| format!("bench ops: {e}"))?;
    let e = |what: &str| {
        let what = what.to_string();
        move |err: crate::client::ClientError| format!("bench ops: {what}: {err}")
    };
    let time =
        |phase: &mut Phase, f: &mut dyn FnMut() -> Result<(), String>| -> Result<(), String> {
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
            Err(format!("bench ops: `true` failed in the guest: {r:?}"))
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
            Err(format!("bench ops: read {} bytes, wanted 4096", d.len()))
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
            Err("bench ops: the 1 MiB read back differs from what was written".to_string())
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
        assert!(
            e.starts_with("bench ops: runs on the local backend only"),
            "{e}"
        );
    }
}
