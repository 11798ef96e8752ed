//! The Lua runtime of one test file: globals, the framework, and one module
//! per userdata (Lab, VM, File, Process, Worker, streams, Clock, RunResult).

pub mod bridge;
pub mod capture;
pub mod clock;
pub mod command;
pub mod console;
pub mod disk;
pub mod duration;
pub mod file;
pub mod fork;
pub mod guest;
pub mod json;
pub mod lab;
pub mod meta;
pub mod network;
pub mod nic;
pub mod phase;
pub mod process;
pub mod run_result;
pub mod snapshot;
pub mod stream;
pub mod test_file;
pub mod vm;
pub mod vm_ctx;
pub mod worker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlua::{Lua, Value};

use crate::runner::{FileEnv, RunnerError};

const FRAMEWORK: &str = include_str!("framework.lua");

/// Build the Lua state for one file: standard library, `package.path` over
/// the roots, the framework globals, `json`, and the root Lab as `provium`.
pub fn new_state(env: Arc<FileEnv>) -> mlua::Result<(Lua, lab::Lab)> {
    let lua = Lua::new();
    let globals = lua.globals();

    let package: mlua::Table = globals.get("package")?;
    let mut path = String::new();
    for root in &env.roots {
        let r = root.display();
        path.push_str(&format!("{r}/?.lua;{r}/?/init.lua;"));
    }
    let old: String = package.get("path")?;
    package.set("path", format!("{path}{old}"))?;

    let host = lua.create_table()?;
    let epoch = Instant::now();
    host.set(
        "now",
        lua.create_function(move |_, ()| Ok(epoch.elapsed().as_secs_f64()))?,
    )?;
    let sleep_env = env.clone();
    host.set(
        "sleep",
        lua.create_function(move |_, secs: f64| {
            sleep_env.sleep(Duration::from_secs_f64(secs.max(0.0)))?;
            Ok(())
        })?,
    )?;
    host.set(
        "duration",
        lua.create_function(|_, (v, what): (Value, String)| {
            Ok(duration::from_lua(&v, &what)?.as_secs_f64())
        })?,
    )?;
    host.set(
        "errmsg",
        lua.create_function(|lua, v: Value| match v {
            Value::Error(e) => Ok(Value::String(lua.create_string(error_message(&e))?)),
            other => Ok(other),
        })?,
    )?;
    globals.set("_provium_host", host)?;
    lua.load(FRAMEWORK)
        .set_name("@provium/framework.lua")
        .exec()?;
    globals.set("_provium_host", Value::Nil)?;

    json::install(&lua)?;
    // Debug builds only: a way for the integration tests to make the
    // runner panic inside a test, which poisons the rest of the file
    // (scheduler/executor.rs). Release builds have no such global.
    #[cfg(debug_assertions)]
    globals.set(
        "_provium_test_panic",
        lua.create_function(|_, msg: String| -> mlua::Result<()> {
            panic!("{msg}");
        })?,
    )?;
    let root = lab::Lab::root(env);
    globals.set("provium", root.clone())?;
    Ok((lua, root))
}

/// The runner's errors (a cancelled file's work) raised into Lua with
/// their message, as the test author reads them.
impl From<RunnerError> for mlua::Error {
    fn from(e: RunnerError) -> Self {
        mlua::Error::runtime(crate::error_chain::flatten(&e))
    }
}

/// A Lua error carrying a message, for userdata methods.
pub fn err(message: impl Into<String>) -> mlua::Error {
    mlua::Error::runtime(message.into())
}

/// The one way a Rust error reaches Lua: `method` (named once, with its
/// userdata's prefix: `vm:read_file`) and then `e` with its whole `source()`
/// chain flattened ([`crate::error_chain::flatten`]), so no cause is lost
/// and none is printed twice.
pub fn rust_err(method: &str, e: &dyn std::error::Error) -> mlua::Error {
    err(format!("{method}: {}", crate::error_chain::flatten(e)))
}

/// The message of an mlua error without the Rust-side decoration (callback
/// wrappers, tracebacks), as test authors want to read it.
pub use crate::script_error::message as error_message;
