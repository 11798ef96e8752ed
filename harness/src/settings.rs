//! The process environment Provium reads, read once.
//!
//! `cli::main` calls [`Settings::from_env`] once and hands the result down
//! (inside [`crate::config::Config`], to the backends through the boot spec);
//! no other code reads an environment variable. docs/harness.md,
//! "Environment", lists each variable, who uses it and what it does.
//!
//! Values are kept as read: each user parses its own (an invalid
//! `PROVIUM_KVM_AGENT_TIMEOUT` still fails the boot that uses it, not every
//! command), so reading the environment never fails.

use std::ffi::OsString;
use std::path::PathBuf;

/// Overrides how long a kvm guest's agent may take to say Hello (seconds).
pub const AGENT_TIMEOUT_ENV: &str = "PROVIUM_KVM_AGENT_TIMEOUT";
/// Names the agent binary, for both backends (`crate::agent_search`).
pub const AGENT_ENV: &str = "PROVIUM_AGENT";

/// Loaded exactly when the host's KVM is the paravirtual `kvm_pvm`.
const KVM_PVM_MODULE: &str = "/sys/module/kvm_pvm";

/// The `PROVIUM_KVM_PVM` override when there is one, else what
/// `module_loaded` finds (only then is the host probed).
fn settle_kvm_pvm(forced: Option<bool>, module_loaded: impl FnOnce() -> bool) -> bool {
    forced.unwrap_or_else(module_loaded)
}

/// Every environment variable Provium reads, plus the path of the running
/// executable (where the agent search starts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// `XDG_CACHE_HOME`: base of the default fixture cache and build dirs.
    pub xdg_cache_home: Option<PathBuf>,
    /// `HOME`: `~/.cache/provium` when `XDG_CACHE_HOME` is unset; the rerun
    /// state's default home.
    pub home: Option<PathBuf>,
    /// `PROVIUM_BUILD_DIR`: base of every dynamic profile's default `build_out`.
    pub build_dir: Option<PathBuf>,
    /// `PROVIUM_OVERLAY`: the agent overlay for profiles that set no
    /// `agent_overlay_path` (empty: unset).
    pub overlay: Option<PathBuf>,
    /// `PROVIUM_OVERLAY_CACHE`: where merged initrds are cached.
    pub overlay_cache: Option<PathBuf>,
    /// `PROVIUM_RERUN_STATE`: the `--rerun-failed` state file.
    pub rerun_state: Option<PathBuf>,
    /// `PROVIUM_SEED`: the run seed when `--seed` is not given (unparsed).
    pub seed: Option<String>,
    /// `PATH`: searched by the pre-flight checks for `ip`.
    pub path: Option<OsString>,
    /// `PROVIUM_AGENT`: the agent binary, taken as given.
    pub agent: Option<PathBuf>,
    /// `PROVIUM_KVM_AGENT_TIMEOUT` (unparsed seconds).
    pub kvm_agent_timeout: Option<String>,
    /// `PROVIUM_KVM_PVM`: `1` or `0` force the kvm_pvm detection; any other
    /// value (or none) leaves it to `/sys/module/kvm_pvm`.
    pub kvm_pvm: Option<bool>,
    /// Whether this host's KVM is the paravirtual `kvm_pvm` (DESIGN.md
    /// "This machine's KVM"), settled once: [`Settings::kvm_pvm`] when set,
    /// else, in [`Settings::from_env`] only, whether `/sys/module/kvm_pvm`
    /// exists. [`Settings::from_vars`] and `default()` probe nothing (a
    /// hardware host unless the override says otherwise); a test that needs
    /// a kvm_pvm host sets it.
    pub host_kvm_pvm: bool,
    /// The running executable (`std::env::current_exe`), where the agent
    /// search looks first after `PROVIUM_AGENT`.
    pub current_exe: Option<PathBuf>,
}

impl Settings {
    /// Reads the process environment and settles the host probes. Called
    /// once, by `cli::main`.
    pub fn from_env() -> Settings {
        let mut settings = Settings::from_vars(|name| std::env::var_os(name));
        settings.current_exe = std::env::current_exe().ok();
        settings.host_kvm_pvm = settle_kvm_pvm(settings.kvm_pvm, || {
            std::path::Path::new(KVM_PVM_MODULE).exists()
        });
        settings
    }

    /// The settings `lookup` describes (a variable's value, or `None` when
    /// unset); `current_exe` is left unset.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<OsString>) -> Settings {
        let path = |name: &str| lookup(name).map(PathBuf::from);
        // Text values that are not valid Unicode count as unset, as
        // `std::env::var` treats them.
        let text = |name: &str| lookup(name).and_then(|v| v.into_string().ok());
        let kvm_pvm = match text("PROVIUM_KVM_PVM").as_deref() {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        };
        Settings {
            xdg_cache_home: path("XDG_CACHE_HOME"),
            home: path("HOME"),
            build_dir: path("PROVIUM_BUILD_DIR"),
            overlay: path("PROVIUM_OVERLAY"),
            overlay_cache: path("PROVIUM_OVERLAY_CACHE"),
            rerun_state: path("PROVIUM_RERUN_STATE"),
            seed: text("PROVIUM_SEED"),
            path: lookup("PATH"),
            agent: path(AGENT_ENV),
            kvm_agent_timeout: text(AGENT_TIMEOUT_ENV),
            kvm_pvm,
            host_kvm_pvm: settle_kvm_pvm(kvm_pvm, || false),
            current_exe: None,
        }
    }

    /// Provium's per-user cache: `$XDG_CACHE_HOME/provium`, else
    /// `~/.cache/provium`, else `/tmp/provium-cache`.
    pub fn cache_home(&self) -> PathBuf {
        if let Some(x) = &self.xdg_cache_home {
            return x.join("provium");
        }
        match &self.home {
            Some(h) => h.join(".cache/provium"),
            None => PathBuf::from("/tmp/provium-cache"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Settings {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Settings::from_vars(|name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn every_variable_lands_in_its_field() {
        let s = vars(&[
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
            ("PROVIUM_BUILD_DIR", "/b"),
            ("PROVIUM_OVERLAY", "/o.cpio"),
            ("PROVIUM_OVERLAY_CACHE", "/oc"),
            ("PROVIUM_RERUN_STATE", "/r.json"),
            ("PROVIUM_SEED", "42"),
            ("PATH", "/bin"),
            ("PROVIUM_AGENT", "/a"),
            ("PROVIUM_KVM_AGENT_TIMEOUT", "9"),
            ("PROVIUM_KVM_PVM", "1"),
        ]);
        assert_eq!(s.xdg_cache_home, Some(PathBuf::from("/x")));
        assert_eq!(s.home, Some(PathBuf::from("/h")));
        assert_eq!(s.build_dir, Some(PathBuf::from("/b")));
        assert_eq!(s.overlay, Some(PathBuf::from("/o.cpio")));
        assert_eq!(s.overlay_cache, Some(PathBuf::from("/oc")));
        assert_eq!(s.rerun_state, Some(PathBuf::from("/r.json")));
        assert_eq!(s.seed.as_deref(), Some("42"));
        assert_eq!(s.path, Some(OsString::from("/bin")));
        assert_eq!(s.agent, Some(PathBuf::from("/a")));
        assert_eq!(s.kvm_agent_timeout.as_deref(), Some("9"));
        assert_eq!(s.kvm_pvm, Some(true));
        assert_eq!(s.current_exe, None);
    }

    #[test]
    fn kvm_pvm_takes_only_one_and_zero() {
        assert_eq!(vars(&[("PROVIUM_KVM_PVM", "0")]).kvm_pvm, Some(false));
        assert_eq!(vars(&[("PROVIUM_KVM_PVM", "yes")]).kvm_pvm, None);
        assert_eq!(vars(&[]).kvm_pvm, None);
    }

    #[test]
    fn the_kvm_pvm_override_settles_the_host_without_a_probe() {
        let never = || -> bool { panic!("the override must win without probing /sys") };
        assert!(settle_kvm_pvm(Some(true), never));
        assert!(!settle_kvm_pvm(Some(false), never));
        assert!(
            settle_kvm_pvm(None, || true),
            "no override: the probe decides"
        );
        assert!(!settle_kvm_pvm(None, || false));
        assert!(vars(&[("PROVIUM_KVM_PVM", "1")]).host_kvm_pvm);
        assert!(
            !vars(&[]).host_kvm_pvm,
            "from_vars probes nothing: a hardware host"
        );
        assert!(!Settings::default().host_kvm_pvm);
    }

    #[test]
    fn cache_home_prefers_xdg_then_home() {
        assert_eq!(
            vars(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]).cache_home(),
            PathBuf::from("/x/provium")
        );
        assert_eq!(
            vars(&[("HOME", "/h")]).cache_home(),
            PathBuf::from("/h/.cache/provium")
        );
        assert_eq!(vars(&[]).cache_home(), PathBuf::from("/tmp/provium-cache"));
    }

    #[test]
    fn non_unicode_text_counts_as_unset() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, 0xfe]);
        let s = Settings::from_vars(|name| (name == "PROVIUM_SEED").then(|| bad.clone()));
        assert_eq!(s.seed, None);
    }

    /// The rule this module exists for: outside it (and outside test
    /// modules) no harness code reads the environment, or bakes in where
    /// the source tree was built.
    #[test]
    fn no_other_harness_code_reads_the_environment() {
        let forbidden = [
            "env::var(",
            "env::var_os(",
            "env::vars(",
            "env::current_exe(",
            "env!(\"CARGO_MANIFEST_DIR\")",
        ];
        let found = crate::source_scan::lines_containing("settings.rs", &forbidden);
        assert!(
            found.is_empty(),
            "read the environment in Settings::from_env instead:\n{}",
            found.join("\n")
        );
    }
}
