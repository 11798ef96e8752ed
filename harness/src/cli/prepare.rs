//! `provium prepare [PROFILE]`: run the profiles' build commands only.

use super::load_config;
use super::run::{run_builds, RunError};
use super::EXIT_OK;
use crate::config::ConfigError;

/// Why `provium prepare` failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("provium prepare: profile `{profile}` not found in provium.toml")]
    UnknownProfile { profile: String },
    /// A build command could not run or failed (it names the profile).
    #[error(transparent)]
    Build(#[from] RunError),
}

pub fn run(
    config: &std::path::Path,
    settings: &crate::settings::Settings,
    profile: Option<&str>,
) -> Result<i32, PrepareError> {
    let config = load_config(config, settings)?;
    if let Some(p) = profile {
        if !config.profiles.contains_key(p) {
            return Err(PrepareError::UnknownProfile { profile: p.into() });
        }
    }
    run_builds(&config, profile)?;
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_profile_is_refused_before_any_build() {
        let (d, cli) = super::super::parse_in_project(
            "[profiles.linux]\ncmdline = \"q\"\nbuild = \"touch built\"\n",
            &["prepare", "nope"],
        );
        let e = run(&cli.run.config, &cli.run.settings, Some("nope")).unwrap_err();
        assert!(matches!(&e, PrepareError::UnknownProfile { profile } if profile == "nope"));
        assert_eq!(
            e.to_string(),
            "provium prepare: profile `nope` not found in provium.toml"
        );
        assert!(!d.path().join("built").exists(), "no build ran");
    }

    #[test]
    fn a_missing_config_keeps_its_cause() {
        let d = tempfile::tempdir().unwrap();
        let e = run(&d.path().join("absent.toml"), &Default::default(), None).unwrap_err();
        assert!(matches!(e, PrepareError::Config(_)), "{e:?}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the read error stays a source"
        );
    }
}
