//! The default mode: discover, select, schedule, report.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use provium_protocol::event::ResourceAmount;

use super::{choose_backend, load_config, preflight, RunArgs, EXIT_FAILED, EXIT_INTERNAL, EXIT_OK};
use crate::config::{parse_size, Config, ConfigError};
use crate::discover::{discover, TestFile};
use crate::events::{EventBus, EventSocket};
use crate::lua::duration::parse_duration_str;
use crate::lua::test_file::LuaRuntimeFactory;
use crate::report::human::HumanReporter;
use crate::report::json::JsonReporter;
use crate::report::junit::JunitReporter;
use crate::report::{
    new_run_id, progress::Progress, suite_id, ReportError, Reporters, RunIdentity, Verbosity,
};
use crate::runner::filter::{parse_key_values, FilterError, TestFilter};
use crate::runner::{BackendKind, FileEnv, RunResources};
use crate::scheduler::dispatcher::{Dispatcher, DispatcherOptions, Job, PsiMonitor};
use crate::scheduler::executor::ExecutorContext;
use crate::settings::Settings;

/// What a run can fail with before or after its tests (a test's failure is
/// an outcome, not an error).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// provium.toml could not be loaded (its causes chain on).
    #[error("cannot load the configuration")]
    Config(#[from] ConfigError),
    #[error("rerun state `{}`", path.display())]
    RerunState {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// `--mem` does not parse (the size parser's message).
    #[error("--mem")]
    Mem(#[source] crate::config::SizeError),
    /// `--timeout` does not parse (the duration parser's message).
    #[error("--timeout: {0}")]
    Timeout(String),
    #[error("profile `{profile}`: create build_out `{}`", path.display())]
    BuildOut {
        profile: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("profile `{profile}`: cannot run build command")]
    BuildSpawn {
        profile: String,
        #[source]
        source: std::io::Error,
    },
    #[error("profile `{profile}`: build command failed ({status}); not using stale artifacts")]
    BuildFailed {
        profile: String,
        status: std::process::ExitStatus,
    },
    #[error("--since `{}`", path.display())]
    Since {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The preflight refused the backend (its message names the fix).
    #[error(transparent)]
    Preflight(#[from] crate::cli::preflight::PreflightError),
    /// Discovering the test files failed (it names the path).
    #[error(transparent)]
    Discover(#[from] crate::discover::DiscoverError),
    /// `--events-socket` or `--save-events` could not be opened; the error
    /// names the flag and path.
    #[error(transparent)]
    EventOutput(std::io::Error),
    #[error("--coverage: cannot write marker `{}`", path.display())]
    CoverageMarker {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing events")]
    WritingEvents(#[source] std::io::Error),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(
        "PROVIUM_SEED=`{value}` is not an unsigned 64-bit integer (unset it for a random seed)"
    )]
    Seed { value: String },
}

/// A run error as one line of text (tests compare it): the chain,
/// flattened once.
impl From<RunError> for String {
    fn from(e: RunError) -> String {
        crate::error_chain::flatten(&e)
    }
}

/// `$PROVIUM_RERUN_STATE`, else `~/.cache/provium/rerun.json`, else
/// `/tmp/provium-rerun.json`.
pub fn rerun_state_path(settings: &Settings) -> PathBuf {
    if let Some(p) = &settings.rerun_state {
        return p.clone();
    }
    match &settings.home {
        Some(h) => h.join(".cache/provium/rerun.json"),
        None => PathBuf::from("/tmp/provium-rerun.json"),
    }
}

fn read_rerun_state(settings: &Settings) -> Option<Vec<PathBuf>> {
    let text = std::fs::read_to_string(rerun_state_path(settings)).ok()?;
    serde_json::from_str::<Vec<PathBuf>>(&text).ok()
}

fn write_rerun_state(settings: &Settings, failed: &[PathBuf]) -> Result<(), RunError> {
    let path = rerun_state_path(settings);
    let text = serde_json::to_string_pretty(failed).unwrap_or_default();
    path.parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|source| RunError::RerunState { path, source })
}

fn build_filter(args: &RunArgs) -> Result<TestFilter, RunError> {
    Ok(TestFilter {
        include_slow: args.include_slow,
        tags: args.tags.clone(),
        no_tags: args.no_tags.clone(),
        tag_meta: parse_key_values("--tag-meta", &args.tag_meta)?,
        no_tag_meta: parse_key_values("--no-tag-meta", &args.no_tag_meta)?,
    })
}

fn pool_from(args: &RunArgs) -> Result<ResourceAmount, RunError> {
    let memory_bytes = match &args.mem {
        Some(m) => parse_size(m).map_err(RunError::Mem)?,
        None => host_memory_bytes() / 10 * 8,
    };
    let cpus = args
        .cpus
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    let factor = args.cpu_overcommit.clamp(0.5, 8.0);
    Ok(ResourceAmount {
        memory_bytes,
        cpus: ((cpus as f64 * factor).floor() as u32).max(1),
    })
}

/// One VM per host core where the kvm backend's guest kernels are emulated
/// (kvm_pvm): an emulated VM keeps a core busy, and two sharing one each
/// run at half speed (docs/harness.md, "The pool").
fn emulated_vm_slots(backend: BackendKind, settings: &Settings) -> Option<u32> {
    (backend == BackendKind::Kvm && settings.host_kvm_pvm).then(|| {
        std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
    })
}

fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(8 << 30, |kb| kb * 1024)
}

fn file_timeout(args: &RunArgs) -> Result<Option<Duration>, RunError> {
    let d = parse_duration_str(&args.timeout)
        .map_err(|e| RunError::Timeout(crate::error_chain::flatten(&e)))?;
    Ok(if d.is_zero() { None } else { Some(d) })
}

/// Run the profiles' `build` commands (once, before anything boots).
pub fn run_builds(config: &Config, only: Option<&str>) -> Result<(), RunError> {
    for (name, p) in &config.profiles {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let Some(cmd) = &p.build else { continue };
        std::fs::create_dir_all(&p.build_out).map_err(|source| RunError::BuildOut {
            profile: name.clone(),
            path: p.build_out.clone(),
            source,
        })?;
        eprintln!("provium: building profile `{name}`: {cmd}");
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(&config.base_dir)
            .status()
            .map_err(|source| RunError::BuildSpawn {
                profile: name.clone(),
                source,
            })?;
        if !status.success() {
            return Err(RunError::BuildFailed {
                profile: name.clone(),
                status,
            });
        }
    }
    Ok(())
}

fn select(files: Vec<TestFile>, args: &RunArgs) -> Result<Vec<TestFile>, RunError> {
    let mut files: Vec<TestFile> = match &args.filter {
        Some(f) => files
            .into_iter()
            .filter(|t| t.rel.contains(f.as_str()))
            .collect(),
        None => files,
    };
    if args.rerun_failed && !args.watch {
        match read_rerun_state(&args.settings) {
            Some(failed) => files.retain(|f| failed.contains(&f.abs)),
            None => files.clear(),
        }
    }
    if let Some(reference) = &args.since {
        let t = std::fs::metadata(reference)
            .and_then(|m| m.modified())
            .map_err(|source| RunError::Since {
                path: reference.clone(),
                source,
            })?;
        files.retain(|f| {
            std::fs::metadata(&f.abs)
                .and_then(|m| m.modified())
                .is_ok_and(|m| m > t)
        });
    }
    Ok(files)
}

/// The notice `--rerun-failed` prints when no earlier run recorded a
/// failure: running the whole suite instead is almost never what was meant.
pub fn no_rerun_state_notice(path: &Path) -> String {
    format!(
        "provium: --rerun-failed: no failed files recorded (no state at {}); nothing to run",
        path.display()
    )
}

pub fn run(args: &RunArgs) -> Result<i32, RunError> {
    let config = Arc::new(load_config(&args.config, &args.settings)?);
    if args.rerun_failed && !args.watch && read_rerun_state(&args.settings).is_none() {
        eprintln!(
            "{}",
            no_rerun_state_notice(&rerun_state_path(&args.settings))
        );
        return Ok(EXIT_OK);
    }
    let filter = Arc::new(build_filter(args)?);
    let pool = pool_from(args)?;
    let timeout = file_timeout(args)?;
    let backend = choose_backend(args.vmm, &config);
    crate::runner::interrupt::install();
    if !args.no_preflight {
        preflight::check(backend, args.coverage, &args.settings)?;
    }
    if !args.no_build {
        run_builds(&config, None)?;
    }
    super::fixture::evict_at_startup(&config);
    crate::lua::snapshot::remove_stale_temps(&std::env::temp_dir());
    if backend == BackendKind::Kvm && !args.no_ksm {
        preflight::tune_ksm();
    }
    let paths: Vec<PathBuf> = if !args.paths.is_empty() {
        args.paths.clone()
    } else if !config.roots.is_empty() {
        config.roots.clone()
    } else {
        vec![PathBuf::from(".")]
    };
    let socket = match &args.events_socket {
        Some(p) => Some(EventSocket::bind(p).map_err(RunError::EventOutput)?),
        None => None,
    };
    if !args.watch {
        return run_once(
            args,
            &config,
            &filter,
            pool,
            timeout,
            backend,
            &paths,
            socket.as_ref(),
        );
    }
    // Watch mode: rerun whenever a file under the paths changes.
    let mut last = newest_mtime(&paths);
    loop {
        let _ = run_once(
            args,
            &config,
            &filter,
            pool,
            timeout,
            backend,
            &paths,
            socket.as_ref(),
        );
        if let Some(sig) = crate::runner::interrupt::received() {
            return Ok(crate::runner::interrupt::exit_code(sig));
        }
        eprintln!("provium: watching for changes (Ctrl-C to stop)");
        loop {
            if let Some(sig) = crate::runner::interrupt::received() {
                return Ok(crate::runner::interrupt::exit_code(sig));
            }
            std::thread::sleep(Duration::from_millis(500));
            let now = newest_mtime(&paths);
            if now != last {
                last = now;
                break;
            }
        }
    }
}

fn newest_mtime(paths: &[PathBuf]) -> Option<SystemTime> {
    fn walk(p: &Path, best: &mut Option<SystemTime>) {
        if let Ok(m) = std::fs::metadata(p) {
            if let Ok(t) = m.modified() {
                *best = (*best).max(Some(t));
            }
            if m.is_dir() {
                for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                    walk(&e.path(), best);
                }
            }
        }
    }
    let mut best = None;
    for p in paths {
        walk(p, &mut best);
    }
    best
}

#[allow(clippy::too_many_arguments)]
fn run_once(
    args: &RunArgs,
    config: &Arc<Config>,
    filter: &Arc<TestFilter>,
    pool: ResourceAmount,
    timeout: Option<Duration>,
    backend: BackendKind,
    paths: &[PathBuf],
    socket: Option<&EventSocket>,
) -> Result<i32, RunError> {
    let started = Instant::now();
    let run_seed = run_seed(args.seed, args.settings.seed.as_deref())?;
    let files = select(discover(paths, &config.roots)?, args)?;
    let run = RunIdentity {
        run_id: new_run_id(),
        suite_id: suite_id(files.iter().map(|f| f.rel.as_str())),
        suite_files: u32::try_from(files.len()).unwrap_or(u32::MAX),
        partition: args.partition.map(|p| p.to_string()),
    };
    let files = match args.partition {
        Some(p) => p.select(files, |f| f.rel.as_str()),
        None => files,
    };
    let coverage_tmp = (args.coverage && args.save_events.is_none()).then(|| {
        std::env::temp_dir().join(format!("provium-coverage-{}.msgpack", std::process::id()))
    });
    if let Some(tmp) = &coverage_tmp {
        // The sibling marker proves the temp file is ours (run_coverage).
        let marker = coverage_marker(tmp);
        std::fs::write(&marker, std::process::id().to_string()).map_err(|source| {
            RunError::CoverageMarker {
                path: marker.clone(),
                source,
            }
        })?;
    }
    let save_to = args.save_events.clone().or(coverage_tmp.clone());
    let bus = EventBus::start(save_to.as_deref(), args.events_stdout, socket, false)
        .map_err(RunError::EventOutput)?;
    let verbosity = if args.quiet {
        Verbosity::Quiet
    } else if args.verbose {
        Verbosity::Verbose
    } else {
        Verbosity::Normal
    };
    // Human/JSON output goes to stderr when stdout carries event frames.
    let out: Box<dyn Write> = if args.events_stdout {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let roots: Vec<PathBuf> = if config.roots.is_empty() {
        paths.to_vec()
    } else {
        config.roots.clone()
    };
    let run_resources = RunResources::with_pool(pool);
    // One backend value for the whole run: its guests share one CID space.
    let machines = crate::backend::for_kind(backend);
    // Only the dispatcher calls the reporters and writes the event stream;
    // --json replaces the human lines (and their progress line and summary).
    let mut reporters = Reporters::default();
    if args.json {
        reporters.push(JsonReporter::new(out, run.clone()));
    } else {
        let progress = Progress::new(files.len(), !args.events_stdout);
        reporters.push(HumanReporter::new(out, verbosity, progress));
    }
    if let Some(path) = &args.junit {
        reporters.push(JunitReporter::new(path.clone()));
    }
    let opts = DispatcherOptions {
        identity: run,
        pool,
        fail_fast: args.fail_fast,
        emulated_vm_slots: emulated_vm_slots(backend, &args.settings),
        run_started: started,
        run_resources: run_resources.clone(),
    };
    let executor = ExecutorContext {
        filter: filter.clone(),
        file_timeout: timeout,
        runtimes: Arc::new(LuaRuntimeFactory),
    };
    let mut psi = PsiMonitor::new("/proc/pressure");
    let dispatcher = Dispatcher::new(opts, executor, bus.sender(), &mut psi, &mut reporters);
    // Each file's events (its tests, VMs, claims, fixtures) go to the
    // dispatcher, which alone passes them on.
    let events = dispatcher.event_sender();
    let jobs: Vec<Job> = files
        .iter()
        .map(|f| Job {
            env: Arc::new(
                FileEnv::new(
                    f.rel.clone(),
                    f.abs.clone(),
                    roots
                        .iter()
                        .map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()))
                        .collect(),
                    config.clone(),
                    machines.clone(),
                    events.clone(),
                )
                .with_run_seed(run_seed)
                .with_run_resources(run_resources.clone()),
            ),
            claim: f.declared_claim,
            fixture_refs: f.fixture_refs.clone(),
            vms: f.vm_estimate,
        })
        .collect();
    drop(events);
    let summary = dispatcher.run(jobs);
    drop(reporters);
    bus.finish().map_err(RunError::WritingEvents)?;
    if let Some(e) = summary.report_error {
        return Err(e.into());
    }
    let outcomes = summary.outcomes;
    let failed: Vec<PathBuf> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| o.abs_path.clone())
        .collect();
    if !failed.is_empty() {
        write_rerun_state(&args.settings, &failed)?;
        eprintln!(
            "provium: run seed {run_seed} (rerun with --seed {run_seed} or PROVIUM_SEED={run_seed} for the same drops)"
        );
    }
    let mut code = if failed.is_empty() {
        EXIT_OK
    } else {
        EXIT_FAILED
    };
    if args.coverage {
        code = code.max(run_coverage(save_to.as_deref(), coverage_tmp.is_some()));
    }
    if let Some(sig) = crate::runner::interrupt::received() {
        eprintln!(
            "provium: interrupted by {}: {} of {} files reported, the rest not run",
            crate::runner::interrupt::signal_name(sig),
            outcomes.len(),
            files.len()
        );
        code = crate::runner::interrupt::exit_code(sig);
    }
    Ok(code)
}

fn run_coverage(events: Option<&Path>, temporary: bool) -> i32 {
    let Some(path) = events else {
        return EXIT_INTERNAL;
    };
    let mut cmd = std::process::Command::new("provium-coverage");
    cmd.arg("--from")
        .arg(path)
        .env("PROVIUM_COVERAGE_TMP", path);
    let marker = coverage_marker(path);
    if temporary {
        cmd.env("PROVIUM_COVERAGE_MARKER", &marker);
    } else {
        cmd.env("PROVIUM_COVERAGE_USER_FILE", path);
    }
    let code = match cmd.status() {
        Ok(s) if s.success() => EXIT_OK,
        Ok(_) => EXIT_FAILED,
        Err(e) => {
            eprintln!("provium: --coverage: cannot run provium-coverage: {e}");
            EXIT_FAILED
        }
    };
    // Delete the events only where the marker says this run made them.
    if temporary && marker.is_file() {
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(&marker);
    }
    code
}

/// `--coverage`'s marker for its temp events file: a sibling
/// `<file>.provium-marker` (the reference's `PROVIUM_COVERAGE_MARKER`).
fn coverage_marker(events: &Path) -> PathBuf {
    let mut name = events.as_os_str().to_owned();
    name.push(".provium-marker");
    PathBuf::from(name)
}

/// The run seed: `--seed`, else `PROVIUM_SEED` (read once, by the caller),
/// else a fresh random one below 2^63 (so Lua shows it as an integer).
pub fn run_seed(flag: Option<u64>, env: Option<&str>) -> Result<u64, RunError> {
    if let Some(s) = flag {
        return Ok(s);
    }
    if let Some(v) = env {
        return v.trim().parse::<u64>().map_err(|_| RunError::Seed {
            value: v.to_string(),
        });
    }
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = ((t as u64) ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    Ok(u64::from_le_bytes(b) >> 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_errors_name_the_value_and_print_their_cause_once() {
        let e = run_seed(None, Some("12x")).unwrap_err();
        assert_eq!(
            String::from(e),
            "PROVIUM_SEED=`12x` is not an unsigned 64-bit integer (unset it for a random seed)"
        );
        assert_eq!(run_seed(Some(3), Some("12x")).unwrap(), 3);
        assert_eq!(run_seed(None, Some(" 7 ")).unwrap(), 7);
        let e = RunError::Since {
            path: "ref".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(String::from(e), "--since `ref`: entity not found");
        let d = tempfile::tempdir().unwrap();
        let absent = d.path().join("absent.toml");
        let e = RunError::from(load_config(&absent, &Settings::default()).unwrap_err());
        assert!(matches!(e, RunError::Config(_)), "{e:?}");
        // The cause (the i/o error) is chained, and printed once.
        let text = String::from(e);
        assert_eq!(
            text.matches("No such file or directory").count(),
            1,
            "{text}"
        );
        assert!(text.contains("absent.toml"), "{text}");
    }
}
