//! The scheduler, as two actors that share no state and talk only through
//! [`messages::ExecutorMessage`]:
//!
//! - [`dispatcher`] owns the run: the queue, the pool and each file's
//!   reservation, PSI, cancellation on a signal or `--fail-fast`. It is the
//!   only caller of the reporters and the only writer of the event stream.
//! - [`executor`] runs one file on its own thread: its runtime (the Lua
//!   state, behind `runner::file::FileRuntime`), its VMs, its watchdog; it
//!   decides how each test ends and sends the dispatcher the file's and
//!   tests' lifecycle events. What runs below it (VMs, claims, fixture
//!   builds) sends its events the same way, through the file's
//!   `crate::events::EventSender`, so one file's events reach the
//!   dispatcher in the order they happened.
//!
//! The scheduler names no Lua type: the CLI hands it the Lua layer's
//! runtime factory (`lua::test_file::LuaRuntimeFactory`).

pub mod dispatcher;
pub mod executor;
pub mod messages;
#[cfg(test)]
pub mod test_utils;

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The runner, the scheduler and the reporters name no Lua type (the
    /// Lua layer implements `runner::file::FileRuntime` and converts
    /// `RunnerError`), so none of their files mentions the Lua crate.
    #[test]
    fn runner_scheduler_and_reporters_know_no_lua_crate() {
        let lua_crate = concat!("ml", "ua");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src.join("events.rs")];
        for dir in ["runner", "scheduler", "report"] {
            for entry in std::fs::read_dir(src.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 10, "{files:?}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(
                !text.contains(lua_crate),
                "{} names {lua_crate}",
                f.display()
            );
        }
    }
}
