//! `provium repl <PROFILE>`: boot a VM and evaluate Lua lines against it.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;

use super::run::RunError;
use super::{choose_backend, load_config};
use super::{RunArgs, EXIT_OK};
use crate::config::ConfigError;
use crate::events::EventSender;
use crate::lua;
use crate::runner::FileEnv;

/// Why `provium repl` could not start or go on (an error in a line typed at
/// the prompt is printed, not returned).
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("repl: give a profile (none in provium.toml)")]
    NoProfile,
    /// A profile's build command could not run or failed.
    #[error(transparent)]
    Build(#[from] RunError),
    #[error(transparent)]
    LuaState(mlua::Error),
    /// Booting the VM (or resuming the fixture) raised: the Lua error's
    /// message, as a test would see it.
    #[error(transparent)]
    Setup(crate::script_error::ScriptError),
    #[error("repl: cannot read stdin")]
    Stdin(#[source] std::io::Error),
}

pub fn run(
    args: &RunArgs,
    profile: Option<String>,
    name: &str,
    fixture: Option<String>,
) -> Result<i32, ReplError> {
    let config = Arc::new(load_config(&args.config, &args.settings)?);
    // With --fixture and no profile, the first profile (by name) is named.
    let profile = profile.or_else(|| config.profiles.keys().next().cloned());
    let profile = match (&fixture, profile) {
        (_, Some(p)) => p,
        (Some(_), None) => String::new(),
        (None, None) => return Err(ReplError::NoProfile),
    };
    // As `provium` does: build before anything boots. A fixture may boot
    // any profile, so with --fixture every profile's build runs.
    if !args.no_build {
        let only = fixture.is_none().then_some(profile.as_str());
        super::run::run_builds(&config, only)?;
    }
    let backend = choose_backend(args.vmm, &config);
    let env = Arc::new(FileEnv::new(
        "repl".into(),
        PathBuf::from("repl"),
        config.roots.clone(),
        config.clone(),
        crate::backend::for_kind(backend),
        EventSender::disabled(),
    ));
    let (lua_state, _root) = lua::new_state(env).map_err(ReplError::LuaState)?;
    // Resume from a fixture (built first if it is not cached), or cold-boot.
    let setup = match &fixture {
        Some(f) => format!("vm = provium:vm_fixture({f:?})"),
        None => format!("vm = provium:vm({name:?}, {profile:?}):boot()"),
    };
    lua_state
        .load(setup)
        .exec()
        .map_err(|e| ReplError::Setup(crate::script_error::ScriptError(e)))?;
    let shown: String = lua_state
        .load("return vm:name() .. ' (' .. vm:profile() .. ')'")
        .eval()
        .unwrap_or_default();
    eprintln!("provium repl: `vm` is {shown}; Ctrl-D quits");
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(ReplError::Stdin)?
            == 0
        {
            break;
        }
        // Try it as an expression first so `vm:state()` prints its value.
        let as_expr = format!("return {line}");
        let r = lua_state
            .load(&as_expr)
            .eval::<mlua::MultiValue>()
            .or_else(|_| lua_state.load(&line).eval());
        match r {
            Ok(values) => {
                let shown: Vec<String> = values
                    .iter()
                    .map(|v| v.to_string().unwrap_or_else(|_| "?".into()))
                    .collect();
                if !shown.is_empty() {
                    println!("{}", shown.join("\t"));
                }
            }
            Err(e) => eprintln!("error: {}", lua::error_message(&e)),
        }
    }
    let _ = lua_state.load("vm:shutdown()").exec();
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_without_profiles_asks_for_one() {
        let (_project, cli) = super::super::parse_in_project("[provium]\n", &["repl"]);
        let e = run(&cli.run, None, "vm", None).unwrap_err();
        assert!(matches!(e, ReplError::NoProfile), "{e:?}");
        assert_eq!(e.to_string(), "repl: give a profile (none in provium.toml)");
    }
}
