//! `provium bench boot|restore|ops|compare`: boot, fixture-restore and agent
//! round-trip timing as a product feature (docs/benchmarking.md).
//!
//! Every bench runs warm-up iterations (not recorded), then N timed ones, and
//! reports per phase min / median / p90 / p99 / max (nearest rank) with the
//! raw samples. Output is a table, or with `--json` one JSON object per line
//! per phase (`SCHEMA`; the field names are documented in docs/benchmarking.md
//! and kept stable). `--compare OLD.json` prints new/old median ratios and
//! exits 1 when one regressed by more than `--max-regression`.
//!
//! Boot phases come from the VMM's own boot timer (`provium_vmm::boot_timer`):
//! marks stamped on the threads where the events happen, not times parsed out
//! of the console afterwards. Phases that cannot be measured on this build or
//! host are reported with `available: false` and the reason.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};

use provium_vmm::boot_timer::{BootMarks, BootTimer, BOOT_TIMER_PORT, GUEST_READY};
use provium_vmm::{tiny_guest, BootSource, KernelImage, Vm, VmConfig, VmState};

use super::{choose_backend, load_config};
use super::{RunArgs, VmmChoice, EXIT_FAILED, EXIT_OK};
use crate::backend::kvm::config::{self as kvm_config, locate_guest_agent, KvmBootOpts};
use crate::backend::kvm::KvmMachine;
use crate::client::AgentOps;
use crate::config::Profile;
use crate::host_memory::mapping_memory;
use crate::machine::{BootSpec, Machine};
use crate::runner::BackendKind;

/// The `schema` field of every JSON object this command writes.
pub const SCHEMA: &str = "provium-bench/1";
/// What Linux prints when it starts user space: `Run /init as init process`
/// (or `/sbin/provium-agent`, `/sbin/init`, ...).
pub const RUN_INIT_TEXT: &str = " as init process";
/// A phase's min and max further apart than this factor draw a warning.
pub const NOISY_MAX_OVER_MIN: f64 = 2.0;

#[derive(Debug, Subcommand)]
pub enum BenchOp {
    /// Boot a profile's kernel (or the built-in tiny guest) N times; phases
    /// from the VMM's boot timer.
    Boot(BootArgs),
    /// Restore a cached vm_fixture N times (P at once) and time it to the
    /// first agent answer; resident memory per restored VM.
    Restore(RestoreArgs),
    /// Agent round trips: no-op, run("true"), 4 KiB read, 1 MiB write+read.
    Ops(OpsArgs),
    /// Compare two `--json` outputs: new/old median per phase.
    Compare {
        /// The baseline (`--json` output of an earlier run).
        old: PathBuf,
        /// The run to check against it.
        new: PathBuf,
        /// Fail (exit 1) when a median grew by more than this ("10%", "25").
        #[arg(long, default_value = "10%")]
        max_regression: String,
    },
}

#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Timed iterations (boot/restore default 10, ops default 200).
    #[arg(short = 'n', long = "runs")]
    pub runs: Option<usize>,
    /// Untimed iterations first (boot/restore default 1, ops default 10).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// One JSON object per phase per line on stdout (see docs/benchmarking.md).
    #[arg(long)]
    pub json: bool,
    /// Compare with an earlier `--json` output; exit 1 on a regression.
    #[arg(long, value_name = "OLD.json")]
    pub compare: Option<PathBuf>,
    /// With --compare: the largest allowed growth of a median ("10%", "25").
    #[arg(long, default_value = "10%")]
    pub max_regression: String,
    /// Pin this process (and the vCPU threads and sandboxes it starts) to one CPU.
    #[arg(long, value_name = "CPU")]
    pub pin: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Until {
    /// The first console byte.
    Console,
    /// Linux's "Run /init as init process".
    Init,
    /// The guest's write of 123 to the boot-timer port.
    Ready,
}

#[derive(Debug, Clone, Args)]
pub struct BootArgs {
    /// Profile (from provium.toml) whose kernel, initrd and command line boot.
    #[arg(required_unless_present = "tiny_guest", conflicts_with = "tiny_guest")]
    pub profile: Option<String>,
    /// Boot the tiny test guest built into provium-vmm instead of a profile.
    #[arg(long)]
    pub tiny_guest: bool,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Guest memory in MiB (default: 32 for the tiny guest, 256 for a profile).
    #[arg(long, value_name = "MIB")]
    pub mem: Option<u64>,
    /// vCPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u8,
    /// Replace the profile's kernel command line.
    #[arg(long)]
    pub cmdline: Option<String>,
    /// The last mark each boot waits for (default: ready; init for a Linux
    /// guest on kvm_pvm, where guest kernel code is emulated and slow).
    #[arg(long, value_enum)]
    pub until: Option<Until>,
    /// Seconds one boot may take to reach --until before the bench fails.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// With --until ready on a Linux guest: seconds to wait for the boot-timer
    /// write after "Run /init" before reporting the phase unavailable.
    #[arg(long, default_value_t = 30)]
    pub ready_timeout: u64,
}

#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// The vm_fixture (path below a test root, without `.fixture.lua`); built
    /// first if the cache has no entry for it.
    #[arg(required_unless_present = "tiny_guest", conflicts_with = "tiny_guest")]
    pub fixture: Option<String>,
    /// Restore the built-in tiny-guest fixture on the VMM instead (booted to
    /// READY and snapshotted into the fixture cache once): restore to first
    /// guest instruction and resident guest memory per restored VM.
    #[arg(long)]
    pub tiny_guest: bool,
    /// With --tiny-guest: guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub mem: u64,
    /// Restores running at once; memory is measured while all of a batch live.
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// Backend (only `local` can restore today).
    #[arg(long, value_enum, default_value = "auto")]
    pub vmm: VmmChoice,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    /// Profile to boot (optional with --vmm local, whose sandbox boots no kernel).
    pub profile: Option<String>,
    /// Backend (only `local` runs the agent today).
    #[arg(long, value_enum, default_value = "auto")]
    pub vmm: VmmChoice,
    #[command(flatten)]
    pub common: CommonArgs,
}

// ---------------------------------------------------------------------------
// Results

/// What a phase's samples measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Ns,
    Bytes,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::Bytes => "bytes",
        }
    }
}

/// One phase of a bench: its samples, or why there are none.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: &'static str,
    /// One line on what it measures (also in the JSON).
    pub what: &'static str,
    /// Who took the timestamps: "vmm" (the VMM's boot timer), "harness".
    pub source: &'static str,
    pub unit: Unit,
    pub samples: Vec<u64>,
    /// Set when the phase cannot be measured here.
    pub unavailable: Option<String>,
}

impl Phase {
    fn new(name: &'static str, what: &'static str, source: &'static str, unit: Unit) -> Phase {
        Phase {
            name,
            what,
            source,
            unit,
            samples: Vec::new(),
            unavailable: None,
        }
    }

    fn push_duration(&mut self, d: Option<Duration>) {
        if let Some(d) = d {
            self.samples
                .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        }
    }

    /// Marks it unavailable unless it has samples.
    fn unless_measured(&mut self, why: impl Into<String>) {
        if self.samples.is_empty() && self.unavailable.is_none() {
            self.unavailable = Some(why.into());
        }
    }

    fn available(&self) -> bool {
        self.unavailable.is_none() && !self.samples.is_empty()
    }
}

/// min / median / p90 / p99 / max (nearest rank) and the mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub min: u64,
    pub median: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

/// Nearest-rank percentiles of `samples` (None when empty).
pub fn stats(samples: &[u64]) -> Option<Stats> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    };
    Some(Stats {
        min: v[0],
        median: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: v[v.len() - 1],
        mean: v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64,
    })
}

/// Whether max > 2x min (a phase whose spread says the machine was busy).
pub fn is_noisy(s: &Stats) -> bool {
    s.min > 0 && s.max as f64 > NOISY_MAX_OVER_MIN * s.min as f64
}

/// A finished bench.
pub struct Report {
    pub bench: &'static str,
    pub target: String,
    pub runs: usize,
    pub warmup: usize,
    pub host: Value,
    /// The guest (boot), fixture (restore) or sandbox (ops) measured.
    pub guest: Value,
    pub phases: Vec<Phase>,
}

impl Report {
    /// One JSON object per phase.
    pub fn to_json_lines(&self) -> Vec<Value> {
        self.phases
            .iter()
            .map(|p| {
                let s = if p.available() {
                    stats(&p.samples)
                } else {
                    None
                };
                json!({
                    "schema": SCHEMA,
                    "bench": self.bench,
                    "target": self.target,
                    "phase": p.name,
                    "what": p.what,
                    "source": p.source,
                    "unit": p.unit.as_str(),
                    "available": s.is_some(),
                    "reason": p.unavailable,
                    "runs": self.runs,
                    "warmup": self.warmup,
                    "n": if s.is_some() { p.samples.len() } else { 0 },
                    "samples": if s.is_some() { p.samples.clone() } else { Vec::new() },
                    "min": s.map(|s| s.min),
                    "median": s.map(|s| s.median),
                    "p90": s.map(|s| s.p90),
                    "p99": s.map(|s| s.p99),
                    "max": s.map(|s| s.max),
                    "mean": s.map(|s| s.mean),
                    "noisy": s.as_ref().is_some_and(is_noisy),
                    "host": self.host,
                    "guest": self.guest,
                })
            })
            .collect()
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "provium bench {} {}: {} run(s) after {} warm-up\n  host: {}\n  guest: {}\n\n",
            self.bench,
            self.target,
            self.runs,
            self.warmup,
            describe_host(&self.host),
            describe_guest(&self.guest),
        );
        out.push_str(&format!(
            "{:<28} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "phase", "n", "min", "median", "p90", "p99", "max"
        ));
        for p in &self.phases {
            match (p.available(), stats(&p.samples)) {
                (true, Some(s)) => {
                    let f = |x: u64| fmt_value(x, p.unit);
                    out.push_str(&format!(
                        "{:<28} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10}{}\n",
                        p.name,
                        p.samples.len(),
                        f(s.min),
                        f(s.median),
                        f(s.p90),
                        f(s.p99),
                        f(s.max),
                        if is_noisy(&s) { "  (noisy)" } else { "" }
                    ));
                }
                _ => out.push_str(&format!(
                    "{:<28} {:>4} unavailable: {}\n",
                    p.name,
                    "-",
                    p.unavailable.as_deref().unwrap_or("no samples")
                )),
            }
        }
        out
    }

    /// Warnings for phases whose max is more than 2x their min.
    pub fn noise_warnings(&self) -> Vec<String> {
        self.phases
            .iter()
            .filter(|p| p.available())
            .filter_map(|p| {
                let s = stats(&p.samples)?;
                is_noisy(&s).then(|| {
                    format!(
                        "warning: {} {}: max {} is more than {NOISY_MAX_OVER_MIN}x min {}; the numbers are noisy \
                         (more warm-up, --pin, an idle machine: docs/benchmarking.md)",
                        self.bench,
                        p.name,
                        fmt_value(s.max, p.unit),
                        fmt_value(s.min, p.unit)
                    )
                })
            })
            .collect()
    }
}

fn describe_host(h: &Value) -> String {
    let s = |k: &str| h.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    let load = h
        .get("loadavg")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_f64)
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let pin = match h.get("pinned_cpu").and_then(Value::as_u64) {
        Some(c) => format!(", pinned to CPU {c}"),
        None => String::new(),
    };
    format!(
        "{} ({}), Linux {}, {} CPUs ({}), kvm: {}, load {load}{pin}",
        s("hostname"),
        s("arch"),
        s("kernel"),
        h.get("nproc").and_then(Value::as_u64).unwrap_or(0),
        s("cpu_model"),
        s("kvm"),
    )
}

fn describe_guest(g: &Value) -> String {
    match g {
        Value::Object(m) => m
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

/// `1.23 ms`, `456 us`, `12 ns`, `3.4 MiB`.
pub fn fmt_value(x: u64, unit: Unit) -> String {
    match unit {
        Unit::Ns => {
            let f = x as f64;
            if x >= 1_000_000_000 {
                format!("{:.2}s", f / 1e9)
            } else if x >= 1_000_000 {
                format!("{:.2}ms", f / 1e6)
            } else if x >= 1_000 {
                format!("{:.1}us", f / 1e3)
            } else {
                format!("{x}ns")
            }
        }
        Unit::Bytes => {
            let f = x as f64;
            if x >= 1 << 20 {
                format!("{:.1}MiB", f / (1u64 << 20) as f64)
            } else if x >= 1 << 10 {
                format!("{:.1}KiB", f / 1024.0)
            } else {
                format!("{x}B")
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Host

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// What KVM this host has: "kvm_pvm" (paravirtual, nested: guest kernel
/// code is emulated, so slow; user space needs a kernel with the kvm_pvm
/// shims), "kvm", or "none".
pub fn kvm_kind() -> &'static str {
    if Path::new("/sys/module/kvm_pvm").exists() {
        "kvm_pvm"
    } else if Path::new("/dev/kvm").exists() {
        "kvm"
    } else {
        "none"
    }
}

/// The machine a run was measured on.
pub fn host_info(pinned_cpu: Option<usize>) -> Value {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let loadavg: Vec<f64> = read_trim("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|x| x.parse().ok())
        .collect();
    json!({
        "hostname": read_trim("/proc/sys/kernel/hostname"),
        "kernel": read_trim("/proc/sys/kernel/osrelease"),
        "arch": std::env::consts::ARCH,
        "cpu_model": cpu_model,
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "kvm": kvm_kind(),
        "loadavg": loadavg,
        "pinned_cpu": pinned_cpu,
        "provium_version": env!("CARGO_PKG_VERSION"),
    })
}

fn pin_to(cpu: usize) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it, and
    // sched_setaffinity reads `size_of::<cpu_set_t>()` bytes from it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return Err(format!("--pin {cpu}: no such CPU"));
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "--pin {cpu}: sched_setaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Entry

pub fn run(args: &RunArgs, op: BenchOp) -> Result<i32, String> {
    let (report, common) = match op {
        BenchOp::Compare {
            old,
            new,
            max_regression,
        } => {
            let max = parse_regression(&max_regression)?;
            let old = read_json_lines(&old)?;
            let new = read_json_lines(&new)?;
            let c = compare(&old, &new, max);
            out(&c.text);
            return Ok(if c.regressed { EXIT_FAILED } else { EXIT_OK });
        }
        BenchOp::Boot(b) => {
            setup(&b.common)?;
            (bench_boot(args, &b)?, b.common)
        }
        BenchOp::Restore(r) => {
            setup(&r.common)?;
            (bench_restore(args, &r)?, r.common)
        }
        BenchOp::Ops(o) => {
            setup(&o.common)?;
            (bench_ops(args, &o)?, o.common)
        }
    };
    finish(&report, &common)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn out(text: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

fn setup(c: &CommonArgs) -> Result<(), String> {
    if let Some(cpu) = c.pin {
        pin_to(cpu)?;
    }
    if c.compare.is_some() {
        parse_regression(&c.max_regression)?;
    }
    Ok(())
}

fn finish(report: &Report, c: &CommonArgs) -> Result<i32, String> {
    let lines = report.to_json_lines();
    if c.json {
        for l in &lines {
            out(&format!("{l}\n"));
        }
    } else {
        out(&report.table());
    }
    for w in report.noise_warnings() {
        eprintln!("provium bench: {w}");
    }
    let Some(old_path) = &c.compare else {
        return Ok(EXIT_OK);
    };
    let max = parse_regression(&c.max_regression)?;
    let old = read_json_lines(old_path)?;
    let cmp = compare(&old, &lines, max);
    if c.json {
        eprint!("{}", cmp.text);
    } else {
        out(&format!("\n{}", cmp.text));
    }
    Ok(if cmp.regressed { EXIT_FAILED } else { EXIT_OK })
}

// ---------------------------------------------------------------------------
// Compare

/// `"10%"`, `"10"` (percent) or `"2.5%"` → 0.10 / 0.10 / 0.025.
pub fn parse_regression(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%').trim();
    match t.parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p / 100.0),
        _ => Err(format!(
            "--max-regression {s:?}: expected a percentage such as \"10%\""
        )),
    }
}

/// The objects of a `--json` output (JSON lines; a JSON array is accepted too).
pub fn read_json_lines(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.trim_start().starts_with('[') {
        return match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(a)) => Ok(a),
            Ok(_) => unreachable!("starts with ["),
            Err(e) => Err(format!("{}: not JSON: {e}", path.display())),
        };
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), i + 1))
        })
        .collect()
}

/// A comparison's printout and verdict.
pub struct Comparison {
    pub text: String,
    pub regressed: bool,
}

/// new/old median per (bench, phase) present in both; regressed when a
/// ratio exceeds 1 + `max`.
pub fn compare(old: &[Value], new: &[Value], max: f64) -> Comparison {
    let key = |v: &Value| {
        (
            v.get("bench")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
            v.get("phase")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
        )
    };
    let median = |v: &Value| {
        if v.get("available").and_then(Value::as_bool) == Some(false) {
            return None;
        }
        v.get("median").and_then(Value::as_f64)
    };
    let unit = |v: &Value| match v.get("unit").and_then(Value::as_str) {
        Some("bytes") => Unit::Bytes,
        _ => Unit::Ns,
    };
    let mut text = format!(
        "compare (max regression {:.1}%):\n{:<24} {:>10} {:>10} {:>7}\n",
        max * 100.0,
        "phase",
        "old",
        "new",
        "ratio"
    );
    let mut regressed = false;
    for n in new {
        let k = key(n);
        let name = format!("{}/{}", k.0, k.1);
        let Some(o) = old.iter().find(|o| key(o) == k) else {
            text.push_str(&format!("{name:<24} not in the baseline\n"));
            continue;
        };
        match (median(o), median(n)) {
            (Some(om), Some(nm)) if om > 0.0 => {
                let ratio = nm / om;
                let bad = ratio > 1.0 + max;
                regressed |= bad;
                let u = unit(n);
                text.push_str(&format!(
                    "{name:<24} {:>10} {:>10} {:>7.3}{}\n",
                    fmt_value(om as u64, u),
                    fmt_value(nm as u64, u),
                    ratio,
                    if bad { "  REGRESSED" } else { "" }
                ));
            }
            _ => text.push_str(&format!(
                "{name:<24} not comparable (unavailable in one run)\n"
            )),
        }
    }
    for o in old {
        if !new.iter().any(|n| key(n) == key(o)) {
            let k = key(o);
            text.push_str(&format!("{}/{:<17} missing from this run\n", k.0, k.1));
        }
    }
    text.push_str(if regressed {
        "result: REGRESSED\n"
    } else {
        "result: ok\n"
    });
    Comparison { text, regressed }
}

// ---------------------------------------------------------------------------
// boot

struct BootTarget {
    name: String,
    /// What is booted (for a profile: as the kvm backend builds it, agent
    /// and `provium.boot_timer=` included when injected).
    boot: BootSource,
    /// A profile boots through the kvm backend's own config builder and
    /// connect path (`KvmMachine`); the tiny guest is booted directly.
    kvm: Option<(Profile, KvmBootOpts)>,
    /// Why no agent is in the guest (a profile with `inject_agent = false`,
    /// or no agent binary found); None when it is injected.
    no_agent: Option<String>,
    linux: bool,
    mem_mib: u64,
    shown_kernel: String,
}

fn boot_target(args: &RunArgs, b: &BootArgs) -> Result<BootTarget, String> {
    if b.tiny_guest {
        return Ok(BootTarget {
            name: "tiny-guest".into(),
            boot: BootSource {
                kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
                initrd: None,
                cmdline: b
                    .cmdline
                    .clone()
                    .unwrap_or_else(|| "console=ttyS0".to_string()),
            },
            kvm: None,
            no_agent: Some("the tiny guest has no agent".into()),
            linux: false,
            mem_mib: b.mem.unwrap_or(32),
            shown_kernel: format!(
                "tiny guest ({} bytes, built into provium-vmm)",
                tiny_guest::BZIMAGE.len()
            ),
        });
    }
    let name = b.profile.clone().expect("clap requires a profile");
    let config = load_config(&args.config)?;
    let Some(p) = config.profiles.get(&name) else {
        let known: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
        return Err(format!(
            "bench boot: no profile `{name}` in {} (profiles: {})",
            args.config.display(),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    let Some(kernel) = p.kernel.clone() else {
        return Err(format!("bench boot: profile `{name}` has no kernel"));
    };
    if !kernel.is_file() {
        return Err(format!(
            "bench boot: profile `{name}`: kernel {} does not exist",
            kernel.display()
        ));
    }
    let mem_mib = b.mem.unwrap_or(256);
    // The agent goes in when the profile asks for it and one is found; a
    // missing agent binary still lets the kernel phases be measured.
    let (inject_agent, no_agent) = if !p.inject_agent {
        (
            false,
            Some("the profile has inject_agent = false".to_string()),
        )
    } else {
        match locate_guest_agent() {
            Ok(_) => (true, None),
            Err(e) => (false, Some(format!("no agent to inject: {e}"))),
        }
    };
    let opts = KvmBootOpts {
        memory_bytes: mem_mib << 20,
        cpus: u32::from(b.cpus),
        kernel_cmdline: b.cmdline.clone(),
        inject_agent,
        ..KvmBootOpts::default()
    };
    // Built once here only to report what is booted; every boot builds its
    // own through KvmMachine::create (same builder, fresh vsock).
    let (cfg, _) = kvm_config::vm_config(p, &opts, BENCH_CID)
        .map_err(|e| format!("bench boot: profile `{name}`: {e}"))?;
    Ok(BootTarget {
        name,
        boot: cfg.boot,
        kvm: Some((p.clone(), opts)),
        no_agent,
        linux: true,
        mem_mib,
        shown_kernel: kernel.display().to_string(),
    })
}

/// The guest CID of the config `boot_target` builds only to report what
/// is booted (no VM is made from it).
const BENCH_CID: u32 = 3;

/// Per-boot samples.
struct BootSample {
    vm_create: Duration,
    marks: BootMarks,
    start: Instant,
    /// Whether the ready wait gave up (Linux guest, no boot-timer write).
    ready_gave_up: bool,
    /// First KVM_RUN to the agent's Hello completing (agent injected and
    /// its ready mark seen).
    hello: Option<Duration>,
}

fn console_tail(vm: &Vm) -> String {
    let log = vm.console().log_string();
    let start = log.len().saturating_sub(2048);
    let start = (start..log.len())
        .find(|&i| log.is_char_boundary(i))
        .unwrap_or(log.len());
    log[start..].to_string()
}

fn one_boot(
    t: &BootTarget,
    b: &BootArgs,
    until: Until,
    kernel_version: &mut Option<String>,
) -> Result<BootSample, String> {
    let timer = BootTimer::new();
    timer.watch_console(RUN_INIT_TEXT);
    let start = Instant::now();
    let machine = match &t.kvm {
        Some((profile, opts)) => {
            let opts = KvmBootOpts {
                boot_timer: Some(timer.clone()),
                ..opts.clone()
            };
            let m = KvmMachine::create(&t.name, profile, &opts, None)
                .map_err(|e| format!("bench boot: {e}"))?
                .with_agent_timeout(Duration::from_secs(b.ready_timeout));
            Booted::Kvm(Box::new(m))
        }
        None => {
            let mut cfg = VmConfig::new(t.boot.clone());
            cfg.machine.mem_size_mib = t.mem_mib;
            cfg.machine.vcpu_count = b.cpus;
            cfg.boot_timer = Some(timer.clone());
            Booted::Vm(
                Vm::new(cfg)
                    .map_err(|e| format!("bench boot: {}", crate::error_chain::flatten(&e)))?,
            )
        }
    };
    let vm_create = start.elapsed();
    let vm = machine.vm();
    vm.boot()
        .map_err(|e| format!("bench boot: {}", crate::error_chain::flatten(&e)))?;
    let deadline = Instant::now() + Duration::from_secs(b.timeout);
    let reached = |m: &BootMarks| match until {
        Until::Console => m.first_console_byte.is_some(),
        Until::Init => m.console_at(RUN_INIT_TEXT).is_some() || m.guest_ready.is_some(),
        Until::Ready => m.guest_ready.is_some(),
    };
    let ready_grace = Duration::from_secs(b.ready_timeout);
    let mut ready_gave_up = false;
    let marks = loop {
        // Never look at the Vm inside the predicate: it runs under the
        // timer's lock, which vCPU threads take while the Vm's lock may be
        // held by a teardown waiting for them.
        let m = timer.wait(Duration::from_millis(200), |m| reached(m));
        if reached(&m) {
            break m;
        }
        if until == Until::Ready && t.linux {
            if let Some(init) = m.console_at(RUN_INIT_TEXT) {
                if init.elapsed() >= ready_grace {
                    ready_gave_up = true;
                    break m;
                }
            }
        }
        let state = vm.state();
        if matches!(state, VmState::Dead | VmState::Shutdown) {
            let why = vm
                .stop_reason()
                .map_or_else(|| state.to_string(), |r| r.to_string());
            return Err(format!(
                "bench boot {}: the VM stopped before {until:?} ({why}); console tail:\n{}",
                t.name,
                console_tail(vm)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "bench boot {}: no {until:?} mark within {} s (--timeout); console tail:\n{}",
                t.name,
                b.timeout,
                console_tail(vm)
            ));
        }
    };
    // The agent's Hello: only with --until ready and once it marked ready
    // (so it is listening), through the kvm backend's own connect (vsock,
    // retries, handshake), so the number is what a test's boot waits for.
    let mut hello = None;
    if let (Booted::Kvm(m), Some(_)) = (&machine, marks.guest_ready) {
        if t.no_agent.is_none() && until == Until::Ready {
            m.connect()
                .map_err(|e| format!("bench boot {}: {e}", t.name))?;
            hello = marks.first_kvm_run.map(|k| k.elapsed());
        }
    }
    if kernel_version.is_none() {
        let log = vm.console().log_string();
        *kernel_version = log
            .lines()
            .find_map(|l| l.find("Linux version ").map(|i| l[i..].trim().to_string()))
            .or_else(|| log.lines().next().map(|l| l.trim().to_string()));
    }
    vm.shutdown()
        .map_err(|e| format!("bench boot: shutdown: {}", crate::error_chain::flatten(&e)))?;
    Ok(BootSample {
        vm_create,
        marks,
        start,
        ready_gave_up,
        hello,
    })
}

/// What one boot runs: the kvm backend's machine (profiles) or a bare Vm.
enum Booted {
    Kvm(Box<KvmMachine>),
    Vm(Vm),
}

impl Booted {
    fn vm(&self) -> &Vm {
        match self {
            Booted::Kvm(m) => m.vm(),
            Booted::Vm(v) => v,
        }
    }
}

fn bench_boot(args: &RunArgs, b: &BootArgs) -> Result<Report, String> {
    let t = boot_target(args, b)?;
    let runs = b.common.runs.unwrap_or(10).max(1);
    let warmup = b.common.warmup.unwrap_or(1);
    let kvm = kvm_kind();
    let kvm_pvm = kvm == "kvm_pvm";
    // On kvm_pvm each emulated boot takes minutes to reach init, and more to
    // user space: stop at init unless asked for more.
    let until = b.until.unwrap_or(if t.linux && kvm_pvm {
        Until::Init
    } else {
        Until::Ready
    });
    if !t.linux && until == Until::Init {
        return Err(
            "bench boot --tiny-guest: the tiny guest is not Linux and prints no \"Run /init\"; \
             use --until ready (the default) or console"
                .into(),
        );
    }
    let mut kernel_version = None;
    for i in 0..warmup {
        one_boot(&t, b, until, &mut kernel_version)
            .map_err(|e| format!("warm-up boot {}: {e}", i + 1))?;
    }
    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs {
        samples.push(
            one_boot(&t, b, until, &mut kernel_version)
                .map_err(|e| format!("boot {}: {e}", i + 1))?,
        );
    }

    let mut vm_create = Phase::new(
        "vm_create",
        "Vm::new: open /dev/kvm, check capabilities, start the monitor thread",
        "harness",
        Unit::Ns,
    );
    let mut vmm_setup = Phase::new(
        "vmm_setup",
        "boot() to vCPU 0's first KVM_RUN: RAM, KVM VM, kernel and initrd load, boot params, devices, vCPUs",
        "vmm",
        Unit::Ns,
    );
    let mut to_console = Phase::new(
        "kernel_to_console",
        "first KVM_RUN (kernel entry) to the guest's first console byte",
        "vmm",
        Unit::Ns,
    );
    let mut to_init = Phase::new(
        "kernel_to_init",
        "first KVM_RUN to the console line \"Run /init as init process\"",
        "vmm",
        Unit::Ns,
    );
    let mut to_ready = Phase::new(
        "kernel_to_ready",
        "first KVM_RUN to the guest writing 123 to the boot-timer port 0x440",
        "vmm",
        Unit::Ns,
    );
    let mut to_hello = Phase::new(
        "kernel_to_agent_hello",
        "first KVM_RUN to the harness's Hello handshake with the agent over vsock completing",
        // The start is the VMM's mark, the end the harness's clock.
        "harness+vmm",
        Unit::Ns,
    );
    let mut start_to_console = Phase::new(
        "start_to_console",
        "before Vm::new to the first console byte (what QEMU's start-to-first-serial-byte measures)",
        "harness+vmm",
        Unit::Ns,
    );
    let mut gave_up = 0;
    for s in &samples {
        let m = &s.marks;
        vm_create.push_duration(Some(s.vm_create));
        vmm_setup.push_duration(BootMarks::between(m.build_start, m.first_kvm_run));
        to_console.push_duration(BootMarks::between(m.first_kvm_run, m.first_console_byte));
        to_init.push_duration(BootMarks::between(
            m.first_kvm_run,
            m.console_at(RUN_INIT_TEXT),
        ));
        to_ready.push_duration(BootMarks::between(m.first_kvm_run, m.guest_ready));
        to_hello.push_duration(s.hello);
        start_to_console.push_duration(BootMarks::between(Some(s.start), m.first_console_byte));
        gave_up += usize::from(s.ready_gave_up);
    }
    if !t.linux {
        to_init.unless_measured("the tiny guest is not Linux: it prints no \"Run /init\"");
    } else if until == Until::Console {
        to_init.unless_measured("not waited for (--until console)");
    } else {
        to_init.unless_measured("the kernel never printed \"Run /init as init process\"");
    }
    let ready_why = if !t.linux {
        "not waited for (--until console)".to_string()
    } else if kvm_pvm && until != Until::Ready {
        format!(
            "not waited for (--until {}): this host's KVM is kvm_pvm, where guest kernel code is \
             emulated and slow; --until ready waits for the agent's {GUEST_READY} on port \
             {BOOT_TIMER_PORT:#x} (the kernel needs the kvm_pvm shims, scripts/probe-kernel/)",
            format!("{until:?}").to_lowercase()
        )
    } else if until != Until::Ready {
        format!("not waited for (--until {until:?})").to_lowercase()
    } else if let (true, Some(why)) = (gave_up > 0, &t.no_agent) {
        format!(
            "the guest wrote nothing to port {BOOT_TIMER_PORT:#x} within {} s of \"Run /init\" \
             (only the provium agent writes it, and {why})",
            b.ready_timeout
        )
    } else if gave_up > 0 {
        format!(
            "the guest wrote nothing to port {BOOT_TIMER_PORT:#x} within {} s of \"Run /init\" \
             (the injected agent never marked ready: see its stderr on the console)",
            b.ready_timeout
        )
    } else {
        "no boot-timer write".to_string()
    };
    to_ready.unless_measured(ready_why);
    to_hello.unless_measured(if !t.linux {
        "the tiny guest has no agent".to_string()
    } else if let Some(why) = &t.no_agent {
        format!("no agent Hello to wait for: {why}")
    } else if kvm_pvm && until != Until::Ready {
        format!(
            "the Hello is only awaited with --until ready, not --until {} (the default on kvm_pvm, \
             where guest kernel code is emulated and slow)",
            format!("{until:?}").to_lowercase()
        )
    } else if until != Until::Ready {
        format!(
            "the Hello is only awaited with --until ready, not --until {}",
            format!("{until:?}").to_lowercase()
        )
    } else {
        "the agent never marked ready, so its Hello was not awaited".to_string()
    });
    let (kernel, initrd) = (t.shown_kernel.clone(), t.boot.initrd.clone());
    Ok(Report {
        bench: "boot",
        target: t.name.clone(),
        runs,
        warmup,
        host: host_info(b.common.pin),
        guest: json!({
            "kernel": kernel,
            "kernel_version": kernel_version,
            "initrd": initrd.map(|p| p.display().to_string()),
            "cmdline": t.boot.cmdline,
            "mem_mib": t.mem_mib,
            "vcpus": b.cpus,
            "until": format!("{until:?}").to_lowercase(),
        }),
        phases: vec![
            vm_create,
            vmm_setup,
            to_console,
            to_init,
            to_ready,
            to_hello,
            start_to_console,
        ],
    })
}

// ---------------------------------------------------------------------------
// restore

fn local_backend(
    choice: VmmChoice,
    config: &crate::config::Config,
    what: &str,
) -> Result<(), String> {
    match choose_backend(choice, config) {
        BackendKind::Local => Ok(()),
        BackendKind::Kvm => Err(format!(
            "bench {what}: runs on the local backend only for now (on kvm it would time the agent \
             inside a Linux guest, which this bench does not boot yet); run with --vmm local"
        )),
    }
}

/// The tiny-guest fixture: the tiny guest booted to READY on `mem_mib` of
/// RAM and snapshotted into the fixture cache, keyed by the guest image and
/// size (built once, reused by later benches).
fn tiny_guest_fixture(
    cache: &provium_snapshot::FixtureCache,
    mem_mib: u64,
) -> Result<(PathBuf, bool), String> {
    use provium_snapshot::{EntryKind, KeyBuilder};
    let mut k = KeyBuilder::new("provium-bench-tiny-guest-fixture/1");
    k.field("bzimage", tiny_guest::BZIMAGE)
        .field("mem_mib", &mem_mib.to_le_bytes())
        .field(
            "protocol",
            &provium_protocol::PROTOCOL_VERSION.to_le_bytes(),
        );
    let key = k.finish();
    if let Some(p) = cache.lookup(&key, EntryKind::Vm) {
        return Ok((p, false));
    }
    let vm =
        Vm::new(tiny_restore_config(mem_mib, None)).map_err(|e| crate::error_chain::flatten(&e))?;
    vm.boot().map_err(|e| crate::error_chain::flatten(&e))?;
    if !vm
        .console()
        .wait_for(tiny_guest::READY.as_bytes(), 1, Duration::from_secs(120))
    {
        return Err(format!(
            "bench restore --tiny-guest: the tiny guest did not print READY; console:\n{}",
            console_tail(&vm)
        ));
    }
    let tmp = cache
        .dir()
        .join(format!(".tiny-guest-{}.snap", std::process::id()));
    vm.snapshot(&tmp)
        .map_err(|e| crate::error_chain::flatten(&e))?;
    drop(vm);
    let p = cache
        .install_vm(&key, &tmp)
        .map_err(|e| crate::error_chain::flatten(&e))?;
    Ok((p, true))
}

fn tiny_restore_config(mem_mib: u64, timer: Option<BootTimer>) -> VmConfig {
    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
        initrd: None,
        cmdline: "console=ttyS0".into(),
    });
    cfg.machine.mem_size_mib = mem_mib;
    cfg.boot_timer = timer;
    cfg.protocol_version = provium_protocol::PROTOCOL_VERSION;
    cfg
}

/// `warmup` untimed samples, then `runs` kept ones, taken by `batch` at
/// most `parallel` at a time.
fn run_batches<T>(
    warmup: usize,
    runs: usize,
    parallel: usize,
    mut batch: impl FnMut(usize) -> Result<Vec<T>, String>,
) -> Result<Vec<T>, String> {
    let mut left = warmup;
    while left > 0 {
        let c = left.min(parallel);
        batch(c)?;
        left -= c;
    }
    let mut samples = Vec::with_capacity(runs);
    let mut left = runs;
    while left > 0 {
        let c = left.min(parallel);
        samples.extend(batch(c)?);
        left -= c;
    }
    Ok(samples)
}

struct TinyRestoreSample {
    restore: Duration,
    first_insn: Option<Duration>,
    running: Duration,
    rss: u64,
    pss: u64,
}

/// `bench restore --tiny-guest`: restores of the tiny-guest fixture on the
/// VMM, P at once, each in a new VM.
fn bench_restore_tiny(args: &RunArgs, r: &RestoreArgs) -> Result<Report, String> {
    use provium_snapshot::FixtureCache;
    let config = load_config(&args.config)?;
    let cache =
        FixtureCache::open(&config.cache_dir).map_err(|e| crate::error_chain::flatten(&e))?;
    let (entry, built) = tiny_guest_fixture(&cache, r.mem)?;
    if built {
        eprintln!(
            "provium bench: built the tiny-guest fixture {}",
            entry.display()
        );
    }
    let runs = r.common.runs.unwrap_or(10).max(1);
    let warmup = r.common.warmup.unwrap_or(1);
    let parallel = r.parallel.max(1);
    let entry_bytes = std::fs::metadata(&entry).map(|m| m.len()).ok();
    let counter_gpa = tiny_guest::COUNTER_GPA;
    let batch = |count: usize| -> Result<Vec<TinyRestoreSample>, String> {
        let barrier = Barrier::new(count);
        let results: Mutex<Vec<Result<TinyRestoreSample, String>>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..count {
                let (barrier, results, entry) = (&barrier, &results, &entry);
                s.spawn(move || {
                    let timer = BootTimer::new();
                    let one = || -> Result<(Vm, TinyRestoreSample), String> {
                        let vm = Vm::new(tiny_restore_config(r.mem, Some(timer.clone())))
                            .map_err(|e| crate::error_chain::flatten(&e))?;
                        let t0 = Instant::now();
                        vm.restore(entry)
                            .map_err(|e| crate::error_chain::flatten(&e))?;
                        let restore = t0.elapsed();
                        // Running: the guest's counter (in restored RAM) moves.
                        let c0 = vm.read_guest_u64(counter_gpa).map_err(|e| e.to_string())?;
                        while vm.read_guest_u64(counter_gpa).map_err(|e| e.to_string())? == c0 {
                            if t0.elapsed() > Duration::from_secs(60) {
                                return Err(
                                    "the restored tiny guest did not run within 60 s".into()
                                );
                            }
                            std::thread::yield_now();
                        }
                        let running = t0.elapsed();
                        let m = timer.marks();
                        let first_insn = BootMarks::between(
                            m.get(provium_vmm::BootMark::BuildStart),
                            m.get(provium_vmm::BootMark::FirstKvmRun),
                        );
                        Ok((
                            vm,
                            TinyRestoreSample {
                                restore,
                                first_insn,
                                running,
                                rss: 0,
                                pss: 0,
                            },
                        ))
                    };
                    let out = one();
                    // Every restore of the batch is alive here: measure then.
                    barrier.wait();
                    let out = out.map(|(vm, mut sample)| {
                        (sample.rss, sample.pss) = mapping_memory(&vm.ram_host_ranges());
                        (vm, sample)
                    });
                    barrier.wait();
                    let out = out.map(|(vm, sample)| {
                        drop(vm);
                        sample
                    });
                    results.lock().unwrap_or_else(|e| e.into_inner()).push(out);
                });
            }
        });
        results
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter()
            .map(|r| r.map_err(|e| format!("bench restore --tiny-guest: {e}")))
            .collect()
    };
    let samples = run_batches(warmup, runs, parallel, batch)?;
    let mut first_insn = Phase::new(
        "restore_to_first_instruction",
        "start of Vm::restore to vCPU 0 entering KVM_RUN in the restored VM",
        "vmm",
        Unit::Ns,
    );
    let mut machine = Phase::new(
        "restore_machine",
        "Vm::restore: open and verify the snapshot, map the restore image, rebuild KVM state and devices, start vCPUs",
        "harness",
        Unit::Ns,
    );
    let mut running = Phase::new(
        "restore_to_guest_running",
        "start of the restore to the guest's loop counter moving in restored RAM",
        "harness",
        Unit::Ns,
    );
    let mut rss = Phase::new(
        "rss_per_vm",
        "resident guest RAM (smaps Rss of the VM's RAM mappings), all of a batch alive",
        "harness",
        Unit::Bytes,
    );
    let mut pss = Phase::new(
        "pss_per_vm",
        "proportional guest RAM (smaps Pss: page-cache pages shared by the batch's restores are split)",
        "harness",
        Unit::Bytes,
    );
    for s in &samples {
        first_insn.push_duration(s.first_insn);
        machine.push_duration(Some(s.restore));
        running.push_duration(Some(s.running));
        rss.samples.push(s.rss);
        pss.samples.push(s.pss);
    }
    if first_insn.samples.is_empty() {
        first_insn.unavailable = Some("the VMM's boot timer recorded no first KVM_RUN".into());
    }
    Ok(Report {
        bench: "restore",
        target: "tiny-guest".into(),
        runs,
        warmup,
        host: host_info(r.common.pin),
        guest: json!({
            "backend": "kvm",
            "fixture": "tiny-guest",
            "entry": entry.display().to_string(),
            "entry_bytes": entry_bytes,
            "memory_bytes": r.mem << 20,
            "vcpus": 1,
            "parallel": parallel,
        }),
        phases: vec![first_insn, machine, running, rss, pss],
    })
}

struct RestoreSample {
    machine: Duration,
    answer: Duration,
    rss: u64,
    pss: u64,
}

fn bench_restore(args: &RunArgs, r: &RestoreArgs) -> Result<Report, String> {
    use crate::fixture;
    use provium_snapshot::{EntryKind, FixtureCache};

    if r.tiny_guest {
        return bench_restore_tiny(args, r);
    }
    let fixture_name = r.fixture.clone().expect("clap requires a fixture");
    let r = &RestoreArgs {
        fixture: Some(fixture_name.clone()),
        ..r.clone()
    };
    let config = Arc::new(load_config(&args.config)?);
    let backend = choose_backend(r.vmm, &config);
    let roots = if config.roots.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        config.roots.clone()
    };
    let env = Arc::new(crate::runner::FileEnv::new(
        "provium bench".into(),
        PathBuf::from("provium-bench"),
        roots.clone(),
        config.clone(),
        backend,
        crate::events::EventSender::disabled(),
    ));
    let file = fixture::key::resolve_fixture(&roots, &fixture_name)?;
    if fixture::fixture_kind(&file) != EntryKind::Vm {
        return Err(format!(
            "bench restore: `{}` is a lab_fixture; bench restore takes a vm_fixture",
            fixture_name
        ));
    }
    if fixture::build_for_cli(&env, &fixture_name, false, &crate::lua::lab::ChunkBuilder)? {
        eprintln!(
            "provium bench: built fixture `{}` (it was not cached)",
            fixture_name
        );
    }
    let key = fixture::fixture_key(&env, &fixture_name)?;
    let cache =
        FixtureCache::open(&config.cache_dir).map_err(|e| crate::error_chain::flatten(&e))?;
    let entry = cache.lookup(&key, EntryKind::Vm).ok_or_else(|| {
        format!(
            "bench restore: fixture `{}` has no cache entry after building",
            fixture_name
        )
    })?;
    let decl = crate::lua::snapshot::VmDecl::read(&entry)?;
    // The bench restores bare machines: a kvm snapshot whose machine had
    // disks or NICs needs them again, which only the Lua layer recreates.
    if let Some(d) = crate::lua::snapshot::VmDevices::read_if_present(&entry)? {
        if !d.disks.is_empty() || !d.nics.is_empty() {
            return Err(format!(
                "bench restore: fixture `{fixture_name}`'s VM had {} disk(s) and {} NIC(s), which \
                 this bench does not recreate; bench a fixture whose VM has none",
                d.disks.len(),
                d.nics.len()
            ));
        }
    }
    let runs = r.common.runs.unwrap_or(10).max(1);
    let warmup = r.common.warmup.unwrap_or(1);
    let parallel = r.parallel.max(1);
    let entry_bytes = std::fs::metadata(&entry).map(|m| m.len()).ok();

    let spec_for = |i: usize| BootSpec {
        vm_name: format!("bench-restore-{}-{i}", std::process::id()),
        profile_name: decl.profile.clone(),
        profile: config.profiles.get(&decl.profile).cloned(),
        memory_bytes: decl.memory_bytes,
        cpus: decl.cpus,
        kernel_cmdline: None,
        rng_seed: decl.rng_seed,
        initial_time: None,
    };
    let mut next = 0usize;
    let batch = |count: usize| -> Result<Vec<RestoreSample>, String> {
        let barrier = Barrier::new(count);
        let results: Mutex<Vec<Result<RestoreSample, String>>> = Mutex::new(Vec::new());
        let first = next;
        next += count;
        std::thread::scope(|s| {
            for i in 0..count {
                let (barrier, results, entry) = (&barrier, &results, &entry);
                let spec = spec_for(first + i);
                s.spawn(move || {
                    let t0 = Instant::now();
                    let r = Machine::restore(backend, &spec, entry);
                    let machine_t = t0.elapsed();
                    let r = r.and_then(|m| {
                        let c = m.connect();
                        let pinged = c.and_then(|c| c.ping().map_err(|e| e.to_string()));
                        match pinged {
                            Ok(()) => Ok((m, t0.elapsed())),
                            Err(e) => {
                                m.kill();
                                Err(e)
                            }
                        }
                    });
                    // Every restore of the batch is alive here: measure then.
                    barrier.wait();
                    let out = r.map(|(m, answer)| {
                        let (rss, pss) = m.resident_memory();
                        (m, answer, rss, pss)
                    });
                    barrier.wait();
                    let out = out.map(|(m, answer, rss, pss)| {
                        m.shutdown();
                        RestoreSample {
                            machine: machine_t,
                            answer,
                            rss,
                            pss,
                        }
                    });
                    results.lock().unwrap_or_else(|e| e.into_inner()).push(out);
                });
            }
        });
        results
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter()
            .map(|r| r.map_err(|e| format!("bench restore `{}`: {e}", entry.display())))
            .collect()
    };
    let samples = run_batches(warmup, runs, parallel, batch)?;

    let mut answer = Phase::new(
        "restore_to_agent_answer",
        "start of the restore to the restored VM's agent answering a ping",
        "harness",
        Unit::Ns,
    );
    let kvm = backend == BackendKind::Kvm;
    let mut machine = Phase::new(
        "restore_machine",
        if kvm {
            "open and verify the snapshot, map its memory image, rebuild KVM state and devices, \
             start the vCPUs (no agent round trip)"
        } else {
            "read and verify the snapshot, start the sandbox, put its files back (no agent round trip)"
        },
        "harness",
        Unit::Ns,
    );
    let mut first_insn = Phase::new(
        "restore_to_first_instruction",
        "start of the restore to the guest's first instruction",
        "vmm",
        Unit::Ns,
    );
    first_insn.unavailable = Some(if kvm {
        "not timed for a Linux fixture; `bench restore --tiny-guest` measures it on the VMM".into()
    } else {
        "the local backend runs no guest CPU (a sandbox's snapshot is its files); \
         `bench restore --tiny-guest` measures it on the VMM"
            .into()
    });
    let mut rss = Phase::new(
        "rss_per_vm",
        if kvm {
            "resident guest RAM (smaps Rss of the VM's RAM mappings), all of a batch alive"
        } else {
            "resident memory (VmRSS) summed over the restored sandbox's processes, all of a batch alive"
        },
        "harness",
        Unit::Bytes,
    );
    let mut pss = Phase::new(
        "pss_per_vm",
        if kvm {
            "proportional guest RAM (smaps Pss: page-cache pages of the memory image shared by the \
             batch's restores are split)"
        } else {
            "proportional memory (Pss, shared pages split between sharers) of the same processes"
        },
        "harness",
        Unit::Bytes,
    );
    for s in &samples {
        answer.push_duration(Some(s.answer));
        machine.push_duration(Some(s.machine));
        rss.samples.push(s.rss);
        pss.samples.push(s.pss);
    }
    Ok(Report {
        bench: "restore",
        target: fixture_name.clone(),
        runs,
        warmup,
        host: host_info(r.common.pin),
        guest: json!({
            "backend": backend.as_str(),
            "emulated_kernel_code": kvm && crate::backend::kvm::host_is_kvm_pvm(),
            "fixture": fixture_name,
            "entry": entry.display().to_string(),
            "entry_bytes": entry_bytes,
            "profile": decl.profile,
            "memory_bytes": decl.memory_bytes,
            "vcpus": decl.cpus,
            "parallel": parallel,
        }),
        phases: vec![answer, machine, first_insn, rss, pss],
    })
}

// ---------------------------------------------------------------------------
// ops

fn bench_ops(args: &RunArgs, o: &OpsArgs) -> Result<Report, String> {
    let config = load_config(&args.config)?;
    local_backend(o.vmm, &config, "ops")?;
    let profile_name = o.profile.clone().unwrap_or_else(|| "default".into());
    let spec = BootSpec {
        vm_name: format!("bench-ops-{}", std::process::id()),
        profile: config.profiles.get(&profile_name).cloned(),
        profile_name: profile_name.clone(),
        memory_bytes: crate::lua::vm::DEFAULT_MEMORY_BYTES,
        cpus: 1,
        kernel_cmdline: None,
        rng_seed: None,
        initial_time: None,
    };
    let runs = o.common.runs.unwrap_or(200).max(1);
    let warmup = o.common.warmup.unwrap_or(10);
    let machine =
        Machine::boot(BackendKind::Local, &spec).map_err(|e| format!("bench ops: {e}"))?;
    let result = run_ops(&machine, runs, warmup);
    machine.shutdown();
    let phases = result?;
    let agent = crate::backend::local::locate_agent()
        .map(|p| p.display().to_string())
        .ok();
    Ok(Report {
        bench: "ops",
        target: "local".into(),
        runs,
        warmup,
        host: host_info(o.common.pin),
        guest: json!({
            "backend": "local",
            "profile": o.profile,
            "agent": agent,
            "transport": "unix socket (local sandbox)",
        }),
        phases,
    })
}

fn run_ops(machine: &Machine, runs: usize, warmup: usize) -> Result<Vec<Phase>, String> {
    let c = machine.connect().map_err(|e| format!("bench ops: {e}"))?;
    let e = |what: &str| {
        let what = what.to_string();
        move |err: crate::client::ClientError| format!("bench ops: {what}: {err}")
    };
    let time =
        |phase: &mut Phase, f: &mut dyn FnMut() -> Result<(), String>| -> Result<(), String> {
            for _ in 0..warmup {
                f()?;
            }
            for _ in 0..runs {
                let t = Instant::now();
                f()?;
                phase.push_duration(Some(t.elapsed()));
            }
            Ok(())
        };
    let mut ping = Phase::new("ping", "a no-op agent round trip", "harness", Unit::Ns);
    time(&mut ping, &mut || c.ping().map_err(e("ping")))?;
    let mut run_true = Phase::new(
        "run_true",
        "vm:run(\"true\"): spawn /bin/sh -c true in the guest and wait for it",
        "harness",
        Unit::Ns,
    );
    time(&mut run_true, &mut || {
        let r = c.run("true").map_err(e("run true"))?;
        if r.success() {
            Ok(())
        } else {
            Err(format!("bench ops: `true` failed in the guest: {r:?}"))
        }
    })?;
    let four_k = vec![0x5au8; 4096];
    let path_4k = "/tmp/provium-bench-4k";
    c.write_file(path_4k, &four_k).map_err(e("write 4 KiB"))?;
    let mut read_4k = Phase::new("read_4k", "read_file of a 4 KiB file", "harness", Unit::Ns);
    time(&mut read_4k, &mut || {
        let d = c.read_file(path_4k).map_err(e("read 4 KiB"))?;
        if d.len() == 4096 {
            Ok(())
        } else {
            Err(format!("bench ops: read {} bytes, wanted 4096", d.len()))
        }
    })?;
    let one_m: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let path_1m = "/tmp/provium-bench-1m";
    let mut wr_1m = Phase::new(
        "write_read_1m",
        "write_file then read_file of 1 MiB",
        "harness",
        Unit::Ns,
    );
    time(&mut wr_1m, &mut || {
        c.write_file(path_1m, &one_m).map_err(e("write 1 MiB"))?;
        let d = c.read_file(path_1m).map_err(e("read 1 MiB"))?;
        if d == one_m {
            Ok(())
        } else {
            Err("bench ops: the 1 MiB read back differs from what was written".to_string())
        }
    })?;
    Ok(vec![ping, run_true, read_4k, wr_1m])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_stats() {
        let s = stats(&[5, 1, 4, 2, 3, 6, 7, 8, 9, 10]).expect("samples");
        assert_eq!((s.min, s.median, s.p90, s.p99, s.max), (1, 5, 9, 10, 10));
        assert!((s.mean - 5.5).abs() < 1e-9);
        assert!(stats(&[]).is_none());
        let one = stats(&[7]).expect("one");
        assert_eq!((one.min, one.median, one.max), (7, 7, 7));
        assert!(is_noisy(&stats(&[1, 3]).expect("two")));
        assert!(!is_noisy(&stats(&[2, 4]).expect("two")));
    }

    #[test]
    fn regression_thresholds_parse() {
        assert_eq!(parse_regression("10%"), Ok(0.10));
        assert_eq!(parse_regression("25"), Ok(0.25));
        assert_eq!(parse_regression(" 2.5 % "), Ok(0.025));
        assert!(parse_regression("fast").is_err());
        assert!(parse_regression("-1%").is_err());
    }

    #[test]
    fn values_format_by_unit() {
        assert_eq!(fmt_value(999, Unit::Ns), "999ns");
        assert_eq!(fmt_value(1_500, Unit::Ns), "1.5us");
        assert_eq!(fmt_value(2_340_000, Unit::Ns), "2.34ms");
        assert_eq!(fmt_value(3_000_000_000, Unit::Ns), "3.00s");
        assert_eq!(fmt_value(512, Unit::Bytes), "512B");
        assert_eq!(fmt_value(3 << 20, Unit::Bytes), "3.0MiB");
    }

    fn report() -> Report {
        let mut a = Phase::new("a", "A", "vmm", Unit::Ns);
        a.samples = vec![100, 300];
        let mut b = Phase::new("b", "B", "harness", Unit::Bytes);
        b.unavailable = Some("not here".into());
        Report {
            bench: "boot",
            target: "t".into(),
            runs: 2,
            warmup: 0,
            host: host_info(None),
            guest: json!({"kernel": "k"}),
            phases: vec![a, b],
        }
    }

    #[test]
    fn json_lines_carry_samples_or_the_reason() {
        let lines = report().to_json_lines();
        assert_eq!(lines.len(), 2);
        let a = &lines[0];
        assert_eq!(a["schema"], SCHEMA);
        assert_eq!(a["phase"], "a");
        assert_eq!(a["available"], true);
        assert_eq!(a["samples"], json!([100, 300]));
        assert_eq!(a["median"], 100);
        assert_eq!(a["noisy"], true);
        assert!(a["host"]["kernel"].is_string());
        let b = &lines[1];
        assert_eq!(b["available"], false);
        assert_eq!(b["reason"], "not here");
        assert!(b["median"].is_null());
        let r = report();
        assert!(r.table().contains("unavailable: not here"));
        assert_eq!(r.noise_warnings().len(), 1);
    }

    #[test]
    fn compare_flags_only_growth_past_the_threshold() {
        let old = report().to_json_lines();
        let mut slower = old.clone();
        slower[0]["median"] = json!(111);
        let c = compare(&old, &slower, 0.10);
        assert!(c.regressed, "{}", c.text);
        assert!(c.text.contains("REGRESSED"));
        slower[0]["median"] = json!(109);
        assert!(!compare(&old, &slower, 0.10).regressed);
        let mut faster = old.clone();
        faster[0]["median"] = json!(10);
        let c = compare(&old, &faster, 0.0);
        assert!(!c.regressed, "{}", c.text);
        assert!(c.text.contains("not comparable"), "{}", c.text);
    }
}
