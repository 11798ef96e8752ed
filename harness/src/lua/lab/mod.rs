//! The Lab userdata. The `provium` global is the root Lab of the file; each
//! test runs with `provium` set to a test-scope Lab whose lookups fall
//! through to the root, and whose resources are closed when the test ends.
//!
//! One concern per file: [`state`] holds what a lab contains and the naming
//! rules, [`file_scope`] the file-wide settings, claim and barriers,
//! [`topology`] which bridge a VM's NIC is on across sub-labs, [`persist`]
//! `lab:snapshot()` / `lab:restore()` and the `reset_between_tests`
//! baseline, [`fixture`] `vm_fixture` / `lab_fixture` and the build-time
//! state that builds a fixture, and [`methods`] the userdata's method table.
//! This file owns the handle and the test-scope swap the runner drives.

mod file_scope;
mod fixture;
mod fork;
mod methods;
mod persist;
mod state;
mod topology;

use std::sync::{Arc, Mutex};

use mlua::{Lua, Value};
use provium_protocol::event::ClaimReleased;

use self::file_scope::FileScope;
pub use self::fixture::ChunkBuilder;
use self::state::LabState;
use crate::events::Lifecycle;
use crate::lock::Locked;
use crate::network::NetworkError;
use crate::runner::FileEnv;

/// Why a lab could not put a recorded topology back, naming the bridge
/// or lab and what was in the way.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The lab has no bridge of a restored NIC's name and cannot make one
    /// (`reason`: why the name is refused).
    #[error("cannot make bridge `{name}` for the restored NICs in lab `{lab}`: {reason}")]
    NoRoomForBridge {
        name: String,
        lab: String,
        reason: String,
    },
    #[error(transparent)]
    Network(#[from] NetworkError),
}

/// Keys of the `provium` table that never resolve to a resource.
pub const RESERVED_NAMES: &[&str] = &[
    "pack",
    "unpack",
    "vm_fixture",
    "lab_fixture",
    "timeout",
    "reset_between_tests",
];

/// A lab handle; clones share the lab.
#[derive(Clone)]
pub struct Lab(Arc<LabInner>);

struct LabInner {
    name: String,
    env: Arc<FileEnv>,
    /// Set for a test scope: lookups fall through to the file root.
    parent: Option<Lab>,
    state: Mutex<LabState>,
    /// File-scope coordination shared by the root and its test scopes.
    file: Arc<FileScope>,
    /// The file's root lab (the `provium` global outside tests).
    is_root: bool,
}

/// Handle for a test scope entered by the runner.
pub struct TestScope {
    root_global: Lab,
}

impl Lab {
    pub fn root(env: Arc<FileEnv>) -> Lab {
        Lab(Arc::new(LabInner {
            name: "provium".into(),
            env,
            parent: None,
            state: Mutex::new(LabState::default()),
            file: Arc::new(FileScope::default()),
            is_root: true,
        }))
    }

    /// A lab sharing this one's file scope: a test scope (`parent` set, so
    /// lookups fall through to it) or a sub-lab (no parent).
    fn child(&self, name: String, parent: Option<Lab>) -> Lab {
        Lab(Arc::new(LabInner {
            name,
            env: self.0.env.clone(),
            parent,
            state: Mutex::new(LabState::default()),
            file: self.0.file.clone(),
            is_root: false,
        }))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Swap the `provium` global for a fresh test-scope lab.
    pub fn enter_test_scope(&self, lua: &Lua) -> TestScope {
        let scope = self.child(self.0.name.clone(), Some(self.clone()));
        self.0.env.push_scope();
        let _ = lua.globals().set("provium", scope);
        TestScope {
            root_global: self.clone(),
        }
    }

    /// Close what the test created (streams, processes, files, workers,
    /// bridges, VMs, in that order) and put the root back.
    pub fn leave_test_scope(
        &self,
        lua: &Lua,
        scope: TestScope,
    ) -> Result<(), crate::runner::file::TestFailure> {
        let r = self.0.env.pop_scope();
        let _ = lua.globals().set("provium", scope.root_global);
        r
    }

    /// File end: close everything at file scope and release the claim.
    pub fn close_all(&self, lua: &Lua) {
        let _ = self.0.env.pop_scope();
        if let Some(dir) = self.0.file.baseline.locked().take() {
            crate::lua::snapshot::remove_any(&dir);
        }
        if let Some(amount) = self.0.file.claim.locked().take() {
            let env = &self.0.env;
            let path = env.rel_path.clone();
            env.events
                .send(Lifecycle::ClaimReleased(ClaimReleased { path, amount }));
        }
        let _ = lua.globals().set("provium", Value::Nil);
    }
}

/// Doubles shared by the lab's unit tests: a kvm file env (no VM boots in
/// these tests; a kvm env makes NICs real bridge ports) and VMs that are
/// created, never booted.
#[cfg(test)]
mod test_utils {
    use std::sync::Arc;

    use super::Lab;
    use crate::lua::vm::{Vm, VmSizing};
    use crate::network::Bridge;
    use crate::runner::{BackendKind, FileEnv};

    pub use crate::lua::vm::test_utils::env;

    pub fn kvm_env() -> Arc<FileEnv> {
        env(BackendKind::Kvm)
    }

    pub fn vm(lab: &Lab, name: &str) -> Vm {
        let sizing = VmSizing {
            memory_bytes: 64 << 20,
            cpus: 1,
        };
        Vm::create(lab.0.env.clone(), name.into(), "p".into(), sizing).unwrap()
    }

    /// Puts `vm` in `lab` under its name, as `lab:vm(name, profile)` does.
    pub fn add_vm(lab: &Lab, vm: &Vm) {
        lab.put_vm(vm.name().to_string(), vm);
    }

    /// A new bridge `name` in `lab`, as `lab:bridge(name)` makes it.
    pub fn add_bridge(lab: &Lab, name: &str) -> Bridge {
        let b = Bridge::create(&lab.0.env, name);
        lab.put_bridge(name.into(), &b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::test_utils::{add_vm, kvm_env, vm};
    use super::*;

    /// A test scope is a fresh lab of the root's name whose lookups fall
    /// through to the root; leaving it puts the root back as `provium`.
    fn global_lab(lua: &Lua) -> Lab {
        let ud: mlua::AnyUserData = lua.globals().get("provium").unwrap();
        ud.borrow::<Lab>().map(|lab| lab.clone()).unwrap()
    }

    #[test]
    fn a_test_scope_swaps_the_global_and_falls_through_to_the_root() {
        let lua = Lua::new();
        let root = Lab::root(kvm_env());
        lua.globals().set("provium", root.clone()).unwrap();
        add_vm(&root, &vm(&root, "a"));
        let scope = root.enter_test_scope(&lua);
        let inner = global_lab(&lua);
        assert!(!Arc::ptr_eq(&inner.0, &root.0), "a fresh scope lab");
        assert_eq!(inner.name(), "provium");
        assert!(inner.find_vm("a").is_some(), "falls through to the root");
        assert!(inner.vms().is_empty(), "owns nothing yet");
        root.leave_test_scope(&lua, scope).unwrap();
        let back = global_lab(&lua);
        assert!(Arc::ptr_eq(&back.0, &root.0));
        root.close_all(&lua);
        assert!(lua.globals().get::<Value>("provium").unwrap().is_nil());
    }

    /// A sub-lab shares the file scope but not the parent chain.
    #[test]
    fn children_share_the_file_scope() {
        let root = Lab::root(kvm_env());
        let sub = root.child("site".into(), None);
        assert!(Arc::ptr_eq(&sub.0.file, &root.0.file));
        assert!(sub.0.parent.is_none() && !sub.0.is_root && root.0.is_root);
    }
}
