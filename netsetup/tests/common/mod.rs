//! Shared by the root-only tests: run a closure in a fresh network namespace.

#![allow(dead_code)]

use std::process::Command;

/// Runs `f` on a new thread that first calls `unshare(CLONE_NEWNET)`, so the
/// TAPs, routes and nft tables it makes live and die with that namespace and
/// never touch the host's. Commands spawned from that thread inherit the
/// namespace. Returns `None` (after printing why) when the namespace cannot be
/// created, e.g. without CAP_SYS_ADMIN.
pub fn in_fresh_netns<T: Send + 'static>(
    test: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let test = test.to_owned();
    std::thread::spawn(move || {
        // SAFETY: unshare affects only this thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!(
                "SKIP {test}: cannot create a network namespace ({}); run as root",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(f())
    })
    .join()
    .expect("netns test thread panicked")
}

/// Runs a command (inheriting the calling thread's namespace); panics with
/// its stderr on failure; returns stdout.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("spawning sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// True when `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}
