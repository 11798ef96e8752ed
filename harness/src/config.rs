//! `provium.toml`: the `[provium]` section and `[profiles.<name>]` blocks.
//!
//! Loading follows the reference's five steps (read, parse, validate, expand
//! `{out}`, use) and its three error forms, each of which aborts the run with
//! exit code 2 (see [`ConfigError`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Guest OS identifiers this build can boot. The reference's v1 accepted only
/// `peios`; this VMM boots any Linux guest, so `linux` is accepted too.
pub const SUPPORTED_GUEST_OS: &[&str] = &["peios", "linux"];
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 20 << 30;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parse `{path}`: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config in `{path}`: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    provium: RawProvium,
    #[serde(default)]
    profiles: BTreeMap<String, RawProfile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvium {
    #[serde(default)]
    roots: Vec<String>,
    cache_dir: Option<String>,
    cache_max_size: Option<SizeValue>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    kernel: Option<String>,
    initrd: Option<String>,
    cmdline: Option<String>,
    cmdline_file: Option<String>,
    guest_os: Option<String>,
    inject_agent: Option<bool>,
    agent_overlay_path: Option<String>,
    build: Option<String>,
    build_out: Option<String>,
}

/// A validated, `{out}`-expanded configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Where the config was read from (None: no file, defaults).
    pub path: Option<PathBuf>,
    /// Directory paths are resolved against (the config file's directory).
    pub base_dir: PathBuf,
    pub roots: Vec<PathBuf>,
    pub cache_dir: PathBuf,
    pub cache_max_bytes: u64,
    pub profiles: BTreeMap<String, Profile>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub cmdline_file: Option<PathBuf>,
    pub guest_os: String,
    pub inject_agent: bool,
    pub agent_overlay_path: Option<PathBuf>,
    pub build: Option<String>,
    pub build_out: PathBuf,
}

impl Profile {
    /// The kernel command line for a boot: the file's contents (whitespace
    /// collapsed), then the inline `cmdline`, or `override_cmdline` instead of
    /// both; `console=ttyS0` appended when absent.
    pub fn kernel_cmdline(&self, override_cmdline: Option<&str>) -> std::io::Result<String> {
        let mut parts: Vec<String> = Vec::new();
        match override_cmdline {
            Some(c) => parts.push(c.to_string()),
            None => {
                if let Some(file) = &self.cmdline_file {
                    let text = std::fs::read_to_string(file).map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("cmdline_file `{}`: {e}", file.display()),
                        )
                    })?;
                    parts.push(text.split_whitespace().collect::<Vec<_>>().join(" "));
                }
                parts.push(self.cmdline.clone());
            }
        }
        let mut line = parts
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if !line.split_whitespace().any(|t| t == "console=ttyS0") {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str("console=ttyS0");
        }
        Ok(line)
    }
}

/// Parse a size: bare bytes, or a number with K/M/G/T (binary) suffix, an
/// optional `B`/`iB` after it. "512M", "2G", "1.5G".
pub fn parse_size(text: &str) -> Result<u64, String> {
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
    let value: f64 = num.trim().parse().map_err(|_| {
        format!("bad size `{text}`: expected bytes or a number with K/M/G/T, e.g. \"512M\"")
    })?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("bad size `{text}`: must be a non-negative number"));
    }
    Ok((value * mult as f64) as u64)
}

fn home_cache() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(x).join("provium");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/provium"),
        None => PathBuf::from("/tmp/provium-cache"),
    }
}

fn default_build_base() -> PathBuf {
    if let Some(d) = std::env::var_os("PROVIUM_BUILD_DIR") {
        return PathBuf::from(d);
    }
    if std::env::var_os("XDG_CACHE_HOME").is_some() || std::env::var_os("HOME").is_some() {
        return home_cache().join("builds");
    }
    PathBuf::from("/tmp/provium-builds")
}

impl Config {
    /// Defaults when there is no config file (local-backend runs of plain paths).
    pub fn defaults(base_dir: &Path) -> Config {
        Config {
            path: None,
            base_dir: base_dir.to_path_buf(),
            roots: Vec::new(),
            cache_dir: home_cache().join("fixtures"),
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            profiles: BTreeMap::new(),
        }
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let mut cfg = Self::parse(path, &text)?;
        cfg.apply_overlay_env(std::env::var_os("PROVIUM_OVERLAY").map(PathBuf::from));
        if let Ok(cwd) = std::env::current_dir() {
            for w in cfg.cwd_path_warnings(&cwd) {
                eprintln!("provium: warning: {w}");
            }
        }
        Ok(cfg)
    }

    /// `PROVIUM_OVERLAY` (read once, by [`Config::load`]): the agent overlay
    /// for every profile that does not set `agent_overlay_path` itself (the
    /// reference's order: the field, then the variable).
    pub fn apply_overlay_env(&mut self, overlay: Option<PathBuf>) {
        let Some(o) = overlay.filter(|o| !o.as_os_str().is_empty()) else {
            return;
        };
        for p in self.profiles.values_mut() {
            if p.agent_overlay_path.is_none() {
                p.agent_overlay_path = Some(o.clone());
            }
        }
    }

    /// Relative profile paths are resolved against the config file's
    /// directory, not the current directory as the reference says (so a
    /// suite runs the same from anywhere; docs/harness.md). Where the
    /// difference picks another existing file — the relative path names a
    /// file under `cwd` but not under the config's directory — the user
    /// porting a suite is told, once per path.
    pub fn cwd_path_warnings(&self, cwd: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let Some(config) = &self.path else {
            return out;
        };
        let base = &self.base_dir;
        let same_dir = match (base.canonicalize(), cwd.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        for (name, p) in &self.profiles {
            if p.build.is_some() && !same_dir {
                out.push(format!(
                    "profile `{name}`: its build command runs in `{}`, the directory of `{}`, \
                     not the current directory `{}` (the reference's); relative paths in it are \
                     read from there",
                    base.display(),
                    config.display(),
                    cwd.display()
                ));
            }
            let fields = [
                ("kernel", &p.kernel),
                ("initrd", &p.initrd),
                ("cmdline_file", &p.cmdline_file),
                ("agent_overlay_path", &p.agent_overlay_path),
            ];
            for (field, path) in fields {
                let Some(resolved) = path else { continue };
                let Ok(rel) = resolved.strip_prefix(base) else {
                    continue;
                };
                if rel.as_os_str().is_empty() {
                    continue;
                }
                let from_cwd = cwd.join(rel);
                if !resolved.exists() && from_cwd.exists() {
                    out.push(format!(
                        "profile `{name}`: {field} `{}` is resolved against the directory of `{}` \
                         (`{}`, which does not exist), not the current directory (`{}`, which does); \
                         write the path relative to provium.toml, or make it absolute",
                        rel.display(),
                        config.display(),
                        resolved.display(),
                        from_cwd.display()
                    ));
                }
            }
        }
        out
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.into(),
            message,
        };
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base_dir = if base_dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base_dir
        };
        let resolve = |p: &str| -> PathBuf {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                base_dir.join(p)
            }
        };
        let mut cfg = Config::defaults(&base_dir);
        cfg.path = Some(path.to_path_buf());
        cfg.roots = raw.provium.roots.iter().map(|r| resolve(r)).collect();
        if let Some(d) = &raw.provium.cache_dir {
            cfg.cache_dir = resolve(d);
        }
        cfg.cache_max_bytes = match raw.provium.cache_max_size {
            None => DEFAULT_CACHE_MAX_BYTES,
            Some(SizeValue::Bytes(b)) => b,
            Some(SizeValue::Text(t)) => {
                parse_size(&t).map_err(|m| invalid(format!("cache_max_size: {m}")))?
            }
        };
        for (name, p) in raw.profiles {
            let cmdline = p.cmdline.unwrap_or_default();
            if cmdline.trim().is_empty() && p.cmdline_file.is_none() {
                return Err(invalid(format!(
                    "profile `{name}` has empty cmdline and no `cmdline_file`; set at least one"
                )));
            }
            let guest_os = p.guest_os.unwrap_or_else(|| "peios".into());
            if !SUPPORTED_GUEST_OS.contains(&guest_os.as_str()) {
                return Err(invalid(format!(
                    "profile `{name}` has guest_os = `{guest_os}`, only {} supported",
                    SUPPORTED_GUEST_OS
                        .iter()
                        .map(|s| format!("`{s}`"))
                        .collect::<Vec<_>>()
                        .join(" and ")
                        + " are"
                )));
            }
            let build_out = match &p.build_out {
                Some(b) => resolve(b),
                None => default_build_base().join(&name),
            };
            let out = build_out.to_string_lossy().into_owned();
            let expand = |s: &str| s.replace("{out}", &out);
            let path_field = |v: &Option<String>| v.as_deref().map(|s| resolve(&expand(s)));
            cfg.profiles.insert(
                name.clone(),
                Profile {
                    kernel: path_field(&p.kernel),
                    initrd: path_field(&p.initrd),
                    cmdline: expand(&cmdline),
                    cmdline_file: path_field(&p.cmdline_file),
                    guest_os,
                    inject_agent: p.inject_agent.unwrap_or(true),
                    agent_overlay_path: path_field(&p.agent_overlay_path),
                    build: p.build.as_deref().map(expand),
                    build_out,
                    name,
                },
            );
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/p/provium.toml"), text)
    }

    #[test]
    fn full_config_parses_and_expands_out() {
        let cfg = parse(
            r#"
            [provium]
            roots = ["tests", "/abs"]
            cache_dir = "cache"
            cache_max_size = "1.5G"
            [profiles.a]
            build = "make --out {out}"
            build_out = "/b/a"
            kernel = "{out}/bzImage"
            initrd = "{out}/initrd"
            cmdline_file = "{out}/cmdline"
            inject_agent = false
            guest_os = "linux"
            "#,
        )
        .unwrap();
        assert_eq!(
            cfg.roots,
            vec![PathBuf::from("/p/tests"), PathBuf::from("/abs")]
        );
        assert_eq!(cfg.cache_dir, PathBuf::from("/p/cache"));
        assert_eq!(cfg.cache_max_bytes, 1610612736);
        let a = &cfg.profiles["a"];
        assert_eq!(a.build.as_deref(), Some("make --out /b/a"));
        assert_eq!(a.kernel.as_deref(), Some(Path::new("/b/a/bzImage")));
        assert!(!a.inject_agent);
    }

    #[test]
    fn the_three_error_forms() {
        let err = Config::load(Path::new("/nonexistent/provium.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("read `/nonexistent/provium.toml`: "),
            "{err}"
        );
        let err = parse("[provium\n").unwrap_err().to_string();
        assert!(err.starts_with("parse `/p/provium.toml`: "), "{err}");
        let err = parse("[profiles.x]\nkernel = \"k\"\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid config in `/p/provium.toml`: profile `x` has empty cmdline and no `cmdline_file`; set at least one"
        );
        let err = parse("[profiles.x]\ncmdline = \"q\"\nguest_os = \"windows\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "profile `x` has guest_os = `windows`, only `peios` and `linux` are supported"
            ),
            "{err}"
        );
        let err = parse("[provium]\nrootz = []\n").unwrap_err().to_string();
        assert!(err.contains("rootz"), "{err}");
    }

    #[test]
    fn console_is_appended_once() {
        let cfg = parse("[profiles.x]\ncmdline = \"quiet\"\n").unwrap();
        let p = &cfg.profiles["x"];
        assert_eq!(p.kernel_cmdline(None).unwrap(), "quiet console=ttyS0");
        assert_eq!(
            p.kernel_cmdline(Some("console=ttyS0 x")).unwrap(),
            "console=ttyS0 x"
        );
    }

    #[test]
    fn cmdline_file_collapses_whitespace_then_inline_follows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cl"), "init=/a\n  loglevel=3\n").unwrap();
        let cfg_path = dir.path().join("provium.toml");
        let cfg = Config::parse(
            &cfg_path,
            "[profiles.x]\ncmdline_file = \"cl\"\ncmdline = \"loglevel=7\"\n",
        )
        .unwrap();
        assert_eq!(
            cfg.profiles["x"].kernel_cmdline(None).unwrap(),
            "init=/a loglevel=3 loglevel=7 console=ttyS0"
        );
    }

    #[test]
    fn cwd_relative_paths_that_differ_are_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let (conf, cwd) = (dir.path().join("suite"), dir.path().join("elsewhere"));
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::write(cwd.join("cl"), "init=/x").unwrap();
        std::fs::write(conf.join("k"), "kernel").unwrap();
        std::fs::write(cwd.join("k"), "kernel").unwrap();
        let cfg = Config::parse(
            &conf.join("provium.toml"),
            "[profiles.x]\nkernel = \"k\"\ncmdline_file = \"cl\"\nbuild = \"true\"\n",
        )
        .unwrap();
        let w = cfg.cwd_path_warnings(&cwd);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("build command runs in"), "{w:?}");
        assert!(
            w[1].contains("cmdline_file `cl` is resolved against the directory of"),
            "{w:?}"
        );
        // Run from the config's own directory: nothing to say.
        assert!(cfg.cwd_path_warnings(&conf).is_empty());
    }

    #[test]
    fn provium_overlay_fills_only_profiles_without_the_field() {
        let mut cfg = parse(
            "[profiles.a]\ncmdline = \"q\"\nagent_overlay_path = \"/own.cpio\"\n[profiles.b]\ncmdline = \"q\"\n",
        )
        .unwrap();
        cfg.apply_overlay_env(Some(PathBuf::from("/env.cpio")));
        assert_eq!(
            cfg.profiles["a"].agent_overlay_path.as_deref(),
            Some(Path::new("/own.cpio"))
        );
        assert_eq!(
            cfg.profiles["b"].agent_overlay_path.as_deref(),
            Some(Path::new("/env.cpio"))
        );
    }

    /// The annotated example documents real fields: it must load.
    #[test]
    fn the_example_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../provium.toml.example");
        let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!cfg.profiles.is_empty(), "the example declares profiles");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("lots").unwrap_err().contains("bad size `lots`"));
    }
}
