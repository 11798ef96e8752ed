//! `provium list [--fixtures] [--partition KIND:I/N]`: what would run,
//! without running it. Tests print under their file, indented, as
//! cargo-nextest lists tests under their binary:
//!
//! ```text
//! net/partition.test.lua
//!     split-brain
//!     heals
//! ```
//!
//! Nothing is run, so test names come from a static scan of the source
//! ([`test_names`]): `test("name", …)` calls with a literal name. A test
//! whose name is computed (`test("case " .. i, …)`) is not listed.

use std::path::PathBuf;
use std::sync::OnceLock;

use regex::Regex;

use super::load_config;
use super::EXIT_OK;
use crate::config::ConfigError;
use crate::discover::{discover, DiscoverError};
use crate::partition::Partition;

/// The literal names of the `test(...)` calls in `source`, in order;
/// comment lines are ignored.
pub fn test_names(source: &str) -> Vec<String> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r#"(?:^|[^\w.:])test\s*\(\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')\s*[,)]"#)
            .expect("a valid regex")
    });
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .flat_map(|l| {
            re.captures_iter(l)
                .filter_map(|c| c.get(1).or(c.get(2)).map(|m| m.as_str().to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Why `provium list` could not list.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Discover(#[from] DiscoverError),
}

pub fn run(
    config: &std::path::Path,
    settings: &crate::settings::Settings,
    paths: &[PathBuf],
    fixtures: bool,
    partition: Option<Partition>,
) -> Result<i32, ListError> {
    let config = load_config(config, settings)?;
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
    let files = discover(&paths, &config.roots)?;
    let files = match partition {
        Some(p) => p.select(files, |f| f.rel.as_str()),
        None => files,
    };
    for f in files {
        println!("{}", f.rel);
        let source = std::fs::read_to_string(&f.abs).unwrap_or_default();
        for name in test_names(&source) {
            println!("    {name}");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_test_names_in_order_not_comments_or_computed_ones() {
        let src = "test(\"one\", function(t) end)\n\
                   test('two', {tags = {'x'}}, function(t) end)\n\
                   -- test(\"commented\", function() end)\n\
                   for i = 1, 3 do test(\"case \" .. i, function() end) end\n\
                   t:test(\"method\")\n  test ( \"spaced\" , f)\n";
        assert_eq!(test_names(src), ["one", "two", "spaced"]);
    }

    #[test]
    fn a_missing_path_fails_as_discovery() {
        let (project, cli) = super::super::parse_in_project("[provium]\n", &["list"]);
        let missing = project.path().join("missing");
        let e = run(
            &cli.run.config,
            &cli.run.settings,
            std::slice::from_ref(&missing),
            false,
            None,
        )
        .unwrap_err();
        assert!(matches!(e, ListError::Discover(_)), "{e:?}");
        assert_eq!(e.to_string(), format!("`{}`", missing.display()));
    }
}
