//! The Lab userdata's method table: one small function per Lua method, so
//! `add_methods` reads as the list of what a lab offers. Argument checks
//! and error texts live with each function; the work is in the sibling
//! modules.

use mlua::{Lua, MetaMethod, MultiValue, Table, UserData, UserDataMethods, Value};

use super::Lab;
use crate::lua::vm::{Vm, VmSizing};
use crate::lua::{duration, err};
use crate::network::{Bridge, BridgeOpts};

impl UserData for Lab {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("name", |_, this, ()| Ok(this.0.name.clone()));
        m.add_method("vm", |_, this, (name, profile, opts)| {
            vm(this, name, profile, opts)
        });
        m.add_method("bridge", |_, this, (name, opts)| bridge(this, name, opts));
        m.add_method("lab", |_, this, name| sub_lab(this, name));
        m.add_method("include", |_, this, v| include(this, &v));
        m.add_method("remove", |_, this, v| remove(this, &v));
        m.add_method("members", |lua, this, ()| this.members_of(lua));
        m.add_method("vm_names", |_, this, ()| Ok(this.vm_names()));
        m.add_method("bridge_names", |_, this, ()| Ok(this.bridge_names()));
        m.add_method("sub_lab_names", |_, this, ()| Ok(this.sub_lab_names()));
        m.add_method("boot", |_, this, ()| boot(this));
        m.add_method("shutdown", |_, this, ()| {
            for vm in this.vms() {
                vm.shutdown()?;
            }
            Ok(())
        });
        m.add_method("pause", |_, this, ()| {
            for vm in this.vms() {
                vm.pause()?;
            }
            Ok(())
        });
        m.add_method("resume", |_, this, ()| {
            for vm in this.vms() {
                vm.resume()?;
            }
            Ok(())
        });
        m.add_method("claim", |_, this, spec: Table| this.claim(spec));
        m.add_method("barrier", |_, this, (name, count, timeout)| {
            barrier(this, name, count, timeout)
        });
        m.add_method("snapshot", |lua, this, path: Option<String>| {
            this.snapshot_method(lua, path)
        });
        m.add_method("restore", |_, this, v: Value| this.restore_method(&v));
        m.add_method("fork", |lua, this, n: Value| {
            lua.create_sequence_from(this.fork(&n)?)
        });
        // vm_fixture / lab_fixture are served by __index (below), so both
        // `provium:vm_fixture(p)` and `provium.vm_fixture(p)` work.
        m.add_method("depends_on_file", |_, _, path: String| {
            depends_on_file(&path)
        });

        m.add_meta_method(MetaMethod::Index, |lua, this, key: Value| {
            index(lua, this, &key)
        });
        m.add_meta_method(
            MetaMethod::NewIndex,
            |_, this, (key, value): (String, Value)| new_index(this, &key, value),
        );
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Lab({})", this.0.name))
        });
    }
}

/// `lab:vm(name)` looks a VM up (through the scope chain);
/// `lab:vm(name, profile, opts?)` creates one here.
fn vm(this: &Lab, name: String, profile: Option<String>, opts: Option<Table>) -> mlua::Result<Vm> {
    match profile {
        None => {
            if opts.is_some() {
                return Err(err(format!(
                    "vm(\"{name}\", nil, opts): sizing opts need a profile"
                )));
            }
            this.find_vm(&name).ok_or_else(|| {
                err(format!(
                    "no vm named `{name}` in lab `{}`; create it with {}:vm(\"{name}\", \"<profile>\")",
                    this.0.name, this.0.name
                ))
            })
        }
        Some(profile) => {
            this.check_new_name("vm", &name)?;
            let sizing = VmSizing::from_opts(opts.as_ref())?;
            let vm = Vm::create(this.0.env.clone(), name.clone(), profile, sizing)?;
            this.put_vm(name, &vm);
            Ok(vm)
        }
    }
}

/// `lab:bridge(name, opts?)`: the bridge of that name up the scope chain,
/// else a new one here, with `opts` (`{kernel_path = false}`).
fn bridge(this: &Lab, name: String, opts: Option<Table>) -> mlua::Result<Bridge> {
    let parsed = bridge_opts(&name, opts.as_ref())?;
    // Lookup walks up the scope chain; otherwise create here.
    if let Some(b) = this.find_bridge(&name) {
        if parsed.is_some() {
            return Err(err(format!(
                "bridge(\"{name}\", opts): bridge `{name}` exists already and opts apply only \
                 where a bridge is created; drop the opts, or give the new bridge another name"
            )));
        }
        return Ok(b);
    }
    this.check_new_name("bridge", &name)?;
    let b = Bridge::create_with(&this.0.env, &name, parsed.unwrap_or_default());
    this.put_bridge(name, &b);
    Ok(b)
}

/// The options of `bridge(name, opts)`, `None` when none were given (no
/// table, or an empty one); each bad one is named with the fix.
fn bridge_opts(name: &str, opts: Option<&Table>) -> mlua::Result<Option<BridgeOpts>> {
    let mut out = None;
    let Some(o) = opts else {
        return Ok(out);
    };
    for pair in o.pairs::<Value, Value>() {
        let (k, v) = pair?;
        let key = match &k {
            Value::String(s) => s.to_str().ok().map(|s| s.to_string()),
            _ => None,
        };
        match (key.as_deref(), v) {
            (Some("kernel_path"), Value::Boolean(on)) => {
                out.get_or_insert_with(BridgeOpts::default).kernel_path = on
            }
            (Some("kernel_path"), other) => {
                return Err(err(format!(
                    "bridge(\"{name}\", opts): kernel_path must be true or false, got {}",
                    other.type_name()
                )))
            }
            _ => {
                return Err(err(format!(
                    "bridge(\"{name}\", opts): unknown option {k:?} (the one bridge option is \
                     kernel_path = true|false)"
                )))
            }
        }
    }
    Ok(out)
}

/// `lab:lab(name?)`: a new sub-lab (anonymous `__lab_N` without a name).
fn sub_lab(this: &Lab, name: Option<String>) -> mlua::Result<Lab> {
    let name = match name {
        Some(n) => n,
        None => this.next_anon_lab_name(),
    };
    this.check_new_name("lab", &name)?;
    // Federation sub-labs have no parent chain: no fall-through.
    let lab = this.child(name.clone(), None);
    this.put_sub_lab(name, &lab);
    Ok(lab)
}

/// `lab:include(x)` or `lab:include({x, y, ...})`.
fn include(this: &Lab, v: &Value) -> mlua::Result<()> {
    match v {
        Value::Table(t) => {
            for item in t.sequence_values::<Value>() {
                this.include_one(&item?)?;
            }
        }
        other => this.include_one(other)?,
    }
    Ok(())
}

/// `lab:remove(x)`, by name or by the member itself.
fn remove(this: &Lab, v: &Value) -> mlua::Result<()> {
    let name = match v {
        Value::String(s) => s.to_str()?.to_string(),
        Value::UserData(ud) => {
            if let Ok(vm) = ud.borrow::<Vm>() {
                vm.name().to_string()
            } else if let Ok(b) = ud.borrow::<Bridge>() {
                b.name().to_string()
            } else if let Ok(l) = ud.borrow::<Lab>() {
                l.name().to_string()
            } else {
                return Err(err("remove: expected a name, a VM, a Bridge or a Lab"));
            }
        }
        other => {
            return Err(err(format!(
                "remove: expected a name or a userdata, got {}",
                other.type_name()
            )))
        }
    };
    this.remove_named(&name)
}

/// `lab:boot()`: every VM of this lab at once.
fn boot(this: &Lab) -> mlua::Result<Lab> {
    // All at once: a boot is mostly waiting for the guest's kernel
    // and agent, and where kernels are emulated (kvm_pvm) each VM
    // has a host core of its own (the dispatcher's slots), so a
    // serial loop would take the sum of the boots instead of the
    // longest. The first error (in name order) is the one raised.
    let vms = this.vms();
    let results: Vec<mlua::Result<Vm>> = std::thread::scope(|scope| {
        let handles: Vec<_> = vms
            .iter()
            .map(|vm| scope.spawn(move || vm.boot(None)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(mlua::Error::runtime("provium:boot(): a VM's boot panicked"))
                })
            })
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(this.clone())
}

/// `lab:barrier(name, count, timeout?)`.
fn barrier(this: &Lab, name: String, count: i64, timeout: Value) -> mlua::Result<bool> {
    let timeout = match timeout {
        Value::Nil => None,
        v => Some(duration::from_lua(&v, "barrier: timeout")?),
    };
    this.barrier(name, count, timeout)
}

/// A marker for the fixture-key scanner; nothing happens at run time.
fn depends_on_file(path: &str) -> mlua::Result<()> {
    if path.is_empty() {
        return Err(err("depends_on_file: the path must not be empty"));
    }
    Ok(())
}

/// `provium.<key>`: the reserved keys (functions and settings), else a
/// member of that name up the scope chain, else nil.
fn index(lua: &Lua, this: &Lab, key: &Value) -> mlua::Result<Value> {
    let Value::String(s) = key else {
        return Ok(Value::Nil);
    };
    let key = s.to_str()?.to_string();
    match key.as_str() {
        "pack" => {
            return Ok(Value::Function(
                lua.create_function(|lua, args: MultiValue| pack(lua, args))?,
            ))
        }
        "unpack" => {
            return Ok(Value::Function(
                lua.create_function(|lua, args: MultiValue| unpack(lua, args))?,
            ))
        }
        "vm_fixture" | "lab_fixture" => {
            let this = this.clone();
            let which: &'static str = if key == "vm_fixture" {
                "vm_fixture"
            } else {
                "lab_fixture"
            };
            return Ok(Value::Function(lua.create_function(
                move |lua, args: MultiValue| this.fixture_call(lua, which, drop_self(args)),
            )?));
        }
        "timeout" => {
            let s = this.settings().timeout;
            return Ok(s.map_or(Value::Nil, |d| Value::Number(d.as_secs_f64())));
        }
        "reset_between_tests" => return Ok(Value::Boolean(this.settings().reset_between_tests)),
        _ => {}
    }
    if let Some(vm) = this.find_vm(&key) {
        return Ok(Value::UserData(lua.create_userdata(vm)?));
    }
    if let Some(b) = this.find_bridge(&key) {
        return Ok(Value::UserData(lua.create_userdata(b)?));
    }
    if let Some(l) = this.find_sub_lab(&key) {
        return Ok(Value::UserData(lua.create_userdata(l)?));
    }
    Ok(Value::Nil)
}

/// `provium.<key> = value`: only the file settings can be assigned.
fn new_index(this: &Lab, key: &str, value: Value) -> mlua::Result<()> {
    match key {
        "timeout" | "reset_between_tests" => this.set_setting(key, value),
        other => Err(err(format!(
            "cannot assign provium.{other}: only `timeout` and `reset_between_tests` can be set; \
             create resources with provium:vm(name, profile)"
        ))),
    }
}

/// The reserved keys work in both call forms, `provium:pack(...)` and
/// `provium.pack(...)`: a leading Lab argument is the method form's self.
fn drop_self(args: MultiValue) -> MultiValue {
    let mut v: Vec<Value> = args.into_iter().collect();
    if matches!(v.first(), Some(Value::UserData(ud)) if ud.is::<Lab>()) {
        v.remove(0);
    }
    v.into_iter().collect()
}

fn pack(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let string: Table = lua.globals().get("string")?;
    string.get::<mlua::Function>("pack")?.call(drop_self(args))
}

fn unpack(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let string: Table = lua.globals().get("string")?;
    string
        .get::<mlua::Function>("unpack")?
        .call(drop_self(args))
}

#[cfg(test)]
mod tests {
    use super::super::test_utils::kvm_env;
    use super::*;
    use crate::lua::error_message;

    /// A bare Lua state with a root lab as `provium`: the methods that
    /// only touch the lab's own state run without booting anything.
    fn lua_with_root() -> (Lua, Lab) {
        let lua = Lua::new();
        let root = Lab::root(kvm_env());
        lua.globals().set("provium", root.clone()).unwrap();
        (lua, root)
    }

    fn run_err(lua: &Lua, chunk: &str) -> String {
        error_message(&lua.load(chunk).exec().unwrap_err())
    }

    #[test]
    fn members_are_made_listed_and_looked_up_by_name() {
        let (lua, root) = lua_with_root();
        lua.load(
            r#"
            local v = provium:vm("web", "p")
            local b = provium:bridge("lan")
            assert(provium:bridge("lan"):name() == b:name())
            local site = provium:lab("site")
            assert(site:name() == "site")
            assert(provium:lab():name() == "__lab_0")
            assert(provium.web:name() == "web")
            assert(provium.lan ~= nil and provium.site ~= nil)
            assert(provium.nothing == nil)
            assert(tostring(provium) == "Lab(provium)")
            assert(#provium:members() == 4)
            provium:remove("__lab_0")
            provium:remove(site)
            "#,
        )
        .exec()
        .unwrap();
        assert_eq!(root.vm_names(), ["web"]);
        assert_eq!(root.bridge_names(), ["lan"]);
        assert!(root.sub_lab_names().is_empty());
    }

    #[test]
    fn argument_errors_name_the_fix() {
        let (lua, _root) = lua_with_root();
        assert_eq!(
            run_err(&lua, r#"provium:vm("a", nil, {})"#),
            "vm(\"a\", nil, opts): sizing opts need a profile"
        );
        assert_eq!(
            run_err(&lua, r#"provium:vm("a")"#),
            "no vm named `a` in lab `provium`; create it with provium:vm(\"a\", \"<profile>\")"
        );
        assert_eq!(
            run_err(&lua, r#"provium:bridge("b", {mtu = 1})"#),
            "bridge(\"b\", opts): unknown option String(\"mtu\") (the one bridge option is kernel_path = true|false)"
        );
        assert_eq!(
            run_err(&lua, r#"provium:bridge("b", {kernel_path = "no"})"#),
            "bridge(\"b\", opts): kernel_path must be true or false, got string"
        );
        assert_eq!(
            run_err(
                &lua,
                r#"provium:bridge("c", {kernel_path = false}); provium:bridge("c", {kernel_path = true})"#
            ),
            "bridge(\"c\", opts): bridge `c` exists already and opts apply only where a bridge is \
             created; drop the opts, or give the new bridge another name"
        );
        assert_eq!(
            run_err(&lua, "provium:remove(1)"),
            "remove: expected a name or a userdata, got integer"
        );
        assert_eq!(
            run_err(&lua, r#"provium:depends_on_file("")"#),
            "depends_on_file: the path must not be empty"
        );
        assert_eq!(
            run_err(&lua, "provium.web = 1"),
            "cannot assign provium.web: only `timeout` and `reset_between_tests` can be set; \
             create resources with provium:vm(name, profile)"
        );
    }

    #[test]
    fn settings_and_string_helpers_work_in_both_call_forms() {
        let (lua, root) = lua_with_root();
        lua.load(
            r#"
            assert(provium.timeout == nil and provium.reset_between_tests == false)
            provium.timeout = "2s"
            assert(provium.timeout == 2)
            local packed = provium.pack("<I2", 258)
            assert(provium:unpack("<I2", packed) == 258)
            assert(provium:pack("<I2", 258) == packed)
            "#,
        )
        .exec()
        .unwrap();
        assert_eq!(
            root.settings().timeout,
            Some(std::time::Duration::from_secs(2))
        );
    }

    /// A lab with no VMs boots, pauses, resumes and shuts down as a no-op.
    #[test]
    fn lifecycle_calls_on_an_empty_lab_do_nothing() {
        let (lua, _root) = lua_with_root();
        lua.load("assert(provium:boot():name() == 'provium'); provium:pause(); provium:resume(); provium:shutdown()")
            .exec()
            .unwrap();
    }
}
