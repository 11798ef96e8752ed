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
//!
//! One file per concern: [`args`] (the clap arguments), [`stats`] (phases
//! and nearest-rank statistics), [`render`] (the report as a table or JSON
//! lines), [`host`] (what machine measured it), [`pin`] (`--pin`), [`gate`]
//! (`--compare` and `bench compare`), and one per bench: [`boot`],
//! [`restore`], [`ops`], [`fork`]. This module is the entry: it runs a bench, prints
//! its report and applies the gate.

mod args;
mod boot;
mod fork;
mod gate;
mod host;
mod ops;
mod pin;
mod render;
mod restore;
mod stats;

use provium_vmm::Console;

use super::{RunArgs, EXIT_FAILED, EXIT_OK};

pub use args::{BenchOp, BootArgs, CommonArgs, ForkArgs, OpsArgs, RestoreArgs, Until};
pub use gate::{compare, parse_regression, read_json_lines, Comparison, GateError};
pub use host::{host_info, kvm_kind};
pub use pin::PinError;
pub use render::{fmt_value, Report};
pub use stats::{is_noisy, stats, Phase, Stats, Unit, NOISY_MAX_OVER_MIN};

/// The `schema` field of every JSON object this command writes.
pub const SCHEMA: &str = "provium-bench/1";
/// What Linux prints when it starts user space: `Run /init as init process`
/// (or `/sbin/provium-agent`, `/sbin/init`, ...).
pub const RUN_INIT_TEXT: &str = " as init process";

/// Why a bench run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Gate(#[from] GateError),
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error(transparent)]
    Boot(#[from] boot::BootBenchError),
    #[error(transparent)]
    Restore(#[from] restore::RestoreBenchError),
    #[error(transparent)]
    Ops(#[from] ops::OpsBenchError),
    #[error(transparent)]
    Fork(#[from] fork::ForkBenchError),
}

/// Runs `op`; returns the exit code, or the error (`cli::main` prints its
/// chain).
pub fn run(args: &RunArgs, op: BenchOp) -> Result<i32, BenchError> {
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
            (boot::bench_boot(args, &b)?, b.common)
        }
        BenchOp::Restore(r) => {
            setup(&r.common)?;
            (restore::bench_restore(args, &r)?, r.common)
        }
        BenchOp::Ops(o) => {
            setup(&o.common)?;
            (ops::bench_ops(args, &o)?, o.common)
        }
        BenchOp::Fork(f) => {
            setup(&f.common)?;
            (fork::bench_fork(args, &f)?, f.common)
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

/// Applies `--pin` and checks `--max-regression` before a bench runs, so a
/// bad threshold fails at once, not after minutes of measuring.
fn setup(c: &CommonArgs) -> Result<(), BenchError> {
    if let Some(cpu) = c.pin {
        pin::pin_to(cpu)?;
    }
    if c.compare.is_some() {
        parse_regression(&c.max_regression)?;
    }
    Ok(())
}

/// Prints `report` and its noise warnings, then applies `--compare`.
fn finish(report: &Report, c: &CommonArgs) -> Result<i32, BenchError> {
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

/// The last 2 KiB of `console`'s log, cut at a character boundary.
fn console_tail(console: &Console) -> String {
    let log = console.log_string();
    let start = log.len().saturating_sub(2048);
    let start = (start..log.len())
        .find(|&i| log.is_char_boundary(i))
        .unwrap_or(log.len());
    log[start..].to_string()
}

/// Parses `provium ARGS...` into the run args and the bench op, as
/// `cli::main` would.
#[cfg(test)]
pub(crate) fn parse_bench(args: &[&str]) -> (RunArgs, BenchOp) {
    use clap::Parser;
    let cli = super::Cli::try_parse_from(std::iter::once("provium").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    match cli.command {
        Some(super::Command::Bench { op }) => (cli.run, op),
        _ => panic!("{args:?} is not a bench command"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_refuses_a_bad_threshold_only_with_compare() {
        let mut c = CommonArgs {
            runs: None,
            warmup: None,
            json: false,
            pin: None,
            compare: None,
            max_regression: "fast".into(),
        };
        assert!(setup(&c).is_ok(), "no --compare: the threshold is unused");
        c.compare = Some("old.json".into());
        assert!(setup(&c).is_err());
        c.max_regression = "10%".into();
        assert!(setup(&c).is_ok());
    }

    /// A gate error reaches `cli::main` with its cause, once.
    #[test]
    fn errors_are_flattened_once_for_main() {
        let flat = |e: BenchError| crate::error_chain::flatten(&e);
        let (run_args, op) =
            parse_bench(&["bench", "compare", "/nonexistent/old.json", "new.json"]);
        let e = flat(run(&run_args, op).unwrap_err());
        assert_eq!(
            e,
            "cannot read /nonexistent/old.json: No such file or directory (os error 2)"
        );
        let (run_args, op) = parse_bench(&["bench", "ops", "--pin", "1048576"]);
        assert_eq!(
            flat(run(&run_args, op).unwrap_err()),
            "--pin 1048576: no such CPU"
        );
    }
}
