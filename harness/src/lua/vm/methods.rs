//! The VM's Lua methods: each checks its arguments and calls the `Vm`
//! method that does the work (lifecycle, ops, accessors); guest operations
//! come from `lua::guest`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mlua::{Table, UserData, UserDataMethods, Value};

use super::Vm;
use crate::lua::clock::ClockUd;
use crate::lua::guest::add_guest_methods;
use crate::lua::worker::WorkerUd;
use crate::lua::{err, rust_err};

impl UserData for Vm {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("boot", |_, this, opts: Option<Table>| this.boot(opts));
        m.add_method("pause", |_, this, ()| this.pause());
        m.add_method("resume", |_, this, ()| this.resume());
        m.add_method("shutdown", |_, this, ()| this.shutdown());
        m.add_method("close", |_, this, ()| this.shutdown());
        m.add_method("reset", |_, this, ()| this.reset());
        m.add_method("power_button", |_, this, ()| {
            let machine = this.booted_machine("power_button")?;
            // A backend without a power button refuses with the VM as it was.
            if let Some(why) = machine.capabilities().power_button.refusal() {
                return Err(err(format!("vm:power_button: vm `{}`: {why}", this.name())));
            }
            let pressed = machine.power_button();
            // Shutdown either way (the reference's post-state); a guest that
            // did not power off is still an error, with what it did instead.
            this.shutdown()?;
            pressed.map_err(|e| rust_err(&format!("vm:power_button: vm `{}`", this.name()), &e))
        });
        m.add_method("snapshot", |_, this, path: Option<String>| {
            use crate::lua::snapshot::{delete_at_scope_end, temp_path, SnapshotUd};
            let (path, temp) = match path {
                Some(p) => (std::path::PathBuf::from(p), false),
                None => (temp_path(".snap"), true),
            };
            this.snapshot_to(&path)?;
            if temp {
                delete_at_scope_end(this.env(), &path);
            }
            Ok(SnapshotUd { path })
        });
        m.add_method("fork", |lua, this, n: Value| {
            let copies = this.fork(&n)?;
            lua.create_sequence_from(copies)
        });
        m.add_method("restore", |_, this, v: Value| {
            let path = crate::lua::snapshot::snapshot_path_arg(&v, "vm:restore")?;
            this.restore_from(&path)?;
            Ok(this.clone())
        });
        // Always succeeds (the reference): a backend without a console
        // refuses at the console's first use.
        m.add_method("console", |_, this, ()| {
            let vm = this.ctx().clone();
            let machine = move || vm.current_machine();
            Ok(crate::lua::console::ConsoleUd::new(
                this.ctx().clone(),
                Box::new(machine),
            ))
        });
        m.add_method("clock", |_, this, ()| Ok(ClockUd::new(this.ctx().clone())));
        m.add_method("spawn_worker", |_, this, opts: Option<Table>| {
            if let Some(o) = opts {
                for pair in o.pairs::<Value, Value>() {
                    let (k, v) = pair?;
                    match (k.to_string()?.as_str(), v) {
                        ("thread", Value::Boolean(false) | Value::Nil) => {}
                        ("thread", Value::Boolean(true)) => {
                            return Err(err("vm:spawn_worker: {thread = true} is future work (thread-mode workers are not supported yet); omit it or pass {thread = false}"));
                        }
                        ("thread", other) => {
                            return Err(err(format!(
                                "vm:spawn_worker: `thread` must be a boolean, got {}",
                                other.type_name()
                            )));
                        }
                        (key, _) => {
                            return Err(err(format!(
                                "vm:spawn_worker: unknown option `{key}` (accepted: thread)"
                            )));
                        }
                    }
                }
            }
            let client = this.client("vm:spawn_worker")?;
            let w = this.guard_op("vm:spawn_worker", || client.spawn_worker())?;
            Ok(WorkerUd::new(this.ctx().clone(), w))
        });
        m.add_method("nic", |_, this, name: String| {
            crate::lua::nic::vm_nic(&this.net(), this.ctx(), &name)
        });
        m.add_method("disk", |_, this, id: Value| {
            let Value::String(id) = &id else {
                return Err(err(format!(
                    "vm:disk: the id must be a string, got {}",
                    id.type_name()
                )));
            };
            this.disk(&id.to_str()?)
        });
        m.add_method("attach_disk", |_, this, opts: Value| {
            this.attach_disk(&opts)
        });
        m.add_method("name", |_, this, ()| Ok(this.name().to_string()));
        m.add_method("profile", |_, this, ()| Ok(this.0.profile.clone()));
        m.add_method("state", |_, this, ()| Ok(this.phase().as_str()));
        m.add_method("cid", |_, this, ()| {
            Ok(this
                .current_machine()
                .and_then(|m| m.cid())
                .filter(|c| *c != 0))
        });
        m.add_method("is_quiescent", |_, this, ()| {
            Ok(this.in_flight() == 0
                && this.file_counter().load(Ordering::SeqCst) == 0
                && this.stream_count() == 0)
        });
        m.add_method("open_file_count", |_, this, ()| {
            Ok(this.file_counter().load(Ordering::SeqCst))
        });
        m.add_method("open_stream_count", |_, this, ()| Ok(this.stream_count()));
        add_guest_methods::<Vm, M>(m);
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("VM({}, {})", this.name(), this.phase().as_str()))
        });
        m.add_meta_method(mlua::MetaMethod::Eq, |_, this, other: mlua::AnyUserData| {
            Ok(other
                .borrow::<Vm>()
                .map(|o| Arc::ptr_eq(&o.0, &this.0))
                .unwrap_or(false))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_utils::{env, vm};
    use crate::runner::BackendKind;

    /// What a test sees of a VM before it boots: its name, profile and
    /// state, no CID, nothing in flight.
    #[test]
    fn the_accessors_answer_before_boot() {
        let lua = mlua::Lua::new();
        lua.globals().set("vm", vm(&env(BackendKind::Kvm))).unwrap();
        let got: (String, String, String, Option<u32>, bool, String) = lua
            .load("return vm:name(), vm:profile(), vm:state(), vm:cid(), vm:is_quiescent(), tostring(vm)")
            .eval()
            .unwrap();
        assert_eq!(
            got,
            (
                "v".into(),
                "p".into(),
                "created".into(),
                None,
                true,
                "VM(v, created)".into()
            )
        );
        let e: String = lua
            .load("local ok, e = pcall(vm.spawn_worker, vm, {thread = true}); return tostring(e)")
            .eval()
            .unwrap();
        assert!(e.contains("{thread = true} is future work"), "{e}");
    }
}
