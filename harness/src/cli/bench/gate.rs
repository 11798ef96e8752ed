//! The comparison gate: `--compare OLD.json` and `bench compare OLD NEW`
//! print new/old median ratios and fail when one grew past the threshold.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::render::fmt_value;
use super::stats::Unit;

/// A threshold or an earlier result the gate cannot use.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("--max-regression {text:?}: expected a percentage such as \"10%\"")]
    BadThreshold { text: String },
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not JSON", path.display())]
    NotJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}:{line}: not JSON", path.display())]
    LineNotJson {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// `"10%"`, `"10"` (percent) or `"2.5%"` → 0.10 / 0.10 / 0.025.
pub fn parse_regression(s: &str) -> Result<f64, GateError> {
    let t = s.trim().trim_end_matches('%').trim();
    match t.parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p / 100.0),
        _ => Err(GateError::BadThreshold {
            text: s.to_string(),
        }),
    }
}

/// The objects of a `--json` output (JSON lines; a JSON array is accepted too).
pub fn read_json_lines(path: &Path) -> Result<Vec<Value>, GateError> {
    let text = std::fs::read_to_string(path).map_err(|source| GateError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if text.trim_start().starts_with('[') {
        return match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(a)) => Ok(a),
            Ok(_) => unreachable!("starts with ["),
            Err(source) => Err(GateError::NotJson {
                path: path.to_path_buf(),
                source,
            }),
        };
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| GateError::LineNotJson {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::render::tests::report;
    use serde_json::json;

    #[test]
    fn regression_thresholds_parse() {
        assert_eq!(parse_regression("10%").ok(), Some(0.10));
        assert_eq!(parse_regression("25").ok(), Some(0.25));
        assert_eq!(parse_regression(" 2.5 % ").ok(), Some(0.025));
        assert!(parse_regression("fast").is_err());
        assert!(parse_regression("-1%").is_err());
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

    #[test]
    fn json_lines_are_read_back_skipping_blanks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        std::fs::write(&path, "{\"phase\": \"a\"}\n\n{\"phase\": \"b\"}\n").unwrap();
        let lines = read_json_lines(&path).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["phase"], "b");
        let missing = dir.path().join("missing.json");
        let e = read_json_lines(&missing).unwrap_err();
        assert!(
            crate::error_chain::flatten(&e)
                .starts_with(&format!("cannot read {}: ", missing.display())),
            "{e}"
        );
        std::fs::write(&path, "{}\nnope\n").unwrap();
        let e = read_json_lines(&path).unwrap_err();
        assert_eq!(e.to_string(), format!("{}:2: not JSON", path.display()));
    }
}
