//! The Worker userdata: its own agent queue and handle namespace in the same
//! guest, so test code can dispatch concurrent operations.

use std::sync::{Arc, Mutex};

use mlua::{UserData, UserDataMethods, Value};

use super::err;
use super::guest::{add_guest_methods, GuestTarget};
use super::phase::Phase;
use super::process::signal_arg;
use super::vm_ctx::{Ops, VmCtx};
use crate::client::{AgentOps, Worker};
use crate::lock::Locked;
use crate::runner::{CloseKind, Closeable};

struct WorkerInner {
    vm: VmCtx,
    id: u64,
    worker: Mutex<Option<Arc<Worker>>>,
}

#[derive(Clone)]
pub struct WorkerUd(Arc<WorkerInner>);

impl Closeable for WorkerUd {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        let w = self.0.worker.locked().take();
        if let Some(w) = w {
            if self.0.vm.phase() == Phase::Booted {
                if let Ok(w) = Arc::try_unwrap(w) {
                    w.close().map_err(|e| {
                        format!("worker:close: {}", crate::error_chain::flatten(&e))
                    })?;
                }
            }
        }
        Ok(())
    }
}

impl WorkerUd {
    pub fn new(vm: VmCtx, w: Worker) -> WorkerUd {
        let ud = WorkerUd(Arc::new(WorkerInner {
            id: w.id(),
            vm: vm.clone(),
            worker: Mutex::new(Some(Arc::new(w))),
        }));
        vm.env()
            .register_closeable(CloseKind::Worker, Arc::new(ud.clone()));
        ud
    }

    fn worker(&self, method: &str) -> mlua::Result<Arc<Worker>> {
        self.0
            .worker
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| err(format!("worker:{method}: worker {} is closed", self.0.id)))
    }
}

impl GuestTarget for WorkerUd {
    const PREFIX: &'static str = "worker";

    fn ops(&self) -> mlua::Result<Ops> {
        Ok(self.worker("op")? as Arc<dyn AgentOps + Send + Sync>)
    }

    fn ctx(&self) -> &VmCtx {
        &self.0.vm
    }
}

impl UserData for WorkerUd {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("kill", |_, this, sig: Value| {
            let sig = signal_arg(sig, "worker:kill")?;
            let w = this.worker("kill")?;
            this.0.vm.guard_op("worker:kill", || w.kill(sig))
        });
        m.add_method("join", |_, this, ()| {
            let w = this.worker("join")?;
            this.0.vm.guard_op("worker:join", || w.join())
        });
        m.add_method("handle", |_, this, ()| Ok(this.0.id));
        m.add_method("close", |_, this, ()| this.auto_close().map_err(err));
        add_guest_methods::<WorkerUd, M>(m);
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Worker({})", this.0.id))
        });
    }
}
