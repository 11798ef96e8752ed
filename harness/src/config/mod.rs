//! `provium.toml`: one file per table ([`provium`] for `[provium]`,
//! [`profile`] for `[profiles.<name>]`), assembled here into a [`Config`].
//!
//! Loading follows the reference's five steps (read, parse, validate, expand
//! `{out}`, use) and its three error forms, each of which aborts the run with
//! exit code 2 (see [`ConfigError`]). A key no table knows is not an error:
//! it is collected with its key path ([`Config::unknown_keys`], through
//! `serde_ignored`) and [`Config::load`] warns about it, naming the file, so a
//! misspelt field never goes unnoticed and a newer provium.toml still loads.

pub mod profile;
pub mod provium;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use profile::{
    CmdlineFileError, Profile, ProfileError, Transport, DEFAULT_GUEST_OS, SUPPORTED_GUEST_OS,
};
pub use provium::{parse_size, SizeError, DEFAULT_CACHE_MAX_BYTES};

use crate::settings::Settings;

/// Why provium.toml cannot be used. Rendered with its causes
/// (`error_chain::flatten`), e.g. "parse `provium.toml`: TOML parse error ...".
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read `{path}`", path = path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parse `{path}`", path = path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid config in `{path}`", path = path.display())]
    Profile {
        path: PathBuf,
        #[source]
        source: ProfileError,
    },
    #[error("invalid config in `{path}`: cache_max_size", path = path.display())]
    CacheMaxSize {
        path: PathBuf,
        #[source]
        source: SizeError,
    },
}

/// For the subcommands that still report errors as text: the chain,
/// flattened once.
impl From<ConfigError> for String {
    fn from(e: ConfigError) -> String {
        crate::error_chain::flatten(&e)
    }
}

/// The whole file as written; each table's fields live in its own module.
#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    provium: provium::ProviumTable,
    #[serde(default)]
    profiles: BTreeMap<String, profile::ProfileTable>,
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
    /// Key paths the file holds that no table knows (`provium.rootz`,
    /// `profiles.x.kernal`), in the order the parser visits them (sorted);
    /// ignored, and warned about by
    /// [`Config::load`].
    pub unknown_keys: Vec<String>,
    /// The environment, read once by `cli::main`; the backends take what
    /// they need from here.
    pub settings: Settings,
}

/// `p` as written when absolute, else joined to `base_dir`.
fn resolve_path(base_dir: &Path, p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() {
        p
    } else {
        base_dir.join(p)
    }
}

/// The warning [`Config::load`] prints for an unknown key.
pub fn unknown_key_warning(config: &Path, key: &str) -> String {
    format!(
        "`{}`: unknown key `{key}` ignored (misspelt? provium.toml.example lists every field)",
        config.display()
    )
}

impl Config {
    /// Defaults when there is no config file (local-backend runs of plain paths).
    pub fn defaults(base_dir: &Path, settings: &Settings) -> Config {
        Config {
            path: None,
            base_dir: base_dir.to_path_buf(),
            roots: Vec::new(),
            cache_dir: provium::default_cache_dir(settings),
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            profiles: BTreeMap::new(),
            unknown_keys: Vec::new(),
            settings: settings.clone(),
        }
    }

    /// Reads, parses and validates `path`, then applies `PROVIUM_OVERLAY`;
    /// warnings (unknown keys, paths the current directory would resolve
    /// differently) go to stderr.
    pub fn load(path: &Path, settings: &Settings) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let mut cfg = Self::parse(path, &text, settings)?;
        cfg.apply_overlay_env(settings.overlay.clone());
        for key in &cfg.unknown_keys {
            eprintln!("provium: warning: {}", unknown_key_warning(path, key));
        }
        if let Ok(cwd) = std::env::current_dir() {
            for w in cfg.cwd_path_warnings(&cwd) {
                eprintln!("provium: warning: {w}");
            }
        }
        Ok(cfg)
    }

    /// `PROVIUM_OVERLAY` (read once, into [`Settings::overlay`]): the agent
    /// overlay for every profile that does not set `agent_overlay_path`
    /// itself (the reference's order: the field, then the variable).
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

    /// Parses and validates `text` (the contents of `path`), resolving
    /// relative paths against `path`'s directory.
    pub fn parse(path: &Path, text: &str, settings: &Settings) -> Result<Config, ConfigError> {
        let parse_err = |source| ConfigError::Parse {
            path: path.into(),
            source,
        };
        let mut unknown_keys = Vec::new();
        let file: ConfigFile = serde_ignored::deserialize(
            toml::Deserializer::parse(text).map_err(parse_err)?,
            |key| unknown_keys.push(key.to_string()),
        )
        .map_err(parse_err)?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base_dir = if base_dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base_dir
        };
        let table = file
            .provium
            .resolve(&base_dir, settings)
            .map_err(|source| ConfigError::CacheMaxSize {
                path: path.into(),
                source,
            })?;
        let mut cfg = Config::defaults(&base_dir, settings);
        cfg.path = Some(path.to_path_buf());
        cfg.roots = table.roots;
        cfg.cache_dir = table.cache_dir;
        cfg.cache_max_bytes = table.cache_max_bytes;
        cfg.unknown_keys = unknown_keys;
        for (name, p) in file.profiles {
            let profile = p
                .resolve(name.clone(), &base_dir, settings)
                .map_err(|source| ConfigError::Profile {
                    path: path.into(),
                    source,
                })?;
            cfg.profiles.insert(name, profile);
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/p/provium.toml"), text, &Settings::default())
    }

    /// The error as `load_config` prints it: with its causes.
    fn flat(e: ConfigError) -> String {
        crate::error_chain::flatten(&e)
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
        let err = flat(
            Config::load(Path::new("/nonexistent/provium.toml"), &Settings::default()).unwrap_err(),
        );
        assert!(
            err.starts_with("read `/nonexistent/provium.toml`: "),
            "{err}"
        );
        let err = flat(parse("[provium\n").unwrap_err());
        assert!(err.starts_with("parse `/p/provium.toml`: "), "{err}");
        let err = flat(parse("[profiles.x]\nkernel = \"k\"\n").unwrap_err());
        assert_eq!(
            err,
            "invalid config in `/p/provium.toml`: profile `x` has empty cmdline and no `cmdline_file`; set at least one"
        );
        let err =
            flat(parse("[profiles.x]\ncmdline = \"q\"\nguest_os = \"windows\"\n").unwrap_err());
        assert!(
            err.contains(
                "profile `x` has guest_os = `windows`, only `peios` and `linux` are supported"
            ),
            "{err}"
        );
        let err = flat(parse("[provium]\ncache_max_size = \"lots\"\n").unwrap_err());
        assert!(
            err.starts_with("invalid config in `/p/provium.toml`: cache_max_size: bad size `lots`"),
            "{err}"
        );
    }

    /// A key no table knows is ignored, and named with its key path (it
    /// used to be refused; the issue asked for a warning instead).
    #[test]
    fn unknown_keys_are_collected_with_their_path() {
        let cfg = parse(
            "top = 1\n[provium]\nrootz = []\n[profiles.x]\ncmdline = \"q\"\nkernal = \"k\"\n[extra]\na = 1\n",
        )
        .unwrap();
        assert_eq!(
            cfg.unknown_keys,
            ["extra", "profiles.x.kernal", "provium.rootz", "top"]
        );
        assert_eq!(cfg.profiles["x"].cmdline, "q");
        assert!(cfg.roots.is_empty());
        assert_eq!(
            unknown_key_warning(Path::new("/p/provium.toml"), "provium.rootz"),
            "`/p/provium.toml`: unknown key `provium.rootz` ignored (misspelt? provium.toml.example lists every field)"
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
            &Settings::default(),
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
            &Settings::default(),
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

    /// The annotated example documents real fields: it must load, and
    /// every key in it must be one a table knows.
    #[test]
    fn the_example_config_loads_with_no_unknown_keys() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../provium.toml.example");
        let cfg = Config::load(&path, &Settings::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(!cfg.profiles.is_empty(), "the example declares profiles");
        assert_eq!(cfg.unknown_keys, Vec::<String>::new());
    }
}
