//! `vm_fixture` / `lab_fixture`: a VM or a sub-lab restored from the
//! fixture cache ([`crate::fixture::obtain`]), and [`ChunkBuilder`], the
//! build-time Lua state that runs a fixture's chunk when the cache has no
//! entry. The cache flow itself knows nothing of Lua; it gets the builder
//! from here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlua::{Lua, MultiValue, Value};
use provium_snapshot::EntryKind;

use super::Lab;
use crate::error_chain::flatten;
use crate::fixture::{self, ChunkReturn, FixtureBuilder, FixtureError, RestoreFailure};
use crate::lua::snapshot::{self, LabSnapshotUd, SnapshotUd};
use crate::lua::vm::{RestoreError, Vm, VmSizing};
use crate::lua::{err, error_message, rust_err};
use crate::runner::FileEnv;
use crate::script_error::ScriptError;

impl Lab {
    /// `vm_fixture(path)` / `lab_fixture(path)`, either call form.
    pub(super) fn fixture_call(
        &self,
        lua: &Lua,
        which: &str,
        args: MultiValue,
    ) -> mlua::Result<Value> {
        let mut args = args.into_iter();
        let name = match args.next() {
            Some(Value::String(s)) => s.to_str()?.to_string(),
            other => {
                return Err(err(format!(
                    "{which}: expected a fixture path like \"fixtures/base\", got {}",
                    other.map_or("nothing", |v| v.type_name())
                )))
            }
        };
        if which == "vm_fixture" {
            let vm_name = fixture_vm_name_opt(args.next())?;
            Ok(Value::UserData(lua.create_userdata(
                self.vm_fixture(&name, vm_name.as_deref())?,
            )?))
        } else {
            Ok(Value::UserData(
                lua.create_userdata(self.lab_fixture(&name)?)?,
            ))
        }
    }

    /// A VM restored from fixture `name` (built first if not cached), added
    /// to this lab under the fixture VM's name, with the fixture VM's
    /// devices: its disks (the recorded images, as they are now) and its
    /// NICs, on bridges of the recorded names found or made by
    /// [`Lab::bridge_for_restore`] from this lab.
    ///
    /// Each call restores a fresh VM. It is named `vm_name` when given
    /// (`vm_fixture(path, {name = ...})`; a taken name is an error), else
    /// the fixture VM's recorded name, or when that is taken in this scope
    /// (an earlier call, even of a VM since shut down), the first free of
    /// `<name>-2`, `<name>-3`, ...
    pub(super) fn vm_fixture(&self, name: &str, vm_name: Option<&str>) -> mlua::Result<Vm> {
        let env = self.0.env.clone();
        let mut restore = |path: &std::path::Path| -> Result<Vm, RestoreFailure> {
            let mut decl =
                snapshot::VmDecl::read(path).map_err(|e| RestoreFailure::Corrupt(flatten(&e)))?;
            let other = |e: mlua::Error| RestoreFailure::Other(ScriptError(e));
            decl.name = match vm_name {
                Some(n) => {
                    self.check_new_name("vm", n).map_err(other)?;
                    n.to_string()
                }
                None => self.free_fixture_vm_name(&decl.name).map_err(other)?,
            };
            let sizing = VmSizing {
                memory_bytes: decl.memory_bytes,
                cpus: decl.cpus,
            };
            let vm = Vm::create(env.clone(), decl.name.clone(), decl.profile.clone(), sizing)
                .map_err(other)?;
            let r = match snapshot::VmDevices::read_if_present(path) {
                Ok(devices) => self
                    .join_recorded_bridges(&vm, &devices.unwrap_or_default())
                    .and_then(|()| vm.restore_checked(path)),
                Err(e) => Err(RestoreError::Failed(err(flatten(&e)))),
            };
            if let Err(e) = r {
                let _ = vm.shutdown();
                return Err(restore_failure(e));
            }
            self.put_vm(decl.name, &vm);
            Ok(vm)
        };
        fixture::obtain(&env, name, EntryKind::Vm, &mut restore, &ChunkBuilder)
            .map_err(|e| rust_err(&format!("vm_fixture(\"{name}\")"), &e))
    }

    /// A fresh sub-lab of this lab with fixture `name` restored into it.
    pub(super) fn lab_fixture(&self, name: &str) -> mlua::Result<Lab> {
        let env = self.0.env.clone();
        let mut restore = |path: &std::path::Path| -> Result<Lab, RestoreFailure> {
            let lab_name = self.next_anon_lab_name();
            let lab = self.child(lab_name.clone(), None);
            if let Err(e) = lab.restore_from_dir_checked(path) {
                let mut vms = Vec::new();
                lab.vms_downward(&mut Vec::new(), &mut vms);
                for (_, vm) in vms {
                    let _ = vm.shutdown();
                }
                return Err(restore_failure(e));
            }
            self.put_sub_lab(lab_name, &lab);
            Ok(lab)
        };
        fixture::obtain(&env, name, EntryKind::Lab, &mut restore, &ChunkBuilder)
            .map_err(|e| rust_err(&format!("lab_fixture(\"{name}\")"), &e))
    }

    /// `base` when it is free in this scope, else the first free
    /// `<base>-N` (N from 2); the error for `base` when none is.
    pub(super) fn free_fixture_vm_name(&self, base: &str) -> mlua::Result<String> {
        let first = match self.check_new_name("vm", base) {
            Ok(()) => return Ok(base.to_string()),
            Err(e) => e,
        };
        (2..=MAX_FIXTURE_COPIES)
            .map(|n| format!("{base}-{n}"))
            .find(|n| self.check_new_name("vm", n).is_ok())
            .ok_or(first)
    }
}

/// How many VMs one scope can restore from one fixture under its recorded
/// name before `vm_fixture` needs an explicit `{name = ...}`.
const MAX_FIXTURE_COPIES: usize = 1000;

/// `vm_fixture(path, opts?)`'s opts: only `name`, a string.
fn fixture_vm_name_opt(opts: Option<Value>) -> mlua::Result<Option<String>> {
    let t = match opts {
        None | Some(Value::Nil) => return Ok(None),
        Some(Value::Table(t)) => t,
        Some(other) => {
            return Err(err(format!(
                "vm_fixture: opts must be a table like {{name = \"node2\"}}, got {}",
                other.type_name()
            )))
        }
    };
    let mut name = None;
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        match (k.to_string()?.as_str(), v) {
            ("name", Value::String(s)) => name = Some(s.to_str()?.to_string()),
            ("name", other) => {
                return Err(err(format!(
                    "vm_fixture: `name` must be a string, got {}",
                    other.type_name()
                )))
            }
            (key, _) => {
                return Err(err(format!(
                    "vm_fixture: unknown option `{key}` (accepted: name)"
                )))
            }
        }
    }
    Ok(name)
}

/// A failed fixture restore's verdict: a device mismatch keeps the entry
/// (rebuilding it would not help), anything else evicts and rebuilds it.
fn restore_failure(e: RestoreError) -> RestoreFailure {
    match e {
        RestoreError::Mismatch(m) => RestoreFailure::Mismatch(m),
        RestoreError::Failed(e) => RestoreFailure::Corrupt(error_message(&e)),
    }
}

/// Builds a fixture by running its chunk in a fresh Lua state, as a test
/// file's state but with the fixture as its file; the chunk ends with
/// `return vm:snapshot()` or `return provium:snapshot()`.
pub struct ChunkBuilder;

impl FixtureBuilder for ChunkBuilder {
    fn build(
        &self,
        env: Arc<FileEnv>,
        name: &str,
        source: &Path,
        rel: &str,
        install: &mut dyn FnMut(ChunkReturn) -> Result<PathBuf, FixtureError>,
    ) -> Result<PathBuf, FixtureError> {
        // The Lua side's errors become text here, flattened, as every error
        // raised into or out of Lua does.
        let (lua, root) = crate::lua::new_state(env).map_err(|source| FixtureError::LuaState {
            name: name.to_string(),
            source,
        })?;
        let source = std::fs::read(source).map_err(|e| FixtureError::ReadSource {
            name: name.to_string(),
            path: source.to_path_buf(),
            source: e,
        })?;
        let result = lua
            .load(&source)
            .set_name(format!("@{rel}"))
            .eval::<Value>();
        let installed = match result {
            Err(e) => Err(FixtureError::Build {
                name: name.to_string(),
                source: ScriptError(e),
            }),
            Ok(value) => install(chunk_return(&value)),
        };
        root.close_all(&lua);
        installed
    }
}

/// What the chunk returned, as the cache sees it.
fn chunk_return(value: &Value) -> ChunkReturn {
    match value {
        Value::UserData(ud) => {
            if let Ok(s) = ud.borrow::<SnapshotUd>() {
                ChunkReturn::VmSnapshot(s.path.clone())
            } else if let Ok(s) = ud.borrow::<LabSnapshotUd>() {
                ChunkReturn::LabSnapshot(s.path.clone())
            } else {
                ChunkReturn::OtherUserdata
            }
        }
        other => ChunkReturn::Other(other.type_name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_fixture_opts_take_only_a_name() {
        let lua = Lua::new();
        let opts = |src: &str| fixture_vm_name_opt(Some(lua.load(src).eval::<Value>().unwrap()));
        assert_eq!(opts("{name = 'node2'}").unwrap().as_deref(), Some("node2"));
        assert_eq!(opts("nil").unwrap(), None);
        assert_eq!(fixture_vm_name_opt(None).unwrap(), None);
        let msg = |src: &str| error_message(&opts(src).unwrap_err());
        assert_eq!(
            msg("'node2'"),
            "vm_fixture: opts must be a table like {name = \"node2\"}, got string"
        );
        assert_eq!(
            msg("{name = 2}"),
            "vm_fixture: `name` must be a string, got integer"
        );
        assert_eq!(
            msg("{cpus = 2}"),
            "vm_fixture: unknown option `cpus` (accepted: name)"
        );
    }

    #[test]
    fn a_mismatch_keeps_the_entry_and_other_failures_evict_it() {
        assert!(matches!(
            restore_failure(RestoreError::Mismatch("no lan".into())),
            RestoreFailure::Mismatch(m) if m == "no lan"
        ));
        assert!(matches!(
            restore_failure(RestoreError::Failed(err("bad checksum"))),
            RestoreFailure::Corrupt(m) if m == "bad checksum"
        ));
    }

    #[test]
    fn the_chunk_return_is_classified_for_the_cache() {
        let lua = Lua::new();
        let vm = Value::UserData(
            lua.create_userdata(SnapshotUd { path: "/a".into() })
                .unwrap(),
        );
        assert!(matches!(chunk_return(&vm), ChunkReturn::VmSnapshot(p) if p == Path::new("/a")));
        let lab = Value::UserData(
            lua.create_userdata(LabSnapshotUd { path: "/b".into() })
                .unwrap(),
        );
        assert!(matches!(chunk_return(&lab), ChunkReturn::LabSnapshot(p) if p == Path::new("/b")));
        let other = lua.create_any_userdata(0_u8).unwrap();
        assert!(matches!(
            chunk_return(&Value::UserData(other)),
            ChunkReturn::OtherUserdata
        ));
        assert!(matches!(
            chunk_return(&Value::Nil),
            ChunkReturn::Other("nil")
        ));
    }
}
