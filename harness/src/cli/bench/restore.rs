//! `provium bench restore`: fixture restores, P at once, each in a new VM
//! (a fixture's VM on the chosen backend, through the backend boundary, or
//! `--tiny-guest` on the VMM itself: a bare VM with no profile or agent).

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::json;

use provium_snapshot::CacheError;
use provium_vmm::boot_timer::{BootMarks, BootTimer};
use provium_vmm::{tiny_guest, BootSource, KernelImage, Vm, VmConfig, VmError};

use super::args::RestoreArgs;
use super::console_tail;
use super::host::host_info;
use super::render::Report;
use super::stats::{Phase, Unit};
use crate::backend::{self, BackendError, BackendKind, Guest, MachineSpec};
use crate::cli::RunArgs;
use crate::cli::{choose_backend, load_config};
use crate::client::{AgentOps, ClientError};
use crate::config::ConfigError;
use crate::fixture::key::KeyError;
use crate::fixture::FixtureError;
use crate::host_memory::mapping_memory;

/// Why `bench restore` failed: each names the fixture or step; causes are
/// sources.
#[derive(Debug, thiserror::Error)]
pub enum RestoreBenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    FixtureName(#[from] KeyError),
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    /// A snapshot section that does not decode (its text names the file).
    #[error(transparent)]
    Section(#[from] crate::lua::snapshot::DeclError),
    #[error("bench restore --tiny-guest: building the fixture")]
    TinyBuild(#[source] Box<VmError>),
    #[error(
        "bench restore --tiny-guest: the tiny guest did not print READY; console:\n{console_tail}"
    )]
    TinyNotReady { console_tail: String },
    #[error("bench restore --tiny-guest")]
    TinyRestore(#[source] Box<VmError>),
    #[error("bench restore --tiny-guest: the restored tiny guest did not run within 60 s")]
    TinyNotRunning,
    #[error("bench restore: `{name}` is a lab_fixture; bench restore takes a vm_fixture")]
    LabFixture { name: String },
    #[error("bench restore: fixture `{name}` has no cache entry after building")]
    NoEntry { name: String },
    #[error(
        "bench restore: fixture `{name}`'s VM had {disks} disk(s) and {nics} NIC(s), which \
         this bench does not recreate; bench a fixture whose VM has none"
    )]
    HasDevices {
        name: String,
        disks: usize,
        nics: usize,
    },
    #[error("bench restore `{}`", entry.display())]
    Restore {
        entry: PathBuf,
        #[source]
        source: Box<BackendError>,
    },
    #[error("bench restore `{}`", entry.display())]
    Ping {
        entry: PathBuf,
        #[source]
        source: ClientError,
    },
}

/// The tiny-guest fixture: the tiny guest booted to READY on `mem_mib` of
/// RAM and snapshotted into the fixture cache, keyed by the guest image and
/// size (built once, reused by later benches).
fn tiny_guest_fixture(
    cache: &provium_snapshot::FixtureCache,
    mem_mib: u64,
) -> Result<(PathBuf, bool), RestoreBenchError> {
    use provium_snapshot::{EntryKind, KeyBuilder};
    let mut k = KeyBuilder::new("provium-bench-tiny-guest-fixture/1");
    k.field("bzimage", tiny_guest::BZIMAGE)
        .field("mem_mib", &mem_mib.to_le_bytes())
        .field(
            "protocol",
            &provium_protocol::PROTOCOL_VERSION.to_le_bytes(),
        );
    let key = k.finish();
    if let Some(p) = cache.lookup(&key, EntryKind::Vm) {
        return Ok((p, false));
    }
    let vm = Vm::new(tiny_restore_config(mem_mib, None))
        .map_err(|e| RestoreBenchError::TinyBuild(Box::new(e)))?;
    vm.boot()
        .map_err(|e| RestoreBenchError::TinyBuild(Box::new(e)))?;
    if !vm
        .console()
        .wait_for(tiny_guest::READY.as_bytes(), 1, Duration::from_secs(120))
    {
        return Err(RestoreBenchError::TinyNotReady {
            console_tail: console_tail(&vm.console()),
        });
    }
    let tmp = cache
        .dir()
        .join(format!(".tiny-guest-{}.snap", std::process::id()));
    vm.snapshot(&tmp)
        .map_err(|e| RestoreBenchError::TinyBuild(Box::new(e)))?;
    drop(vm);
    let p = cache.install_vm(&key, &tmp);
    // The install linked or copied the snapshot and its restore image.
    crate::lua::snapshot::remove_any(&tmp);
    Ok((p?, true))
}

pub(super) fn tiny_restore_config(mem_mib: u64, timer: Option<BootTimer>) -> VmConfig {
    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
        initrd: None,
        cmdline: "console=ttyS0".into(),
    });
    cfg.machine.mem_size_mib = mem_mib;
    cfg.boot_timer = timer;
    cfg.protocol_version = provium_protocol::PROTOCOL_VERSION;
    cfg
}

/// `warmup` untimed samples, then `runs` kept ones, taken by `batch` at
/// most `parallel` at a time.
fn run_batches<T, E>(
    warmup: usize,
    runs: usize,
    parallel: usize,
    mut batch: impl FnMut(usize) -> Result<Vec<T>, E>,
) -> Result<Vec<T>, E> {
    let mut left = warmup;
    while left > 0 {
        let c = left.min(parallel);
        batch(c)?;
        left -= c;
    }
    let mut samples = Vec::with_capacity(runs);
    let mut left = runs;
    while left > 0 {
        let c = left.min(parallel);
        samples.extend(batch(c)?);
        left -= c;
    }
    Ok(samples)
}

/// One batch of `count` restores at once, one thread each: `restore(i)`
/// (i in `0..count`) brings restore `i` up; once every thread has its own,
/// `measure_alive` runs on each (so memory is read with the whole batch
/// resident); then `finish` tears each down into its sample. A failed
/// restore still waits at both barriers, so the others are measured alive
/// as well; the batch fails with the first error by index.
fn run_alive_batch<L, S, E>(
    count: usize,
    restore: impl Fn(usize) -> Result<L, E> + Sync,
    measure_alive: impl Fn(&mut L) + Sync,
    finish: impl Fn(L) -> S + Sync,
) -> Result<Vec<S>, E>
where
    S: Send,
    E: Send,
{
    let barrier = Barrier::new(count);
    let (barrier, restore, measure_alive, finish) = (&barrier, &restore, &measure_alive, &finish);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..count)
            .map(|i| {
                s.spawn(move || {
                    let mut alive = restore(i);
                    barrier.wait();
                    if let Ok(l) = &mut alive {
                        measure_alive(l);
                    }
                    barrier.wait();
                    alive.map(finish)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

struct TinyRestoreSample {
    restore: Duration,
    first_insn: Option<Duration>,
    running: Duration,
    rss: u64,
    pss: u64,
}

/// `bench restore --tiny-guest`: restores of the tiny-guest fixture on the
/// VMM, P at once, each in a new VM.
fn bench_restore_tiny(args: &RunArgs, r: &RestoreArgs) -> Result<Report, RestoreBenchError> {
    use provium_snapshot::FixtureCache;
    let config = load_config(&args.config, &args.settings)?;
    let cache = FixtureCache::open(&config.cache_dir)?;
    let (entry, built) = tiny_guest_fixture(&cache, r.mem)?;
    if built {
        eprintln!(
            "provium bench: built the tiny-guest fixture {}",
            entry.display()
        );
    }
    let runs = r.common.runs.unwrap_or(10).max(1);
    let warmup = r.common.warmup.unwrap_or(1);
    let parallel = r.parallel.max(1);
    let entry_bytes = std::fs::metadata(&entry).map(|m| m.len()).ok();
    let counter_gpa = tiny_guest::COUNTER_GPA;
    // One bench is one run: its restores share the image's RAM copy, as a
    // run's restores through the kvm backend do.
    let ram_cache = provium_vmm::vstate::memory::RestoreRamCache::new();
    let restore_one = |_: usize| -> Result<(Vm, TinyRestoreSample), RestoreBenchError> {
        let timer = BootTimer::new();
        let tiny = |e| RestoreBenchError::TinyRestore(Box::new(e));
        let vm = Vm::new(tiny_restore_config(r.mem, Some(timer.clone()))).map_err(tiny)?;
        let t0 = Instant::now();
        vm.restore_sharing(&entry, &ram_cache).map_err(tiny)?;
        let restore = t0.elapsed();
        // Running: the guest's counter (in restored RAM) moves.
        let c0 = vm.read_guest_u64(counter_gpa).map_err(tiny)?;
        while vm.read_guest_u64(counter_gpa).map_err(tiny)? == c0 {
            if t0.elapsed() > Duration::from_secs(60) {
                return Err(RestoreBenchError::TinyNotRunning);
            }
            std::thread::yield_now();
        }
        let running = t0.elapsed();
        let m = timer.marks();
        let first_insn = BootMarks::between(
            m.get(provium_vmm::BootMark::BuildStart),
            m.get(provium_vmm::BootMark::FirstKvmRun),
        );
        Ok((
            vm,
            TinyRestoreSample {
                restore,
                first_insn,
                running,
                rss: 0,
                pss: 0,
            },
        ))
    };
    let batch = |count: usize| {
        run_alive_batch(
            count,
            restore_one,
            |(vm, sample): &mut (Vm, TinyRestoreSample)| {
                (sample.rss, sample.pss) = mapping_memory(&vm.ram_host_ranges());
            },
            |(vm, sample)| {
                drop(vm);
                sample
            },
        )
    };
    let samples = run_batches(warmup, runs, parallel, batch)?;
    let mut first_insn = Phase::new(
        "restore_to_first_instruction",
        "start of Vm::restore to vCPU 0 entering KVM_RUN in the restored VM",
        "vmm",
        Unit::Ns,
    );
    let mut machine = Phase::new(
        "restore_machine",
        "Vm::restore: open and verify the snapshot, map the restore image, rebuild KVM state and devices, start vCPUs",
        "harness",
        Unit::Ns,
    );
    let mut running = Phase::new(
        "restore_to_guest_running",
        "start of the restore to the guest's loop counter moving in restored RAM",
        "harness",
        Unit::Ns,
    );
    let mut rss = Phase::new(
        "rss_per_vm",
        "resident guest RAM (smaps Rss of the VM's RAM mappings), all of a batch alive",
        "harness",
        Unit::Bytes,
    );
    let mut pss = Phase::new(
        "pss_per_vm",
        "proportional guest RAM (smaps Pss: page-cache pages shared by the batch's restores are split)",
        "harness",
        Unit::Bytes,
    );
    for s in &samples {
        first_insn.push_duration(s.first_insn);
        machine.push_duration(Some(s.restore));
        running.push_duration(Some(s.running));
        rss.samples.push(s.rss);
        pss.samples.push(s.pss);
    }
    if first_insn.samples.is_empty() {
        first_insn.unavailable = Some("the VMM's boot timer recorded no first KVM_RUN".into());
    }
    Ok(Report {
        bench: "restore",
        target: "tiny-guest".into(),
        runs,
        warmup,
        host: host_info(r.common.pin),
        guest: json!({
            "backend": "kvm",
            "fixture": "tiny-guest",
            "entry": entry.display().to_string(),
            "entry_bytes": entry_bytes,
            "memory_bytes": r.mem << 20,
            "vcpus": 1,
            "parallel": parallel,
        }),
        phases: vec![first_insn, machine, running, rss, pss],
    })
}

struct RestoreSample {
    machine: Duration,
    answer: Duration,
    rss: u64,
    pss: u64,
}

pub(super) fn bench_restore(args: &RunArgs, r: &RestoreArgs) -> Result<Report, RestoreBenchError> {
    use crate::fixture;
    use provium_snapshot::{EntryKind, FixtureCache};

    if r.tiny_guest {
        return bench_restore_tiny(args, r);
    }
    let fixture_name = r.fixture.clone().expect("clap requires a fixture");
    let r = &RestoreArgs {
        fixture: Some(fixture_name.clone()),
        ..r.clone()
    };
    let config = Arc::new(load_config(&args.config, &args.settings)?);
    let kind = choose_backend(r.vmm, &config);
    let roots = if config.roots.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        config.roots.clone()
    };
    let env = Arc::new(crate::runner::FileEnv::new(
        "provium bench".into(),
        PathBuf::from("provium-bench"),
        roots.clone(),
        config.clone(),
        backend::for_kind(kind),
        crate::events::EventSender::disabled(),
    ));
    let file = fixture::key::resolve_fixture(&roots, &fixture_name)?;
    if fixture::fixture_kind(&file) != EntryKind::Vm {
        return Err(RestoreBenchError::LabFixture { name: fixture_name });
    }
    if fixture::build_for_cli(&env, &fixture_name, false, &crate::lua::lab::ChunkBuilder)? {
        eprintln!(
            "provium bench: built fixture `{}` (it was not cached)",
            fixture_name
        );
    }
    let key = fixture::fixture_key(&env, &fixture_name)?;
    let cache = FixtureCache::open(&config.cache_dir)?;
    let entry = cache
        .lookup(&key, EntryKind::Vm)
        .ok_or_else(|| RestoreBenchError::NoEntry {
            name: fixture_name.clone(),
        })?;
    let decl = crate::lua::snapshot::VmDecl::read(&entry)?;
    // The bench restores bare machines: a kvm snapshot whose machine had
    // disks or NICs needs them again, which only the Lua layer recreates.
    let devices = crate::lua::snapshot::VmDevices::read_if_present(&entry)?;
    if let Some(d) = devices {
        if !d.disks.is_empty() || !d.nics.is_empty() {
            return Err(RestoreBenchError::HasDevices {
                name: fixture_name,
                disks: d.disks.len(),
                nics: d.nics.len(),
            });
        }
    }
    let runs = r.common.runs.unwrap_or(10).max(1);
    let warmup = r.common.warmup.unwrap_or(1);
    let parallel = r.parallel.max(1);
    let entry_bytes = std::fs::metadata(&entry).map(|m| m.len()).ok();

    let spec_for = |i: usize| MachineSpec {
        rng_seed: decl.rng_seed,
        settings: config.settings.clone(),
        ..MachineSpec::for_profile(
            &format!("bench-restore-{}-{i}", std::process::id()),
            &decl.profile,
            config.profiles.get(&decl.profile).cloned(),
            decl.memory_bytes,
            decl.cpus,
        )
    };
    // One backend for the bench (the fixture build's): its guests get CIDs
    // of their own.
    let restorer = env.machines().clone();
    let restore_failed = |source: BackendError| RestoreBenchError::Restore {
        entry: entry.clone(),
        source: Box::new(source),
    };
    // Restore `i` of the whole bench (warm-up included): its machine and
    // sample, the memory figures still to be read.
    let restore_one = |i: usize| -> Result<(Box<dyn Guest>, RestoreSample), RestoreBenchError> {
        let t0 = Instant::now();
        let m = restorer
            .restore(&spec_for(i), &entry)
            .map_err(restore_failed)?;
        let machine = t0.elapsed();
        let pinged = m.connect().map_err(restore_failed).and_then(|c| {
            c.ping().map_err(|source| RestoreBenchError::Ping {
                entry: entry.clone(),
                source,
            })
        });
        match pinged {
            Ok(()) => Ok((
                m,
                RestoreSample {
                    machine,
                    answer: t0.elapsed(),
                    rss: 0,
                    pss: 0,
                },
            )),
            Err(e) => {
                m.kill();
                Err(e)
            }
        }
    };
    let mut next = 0usize;
    let batch = |count: usize| {
        let first = next;
        next += count;
        run_alive_batch(
            count,
            |i| restore_one(first + i),
            |(m, sample): &mut (Box<dyn Guest>, RestoreSample)| {
                (sample.rss, sample.pss) = m.resident_memory();
            },
            |(m, sample)| {
                m.kill();
                sample
            },
        )
    };
    let samples = run_batches(warmup, runs, parallel, batch)?;

    let mut answer = Phase::new(
        "restore_to_agent_answer",
        "start of the restore to the restored VM's agent answering a ping",
        "harness",
        Unit::Ns,
    );
    let kvm = kind == BackendKind::Kvm;
    let mut machine = Phase::new(
        "restore_machine",
        if kvm {
            "open and verify the snapshot, map its memory image, rebuild KVM state and devices, \
             start the vCPUs (no agent round trip)"
        } else {
            "read and verify the snapshot, start the sandbox, put its files back (no agent round trip)"
        },
        "harness",
        Unit::Ns,
    );
    let mut first_insn = Phase::new(
        "restore_to_first_instruction",
        "start of the restore to the guest's first instruction",
        "vmm",
        Unit::Ns,
    );
    first_insn.unavailable = Some(if kvm {
        "not timed for a Linux fixture; `bench restore --tiny-guest` measures it on the VMM".into()
    } else {
        "the local backend runs no guest CPU (a sandbox's snapshot is its files); \
         `bench restore --tiny-guest` measures it on the VMM"
            .into()
    });
    let mut rss = Phase::new(
        "rss_per_vm",
        if kvm {
            "resident guest RAM (smaps Rss of the VM's RAM mappings), all of a batch alive"
        } else {
            "resident memory (VmRSS) summed over the restored sandbox's processes, all of a batch alive"
        },
        "harness",
        Unit::Bytes,
    );
    let mut pss = Phase::new(
        "pss_per_vm",
        if kvm {
            "proportional guest RAM (smaps Pss: page-cache pages of the memory image shared by the \
             batch's restores are split)"
        } else {
            "proportional memory (Pss, shared pages split between sharers) of the same processes"
        },
        "harness",
        Unit::Bytes,
    );
    for s in &samples {
        answer.push_duration(Some(s.answer));
        machine.push_duration(Some(s.machine));
        rss.samples.push(s.rss);
        pss.samples.push(s.pss);
    }
    Ok(Report {
        bench: "restore",
        target: fixture_name.clone(),
        runs,
        warmup,
        host: host_info(r.common.pin),
        guest: json!({
            "backend": kind.as_str(),
            "emulated_kernel_code": kvm && config.settings.host_kvm_pvm,
            "fixture": fixture_name,
            "entry": entry.display().to_string(),
            "entry_bytes": entry_bytes,
            "profile": decl.profile,
            "memory_bytes": decl.memory_bytes,
            "vcpus": decl.cpus,
            "parallel": parallel,
        }),
        phases: vec![answer, machine, first_insn, rss, pss],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiny_restore_config_is_the_tiny_guest_at_that_size() {
        let cfg = tiny_restore_config(48, None);
        assert_eq!(cfg.machine.mem_size_mib, 48);
        assert_eq!(cfg.boot.cmdline, "console=ttyS0");
        assert!(cfg.boot_timer.is_none());
        assert_eq!(cfg.protocol_version, provium_protocol::PROTOCOL_VERSION);
    }

    #[test]
    fn batches_drop_the_warmup_and_stay_within_parallel() {
        let mut sizes = Vec::new();
        let mut n = 0u32;
        let kept = run_batches::<u32, String>(3, 5, 2, |count| {
            sizes.push(count);
            Ok((0..count)
                .map(|_| {
                    n += 1;
                    n
                })
                .collect())
        })
        .unwrap();
        assert_eq!(
            sizes,
            [2, 1, 2, 2, 1],
            "warm-up 3 then runs 5, two at a time"
        );
        assert_eq!(kept, [4, 5, 6, 7, 8], "only the timed samples are kept");
        let e = run_batches::<u32, String>(0, 1, 1, |_| Err("boom".into())).unwrap_err();
        assert_eq!(e, "boom");
    }

    #[test]
    fn a_batch_measures_every_restore_while_all_are_alive() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let alive = AtomicUsize::new(0);
        let samples = run_alive_batch::<_, _, String>(
            4,
            |i| {
                alive.fetch_add(1, Ordering::SeqCst);
                Ok((i, 0))
            },
            |(_, seen): &mut (usize, usize)| *seen = alive.load(Ordering::SeqCst),
            |(i, seen)| {
                alive.fetch_sub(1, Ordering::SeqCst);
                (i, seen)
            },
        )
        .unwrap();
        assert_eq!(
            samples,
            [(0, 4), (1, 4), (2, 4), (3, 4)],
            "each restore is measured with the whole batch up, samples by index"
        );
        assert_eq!(alive.load(Ordering::SeqCst), 0, "every restore torn down");

        // A failed restore fails the batch; the others are still measured
        // alive and torn down.
        let measured = AtomicUsize::new(0);
        let e = run_alive_batch::<usize, usize, String>(
            3,
            |i| {
                if i == 1 {
                    return Err(format!("restore {i} failed"));
                }
                alive.fetch_add(1, Ordering::SeqCst);
                Ok(i)
            },
            |_| {
                measured.fetch_add(1, Ordering::SeqCst);
            },
            |i| {
                alive.fetch_sub(1, Ordering::SeqCst);
                i
            },
        )
        .unwrap_err();
        assert_eq!(e, "restore 1 failed");
        assert_eq!(measured.load(Ordering::SeqCst), 2);
        assert_eq!(alive.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_failed_restore_names_the_entry_then_the_backends_chain() {
        // A backend refusal, through the boundary.
        let spec = MachineSpec {
            kernel_cmdline: Some("quiet".into()),
            ..MachineSpec::default()
        };
        let source = backend::for_kind(BackendKind::Local)
            .boot(&spec)
            .err()
            .expect("the sandbox has no kernel");
        let e = RestoreBenchError::Restore {
            entry: PathBuf::from("/cache/x.snap"),
            source: Box::new(source),
        };
        assert_eq!(
            crate::error_chain::flatten(&e),
            "bench restore `/cache/x.snap`: kernel_cmdline needs the kvm backend (the local \
             sandbox has no kernel)"
        );
    }
}
