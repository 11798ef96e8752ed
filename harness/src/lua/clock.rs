//! The Clock userdata: the guest's wall clock (signed; may go before 1970).

use mlua::{UserData, UserDataMethods, Value};

use super::vm_ctx::VmCtx;
use super::{duration, err, rust_err};
use crate::client::AgentOps;

pub struct ClockUd {
    vm: VmCtx,
}

impl ClockUd {
    pub fn new(vm: VmCtx) -> Self {
        ClockUd { vm }
    }
}

fn finite(method: &str, v: f64) -> mlua::Result<f64> {
    if v.is_nan() {
        return Err(err(format!(
            "clock:{method}: value must be a finite number (got NaN)"
        )));
    }
    if v.is_infinite() {
        return Err(err(format!(
            "clock:{method}: value must be a finite number (got inf)"
        )));
    }
    Ok(v)
}

fn seconds_arg(method: &str, v: Value) -> mlua::Result<f64> {
    match v {
        Value::Integer(i) => Ok(i as f64),
        Value::Number(n) => finite(method, n),
        Value::String(s) => {
            let text = s.to_str()?.to_string();
            let (neg, body) = match text.strip_prefix('-') {
                Some(rest) => (true, rest.to_string()),
                None => (false, text.clone()),
            };
            let d = duration::parse_duration_str(&body)
                .map_err(|e| rust_err(&format!("clock:{method}"), &e))?;
            Ok(if neg {
                -d.as_secs_f64()
            } else {
                d.as_secs_f64()
            })
        }
        other => Err(err(format!(
            "clock:{method}: expected seconds, got {}",
            other.type_name()
        ))),
    }
}

impl UserData for ClockUd {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("get", |_, this, ()| {
            let c = this.vm.client("clock:get")?;
            let r = this.vm.guard_op("clock:get", || c.clock_get())?;
            Ok(r.realtime_ns as f64 / 1e9)
        });
        m.add_method("get_ns", |_, this, ()| {
            let c = this.vm.client("clock:get_ns")?;
            Ok(this
                .vm
                .guard_op("clock:get_ns", || c.clock_get())?
                .realtime_ns)
        });
        m.add_method("set", |_, this, v: Value| {
            let secs = seconds_arg("set", v)?;
            let c = this.vm.client("clock:set")?;
            this.vm
                .guard_op("clock:set", || c.clock_set((secs * 1e9) as i64))
        });
        m.add_method("set_ns", |_, this, ns: i64| {
            let c = this.vm.client("clock:set_ns")?;
            this.vm.guard_op("clock:set_ns", || c.clock_set(ns))
        });
        m.add_method("advance", |_, this, v: Value| {
            let secs = seconds_arg("advance", v)?;
            let c = this.vm.client("clock:advance")?;
            this.vm
                .guard_op("clock:advance", || c.clock_advance((secs * 1e9) as i64))
        });
        m.add_method("sleep", |_, this, v: Value| {
            let d = duration::from_lua(&v, "clock:sleep")?;
            Ok(this.vm.env().sleep(d)?)
        });
    }
}
