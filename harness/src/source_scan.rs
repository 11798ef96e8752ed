//! Test support: the harness's own source, scanned for a rule's forbidden
//! text. The rules the house style states for the whole harness (the
//! environment is read once, in `settings.rs`; one signal handler, in
//! `runner/interrupt.rs`; one way to lock, in `lock.rs`) are held by unit
//! tests that scan every file here, skipping the rule's own module and
//! test code (everything from the first test-only attribute of a file on).

use std::path::{Path, PathBuf};

/// Every `.rs` file under harness/src.
fn harness_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    assert!(files.len() > 50, "the walk found harness/src");
    files
}

/// `file:line: text` of each non-test line of harness/src that contains
/// one of `forbidden`, in every file but the one whose path ends with
/// `home` (the rule's own module).
pub fn lines_containing(home: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    // This module is test code as a whole (declared under a test-only
    // attribute), so it is never scanned.
    let scanned = harness_files()
        .into_iter()
        .filter(|f| !f.ends_with(home) && !f.ends_with("source_scan.rs"));
    for file in scanned {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            if forbidden.iter().any(|f| line.contains(f)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_finds_code_and_skips_the_home_module() {
        let probe = ["fn locked(&self) -> MutexGuard<'_, T>"];
        let found = lines_containing("lib.rs", &probe);
        assert_eq!(found.len(), 2, "the trait and its impl: {found:?}");
        assert!(found.iter().all(|f| f.contains("lock.rs:")), "{found:?}");
        assert_eq!(
            lines_containing("src/lock.rs", &probe),
            Vec::<String>::new()
        );
        // Test code does not count: this text is only in lock.rs's tests.
        let in_tests = "panic!(\"a holder panics\")";
        let lock_rs =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lock.rs"))
                .unwrap();
        assert!(lock_rs.contains(in_tests));
        assert!(lines_containing("lib.rs", &[in_tests]).is_empty());
    }
}
