//! What the VM's unit tests share: a file environment on a backend (no
//! provium.toml, events off) and a VM `v` of profile `p` on it, 64 MiB and
//! one vCPU. Nothing boots until a test asks.

use std::sync::Arc;

use super::{Vm, VmSizing};
use crate::config::Config;
use crate::events::EventSender;
use crate::runner::{BackendKind, FileEnv};

/// A file environment for `t.test.lua` on `backend`.
pub fn env(backend: BackendKind) -> Arc<FileEnv> {
    Arc::new(file_env(backend))
}

/// [`env`], not yet shared (to add run resources to it).
pub fn file_env(backend: BackendKind) -> FileEnv {
    FileEnv::new(
        "t.test.lua".into(),
        "/t.test.lua".into(),
        Vec::new(),
        Arc::new(Config::default()),
        crate::backend::for_kind(backend),
        EventSender::disabled(),
    )
}

/// VM `v` (profile `p`, 64 MiB, 1 vCPU) in `env`, created.
pub fn vm(env: &Arc<FileEnv>) -> Vm {
    let sizing = VmSizing {
        memory_bytes: 64 << 20,
        cpus: 1,
    };
    Vm::create(env.clone(), "v".into(), "p".into(), sizing).unwrap()
}

/// The text a Lua error carries.
pub fn message(e: mlua::Error) -> String {
    crate::lua::error_message(&e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_is_created_on_the_asked_backend() {
        let v = vm(&env(BackendKind::Local));
        assert_eq!((v.name(), v.profile_name()), ("v", "p"));
        assert_eq!(v.phase(), super::super::Phase::Created);
        assert_eq!(v.capabilities().backend, "local");
    }
}
