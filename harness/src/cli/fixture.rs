//! `provium fixture list|build|rebuild|clean|stale|export|import`: the
//! fixture cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use provium_snapshot::{CacheError, EntryKind, FixtureCache};

use super::{choose_backend, load_config};
use super::{FixtureOp, RunArgs, EXIT_FAILED, EXIT_OK};
use crate::config::{Config, ConfigError};
use crate::events::EventSender;
use crate::fixture::{self, transfer, FixtureError};
use crate::lua::lab::ChunkBuilder;
use crate::runner::FileEnv;

fn mib(bytes: u64) -> String {
    format!("{:.2}MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The test roots, canonical as a run sees them, so the `fixture`
/// subcommands find fixtures, helpers and host files where a run does.
fn roots(config: &Config) -> Vec<PathBuf> {
    let roots = if config.roots.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        config.roots.clone()
    };
    roots
        .into_iter()
        .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
        .collect()
}

/// A FileEnv for building outside a test run.
fn cli_env(args: &RunArgs, config: Arc<Config>) -> Arc<FileEnv> {
    let backend = choose_backend(args.vmm, &config);
    Arc::new(FileEnv::new(
        "provium fixture".into(),
        PathBuf::from("provium-fixture"),
        roots(&config),
        config,
        crate::backend::for_kind(backend),
        EventSender::disabled(),
    ))
}

/// LRU eviction to `cache_max_size`, run at startup before tests dispatch.
/// Problems are warnings: a cache that cannot be trimmed must not stop a run.
pub fn evict_at_startup(config: &Config) {
    if !config.cache_dir.exists() {
        return;
    }
    match FixtureCache::open(&config.cache_dir).and_then(|c| c.evict_lru(config.cache_max_bytes)) {
        Ok(evicted) => {
            for e in evicted {
                eprintln!(
                    "provium: evicted fixture cache entry {} ({}, least recently used; cache_max_size is {})",
                    e.key,
                    mib(e.size_bytes),
                    mib(config.cache_max_bytes)
                );
            }
        }
        Err(e) => eprintln!("provium: warning: {}", crate::error_chain::flatten(&e)),
    }
}

fn shown(config: &Config, p: &Path) -> String {
    let base = std::fs::canonicalize(&config.base_dir).unwrap_or_else(|_| config.base_dir.clone());
    p.strip_prefix(&base)
        .or_else(|_| p.strip_prefix(&config.base_dir))
        .unwrap_or(p)
        .display()
        .to_string()
}

/// Why a `provium fixture` subcommand failed; each layer's error names
/// the fixture, entry or directory.
#[derive(Debug, thiserror::Error)]
pub enum FixtureCmdError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    #[error(transparent)]
    Transfer(#[from] transfer::TransferError),
}

pub fn run(args: &RunArgs, op: FixtureOp) -> Result<i32, FixtureCmdError> {
    let config = Arc::new(load_config(&args.config, &args.settings)?);
    let dir = &config.cache_dir;
    match op {
        FixtureOp::List => {
            let cache = FixtureCache::open(dir)?;
            let entries = cache.list()?;
            let total: u64 = entries.iter().map(|e| e.size_bytes).sum();
            for e in &entries {
                println!(
                    "{:>11}  {:<4} {}",
                    mib(e.size_bytes),
                    e.kind.as_str(),
                    e.key
                );
            }
            println!();
            println!("{} entries, {}", entries.len(), mib(total));
            Ok(EXIT_OK)
        }
        FixtureOp::Clean => {
            let cache = FixtureCache::open(dir)?;
            cache.clean()?;
            println!("removed {}", dir.display());
            Ok(EXIT_OK)
        }
        FixtureOp::Build { path, all } => {
            let env = cli_env(args, config);
            let names: Vec<String> = if all {
                fixture::all_fixtures(&env.roots)
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect()
            } else {
                path.into_iter().collect()
            };
            for path in names {
                if fixture::build_for_cli(&env, &path, false, &ChunkBuilder)? {
                    println!("built: {path}");
                } else {
                    println!("already built: {path}");
                }
            }
            Ok(EXIT_OK)
        }
        FixtureOp::Export { dir } => {
            let env = cli_env(args, config);
            let (exported, missing) = transfer::export(&env, &dir)?;
            for n in &exported {
                println!("exported: {n}");
            }
            for n in &missing {
                eprintln!(
                    "provium: fixture export: `{n}` is not cached, so it was not exported \
                     (run `provium fixture build --all` first)"
                );
            }
            println!(
                "{} fixture(s) exported to {}",
                exported.len(),
                dir.display()
            );
            Ok(if missing.is_empty() {
                EXIT_OK
            } else {
                EXIT_FAILED
            })
        }
        FixtureOp::Import { dir } => {
            let env = cli_env(args, config);
            let report = transfer::import(&env, &dir)?;
            for n in &report.installed {
                println!("imported: {n}");
            }
            for n in &report.already_cached {
                println!("already cached: {n}");
            }
            for (n, why) in &report.refused {
                eprintln!("provium: fixture import: refused `{n}`: {why}");
            }
            println!(
                "{} imported, {} already cached, {} refused",
                report.installed.len(),
                report.already_cached.len(),
                report.refused.len()
            );
            Ok(EXIT_OK)
        }
        FixtureOp::Rebuild { path } => {
            let env = cli_env(args, config);
            fixture::build_for_cli(&env, &path, true, &ChunkBuilder)?;
            println!("rebuilt: {path}");
            Ok(EXIT_OK)
        }
        FixtureOp::Stale => {
            let env = cli_env(args, config.clone());
            let cache = FixtureCache::open(dir)?;
            let mut stale = Vec::new();
            for (name, file) in fixture::all_fixtures(&env.roots) {
                let cached = match fixture::fixture_key(&env, &name) {
                    Ok(k) => {
                        cache.lookup(&k, EntryKind::Vm).is_some()
                            || cache.lookup(&k, EntryKind::Lab).is_some()
                    }
                    Err(_) => false,
                };
                if !cached {
                    stale.push(shown(&config, &file));
                }
            }
            for s in &stale {
                println!("  {s}");
            }
            println!();
            println!("{} stale fixture(s)", stale.len());
            Ok(EXIT_OK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_fixture_fails_typed_with_its_name() {
        let (_project, cli) = super::super::parse_in_project(
            "[provium]\ncache_dir = \"cache\"\n",
            &["--vmm", "local", "fixture", "build", "nope"],
        );
        let Some(super::super::Command::Fixture { op }) = cli.command else {
            panic!("parsed as a fixture command");
        };
        let e = run(&cli.run, op).unwrap_err();
        assert!(matches!(e, FixtureCmdError::Fixture(_)), "{e:?}");
        assert!(
            crate::error_chain::flatten(&e).contains("fixture `nope` not found in any test root"),
            "{e}"
        );
    }

    #[test]
    fn sizes_print_in_mib() {
        assert_eq!(mib(24_589_107), "23.45MiB");
        assert_eq!(
            format!("{:>11}  {:<4} {}", mib(24_589_107), "vm", "k"),
            "   23.45MiB  vm   k"
        );
        assert_eq!(
            format!("{:>11}  {:<4} {}", mib(0), "lab", "k"),
            "    0.00MiB  lab  k"
        );
    }
}
