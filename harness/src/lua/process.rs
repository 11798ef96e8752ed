//! The Process userdata: an async guest process from `run_async`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlua::{Lua, UserData, UserDataMethods, Value};
use provium_protocol::signal::{parse_signal, SIGTERM};

use super::phase::Phase;
use super::vm_ctx::VmCtx;
use super::{duration, err};
use crate::client::Process;
use crate::lock::Locked;
use crate::runner::{CloseKind, Closeable};

struct ProcInner {
    vm: VmCtx,
    handle: u64,
    proc: Mutex<Option<Process>>,
}

#[derive(Clone)]
pub struct ProcessUd(Arc<ProcInner>);

impl Closeable for ProcessUd {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        // SIGTERM, then the agent escalates to SIGKILL after its grace period.
        if let Some(mut p) = self.0.proc.locked().take() {
            if self.0.vm.phase() == Phase::Booted {
                p.release()
                    .map_err(|e| format!("proc:close: {}", crate::error_chain::flatten(&e)))?;
            }
        }
        Ok(())
    }
}

/// A signal as the Lua API accepts it: nil (SIGTERM), a number, or a name.
pub fn signal_arg(v: Value, method: &str) -> mlua::Result<i32> {
    match v {
        Value::Nil => Ok(SIGTERM),
        Value::Integer(i) if (1..=64).contains(&i) => Ok(i as i32),
        Value::Integer(i) => Err(err(format!(
            "{method}: signal number {i} is out of range 1..=64"
        ))),
        Value::String(s) => parse_signal(&s.to_str()?).map_err(|e| err(format!("{method}: {e}"))),
        other => Err(err(format!(
            "{method}: expected a signal number or name, got {}",
            other.type_name()
        ))),
    }
}

impl ProcessUd {
    pub fn new(_lua: &Lua, vm: &VmCtx, p: Process) -> ProcessUd {
        let ud = ProcessUd(Arc::new(ProcInner {
            vm: vm.clone(),
            handle: p.handle(),
            proc: Mutex::new(Some(p)),
        }));
        vm.env()
            .register_closeable(CloseKind::Process, Arc::new(ud.clone()));
        ud
    }

    fn with<T>(
        &self,
        method: &str,
        f: impl FnOnce(&mut Process) -> Result<T, crate::client::ClientError>,
    ) -> mlua::Result<T> {
        let mut guard = self.0.proc.locked();
        let p = guard.as_mut().ok_or_else(|| {
            err(format!(
                "proc:{method}: the process was already waited for or closed"
            ))
        })?;
        self.0.vm.guard_op(&format!("proc:{method}"), || f(p))
    }
}

impl UserData for ProcessUd {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("wait", |_, this, t: Value| {
            let timeout = match t {
                Value::Nil => None,
                v => {
                    let d = duration::from_lua(&v, "proc:wait: timeout")?;
                    if d.is_zero() {
                        return Err(err("proc:wait: a timeout of 0 would kill the process at once; use proc:status() to poll"));
                    }
                    Some(d)
                }
            };
            let out = this.with("wait", |p| p.wait(timeout))?;
            // The agent slot is gone: the Process is consumed.
            this.0.proc.locked().take();
            Ok(out)
        });
        let kill = |_: &Lua, this: &ProcessUd, sig: Value| {
            let sig = signal_arg(sig, "proc:kill")?;
            this.with("kill", |p| p.signal(sig))
        };
        m.add_method("kill", kill);
        m.add_method("signal", |_, this, sig: Value| {
            if sig.is_nil() {
                return Err(err(
                    "proc:signal: a signal is required, e.g. proc:signal(\"usr1\")",
                ));
            }
            let sig = signal_arg(sig, "proc:signal")?;
            this.with("signal", |p| p.signal(sig))
        });
        m.add_method("pid", |_, this, ()| this.with("pid", |p| p.pid()));
        m.add_method("handle", |_, this, ()| Ok(this.0.handle));
        m.add_method("status", |lua, this, ()| {
            let s = this.with("status", |p| p.status())?;
            let t = lua.create_table()?;
            t.set("running", s.running)?;
            t.set("pid", s.pid)?;
            if let Some(e) = s.exit {
                t.set("status", e.status.as_str())?;
                t.set("exit_code", e.exit_code)?;
                t.set("signal", e.signal)?;
            } else {
                t.set("status", "running")?;
            }
            Ok(t)
        });
        m.add_method("stdin_write", |_, this, data: mlua::LuaString| {
            let bytes = data.as_bytes().to_vec();
            this.with("stdin_write", |p| p.stdin_write(&bytes))?;
            Ok(bytes.len())
        });
        m.add_method("close_stdin", |_, this, ()| {
            this.with("close_stdin", |p| p.close_stdin())
        });
        m.add_method("stdout_stream", |lua, this, ()| {
            let r = this.with("stdout_stream", |p| Ok(p.stdout()))?;
            Ok(this.0.vm.open_stream(
                lua,
                Box::new(r),
                "proc_stdout_stream",
                format!("process {}", this.0.handle),
            ))
        });
        m.add_method("stderr_stream", |lua, this, ()| {
            let r = this.with("stderr_stream", |p| Ok(p.stderr()))?;
            Ok(this.0.vm.open_stream(
                lua,
                Box::new(r),
                "proc_stderr_stream",
                format!("process {}", this.0.handle),
            ))
        });
        m.add_method("close", |_, this, ()| this.auto_close().map_err(err));
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Process({})", this.0.handle))
        });
        let _ = Duration::ZERO;
    }
}
