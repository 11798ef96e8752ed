//! Per-test selection: meta.skip, meta.slow, --tag/--no-tag,
//! --tag-meta/--no-tag-meta, in the reference's precedence order.

use std::collections::BTreeMap;

use provium_protocol::meta::{MetaMap, MetaValue};

#[derive(Debug, Clone, Default)]
pub struct TestFilter {
    pub include_slow: bool,
    pub tags: Vec<String>,
    pub no_tags: Vec<String>,
    /// KEY -> accepted VALUEs (OR within a key, AND across keys).
    pub tag_meta: BTreeMap<String, Vec<String>>,
    pub no_tag_meta: BTreeMap<String, Vec<String>>,
}

/// A selection flag that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// `--tag-meta` / `--no-tag-meta` without `=`.
    #[error("{flag} `{item}`: expected KEY=VALUE, e.g. {flag} subsystems=net")]
    NotKeyValue { flag: String, item: String },
}

/// Parse `KEY=VALUE` flags into a key -> values map.
pub fn parse_key_values(
    flag: &str,
    items: &[String],
) -> Result<BTreeMap<String, Vec<String>>, FilterError> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| FilterError::NotKeyValue {
                flag: flag.to_string(),
                item: item.clone(),
            })?;
        out.entry(k.to_string()).or_default().push(v.to_string());
    }
    Ok(out)
}

/// Whether a meta value "contains" a wanted value: equal scalars, or an
/// array holding it.
fn contains(v: &MetaValue, want: &str) -> bool {
    match v {
        MetaValue::Str(s) => s == want,
        MetaValue::Int(i) => i.to_string() == want,
        MetaValue::Bool(b) => b.to_string() == want,
        MetaValue::Float(f) => f.to_string() == want,
        MetaValue::Bytes(b) => b == want.as_bytes(),
        MetaValue::Array(a) => a.iter().any(|x| contains(x, want)),
        MetaValue::Map(_) | MetaValue::Null => false,
    }
}

/// The reference's truthiness for `meta.slow` / `meta.skip`: `false`,
/// `nil` and `0` are off; `true`, any non-zero number and anything else
/// are on.
fn truthy(v: Option<&MetaValue>) -> bool {
    match v {
        None | Some(MetaValue::Null) | Some(MetaValue::Bool(false)) => false,
        Some(MetaValue::Int(i)) => *i != 0,
        Some(MetaValue::Float(f)) => *f != 0.0,
        Some(_) => true,
    }
}

/// The reason a slow test is filtered out without `--include-slow`.
pub const SLOW_SKIP_REASON: &str = "filtered: slow tests skipped (pass --include-slow)";

impl TestFilter {
    /// `Some(reason)` when the test must be skipped, else `None`.
    pub fn skip_reason(&self, meta: &MetaMap) -> Option<String> {
        match meta.get("skip") {
            Some(MetaValue::Str(reason)) => return Some(format!("skipped: {reason}")),
            skip if truthy(skip) => return Some("skipped (meta.skip)".into()),
            _ => {}
        }
        if truthy(meta.get("slow")) && !self.include_slow {
            return Some(SLOW_SKIP_REASON.into());
        }
        let tags: Vec<&str> = match meta.get("tags") {
            Some(MetaValue::Array(a)) => a
                .iter()
                .filter_map(|t| {
                    if let MetaValue::Str(s) = t {
                        Some(s.as_str())
                    } else {
                        None
                    }
                })
                .collect(),
            Some(MetaValue::Str(s)) => vec![s.as_str()],
            _ => Vec::new(),
        };
        if let Some(t) = self.no_tags.iter().find(|t| tags.contains(&t.as_str())) {
            return Some(format!("--no-tag {t}"));
        }
        if !self.tags.is_empty() && !self.tags.iter().any(|t| tags.contains(&t.as_str())) {
            return Some(format!("--tag {}", self.tags.join(",")));
        }
        for (key, values) in &self.no_tag_meta {
            if let Some(v) = values
                .iter()
                .find(|v| meta.get(key).is_some_and(|m| contains(m, v)))
            {
                return Some(format!("--no-tag-meta {key}={v}"));
            }
        }
        for (key, values) in &self.tag_meta {
            if !values
                .iter()
                .any(|v| meta.get(key).is_some_and(|m| contains(m, v)))
            {
                return Some(format!("--tag-meta {key}={}", values.join("|")));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: Vec<(&str, MetaValue)>) -> MetaMap {
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
    fn strs(v: &[&str]) -> MetaValue {
        MetaValue::Array(v.iter().map(|s| MetaValue::Str(s.to_string())).collect())
    }

    #[test]
    fn precedence_follows_the_reference() {
        let mut f = TestFilter {
            tags: vec!["smoke".into()],
            no_tags: vec!["flaky".into()],
            ..Default::default()
        };
        assert_eq!(f.skip_reason(&meta(vec![("tags", strs(&["smoke"]))])), None);
        assert_eq!(
            f.skip_reason(&meta(vec![("tags", strs(&["smoke", "flaky"]))]))
                .as_deref(),
            Some("--no-tag flaky")
        );
        assert!(f.skip_reason(&meta(vec![])).unwrap().starts_with("--tag"));
        assert_eq!(
            f.skip_reason(&meta(vec![("skip", MetaValue::Str("why".into()))]))
                .as_deref(),
            Some("skipped: why")
        );
        f.tags.clear();
        assert_eq!(
            f.skip_reason(&meta(vec![("slow", MetaValue::Bool(true))]))
                .as_deref(),
            Some(SLOW_SKIP_REASON)
        );
        assert_eq!(
            f.skip_reason(&meta(vec![("slow", MetaValue::Int(2))]))
                .as_deref(),
            Some(SLOW_SKIP_REASON)
        );
        assert_eq!(
            f.skip_reason(&meta(vec![("slow", MetaValue::Int(0))])),
            None
        );
        assert_eq!(
            f.skip_reason(&meta(vec![("skip", MetaValue::Int(1))]))
                .as_deref(),
            Some("skipped (meta.skip)")
        );
        assert_eq!(
            f.skip_reason(&meta(vec![("skip", MetaValue::Int(0))])),
            None
        );
        assert_eq!(
            f.skip_reason(&meta(vec![("skip", MetaValue::Bool(false))])),
            None
        );
        f.include_slow = true;
        assert_eq!(
            f.skip_reason(&meta(vec![("slow", MetaValue::Bool(true))])),
            None
        );
    }

    #[test]
    fn tag_meta_is_or_within_a_key_and_across_keys() {
        let items = vec![
            "subsystems=net".to_string(),
            "subsystems=fs".into(),
            "owner=me".into(),
        ];
        let f = TestFilter {
            tag_meta: parse_key_values("--tag-meta", &items).unwrap(),
            ..Default::default()
        };
        let m = meta(vec![
            ("subsystems", strs(&["fs"])),
            ("owner", MetaValue::Str("me".into())),
        ]);
        assert_eq!(f.skip_reason(&m), None);
        let m = meta(vec![("subsystems", strs(&["fs"]))]);
        assert!(f.skip_reason(&m).unwrap().starts_with("--tag-meta owner"));
        let f = TestFilter {
            no_tag_meta: parse_key_values("--no-tag-meta", &["subsystems=net".to_string()])
                .unwrap(),
            ..Default::default()
        };
        assert!(f
            .skip_reason(&meta(vec![("subsystems", strs(&["net", "fs"]))]))
            .is_some());
        assert!(parse_key_values("--tag-meta", &["novalue".to_string()])
            .unwrap_err()
            .to_string()
            .contains("KEY=VALUE"));
    }
}
