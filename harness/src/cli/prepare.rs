//! `provium prepare [PROFILE]`: run the profiles' build commands only.

use super::load_config;
use super::run::run_builds;
use super::EXIT_OK;

pub fn run(
    config: &std::path::Path,
    settings: &crate::settings::Settings,
    profile: Option<&str>,
) -> Result<i32, String> {
    let config = load_config(config, settings)?;
    if let Some(p) = profile {
        if !config.profiles.contains_key(p) {
            return Err(format!(
                "provium prepare: profile `{p}` not found in provium.toml"
            ));
        }
    }
    run_builds(&config, profile)?;
    Ok(EXIT_OK)
}
