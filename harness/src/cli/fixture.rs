//! `provium fixture list|build|rebuild|clean|stale`: the fixture cache.

use super::run::load_config;
use super::{FixtureOp, EXIT_OK};

pub fn run(config: &std::path::Path, op: FixtureOp) -> Result<i32, String> {
    let config = load_config(config)?;
    let dir = &config.cache_dir;
    match op {
        FixtureOp::List => {
            let mut entries: Vec<(String, u64)> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    (name.ends_with(".snap") || name.ends_with(".lab")).then(|| (name, e.metadata().map_or(0, |m| m.len())))
                })
                .collect();
            entries.sort();
            if entries.is_empty() {
                println!("no cached fixtures in {}", dir.display());
            }
            for (name, size) in entries {
                println!("{size:>12}  {name}");
            }
            Ok(EXIT_OK)
        }
        FixtureOp::Clean => {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => println!("removed {}", dir.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("{} is already empty", dir.display()),
                Err(e) => return Err(format!("fixture clean: `{}`: {e}", dir.display())),
            }
            Ok(EXIT_OK)
        }
        FixtureOp::Build { path } | FixtureOp::Rebuild { path } => Err(format!(
            "fixture `{path}`: building fixtures needs VM snapshots, which have not landed yet; nothing was built"
        )),
        FixtureOp::Stale => Err("fixture stale: cache keys need the fixture cache, which has not landed yet".into()),
    }
}
