//! A test file's Lua runtime, as the executor drives it: the Lua layer's
//! side of `runner::file::FileRuntime`. It owns the file's Lua state and its
//! root Lab; the executor decides how each test ends.

use std::sync::Arc;
use std::time::Duration;

use mlua::{Function, HookTriggers, Lua, Table, Value, VmState};
use provium_protocol::meta::MetaMap;

use super::lab::{Lab, TestScope};
use super::{duration, error_message, meta::table_to_meta};
use crate::runner::file::{
    FileRuntime, FileRuntimeFactory, LoadFailure, LoadedFile, RuntimeSetupError, TestFailure,
    TestRun,
};
use crate::runner::outcome::TestStatus;
use crate::runner::FileEnv;

/// Opens a [`LuaTestFile`] per file.
#[derive(Debug, Clone, Copy, Default)]
pub struct LuaRuntimeFactory;

impl FileRuntimeFactory for LuaRuntimeFactory {
    fn open(&self, env: Arc<FileEnv>) -> Result<Box<dyn FileRuntime>, RuntimeSetupError> {
        Ok(Box::new(LuaTestFile::open(env)?))
    }
}

/// One declared test: its registry entry.
struct Entry {
    meta_table: Table,
    /// The registry's `{name, meta, fn}` table, handed back to `run_test`.
    table: Table,
}

/// One file's Lua state, its root Lab and its declared tests.
pub struct LuaTestFile {
    env: Arc<FileEnv>,
    lua: Lua,
    root: Lab,
    entries: Vec<Entry>,
    run_test: Option<Function>,
    /// `provium.timeout`, read once the chunk ran.
    file_default_timeout: Option<Duration>,
    /// The running test's scope (between enter and leave).
    scope: Option<TestScope>,
}

impl LuaTestFile {
    /// A fresh Lua state for `env`'s file, with the cancellation hook.
    pub fn open(env: Arc<FileEnv>) -> Result<Self, RuntimeSetupError> {
        let (lua, root) =
            super::new_state(env.clone()).map_err(|e| RuntimeSetupError(Box::new(e)))?;
        // The watchdog's flag is checked between instructions so a busy Lua
        // loop stops too, not only calls blocked on a VM.
        let hook_env = env.clone();
        let _ = lua.set_global_hook(
            HookTriggers::new().every_nth_instruction(4096),
            move |_, _| {
                hook_env.check_cancelled()?;
                Ok(VmState::Continue)
            },
        );
        Ok(LuaTestFile {
            env,
            lua,
            root,
            entries: Vec::new(),
            run_test: None,
            file_default_timeout: None,
            scope: None,
        })
    }
}

impl FileRuntime for LuaTestFile {
    fn load(&mut self) -> Result<LoadedFile, LoadFailure> {
        let source = std::fs::read(&self.env.abs_path).map_err(|e| {
            LoadFailure::Unreadable(format!("read `{}`: {e}", self.env.abs_path.display()))
        })?;
        let chunk_name = format!("@{}", self.env.rel_path);
        self.lua
            .load(&source)
            .set_name(chunk_name)
            .exec()
            .map_err(|e| LoadFailure::Chunk(error_message(&e)))?;
        self.file_default_timeout = self
            .root
            .file_timeout()
            .map_err(|e| LoadFailure::Settings(error_message(&e)))?;
        self.root
            .prepare_reset_between_tests()
            .map_err(|e| LoadFailure::Settings(error_message(&e)))?;

        let framework: Table = self
            .lua
            .globals()
            .get("_provium_framework")
            .expect("framework installed");
        let registry: Table = framework.get("registry").expect("registry");
        self.run_test = Some(framework.get("run_test").expect("run_test"));
        let todo: Option<String> = registry.get("todo").unwrap_or(None);
        let mut test_names = Vec::new();
        for e in registry
            .get::<Table>("tests")
            .map(|t| t.sequence_values::<Table>().flatten().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            let (Ok(name), Ok(meta_table)) = (e.get::<String>("name"), e.get::<Table>("meta"))
            else {
                continue;
            };
            test_names.push(name);
            self.entries.push(Entry {
                meta_table,
                table: e,
            });
        }
        Ok(LoadedFile { test_names, todo })
    }

    fn test_meta(&self, index: usize) -> MetaMap {
        table_to_meta(&self.entries[index].meta_table)
    }

    fn test_timeout(&self, index: usize) -> Result<Option<Duration>, TestFailure> {
        match self.entries[index].meta_table.get::<Value>("timeout") {
            Ok(Value::Nil) | Err(_) => Ok(self.file_default_timeout),
            Ok(v) => duration::from_lua(&v, "meta.timeout")
                .map(Some)
                .map_err(|e| error_message(&e).into()),
        }
    }

    fn enter_test_scope(&mut self) {
        self.scope = Some(self.root.enter_test_scope(&self.lua));
    }

    fn run_test(&self, index: usize) -> Result<TestRun, TestFailure> {
        let run_test = self.run_test.as_ref().expect("run_test after load");
        let (status, message, log) = run_test
            .call::<(String, Option<String>, Vec<String>)>(self.entries[index].table.clone())
            .map_err(|e| error_message(&e))?;
        let status = match status.as_str() {
            "passed" => TestStatus::Passed,
            "skipped" => TestStatus::Skipped,
            _ => TestStatus::Failed,
        };
        Ok(TestRun {
            status,
            message,
            log,
        })
    }

    fn leave_test_scope(&mut self) -> Result<(), TestFailure> {
        match self.scope.take() {
            Some(scope) => self.root.leave_test_scope(&self.lua, scope),
            None => Ok(()),
        }
    }

    fn restore_between_tests(&self) -> Result<(), TestFailure> {
        self.root.restore_between_tests()
    }

    fn close_all(&mut self) {
        self.root.close_all(&self.lua);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::events::EventSender;
    use crate::runner::BackendKind;

    fn file(dir: &std::path::Path, source: &str) -> LuaTestFile {
        let p = dir.join("t.test.lua");
        std::fs::write(&p, source).unwrap();
        let env = FileEnv::new(
            "t.test.lua".into(),
            p,
            vec![],
            Arc::new(Config::defaults(dir, &Default::default())),
            crate::backend::for_kind(BackendKind::Local),
            EventSender::disabled(),
        );
        LuaTestFile::open(Arc::new(env)).unwrap()
    }

    #[test]
    fn loads_declared_tests_and_runs_them_in_scopes() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = file(
            dir.path(),
            "test('a', function() end)\n\
             test('b', {timeout = '2s'}, function() error('boom') end)\n",
        );
        let loaded = f.load().unwrap();
        assert_eq!(loaded.test_names, ["a", "b"]);
        assert_eq!(loaded.todo, None);
        assert_eq!(f.test_timeout(0), Ok(None));
        assert_eq!(f.test_timeout(1), Ok(Some(Duration::from_secs(2))));
        f.enter_test_scope();
        assert_eq!(f.run_test(0).unwrap().status, TestStatus::Passed);
        f.leave_test_scope().unwrap();
        f.enter_test_scope();
        let failed = f.run_test(1).unwrap();
        assert_eq!(failed.status, TestStatus::Failed);
        assert!(failed.message.unwrap().contains("boom"));
        f.leave_test_scope().unwrap();
        f.restore_between_tests().unwrap();
        f.close_all();
    }

    #[test]
    fn a_cancellation_is_raised_into_lua_with_its_message() {
        use crate::runner::{CancelReason, RunnerError};
        let e = mlua::Error::from(RunnerError::Cancelled(CancelReason::Interrupted(
            libc::SIGINT,
        )));
        assert_eq!(
            error_message(&e),
            "the run was interrupted by SIGINT; the file's lab was torn down"
        );
        let e = mlua::Error::from(RunnerError::CancelledWithoutReason);
        assert_eq!(error_message(&e), "cancelled");
    }

    #[test]
    fn says_which_stage_of_loading_failed() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = file(dir.path(), "error('top level')");
        assert!(
            matches!(f.load(), Err(LoadFailure::Chunk(m)) if m.contains("top level")),
            "chunk"
        );
        let mut f = file(dir.path(), "");
        std::fs::remove_file(dir.path().join("t.test.lua")).unwrap();
        assert!(
            matches!(f.load(), Err(LoadFailure::Unreadable(m)) if m.starts_with("read `")),
            "unreadable"
        );
    }
}
