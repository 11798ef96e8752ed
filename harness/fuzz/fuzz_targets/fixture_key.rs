//! The fixture key scanner on arbitrary Lua source: the static scan that
//! decides what goes into a fixture's cache key (fixture references,
//! required helpers, literal host paths) never panics, finds only literals
//! that occur in the source, and the key of a fixture with that source is
//! a pure function of the files: computed twice, it is the same, and a
//! fixture that references itself is refused rather than recursed into.
//!
//! Input: the fixture's source (any bytes; the scanner reads it lossily as
//! UTF-8, as the key computation does).

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use provium::config::Config;
use provium::fixture::key::{fuzzing::scan, KeyComputer};

struct Root {
    _dir: tempfile::TempDir,
    roots: Vec<PathBuf>,
    config: Config,
}

fn root() -> &'static Root {
    static R: OnceLock<Root> = OnceLock::new();
    R.get_or_init(|| {
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory");
        // A helper and a second fixture the fuzzed source may reach.
        std::fs::write(dir.path().join("helper.lua"), "return require('helper')\n")
            .expect("write a helper");
        std::fs::write(
            dir.path().join("other.fixture.lua"),
            "return vm_fixture('other')\n",
        )
        .expect("write a fixture");
        let roots = vec![dir.path().to_path_buf()];
        Root {
            _dir: dir,
            roots,
            config: Config::default(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let src = String::from_utf8_lossy(data);
    let (refs, requires, deps) = scan(&src);
    for found in refs.iter().chain(&requires).chain(&deps) {
        assert!(!found.is_empty());
        assert!(
            src.contains(found.as_str()),
            "{found:?} is not in the source"
        );
        assert!(!found.contains('"') && !found.contains('\''), "{found:?}");
    }
    let r = root();
    let path = r.roots[0].join("f.fixture.lua");
    std::fs::write(&path, data).expect("write the fixture under test");
    // Errors compare by their text (the typed error has no PartialEq).
    let key = || {
        KeyComputer::new(&r.roots, &r.config, 1)
            .key("f")
            .map_err(|e| e.to_string())
    };
    let (a, b) = (key(), key());
    assert_eq!(a, b, "a key is a pure function of the files");
    if refs.iter().any(|n| n == "f" || n == "other") {
        assert!(a.is_err(), "a fixture that references itself has no key");
    }
});
