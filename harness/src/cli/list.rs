//! `provium list [--fixtures]`: what would run, without running it.

use std::path::PathBuf;

use super::run::load_config;
use super::EXIT_OK;
use crate::discover::discover;

pub fn run(config: &std::path::Path, paths: &[PathBuf], fixtures: bool) -> Result<i32, String> {
    let config = load_config(config)?;
    let paths: Vec<PathBuf> = if !paths.is_empty() {
        paths.to_vec()
    } else if !config.roots.is_empty() {
        config.roots.clone()
    } else {
        vec![PathBuf::from(".")]
    };
    if fixtures {
        let mut found = Vec::new();
        for p in &paths {
            collect_fixtures(p, p, &mut found);
        }
        found.sort();
        for f in found {
            println!("{f}");
        }
        return Ok(EXIT_OK);
    }
    for f in discover(&paths, &config.roots)? {
        println!("{}", f.rel);
    }
    Ok(EXIT_OK)
}

fn collect_fixtures(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_fixtures(root, &p, out);
        } else if let Some(rel) = p.strip_prefix(root).ok().and_then(|r| r.to_str()) {
            if let Some(name) = rel.strip_suffix(".fixture.lua") {
                out.push(name.to_string());
            }
        }
    }
}
