//! The `provium` command line: the test runner (default) and one module per
//! subcommand. Exit codes: 0 all passed, 1 something failed, 2 internal error.

pub mod bench;
pub mod console;
pub mod exec;
pub mod fixture;
pub mod kconfig;
pub mod kernel;
pub mod list;
pub mod lsp_setup;
pub mod preflight;
pub mod prepare;
pub mod repl;
pub mod report;
pub mod run;

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError};
use crate::runner::BackendKind;
use crate::settings::Settings;

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_INTERNAL: i32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VmmChoice {
    /// kvm when /dev/kvm is usable and the profile has a kernel, else local.
    Auto,
    /// The in-process microVMM.
    Kvm,
    /// Namespace sandboxes on the host; no kernel is booted.
    Local,
}

#[derive(Debug, Parser)]
#[command(
    name = "provium",
    version,
    about = "Test kernel and system code in real virtual machines"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Files or directories to scan for *.test.lua (default: the config's roots, else `.`).
    pub paths: Vec<PathBuf>,
    /// Config file location.
    #[arg(long, default_value = "provium.toml", global = true)]
    pub config: PathBuf,
    /// The environment, read once by [`main`] (not a flag).
    #[arg(skip)]
    pub settings: crate::settings::Settings,
    /// Only run files whose test-root-relative path contains this substring.
    #[arg(long)]
    pub filter: Option<String>,
    /// Include meta.slow tests.
    #[arg(long)]
    pub include_slow: bool,
    /// Run only tests with one of these tags (repeatable, OR'd).
    #[arg(long = "tag")]
    pub tags: Vec<String>,
    /// Skip tests with any of these tags (wins over --tag).
    #[arg(long = "no-tag")]
    pub no_tags: Vec<String>,
    /// Run only tests where meta[KEY] contains VALUE.
    #[arg(long = "tag-meta", value_name = "KEY=VALUE")]
    pub tag_meta: Vec<String>,
    /// Skip tests where meta[KEY] contains VALUE (wins over --tag-meta).
    #[arg(long = "no-tag-meta", value_name = "KEY=VALUE")]
    pub no_tag_meta: Vec<String>,
    /// Run only the files that failed in the last run.
    #[arg(long)]
    pub rerun_failed: bool,
    /// Run one shard of the suite: `count:I/N` (files dealt round-robin in
    /// discovery order) or `hash:I/N` (by a stable hash of each file's
    /// root-relative path); I counts from 1. docs/ci.md.
    #[arg(long, value_name = "KIND:I/N")]
    pub partition: Option<crate::partition::Partition>,
    /// Run only files modified after this reference file.
    #[arg(long, value_name = "PATH")]
    pub since: Option<PathBuf>,
    /// Re-run when files change (polls every 500 ms).
    #[arg(long)]
    pub watch: bool,
    /// VMM backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub vmm: VmmChoice,
    /// Pool memory budget (default: 80% of host RAM).
    #[arg(long, value_name = "BYTES")]
    pub mem: Option<String>,
    /// Pool vCPU budget (default: online CPUs).
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Multiplier on --cpus, clamped to [0.5, 8.0].
    #[arg(long, default_value_t = 1.0)]
    pub cpu_overcommit: f64,
    /// Skip the start-up checks of what the backend needs.
    #[arg(long)]
    pub no_preflight: bool,
    /// Skip Kernel Same-page Merging tuning.
    #[arg(long)]
    pub no_ksm: bool,
    /// Skip the profiles' build commands.
    #[arg(long)]
    pub no_build: bool,
    /// Per-file timeout: seconds or "30s"/"10m"; 0 disables.
    #[arg(long, default_value = "300")]
    pub timeout: String,
    /// Run seed for bridges' drop patterns (default: $PROVIUM_SEED, else random;
    /// printed when something fails, so the run can be reproduced).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop after the first failed file.
    #[arg(long)]
    pub fail_fast: bool,
    /// Show passing and skipped tests too.
    #[arg(short, long, conflicts_with = "quiet")]
    pub verbose: bool,
    /// Show only failures.
    #[arg(short, long)]
    pub quiet: bool,
    /// Line-delimited JSON, one object per file.
    #[arg(long, conflicts_with = "events_stdout")]
    pub json: bool,
    /// Write JUnit XML here.
    #[arg(long, value_name = "PATH")]
    pub junit: Option<PathBuf>,
    /// Save the event stream (length-prefixed msgpack frames).
    #[arg(long, value_name = "PATH")]
    pub save_events: Option<PathBuf>,
    /// Event frames on stdout; human output moves to stderr.
    #[arg(long)]
    pub events_stdout: bool,
    /// Serve the event stream on a Unix socket.
    #[arg(long, value_name = "PATH")]
    pub events_socket: Option<PathBuf>,
    /// Pipe the events into `provium-coverage` after the run.
    #[arg(long)]
    pub coverage: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run dynamic profiles' build commands without booting anything.
    Prepare { profile: Option<String> },
    /// Boot a VM and read Lua lines against it (`vm` is the VM).
    Repl {
        profile: Option<String>,
        #[arg(long, default_value = "repl")]
        name: String,
        #[arg(long)]
        fixture: Option<String>,
    },
    /// Attach the terminal to a VM's serial console.
    Console {
        profile: String,
        #[arg(long)]
        mem: Option<String>,
        #[arg(long)]
        cpus: Option<u32>,
        #[arg(long)]
        cmdline: Option<String>,
        #[arg(long)]
        agent: bool,
    },
    /// Manage the fixture cache.
    Fixture {
        #[command(subcommand)]
        op: FixtureOp,
    },
    /// List discovered tests (or fixtures) without running them.
    List {
        paths: Vec<PathBuf>,
        #[arg(long)]
        fixtures: bool,
        /// Only this shard's files (as `provium --partition`).
        #[arg(long, value_name = "KIND:I/N")]
        partition: Option<crate::partition::Partition>,
    },
    /// Reports across runs: `report merge` combines a sharded run's shards.
    Report {
        #[command(subcommand)]
        op: report::ReportOp,
    },
    /// Boot, restore and agent round-trip timing (docs/benchmarking.md).
    Bench {
        #[command(subcommand)]
        op: bench::BenchOp,
    },
    /// Check a kernel against what Provium needs (docs/kernels.md).
    Kernel {
        #[command(subcommand)]
        op: kernel::KernelOp,
    },
    /// Print a merge_config.sh fragment of every kernel option Provium uses.
    Kconfig,
    /// Boot a kernel and run one command in it (no provium.toml needed).
    Exec(exec::ExecArgs),
    /// Write Lua language-server definitions for the harness globals.
    LspSetup {
        dir: Option<PathBuf>,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum FixtureOp {
    List,
    /// Build a fixture unless it is cached; `--all` builds every fixture
    /// under the roots (a CI "build fixtures" job, docs/ci.md).
    Build {
        #[arg(required_unless_present = "all")]
        path: Option<String>,
        #[arg(long, conflicts_with = "path")]
        all: bool,
    },
    /// Evict the fixture's entries (`.snap` and `.lab`) and build it again.
    Rebuild {
        path: String,
    },
    Clean,
    Stale,
    /// Write the cache entries the suite's fixtures need, with their keys
    /// and checksums, into DIR (for a CI cache or artifact step).
    Export {
        dir: PathBuf,
    },
    /// Verify and install the entries of an export; refused ones are named
    /// and left for a local rebuild.
    Import {
        dir: PathBuf,
    },
}

// The setup every subcommand shares: its config and its backend.

/// Load provium.toml: a missing default file means defaults; a missing
/// explicit `--config` is an error.
pub fn load_config(path: &Path, settings: &Settings) -> Result<Config, ConfigError> {
    if path == Path::new("provium.toml") && !path.exists() {
        return Ok(Config::defaults(Path::new("."), settings));
    }
    Config::load(path, settings)
}

/// Choose the backend; `auto` says which it picked, and why, on stderr.
pub fn choose_backend(choice: VmmChoice, config: &Config) -> BackendKind {
    match choice {
        VmmChoice::Local => BackendKind::Local,
        VmmChoice::Kvm => BackendKind::Kvm,
        VmmChoice::Auto => {
            let (kind, why) = auto_backend(preflight::kvm_usable(), config);
            eprintln!(
                "provium: --vmm auto: using the {} backend ({why})",
                kind.as_str()
            );
            kind
        }
    }
}

/// `--vmm auto`: kvm when /dev/kvm is usable (`kvm`) and a profile's kernel
/// exists, with its initrd if it sets one; else local. Returns the reason
/// too, for the stderr line.
pub fn auto_backend(
    kvm: Result<(), preflight::PreflightError>,
    config: &Config,
) -> (BackendKind, String) {
    if let Err(e) = kvm {
        return (BackendKind::Local, crate::error_chain::flatten(&e));
    }
    let mut missing = None;
    for (name, p) in &config.profiles {
        let Some(kernel) = p.kernel.as_ref().filter(|k| k.is_file()) else {
            continue;
        };
        match &p.initrd {
            Some(i) if !i.is_file() => {
                missing.get_or_insert_with(|| {
                    format!("profile `{name}`'s initrd {} does not exist", i.display())
                });
            }
            Some(_) => {
                return (
                    BackendKind::Kvm,
                    format!(
                        "/dev/kvm is usable and profile `{name}`'s kernel {} and initrd exist",
                        kernel.display()
                    ),
                )
            }
            None => {
                return (
                    BackendKind::Kvm,
                    format!(
                        "/dev/kvm is usable and profile `{name}`'s kernel {} exists",
                        kernel.display()
                    ),
                )
            }
        }
    }
    let why = missing.unwrap_or_else(|| "no profile's kernel exists".into());
    (BackendKind::Local, why)
}

/// Parse and run; returns the process exit code.
pub fn main() -> i32 {
    let mut cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                EXIT_INTERNAL
            } else {
                EXIT_OK
            };
            let _ = e.print();
            return code;
        }
    };
    cli.run.settings = crate::settings::Settings::from_env();
    let result = match cli.command {
        None => run::run(&cli.run).map_err(CliError::from),
        Some(Command::Prepare { profile }) => {
            prepare::run(&cli.run.config, &cli.run.settings, profile.as_deref())
                .map_err(CliError::from)
        }
        Some(Command::Repl {
            profile,
            name,
            fixture,
        }) => repl::run(&cli.run, profile, &name, fixture).map_err(CliError::from),
        Some(Command::Console {
            profile,
            mem,
            cpus,
            cmdline,
            agent,
        }) => console::run(
            &cli.run,
            &profile,
            &console::ConsoleOpts {
                mem,
                cpus,
                cmdline,
                agent,
            },
        )
        .map_err(CliError::from),
        Some(Command::Fixture { op }) => fixture::run(&cli.run, op).map_err(CliError::from),
        Some(Command::List {
            paths,
            fixtures,
            partition,
        }) => list::run(
            &cli.run.config,
            &cli.run.settings,
            &paths,
            fixtures,
            partition,
        )
        .map_err(CliError::from),
        Some(Command::Report { op }) => report::run(op).map_err(CliError::from),
        Some(Command::LspSetup { dir, force }) => {
            lsp_setup::run(dir, force).map_err(CliError::from)
        }
        Some(Command::Bench { op }) => bench::run(&cli.run, op).map_err(CliError::from),
        Some(Command::Kernel { op }) => {
            kernel::run(&cli.run.config, &cli.run.settings, op).map_err(CliError::from)
        }
        Some(Command::Kconfig) => Ok(kconfig::run()),
        Some(Command::Exec(args)) => exec::run(&args, &cli.run.settings).map_err(CliError::from),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // The chain, once: each layer's message on its own numbered line.
            eprintln!("provium: {}", crate::error_chain::numbered(&e));
            EXIT_INTERNAL
        }
    }
}

/// A project in a temp dir whose `provium.toml` holds `toml`, and
/// `provium --config <that file> ARGS...` parsed as `main` parses it.
#[cfg(test)]
pub(crate) fn parse_in_project(toml: &str, args: &[&str]) -> (tempfile::TempDir, Cli) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("provium.toml");
    std::fs::write(&path, toml).expect("provium.toml written");
    let path = path.to_str().expect("a UTF-8 temp path").to_string();
    let argv = ["provium", "--config", path.as_str()]
        .into_iter()
        .chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    (dir, cli)
}

/// What a subcommand failed with, as `main` prints it (exit 2): each
/// subcommand's own error, whose `source()` chain `main` prints once,
/// numbered.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Run(#[from] run::RunError),
    #[error(transparent)]
    Prepare(#[from] prepare::PrepareError),
    #[error(transparent)]
    Repl(#[from] repl::ReplError),
    #[error(transparent)]
    Console(#[from] console::ConsoleError),
    #[error(transparent)]
    Fixture(#[from] fixture::FixtureCmdError),
    #[error(transparent)]
    List(#[from] list::ListError),
    #[error(transparent)]
    Report(#[from] report::MergeError),
    #[error(transparent)]
    LspSetup(#[from] lsp_setup::LspSetupError),
    #[error(transparent)]
    Bench(#[from] bench::BenchError),
    #[error(transparent)]
    Kernel(#[from] kernel::KernelCmdError),
    #[error(transparent)]
    Exec(#[from] exec::ExecError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subcommands_error_keeps_its_chain_for_main() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let e = CliError::from(lsp_setup::run(Some(file.clone()), false).unwrap_err());
        let printed = crate::error_chain::numbered(&e);
        assert_eq!(
            printed,
            format!(
                "lsp-setup: `{}`\n  1: Not a directory (os error 20)",
                file.join(".provium-meta").display()
            )
        );
    }

    #[test]
    fn auto_picks_kvm_only_with_a_usable_kvm_and_a_bootable_profile() {
        let d = tempfile::tempdir().unwrap();
        let kernel = d.path().join("bzImage");
        std::fs::write(&kernel, b"k").unwrap();
        let mut config = Config::defaults(d.path(), &Settings::default());
        let (kind, why) = auto_backend(Ok(()), &config);
        assert_eq!(
            (kind, why.as_str()),
            (BackendKind::Local, "no profile's kernel exists")
        );
        let mut p = crate::config::Profile {
            disk_slots: crate::config::profile::DEFAULT_DISK_SLOTS,
            nic_slots: crate::config::profile::DEFAULT_NIC_SLOTS,
            name: "p".into(),
            kernel: Some(kernel.clone()),
            initrd: Some(d.path().join("initrd.cpio")),
            cmdline: String::new(),
            cmdline_file: None,
            guest_os: "linux".into(),
            transport: Default::default(),
            inject_agent: true,
            agent_overlay_path: None,
            agent_channel: Default::default(),
            modules: None,
            build: None,
            build_out: d.path().into(),
        };
        config.profiles.insert("p".into(), p.clone());
        let (kind, why) = auto_backend(Ok(()), &config);
        assert_eq!(kind, BackendKind::Local);
        assert!(
            why.contains("profile `p`'s initrd") && why.contains("does not exist"),
            "{why}"
        );
        p.initrd = None;
        config.profiles.insert("p".into(), p.clone());
        let (kind, why) = auto_backend(Ok(()), &config);
        assert_eq!(kind, BackendKind::Kvm);
        assert_eq!(
            why,
            format!(
                "/dev/kvm is usable and profile `p`'s kernel {} exists",
                kernel.display()
            )
        );
        let gone = preflight::PreflightError::KvmUnusable(std::io::Error::other("gone"));
        let (kind, why) = auto_backend(Err(gone), &config);
        assert_eq!(
            (kind, why.as_str()),
            (BackendKind::Local, "/dev/kvm is not usable: gone")
        );
    }
}
