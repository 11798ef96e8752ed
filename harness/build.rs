//! Builds the guest agent the kvm backend injects: a static, stripped
//! `provium-agent` for x86_64-unknown-linux-gnu, so that a plain
//! `cargo build` (or `cargo test`, `cargo clippy`) gives the kvm backend an
//! agent any guest initrd can run, without a RUSTFLAGS incantation.
//!
//! How: a nested `cargo build -p provium-agent --release --target
//! x86_64-unknown-linux-gnu --locked` with `-Ctarget-feature=+crt-static`
//! and a size-tuned release profile (strip, opt-level "z", fat LTO, one
//! codegen unit, no debug info; every MB of initrd costs about 35 s of
//! emulated boot on kvm_pvm). It keeps the default panic strategy: the agent
//! relies on unwinding (a panicking request thread must not take the
//! connection down, agent/src/locks.rs).
//!
//! Where: `<target root>/guest-agent`, the target root being the first
//! ancestor of `OUT_DIR` that holds cargo's `CACHEDIR.TAG`. A directory of
//! its own means the nested cargo never waits on the build lock the outer
//! cargo holds, and debug, release, test and clippy builds share one agent.
//!
//! The nested cargo gets a clean environment: the outer cargo's `CARGO_*`
//! variables (profile, target, target dir, rustflags, build-script vars),
//! `RUSTFLAGS`, and clippy's workspace wrapper are removed; `CARGO_HOME`,
//! network/registry settings and the jobserver (`CARGO_MAKEFLAGS`, so both
//! cargos share one set of job tokens) are kept.
//!
//! The result reaches the harness as `PROVIUM_GUEST_AGENT` (a path, read
//! with `option_env!` in `backend/kvm/config.rs`). The same nested build
//! makes the hostile agent double (harness/examples/hostile_agent.rs,
//! declared as the agent's example `hostile_guest_agent`) static too, for
//! harness/tests/hostile_guest.rs: `PROVIUM_GUEST_HOSTILE_AGENT`. A failed nested build
//! fails this build, saying why and how to skip it
//! (`PROVIUM_SKIP_GUEST_AGENT_BUILD=1`: the kvm backend then needs
//! `PROVIUM_AGENT`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const GUEST_TARGET: &str = "x86_64-unknown-linux-gnu";
const SKIP_ENV: &str = "PROVIUM_SKIP_GUEST_AGENT_BUILD";
/// The hostile agent double, as the agent crate's example.
const HOSTILE_EXAMPLE: &str = "hostile_guest_agent";

/// Variables of the outer cargo that the nested one may keep (all other
/// `CARGO_*` go): where cargo lives, the jobserver, how it reaches
/// registries.
const KEEP_PREFIXES: &[&str] = &[
    "CARGO_HOME",
    "CARGO_MAKEFLAGS",
    "CARGO_NET_",
    "CARGO_HTTP_",
    "CARGO_REGISTRIES_",
    "CARGO_REGISTRY_",
    "CARGO_SOURCE_",
    "CARGO_TERM_",
];

/// Non-`CARGO_*` variables that would change how the agent is built.
const SCRUB: &[&str] = &[
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "RUSTC_WORKSPACE_WRAPPER",
    "CLIPPY_ARGS",
    "CLIPPY_CONF_DIR",
    "TARGET",
    "HOST",
    "OUT_DIR",
    "OPT_LEVEL",
    "PROFILE",
    "DEBUG",
    "NUM_JOBS",
    "RUSTC_LINKER",
];

/// The size-tuned release profile, as cargo profile env vars.
const PROFILE: &[(&str, &str)] = &[
    ("CARGO_PROFILE_RELEASE_STRIP", "true"),
    ("CARGO_PROFILE_RELEASE_OPT_LEVEL", "z"),
    ("CARGO_PROFILE_RELEASE_LTO", "true"),
    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1"),
    ("CARGO_PROFILE_RELEASE_DEBUG", "false"),
    ("CARGO_PROFILE_RELEASE_INCREMENTAL", "false"),
];

fn main() {
    let manifest_dir = PathBuf::from(env_or_die("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .expect("harness/ sits inside the workspace")
        .to_path_buf();
    for p in [
        "agent/src",
        "agent/Cargo.toml",
        "protocol/src",
        "protocol/Cargo.toml",
        "Cargo.toml",
        "Cargo.lock",
        "harness/examples/hostile_agent.rs",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(p).display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed={SKIP_ENV}");

    if std::env::var_os(SKIP_ENV).is_some_and(|v| v != "0") {
        println!(
            "cargo:warning=the static guest agent is not built ({SKIP_ENV} is set): \
             the kvm backend needs PROVIUM_AGENT=/path/to/a/static/provium-agent"
        );
        return;
    }
    let host_ok = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("HOST").as_deref() == Ok(GUEST_TARGET);
    if !host_ok {
        println!(
            "cargo:warning=the static guest agent is only built on an {GUEST_TARGET} host \
             for a linux harness; the kvm backend needs PROVIUM_AGENT"
        );
        return;
    }

    let out_dir = PathBuf::from(env_or_die("OUT_DIR"));
    let agent_target = target_root(&out_dir).join("guest-agent");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&workspace)
        .args(["build", "-p", "provium-agent", "--release", "--locked"])
        .args(["--bin", "provium-agent", "--example", HOSTILE_EXAMPLE])
        .args(["--target", GUEST_TARGET])
        .arg("--target-dir")
        .arg(&agent_target);
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let cargo_var =
            key.starts_with("CARGO_") && !KEEP_PREFIXES.iter().any(|keep| key.starts_with(keep));
        if cargo_var || SCRUB.contains(&key) {
            cmd.env_remove(key);
        }
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static");
    for (key, value) in PROFILE {
        cmd.env(key, value);
    }
    // Our stdout is cargo's directive channel; the nested cargo's output
    // goes to stderr, which cargo shows when this script fails.
    cmd.stdout(Stdio::from(std::io::stderr()));

    let started = std::time::Instant::now();
    let status = cmd.status();
    let agent = agent_target
        .join(GUEST_TARGET)
        .join("release")
        .join("provium-agent");
    let fail = |why: String| -> ! {
        eprintln!(
            "error: building the static guest agent failed: {why}\n  \
             command: CARGO_ENCODED_RUSTFLAGS=-Ctarget-feature=+crt-static {} build -p provium-agent \
             --release --locked --target {GUEST_TARGET} --target-dir {} (in {}, with the size-tuned \
             release profile)\n  \
             the kvm backend injects this agent into guests; fix the error above \
             (a static glibc build needs libc.a: Debian/Ubuntu libc6-dev, Fedora glibc-static), \
             or build without it: {SKIP_ENV}=1 cargo build, and give the kvm backend \
             PROVIUM_AGENT=/path/to/a/static/provium-agent",
            Path::new(&cargo).display(),
            agent_target.display(),
            workspace.display()
        );
        std::process::exit(1)
    };
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(format!("the nested cargo exited with {s}")),
        Err(e) => fail(format!("cannot run {}: {e}", Path::new(&cargo).display())),
    }
    let hostile = agent_target
        .join(GUEST_TARGET)
        .join("release")
        .join("examples")
        .join(HOSTILE_EXAMPLE);
    for built in [&agent, &hostile] {
        if !built.is_file() {
            fail(format!(
                "the nested cargo succeeded but {} is missing",
                built.display()
            ));
        }
    }
    eprintln!(
        "guest agent: {} ({} bytes) in {:.1} s",
        agent.display(),
        std::fs::metadata(&agent).map_or(0, |m| m.len()),
        started.elapsed().as_secs_f64()
    );
    println!("cargo:rustc-env=PROVIUM_GUEST_AGENT={}", agent.display());
    println!(
        "cargo:rustc-env=PROVIUM_GUEST_HOSTILE_AGENT={}",
        hostile.display()
    );
}

/// The target directory this build writes to: the first ancestor of
/// `out_dir` (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`, or
/// under `build.build-dir`) that holds cargo's `CACHEDIR.TAG`; failing
/// that, four levels up, where a host build's target root is.
fn target_root(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .or_else(|| out_dir.ancestors().nth(4))
        .unwrap_or(out_dir)
        .to_path_buf()
}

fn env_or_die(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| {
        eprintln!("error: {key} is not set: this build script runs under cargo");
        std::process::exit(1)
    })
}
