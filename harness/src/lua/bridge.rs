//! The Bridge userdata: the Lua face of one bridge of the file's virtual
//! network (the Lua-free model in `network` holds its switch, membership
//! and NICs): attach and detach, partitions, impairments, isolation,
//! captures, routes and the uplink, each method checking its arguments
//! and calling the model.

use std::time::Duration;

use mlua::{Table, UserData, UserDataMethods, Value};

use super::capture::CaptureSource;
use super::nic::{u64_value, Nic};
use super::stream::{creation_site, Stream};
use super::vm::Vm;
use super::{err, rust_err};
/// Where integration tests have always found it (the MAC a NIC gets).
pub use crate::network::nic_mac;
use crate::network::{Bridge, DEFAULT_UPLINK_ADDR};

/// A VM argument: a VM userdata, or a bare name (graph-state only).
pub fn vm_ref(v: &Value, what: &str) -> mlua::Result<(String, Option<Vm>)> {
    match v {
        Value::String(s) => {
            let name = s.to_str()?.to_string();
            if name.is_empty() {
                return Err(err(format!("{what}: the vm name must not be empty")));
            }
            Ok((name, None))
        }
        Value::UserData(ud) => match ud.borrow::<Vm>() {
            Ok(vm) => Ok((vm.name().to_string(), Some(vm.clone()))),
            Err(_) => Err(err(format!(
                "{what}: expected a VM or a vm name, got another userdata"
            ))),
        },
        other => Err(err(format!(
            "{what}: expected a VM or a vm name, got {}",
            other.type_name()
        ))),
    }
}

/// `{from = A, to = B, <key> = N}`: the two names and the number.
fn directional(t: &Table, key: Option<&str>, what: &str) -> mlua::Result<(String, String, f64)> {
    let mut allowed = vec!["from", "to"];
    allowed.extend(key);
    for pair in t.clone().pairs::<Value, Value>() {
        let (k, _) = pair?;
        let k = match &k {
            Value::String(s) => s.to_str()?.to_string(),
            other => format!("{other:?}"),
        };
        if !allowed.contains(&k.as_str()) {
            return Err(err(format!(
                "{what}: unknown key `{k}` (accepted: {})",
                allowed.join(", ")
            )));
        }
    }
    let (from, _) = vm_ref(&t.get::<Value>("from")?, &format!("{what}: from"))?;
    let (to, _) = vm_ref(&t.get::<Value>("to")?, &format!("{what}: to"))?;
    if from == to {
        return Err(err(format!("{what}: from and to are both `{from}`")));
    }
    let n = match key {
        None => 0.0,
        Some(k) => number(&t.get::<Value>(k)?, &format!("{what}: {k}"))?,
    };
    Ok((from, to, n))
}

fn number(v: &Value, what: &str) -> mlua::Result<f64> {
    let n = match v {
        Value::Integer(i) => *i as f64,
        Value::Number(n) => *n,
        other => {
            return Err(err(format!(
                "{what} must be a number, got {}",
                other.type_name()
            )))
        }
    };
    if !n.is_finite() || n < 0.0 {
        return Err(err(format!("{what} must be a finite number >= 0, got {n}")));
    }
    Ok(n)
}

fn latency_from_ms(ms: f64, what: &str) -> mlua::Result<Duration> {
    Duration::try_from_secs_f64(ms / 1000.0)
        .map_err(|_| err(format!("{what}: {ms} ms is out of range")))
}

fn bps_from(n: f64, what: &str) -> mlua::Result<u64> {
    if n.fract() != 0.0 || n > u64::MAX as f64 {
        return Err(err(format!(
            "{what}: bits per second must be a whole number, got {n}"
        )));
    }
    Ok(n as u64)
}

fn attach_arg(v: &Value) -> mlua::Result<Vec<(String, Option<Vm>)>> {
    match v {
        Value::Table(t) => {
            let mut out = Vec::new();
            for (i, item) in t.clone().sequence_values::<Value>().enumerate() {
                out.push(vm_ref(
                    &item?,
                    &format!("bridge:attach: element {}", i + 1),
                )?);
            }
            if out.is_empty() {
                return Err(err("bridge:attach: the list is empty"));
            }
            Ok(out)
        }
        other => Ok(vec![vm_ref(other, "bridge:attach")?]),
    }
}

/// Both ends of `bridge:{method}`'s directional rule attached and booted.
fn check_realised(b: &Bridge, method: &str, names: &[&str]) -> mlua::Result<()> {
    b.check_realised(names)
        .map_err(|e| rust_err(&format!("bridge:{method}"), &e))
}

/// `bridge:capture()`: a stream of every frame on the bridge, kept by the
/// bridge so that it counts as a live stream of each VM on it.
fn capture_stream(b: &Bridge, lua: &mlua::Lua) -> mlua::Result<Stream> {
    b.check_open("capture")?;
    let label = creation_site(lua).map_or_else(
        || format!("bridge:capture() on `{}`", b.name()),
        |s| format!("{}:{}", s.file, s.line),
    );
    let cap = b.switch().capture(&label);
    let s = Stream::open(
        lua,
        b.env().clone(),
        Box::new(CaptureSource::new(cap)),
        "capture",
        format!("bridge {}", b.name()),
        None,
    );
    b.add_live_capture(std::sync::Arc::new(s.clone()));
    Ok(s)
}

impl UserData for Bridge {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("name", |_, this, ()| Ok(this.name().to_string()));
        m.add_method("attach", |_, this, v: Value| {
            Ok(this.attach_all(
                attach_arg(&v)?
                    .into_iter()
                    .map(|(name, vm)| (name, vm.map(|v| v.net())))
                    .collect(),
            )?)
        });
        m.add_method("detach", |_, this, v: Value| {
            let (name, _) = vm_ref(&v, "bridge:detach")?;
            this.detach_name(&name);
            Ok(())
        });
        m.add_method("members", |_, this, ()| Ok(this.members_sorted()));

        // ---- partitions ----
        m.add_method("partition", |_, this, (a, b): (Value, Value)| {
            let sw = &this.switch();
            match (&a, &b) {
                (Value::Table(t), Value::Nil) => {
                    let (from, to, _) = directional(t, None, "bridge:partition")?;
                    check_realised(this, "partition", &[&from, &to])?;
                    sw.partition_directional(&from, &to)
                        .map_err(|e| rust_err("bridge:partition", &e))
                }
                _ => {
                    let (a, _) = vm_ref(&a, "bridge:partition: first vm")?;
                    let (b, _) = vm_ref(&b, "bridge:partition: second vm")?;
                    if a == b {
                        return Err(err(format!("bridge:partition: both ends are `{a}`")));
                    }
                    sw.partition(&a, &b);
                    Ok(())
                }
            }
        });
        m.add_method("unpartition", |_, this, (a, b): (Value, Value)| {
            let sw = &this.switch();
            match (&a, &b) {
                (Value::Table(t), Value::Nil) => {
                    let (from, to, _) = directional(t, None, "bridge:unpartition")?;
                    sw.unpartition_directional(&from, &to);
                }
                _ => {
                    let (a, _) = vm_ref(&a, "bridge:unpartition: first vm")?;
                    let (b, _) = vm_ref(&b, "bridge:unpartition: second vm")?;
                    sw.unpartition(&a, &b);
                }
            }
            Ok(())
        });
        m.add_method("partition_all", |_, this, ()| {
            let names = this.members_sorted();
            for (i, a) in names.iter().enumerate() {
                for b in &names[i + 1..] {
                    this.switch().partition(a, b);
                }
            }
            Ok(())
        });
        m.add_method("restore_all", |_, this, ()| {
            this.switch().restore_all();
            Ok(())
        });
        m.add_method("is_partitioned", |_, this, (a, b): (Value, Value)| {
            let (a, _) = vm_ref(&a, "bridge:is_partitioned: first vm")?;
            let (b, _) = vm_ref(&b, "bridge:is_partitioned: second vm")?;
            Ok(this.switch().is_partitioned(&a, &b))
        });
        m.add_method("partitions", |lua, this, ()| {
            let out = lua.create_table()?;
            for (from, to) in this.switch().partitions() {
                let p = lua.create_table()?;
                p.set("from", from)?;
                p.set("to", to)?;
                out.push(p)?;
            }
            Ok(out)
        });

        // ---- impairments ----
        m.add_method("add_latency", |_, this, v: Value| this.latency(&v, false));
        m.add_method("add_directional_latency", |_, this, v: Value| {
            this.latency(&v, true)
        });
        m.add_method("drop_rate", |_, this, v: Value| this.drop_rate(&v, false));
        m.add_method("directional_drop_rate", |_, this, v: Value| {
            this.drop_rate(&v, true)
        });
        m.add_method("bandwidth_limit", |_, this, v: Value| this.bandwidth(&v));
        m.add_method("reset", |_, this, ()| {
            this.switch().reset();
            Ok(())
        });
        m.add_method("latency_ms", |_, this, ()| {
            Ok(this
                .switch()
                .latency()
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0))
        });
        m.add_method("drop_rate_pct", |_, this, ()| {
            Ok(this.switch().drop_rate_pct().unwrap_or(0.0))
        });
        m.add_method("bandwidth_bps", |lua, this, ()| {
            u64_value(lua, this.switch().bandwidth_bps().unwrap_or(0))
        });
        m.add_method("pair_impairment", |lua, this, (a, b): (Value, Value)| {
            let (a, _) = vm_ref(&a, "bridge:pair_impairment: from")?;
            let (b, _) = vm_ref(&b, "bridge:pair_impairment: to")?;
            let imp = this.switch().pair_impairment(&a, &b);
            let t = lua.create_table()?;
            t.set("ms", imp.latency.map(|d| d.as_secs_f64() * 1000.0))?;
            t.set("p", imp.drop_pct)?;
            t.set(
                "bps",
                imp.bandwidth_bps.map(|b| u64_value(lua, b)).transpose()?,
            )?;
            Ok(t)
        });
        m.add_method("stats", |lua, this, ()| {
            let s = this.switch().stats();
            let t = lua.create_table()?;
            t.set("frames_in", s.frames_in)?;
            t.set("flooded", s.flooded)?;
            t.set("delivered", s.delivered)?;
            t.set("delayed", s.delayed)?;
            t.set("dropped_invalid", s.dropped_invalid)?;
            t.set("dropped_link_down", s.dropped_link_down)?;
            t.set("dropped_isolated", s.dropped_isolated)?;
            t.set("dropped_partition", s.dropped_partition)?;
            t.set("dropped_impairment", s.dropped_impairment)?;
            t.set("dropped_rx_queue_full", s.dropped_rx_queue_full)?;
            t.set("dropped_delay_queue_full", s.dropped_delay_queue_full)?;
            t.set("dropped_hairpin", s.dropped_hairpin)?;
            t.set("kernel_path", s.kernel_path)?;
            Ok(t)
        });
        m.add_method("seed", |lua, this, ()| u64_value(lua, this.seeds().0));
        m.add_method("bridge_seed", |lua, this, ()| {
            u64_value(lua, this.seeds().1)
        });

        // ---- isolation ----
        m.add_method("isolate", |_, this, v: Value| {
            let (n, _) = vm_ref(&v, "bridge:isolate")?;
            this.switch().isolate(&n);
            Ok(())
        });
        m.add_method("unisolate", |_, this, v: Value| {
            let (n, _) = vm_ref(&v, "bridge:unisolate")?;
            this.switch().unisolate(&n);
            Ok(())
        });
        m.add_method("is_isolated", |_, this, v: Value| {
            let (n, _) = vm_ref(&v, "bridge:is_isolated")?;
            Ok(this.switch().is_isolated(&n))
        });
        m.add_method("isolated", |_, this, ()| Ok(this.switch().isolated()));

        // ---- L3 routing (preview) ----
        m.add_method("route", |_, this, v: Value| this.route(&v));
        m.add_method("routes", |_, this, ()| Ok(this.routes()));

        // ---- uplink ----
        m.add_method("enable_uplink", |_, this, opts: Option<Table>| {
            let mut addr = DEFAULT_UPLINK_ADDR.to_string();
            if let Some(o) = opts {
                for pair in o.pairs::<String, Value>() {
                    let (k, v) = pair?;
                    match (k.as_str(), v) {
                        ("addr", Value::String(s)) => addr = s.to_str()?.to_string(),
                        (k, _) => {
                            return Err(err(format!(
                                "bridge:enable_uplink: unknown or mistyped option `{k}` (accepted: addr = \"a.b.c.d/len\")"
                            )))
                        }
                    }
                }
            }
            Ok(this.enable_uplink(&addr)?)
        });
        m.add_method("disable_uplink", |_, this, ()| Ok(this.disable_uplink()?));
        m.add_method("uplink_enabled", |_, this, ()| Ok(this.has_uplink()));

        // ---- NICs and capture ----
        m.add_method("nic", |_, this, v: Value| {
            let (name, vm) = vm_ref(&v, "bridge:nic")?;
            if !this.is_member(&name) {
                return Err(err(format!(
                    "bridge:nic: vm `{name}` is not attached to bridge `{}`; call bridge:attach first",
                    this.name()
                )));
            }
            Ok(Nic::new(this.clone(), name, vm.map(|v| v.ctx().clone())))
        });
        m.add_method("capture", |lua, this, ()| capture_stream(this, lua));
        m.add_method("live_captures", |_, this, ()| Ok(this.live_captures()));
        m.add_method("close", |_, this, ()| Ok(this.close()?));
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Bridge({})", this.name()))
        });
        m.add_meta_method(mlua::MetaMethod::Eq, |_, this, other: mlua::AnyUserData| {
            Ok(other
                .borrow::<Bridge>()
                .map(|o| o.ptr_eq(this))
                .unwrap_or(false))
        });
    }
}

impl Bridge {
    /// `bridge:route(other_or_list)`: records the intent (a bridge, its
    /// name, or an array of either) and, at the first call on this bridge,
    /// warns on stderr that no traffic is routed (the reference's v1).
    fn route(&self, v: &Value) -> mlua::Result<()> {
        let one = |v: &Value| -> mlua::Result<String> {
            match v {
                Value::String(s) => Ok(s.to_str()?.to_string()),
                Value::UserData(ud) => ud.borrow::<Bridge>().map(|b| b.name().to_string()).map_err(|_| {
                    err("bridge:route: expected a Bridge, a bridge name or an array of them, got another userdata")
                }),
                other => Err(err(format!(
                    "bridge:route: expected a Bridge, a bridge name or an array of them, got {}",
                    other.type_name()
                ))),
            }
        };
        let targets = match v {
            Value::Table(t) => t
                .sequence_values::<Value>()
                .map(|x| x.and_then(|x| one(&x)))
                .collect::<mlua::Result<Vec<_>>>()?,
            v => vec![one(v)?],
        };
        if let Some(t) = targets.iter().find(|t| **t == self.name()) {
            return Err(err(format!(
                "bridge:route: bridge `{t}` cannot route to itself; route to another bridge"
            )));
        }
        self.add_routes(targets);
        Ok(())
    }

    fn latency(&self, v: &Value, directional_only: bool) -> mlua::Result<()> {
        let sw = &self.switch();
        match v {
            Value::Table(t) => {
                let what = "bridge:add_latency";
                let (from, to, ms) = directional(t, Some("ms"), what)?;
                check_realised(self, "add_latency", &[&from, &to])?;
                sw.set_pair_latency(&from, &to, latency_from_ms(ms, what)?);
                Ok(())
            }
            _ if directional_only => Err(err(
                "bridge:add_directional_latency: expected {from = vm, to = vm, ms = N}",
            )),
            other => {
                let ms = number(other, "bridge:add_latency: ms")?;
                sw.set_latency(latency_from_ms(ms, "bridge:add_latency")?);
                Ok(())
            }
        }
    }

    fn drop_rate(&self, v: &Value, directional_only: bool) -> mlua::Result<()> {
        let sw = &self.switch();
        let r = match v {
            Value::Table(t) => {
                let (from, to, p) = directional(t, Some("p"), "bridge:drop_rate")?;
                check_realised(self, "drop_rate", &[&from, &to])?;
                sw.set_pair_drop_rate(&from, &to, p)
            }
            _ if directional_only => {
                return Err(err(
                    "bridge:directional_drop_rate: expected {from = vm, to = vm, p = N}",
                ))
            }
            other => sw.set_drop_rate(number(other, "bridge:drop_rate: percent")?),
        };
        r.map_err(|e| rust_err("bridge:drop_rate", &e))
    }

    fn bandwidth(&self, v: &Value) -> mlua::Result<()> {
        let sw = &self.switch();
        let what = "bridge:bandwidth_limit";
        match v {
            Value::Table(t) => {
                let (from, to, bps) = directional(t, Some("bps"), what)?;
                check_realised(self, "bandwidth_limit", &[&from, &to])?;
                sw.set_pair_bandwidth(&from, &to, bps_from(bps, what)?);
            }
            other => sw.set_bandwidth(bps_from(number(other, what)?, what)?),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlua::Lua;

    #[test]
    fn numbers_are_checked() {
        assert!(number(&Value::Integer(5), "x").is_ok());
        assert!(number(&Value::Number(-1.0), "x").is_err());
        assert!(number(&Value::Number(f64::NAN), "x").is_err());
        assert!(number(&Value::Boolean(true), "x").is_err());
        assert!(bps_from(1.5, "x").is_err());
        assert_eq!(bps_from(1e6, "x").unwrap(), 1_000_000);
        assert_eq!(
            latency_from_ms(250.0, "x").unwrap(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn directional_tables_are_strict() {
        let lua = Lua::new();
        let t: Table = lua
            .load("return {from = 'a', to = 'b', ms = 5}")
            .eval()
            .unwrap();
        assert_eq!(
            directional(&t, Some("ms"), "x").unwrap(),
            ("a".into(), "b".into(), 5.0)
        );
        let bad: Table = lua
            .load("return {from = 'a', to = 'b', msec = 5}")
            .eval()
            .unwrap();
        let e = directional(&bad, Some("ms"), "x").unwrap_err().to_string();
        assert!(e.contains("unknown key `msec`"), "{e}");
        let same: Table = lua.load("return {from = 'a', to = 'a'}").eval().unwrap();
        assert!(directional(&same, None, "x").is_err());
    }
}
