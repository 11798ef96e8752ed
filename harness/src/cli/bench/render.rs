//! A finished bench as a table (stdout) or as JSON lines (`--json`, schema
//! [`super::SCHEMA`]), and the warnings its noisy phases draw.

use serde_json::{json, Value};

use super::stats::{is_noisy, stats, Phase, Unit, NOISY_MAX_OVER_MIN};
use super::SCHEMA;

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cli::bench::host::host_info;

    #[test]
    fn values_format_by_unit() {
        assert_eq!(fmt_value(999, Unit::Ns), "999ns");
        assert_eq!(fmt_value(1_500, Unit::Ns), "1.5us");
        assert_eq!(fmt_value(2_340_000, Unit::Ns), "2.34ms");
        assert_eq!(fmt_value(3_000_000_000, Unit::Ns), "3.00s");
        assert_eq!(fmt_value(512, Unit::Bytes), "512B");
        assert_eq!(fmt_value(3 << 20, Unit::Bytes), "3.0MiB");
    }

    /// A two-phase report: one measured, one unavailable.
    pub(crate) fn report() -> Report {
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
}
