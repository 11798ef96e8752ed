//! The `[provium]` table: scan roots and the fixture cache (where, how big).
//!
//! Its sizes (`cache_max_size`, and `--mem`, disk and claim sizes elsewhere)
//! share [`parse_size`].

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::settings::Settings;

/// The fixture cache's LRU eviction target when `cache_max_size` is unset.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 20 << 30;

/// A size that is not a non-negative number with an optional K/M/G/T suffix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizeError {
    #[error("bad size `{text}`: expected bytes or a number with K/M/G/T, e.g. \"512M\"")]
    NotANumber { text: String },
    #[error("bad size `{text}`: must be a non-negative number")]
    Negative { text: String },
}

/// `[provium]` as written.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ProviumTable {
    #[serde(default)]
    roots: Vec<String>,
    cache_dir: Option<String>,
    cache_max_size: Option<SizeValue>,
}

/// `cache_max_size`: an integer number of bytes or a size string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// `[provium]` validated, its paths resolved.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ProviumSettings {
    pub roots: Vec<PathBuf>,
    pub cache_dir: PathBuf,
    pub cache_max_bytes: u64,
}

/// The fixture cache when `cache_dir` is unset: `<cache home>/fixtures`
/// ([`Settings::cache_home`]).
pub(super) fn default_cache_dir(settings: &Settings) -> PathBuf {
    settings.cache_home().join("fixtures")
}

impl ProviumTable {
    /// Validates the table; relative paths are joined to `base_dir`.
    pub(super) fn resolve(
        &self,
        base_dir: &Path,
        settings: &Settings,
    ) -> Result<ProviumSettings, SizeError> {
        let resolve = |p: &str| super::resolve_path(base_dir, p);
        Ok(ProviumSettings {
            roots: self.roots.iter().map(|r| resolve(r)).collect(),
            cache_dir: self
                .cache_dir
                .as_deref()
                .map_or_else(|| default_cache_dir(settings), resolve),
            cache_max_bytes: match &self.cache_max_size {
                None => DEFAULT_CACHE_MAX_BYTES,
                Some(SizeValue::Bytes(b)) => *b,
                Some(SizeValue::Text(t)) => parse_size(t)?,
            },
        })
    }
}

/// Parse a size: bare bytes, or a number with K/M/G/T (binary) suffix, an
/// optional `B`/`iB` after it. "512M", "2G", "1.5G".
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let stripped = upper.trim_end_matches("IB").trim_end_matches('B');
    let (num, mult) = match stripped.chars().last() {
        Some('K') => (&stripped[..stripped.len() - 1], 1u64 << 10),
        Some('M') => (&stripped[..stripped.len() - 1], 1 << 20),
        Some('G') => (&stripped[..stripped.len() - 1], 1 << 30),
        Some('T') => (&stripped[..stripped.len() - 1], 1 << 40),
        _ => (stripped, 1),
    };
    let value: f64 = num.trim().parse().map_err(|_| SizeError::NotANumber {
        text: text.to_string(),
    })?;
    if !value.is_finite() || value < 0.0 {
        return Err(SizeError::Negative {
            text: text.to_string(),
        });
    }
    Ok((value * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> ProviumTable {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("lots")
            .unwrap_err()
            .to_string()
            .contains("bad size `lots`"));
        assert_eq!(
            parse_size("-1G").unwrap_err().to_string(),
            "bad size `-1G`: must be a non-negative number"
        );
    }

    #[test]
    fn defaults_come_from_the_settings() {
        let settings = Settings {
            home: Some(PathBuf::from("/h")),
            ..Settings::default()
        };
        let p = table("").resolve(Path::new("/p"), &settings).unwrap();
        assert_eq!(
            p,
            ProviumSettings {
                roots: Vec::new(),
                cache_dir: PathBuf::from("/h/.cache/provium/fixtures"),
                cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            }
        );
    }

    #[test]
    fn paths_resolve_against_the_base_and_sizes_take_both_forms() {
        let s = Settings::default();
        let p = table("roots = [\"t\", \"/abs\"]\ncache_dir = \"c\"\ncache_max_size = 4096\n")
            .resolve(Path::new("/p"), &s)
            .unwrap();
        assert_eq!(p.roots, vec![PathBuf::from("/p/t"), PathBuf::from("/abs")]);
        assert_eq!(p.cache_dir, PathBuf::from("/p/c"));
        assert_eq!(p.cache_max_bytes, 4096);
        let bad = table("cache_max_size = \"huge\"\n").resolve(Path::new("/p"), &s);
        assert!(matches!(bad, Err(SizeError::NotANumber { .. })), "{bad:?}");
    }
}
