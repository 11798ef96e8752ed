//! Helpers shared by the integration tests. Each test crate uses a subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use provium::backend::local::locate_agent;

/// The repository root (the harness crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The agent binary, built on demand so a test never silently runs without
/// one.
pub fn agent() -> PathBuf {
    if let Ok(p) = locate_agent() {
        return p;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "provium-agent"])
        .current_dir(repo_root())
        .status()
        .expect("run cargo build -p provium-agent");
    assert!(status.success(), "cargo build -p provium-agent failed");
    locate_agent().expect("provium-agent after building it")
}

/// Make sure the agent exists (for tests that run the `provium` binary).
pub fn ensure_agent() {
    agent();
}
