//! Test doubles for the network model's unit tests: a file environment on
//! the local backend and VMs in it.

use std::sync::Arc;

use crate::config::Config;
use crate::events::EventSender;
use crate::lua::vm::Vm;
use crate::runner::{BackendKind, FileEnv};

/// A file's environment on the local backend, with run seed `seed`.
pub fn env(seed: u64) -> Arc<FileEnv> {
    Arc::new(
        FileEnv::new(
            "t.test.lua".into(),
            "/t.test.lua".into(),
            Vec::new(),
            Arc::new(Config::default()),
            crate::backend::for_kind(BackendKind::Local),
            EventSender::disabled(),
        )
        .with_run_seed(seed),
    )
}

/// A created (not booted) VM named `name` in `env`.
pub fn vm(env: &Arc<FileEnv>, name: &str) -> Vm {
    let sizing = crate::lua::vm::VmSizing {
        memory_bytes: 64 << 20,
        cpus: 1,
    };
    Vm::create(env.clone(), name.into(), "p".into(), sizing).unwrap()
}
