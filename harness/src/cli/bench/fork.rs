//! `provium bench fork`: how long forking a running VM n ways takes, what
//! each copy holds of the host's memory, and how long the source is paused
//! (docs/benchmarking.md, "Fork").
//!
//! - `--tiny-guest`: on the VMM itself, as `vm:fork` does it on kvm: the
//!   running tiny guest snapshotted (its pause timed by the VMM's snapshot),
//!   then n restores of that file through one `RestoreRamCache` (one sealed
//!   memfd, n private mappings), each until its loop counter moves in its
//!   own RAM. In the same run, for comparison: the same snapshot installed
//!   into the fixture cache and n restores of the cache entry (what a
//!   snapshot plus n fixture restores costs).
//! - `PROFILE --vmm local|kvm`: through the Lua layer (`Vm::fork`) on the
//!   chosen backend: a VM of the profile booted once, then forked n ways.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use provium_vmm::{tiny_guest, Vm, VmError};

use super::args::ForkArgs;
use super::host::host_info;
use super::render::Report;
use super::stats::{Phase, Unit};
use crate::cli::{choose_backend, load_config, RunArgs};
use crate::config::ConfigError;
use crate::host_memory::mapping_memory;

/// Why `bench fork` failed.
#[derive(Debug, thiserror::Error)]
pub enum ForkBenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Cache(#[from] provium_snapshot::CacheError),
    #[error("bench fork --tiny-guest: {step}")]
    Tiny {
        step: &'static str,
        #[source]
        source: Box<VmError>,
    },
    #[error("bench fork --tiny-guest: the tiny guest did not print READY")]
    TinyNotReady,
    #[error("bench fork --tiny-guest: a copy did not run within 300 s of its restore")]
    TinyNotRunning,
    #[error("bench fork `{profile}`: {message}")]
    Lua { profile: String, message: String },
}

fn tiny(step: &'static str) -> impl Fn(VmError) -> ForkBenchError {
    move |e| ForkBenchError::Tiny {
        step,
        source: Box::new(e),
    }
}

/// A phase name or description made per `--copies` value: phases take
/// `&'static str` (the other benches name theirs in literals), and a bench
/// process makes a handful and then exits.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The two phases each `--copies` value has: the fork's latency
/// (`fork_n<n>`) and the Pss per copy (`pss_per_copy_n<n>`).
fn fork_phases(n: usize, what_fork: String, what_pss: &'static str) -> (Phase, Phase) {
    let fork = Phase::new(
        leak(format!("fork_n{n}")),
        leak(what_fork),
        "harness",
        Unit::Ns,
    );
    let pss = Phase::new(
        leak(format!("pss_per_copy_n{n}")),
        what_pss,
        "harness",
        Unit::Bytes,
    );
    (fork, pss)
}

pub(super) fn bench_fork(args: &RunArgs, f: &ForkArgs) -> Result<Report, ForkBenchError> {
    if f.tiny_guest {
        bench_fork_tiny(args, f)
    } else {
        bench_fork_lua(args, f)
    }
}

/// n restores of `snap` through `ram_cache`: returns how long until all n
/// were restored (machine built, vCPUs started) and, once each one's loop
/// counter has moved (checked, not timed: n spinning guests on a few host
/// cores is a scheduler's benchmark), the Pss per copy; then drops them.
fn restore_copies(
    f: &ForkArgs,
    snap: &std::path::Path,
    n: usize,
    ram_cache: &provium_vmm::vstate::memory::RestoreRamCache,
) -> Result<(Duration, u64), ForkBenchError> {
    let t0 = Instant::now();
    let mut copies = Vec::with_capacity(n);
    for _ in 0..n {
        let vm = Vm::new(super::restore::tiny_restore_config(tiny_mem_mib(f), None))
            .map_err(tiny("copy"))?;
        vm.restore_sharing(snap, ram_cache)
            .map_err(tiny("restore"))?;
        copies.push(vm);
    }
    let took = t0.elapsed();
    let t1 = Instant::now();
    for vm in &copies {
        let c0 = vm
            .read_guest_u64(tiny_guest::COUNTER_GPA)
            .map_err(tiny("read"))?;
        while vm
            .read_guest_u64(tiny_guest::COUNTER_GPA)
            .map_err(tiny("read"))?
            == c0
        {
            if t1.elapsed() > Duration::from_secs(300) {
                return Err(ForkBenchError::TinyNotRunning);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let pss: u64 = copies
        .iter()
        .map(|vm| mapping_memory(&vm.ram_host_ranges()).1)
        .sum();
    Ok((took, pss / n.max(1) as u64))
}

/// The tiny guest's memory: `--mem`, else 32 MiB.
fn tiny_mem_mib(f: &ForkArgs) -> u64 {
    f.mem.unwrap_or(32)
}

/// A profile VM's memory: `--mem`, else what `provium:vm` gives a VM.
fn profile_memory_bytes(f: &ForkArgs) -> u64 {
    f.mem
        .map_or(crate::lua::vm::DEFAULT_MEMORY_BYTES, |mib| mib << 20)
}

fn bench_fork_tiny(args: &RunArgs, f: &ForkArgs) -> Result<Report, ForkBenchError> {
    use provium_snapshot::{FixtureCache, KeyBuilder};
    let config = load_config(&args.config, &args.settings)?;
    let cache = FixtureCache::open(&config.cache_dir)?;
    let runs = f.common.runs.unwrap_or(3).max(1);
    let source = Vm::new(super::restore::tiny_restore_config(tiny_mem_mib(f), None))
        .map_err(tiny("boot"))?;
    source.boot().map_err(tiny("boot"))?;
    if !source
        .console()
        .wait_for(tiny_guest::READY.as_bytes(), 1, Duration::from_secs(120))
    {
        return Err(ForkBenchError::TinyNotReady);
    }
    let mut phases = Vec::new();
    let mut pause = Phase::new(
        "source_paused",
        "the source's vCPUs paused while its snapshot is written (Vm::snapshot)",
        "vmm",
        Unit::Ns,
    );
    for &n in &f.copies {
        let (mut fork, mut pss) = fork_phases(
            n,
            format!("snapshot of the running source + {n} restores sharing one sealed memfd (each then checked running)"),
            "proportional guest RAM per copy (smaps Pss of its RAM mappings), all copies alive",
        );
        let mut fixture = Phase::new(
            leak(format!("snapshot_fixture_restores_n{n}")),
            leak(format!("the same snapshot (its time counted) installed into the fixture cache + {n} restores of the entry")),
            "harness",
            Unit::Ns,
        );
        for run in 0..runs {
            let snap = crate::lua::snapshot::temp_path(".fork.snap");
            let t0 = Instant::now();
            source.snapshot(&snap).map_err(tiny("snapshot"))?;
            let paused = t0.elapsed();
            let ram_cache = provium_vmm::vstate::memory::RestoreRamCache::new();
            let (took, per_copy) = restore_copies(f, &snap, n, &ram_cache)?;
            fork.push_duration(Some(paused + took));
            pause.push_duration(Some(paused));
            pss.samples.push(per_copy);
            // The fixture path: install (compress, checksum) then restore.
            let t0 = Instant::now();
            let mut k = KeyBuilder::new("provium-bench-fork/1");
            k.field("run", &[u8::try_from(run % 256).unwrap_or(0)])
                .field("pid", &std::process::id().to_le_bytes())
                .field("n", &(n as u64).to_le_bytes());
            let entry = cache.install_vm(&k.finish(), &snap)?;
            restore_copies(
                f,
                &entry,
                n,
                &provium_vmm::vstate::memory::RestoreRamCache::new(),
            )?;
            fixture.push_duration(Some(paused + t0.elapsed()));
            crate::lua::snapshot::remove_any(&snap);
            crate::lua::snapshot::remove_any(&entry);
        }
        phases.extend([fork, pss, fixture]);
    }
    phases.insert(0, pause);
    Ok(Report {
        bench: "fork",
        target: "tiny-guest".into(),
        runs,
        warmup: 0,
        host: host_info(f.common.pin),
        guest: json!({
            "backend": "kvm",
            "guest": "tiny-guest",
            "memory_bytes": tiny_mem_mib(f) << 20,
            "copies": f.copies,
        }),
        phases,
    })
}

fn bench_fork_lua(args: &RunArgs, f: &ForkArgs) -> Result<Report, ForkBenchError> {
    use crate::lua::vm::{Vm as LuaVm, VmSizing};
    let profile = f.profile.clone().unwrap_or_else(|| "bench".into());
    let lua_err = |e: mlua::Error| ForkBenchError::Lua {
        profile: profile.clone(),
        message: crate::lua::error_message(&e),
    };
    let config = Arc::new(load_config(&args.config, &args.settings)?);
    let kind = choose_backend(f.vmm, &config);
    let env = Arc::new(crate::runner::FileEnv::new(
        "provium bench".into(),
        PathBuf::from("provium-bench"),
        config.roots.clone(),
        config.clone(),
        crate::backend::for_kind(kind),
        crate::events::EventSender::disabled(),
    ));
    let runs = f.common.runs.unwrap_or(3).max(1);
    let sizing = VmSizing {
        memory_bytes: profile_memory_bytes(f),
        cpus: 1,
    };
    let source =
        LuaVm::create(env.clone(), "src".into(), profile.clone(), sizing).map_err(lua_err)?;
    source.boot(None).map_err(lua_err)?;
    let mut phases = Vec::new();
    let mut pause = Phase::new(
        "source_paused",
        "vm:fork's freeze: pause (kvm), snapshot, disk copies, resume",
        "harness",
        Unit::Ns,
    );
    for &n in &f.copies {
        let (mut fork, mut pss) = fork_phases(
            n,
            format!("vm:fork({n}) until every copy's agent answered"),
            "what each copy holds of the host's memory (Guest::resident_memory, proportional)",
        );
        for _ in 0..runs {
            env.push_scope();
            let t0 = Instant::now();
            let (copies, paused_ns) = source
                .fork_timed(&mlua::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX)))
                .map_err(lua_err)?;
            fork.push_duration(Some(t0.elapsed()));
            pause.samples.push(paused_ns);
            let total: u64 = copies
                .iter()
                .filter_map(|c| c.ctx().machine().ok())
                .map(|m| m.resident_memory().1)
                .sum();
            pss.samples.push(total / n.max(1) as u64);
            let _ = env.pop_scope();
        }
        phases.extend([fork, pss]);
    }
    phases.insert(0, pause);
    let _ = source.shutdown();
    Ok(Report {
        bench: "fork",
        target: profile.clone(),
        runs,
        warmup: 0,
        host: host_info(f.common.pin),
        guest: json!({
            "backend": kind.as_str(),
            "profile": profile,
            "memory_bytes": profile_memory_bytes(f),
            "copies": f.copies,
        }),
        phases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile's VM is sized as `provium:vm` sizes one (a Linux guest
    /// panics at boot in the tiny guest's 32 MiB); `--mem` wins for both.
    #[test]
    fn without_mem_the_tiny_guest_gets_32_mib_and_a_profile_vm_the_lua_default() {
        use clap::{Args, FromArgMatches};
        let args = |mem: Option<u64>| {
            let mut words = vec!["fork".to_string(), "p".into()];
            if let Some(m) = mem {
                words.extend(["--mem".into(), m.to_string()]);
            }
            let matches = ForkArgs::augment_args(clap::Command::new("fork"))
                .try_get_matches_from(words)
                .unwrap();
            ForkArgs::from_arg_matches(&matches).unwrap()
        };
        assert_eq!(tiny_mem_mib(&args(None)), 32);
        assert_eq!(
            profile_memory_bytes(&args(None)),
            crate::lua::vm::DEFAULT_MEMORY_BYTES
        );
        assert_eq!(tiny_mem_mib(&args(Some(64))), 64);
        assert_eq!(profile_memory_bytes(&args(Some(64))), 64 << 20);
    }

    /// The phase names docs/benchmarking.md documents, per `--copies`
    /// value, with their units.
    #[test]
    fn each_copy_count_has_a_latency_and_a_pss_phase() {
        let (fork, pss) = fork_phases(10, "what".into(), "pss");
        assert_eq!(
            (fork.name, fork.what, fork.unit),
            ("fork_n10", "what", Unit::Ns)
        );
        assert_eq!(
            (pss.name, pss.what, pss.unit),
            ("pss_per_copy_n10", "pss", Unit::Bytes)
        );
        assert!(fork.samples.is_empty() && pss.samples.is_empty());
    }
}
