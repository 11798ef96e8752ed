//! Pieces shared by the harness's benches (each bench includes this with
//! `mod common;`; not every bench uses every item).
#![allow(dead_code)]

use std::path::PathBuf;

use provium::backend::local::{AGENT_BIN, AGENT_ENV};

/// The release agent: `$PROVIUM_AGENT`, else next to this bench's profile
/// directory, built with cargo if it is not there. Benches measure the
/// release agent, never a debug build.
pub fn release_agent() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(AGENT_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/release/deps/BENCH-HASH -> target/release
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or("cannot find the target directory")?
        .to_path_buf();
    let agent = profile_dir.join(AGENT_BIN);
    if !agent.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = std::process::Command::new(cargo)
            .args(["build", "--release", "-p", "provium-agent"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .is_ok_and(|s| s.success());
        if !ok || !agent.exists() {
            return Err(format!(
                "no agent at {}; build it with `cargo build --release -p provium-agent` or set {AGENT_ENV}",
                agent.display()
            ));
        }
    }
    Ok(agent)
}

/// The `q` quantile (0 < q <= 1) of ascending `sorted`, by nearest rank.
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty(), "a quantile of no samples");
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The first line of a file, trimmed; `?` when unreadable.
pub fn first_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|_| "?".into())
}
