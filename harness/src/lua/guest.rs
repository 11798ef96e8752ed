//! Guest operations shared by the VM and Worker userdata: run, run_async,
//! files, handles, tails, syscall/ioctl and batch, dispatched through the
//! agent client (`AgentOps`) of the VM or of the worker.

use mlua::{Lua, MultiValue, Table, UserData, UserDataMethods, Value};
use provium_protocol::op::{
    IoctlSpec, NestedPtr, Op, OpenMode, SyscallSpec, TailSource, TailStart,
};
use provium_protocol::result::{DirEntry, IoctlResult, OpValue, StatInfo, SyscallResult};

use super::file::FileUd;
use super::process::ProcessUd;
use super::run_result::RunResult;
use super::vm_ctx::{client_err, Ops, VmCtx};
use super::{command, err, rust_err};
use crate::lock::Locked;

/// A userdata that can run guest operations.
pub trait GuestTarget: Sized + 'static {
    /// "vm" or "worker", for error messages.
    const PREFIX: &'static str;
    fn ops(&self) -> mlua::Result<Ops>;
    /// The VM the ops run on (its phase, agent guard and streams).
    fn ctx(&self) -> &VmCtx;
}

pub fn stat_table(lua: &Lua, s: &StatInfo) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("size", s.size)?;
    t.set("mtime", s.mtime_ns as f64 / 1e9)?;
    t.set("mtime_ns", s.mtime_ns)?;
    t.set("perm", s.perm)?;
    t.set("entry_type", s.entry_type.as_str())?;
    Ok(t)
}

pub fn entries_table(lua: &Lua, entries: &[DirEntry]) -> mlua::Result<Table> {
    let out = lua.create_table()?;
    for e in entries {
        let t = lua.create_table()?;
        t.set("name", e.name.as_str())?;
        t.set("entry_type", e.entry_type.as_str())?;
        out.push(t)?;
    }
    Ok(out)
}

fn bufs_table(lua: &Lua, bufs: &[Vec<u8>]) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    for b in bufs {
        t.push(lua.create_string(b)?)?;
    }
    Ok(t)
}

pub fn syscall_table(lua: &Lua, r: &SyscallResult) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("ret", r.ret)?;
    t.set("result", r.ret)?;
    t.set("errno", r.errno)?;
    t.set("out_bufs", bufs_table(lua, &r.out_bufs)?)?;
    Ok(t)
}

fn ioctl_table(lua: &Lua, r: &IoctlResult) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("ret", r.ret)?;
    t.set("result", r.ret)?;
    t.set("errno", r.errno)?;
    if let Some(d) = &r.out_data {
        t.set("out_data", lua.create_string(d)?)?;
    }
    t.set("out_bufs", bufs_table(lua, &r.out_bufs)?)?;
    Ok(t)
}

fn int_arg(v: &Value, what: &str) -> mlua::Result<i64> {
    match v {
        Value::Integer(i) => Ok(*i),
        Value::Number(n) if n.fract() == 0.0 && n.is_finite() => Ok(*n as i64),
        Value::Boolean(b) => Ok(*b as i64),
        other => Err(err(format!(
            "{what} must be an integer, got {}",
            other.type_name()
        ))),
    }
}

fn bytes_list(t: &Table, what: &str) -> mlua::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for (i, v) in t.sequence_values::<Value>().enumerate() {
        match v? {
            Value::String(s) => out.push(s.as_bytes().to_vec()),
            other => {
                return Err(err(format!(
                    "{what}[{}] must be a string, got {}",
                    i + 1,
                    other.type_name()
                )))
            }
        }
    }
    Ok(out)
}

/// `syscall(nr, a1..a6)` or `syscall(nr, {args, bufs, ptrs, nested})`.
pub fn parse_syscall(
    method: &str,
    nr: i64,
    rest: MultiValue,
    allow_table: bool,
) -> mlua::Result<SyscallSpec> {
    let rest: Vec<Value> = rest.into_iter().collect();
    if let [Value::Table(t)] = rest.as_slice() {
        if !allow_table {
            return Err(err(format!(
                "{method}: only the integer-args form is accepted here"
            )));
        }
        for pair in t.pairs::<Value, Value>() {
            let key = pair?.0.to_string()?;
            if !["args", "bufs", "ptrs", "nested"].contains(&key.as_str()) {
                return Err(err(format!(
                    "{method}: unknown key `{key}` (accepted: args, bufs, ptrs, nested)"
                )));
            }
        }
        let args = match t.get::<Option<Table>>("args")? {
            Some(a) => a
                .sequence_values::<Value>()
                .enumerate()
                .map(|(i, v)| int_arg(&v?, &format!("{method}: args[{}]", i + 1)))
                .collect::<mlua::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let bufs = match t.get::<Option<Table>>("bufs")? {
            Some(b) => bytes_list(&b, &format!("{method}: bufs"))?,
            None => Vec::new(),
        };
        let ptrs = match t.get::<Option<Table>>("ptrs")? {
            Some(p) => p
                .sequence_values::<Value>()
                .enumerate()
                .map(|(i, v)| {
                    let slot = int_arg(&v?, &format!("{method}: ptrs[{}]", i + 1))?;
                    u32::try_from(slot).map_err(|_| {
                        err(format!("{method}: ptrs[{}] = {slot} is not a slot", i + 1))
                    })
                })
                .collect::<mlua::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let mut nested = Vec::new();
        if let Some(n) = t.get::<Option<Table>>("nested")? {
            for (i, e) in n.sequence_values::<Table>().enumerate() {
                let e = e?;
                let idx = |k: &str| -> mlua::Result<u32> {
                    let v = int_arg(
                        &e.get::<Value>(k)?,
                        &format!("{method}: nested[{}].{k}", i + 1),
                    )?;
                    // The Lua API's parent/child are 1-based; the wire's are 0-based.
                    let v = if k == "offset" { v } else { v - 1 };
                    u32::try_from(v).map_err(|_| {
                        err(format!("{method}: nested[{}].{k} is out of range", i + 1))
                    })
                };
                nested.push(NestedPtr {
                    parent: idx("parent")?,
                    child: idx("child")?,
                    offset: idx("offset")?,
                });
            }
        }
        let spec = SyscallSpec {
            nr,
            args,
            bufs,
            ptrs,
            nested,
        };
        spec.check().map_err(|e| rust_err(method, &e))?;
        return Ok(spec);
    }
    let args = rest
        .iter()
        .enumerate()
        .map(|(i, v)| int_arg(v, &format!("{method}: argument {}", i + 2)))
        .collect::<mlua::Result<Vec<_>>>()?;
    let spec = SyscallSpec {
        nr,
        args,
        bufs: vec![],
        ptrs: vec![],
        nested: vec![],
    };
    spec.check().map_err(|e| rust_err(method, &e))?;
    Ok(spec)
}

/// `tail_file`'s `start`: "end" (default), "beginning"/"start", an offset
/// (negative: from the end), or a finite float truncated toward zero.
/// `push_file`'s opts: only `auto_dep` (a boolean), read by the fixture-key
/// scanner; anything else is refused rather than ignored.
fn push_file_opts(method: &str, opts: Option<Table>) -> mlua::Result<()> {
    let Some(t) = opts else { return Ok(()) };
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        match (k.to_string()?.as_str(), v) {
            ("auto_dep", Value::Boolean(_)) => {}
            ("auto_dep", other) => {
                return Err(err(format!(
                    "{method}: `auto_dep` must be a boolean, got {}",
                    other.type_name()
                )))
            }
            (key, _) => {
                return Err(err(format!(
                    "{method}: unknown option `{key}` (accepted: auto_dep)"
                )))
            }
        }
    }
    Ok(())
}

/// The directory of the Lua file whose code made the current call: the
/// test or fixture file, or the `require`d helper that called. A relative
/// `push_file` host path resolves against it at run time, as the
/// fixture-key scanner resolves it (`fixture/key.rs`).
pub fn calling_file_dir(lua: &Lua, env: &crate::runner::FileEnv) -> std::path::PathBuf {
    let own = || {
        env.abs_path
            .parent()
            .map(|p| p.to_path_buf())
            .unwrap_or_default()
    };
    for level in 0..64 {
        let source = lua.inspect_stack(level, |d| d.source().source.map(|s| s.into_owned()));
        let Some(source) = source else { break };
        let Some(file) = source.as_deref().and_then(|s| s.strip_prefix('@')) else {
            continue;
        };
        if file == env.rel_path || file.starts_with("provium/") {
            if file == env.rel_path {
                return own();
            }
            continue;
        }
        let p = std::path::Path::new(file);
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            match std::env::current_dir() {
                Ok(cwd) => cwd.join(p),
                Err(_) => return own(),
            }
        };
        return p.parent().map(|d| d.to_path_buf()).unwrap_or_else(own);
    }
    own()
}

pub fn parse_tail_start(method: &str, opts: Option<Table>) -> mlua::Result<TailStart> {
    let Some(o) = opts else {
        return Ok(TailStart::End);
    };
    let from_int = |i: i64| {
        if i < 0 {
            TailStart::FromEnd {
                bytes: i.unsigned_abs(),
            }
        } else {
            TailStart::Offset { offset: i as u64 }
        }
    };
    match o.get::<Value>("start")? {
        Value::Nil => Ok(TailStart::End),
        Value::String(s) => match &*s.to_str()? {
            "end" => Ok(TailStart::End),
            "beginning" | "start" => Ok(TailStart::Beginning),
            other => Err(err(format!(
                "{method}: start = `{other}`: expected \"beginning\", \"end\" or a byte offset"
            ))),
        },
        Value::Integer(i) => Ok(from_int(i)),
        Value::Number(n) if n.is_finite() => Ok(from_int(n.trunc() as i64)),
        other => Err(err(format!(
            "{method}: start must be \"beginning\", \"end\" or a finite number, got {other:?}"
        ))),
    }
}

pub fn parse_open_mode(method: &str, t: &Table) -> mlua::Result<(OpenMode, Option<u32>)> {
    let mut mode = OpenMode::default();
    let mut perm = None;
    for pair in t.pairs::<String, Value>() {
        let (k, v) = pair?;
        let flag = |v: &Value| match v {
            Value::Boolean(b) => Ok(*b),
            other => Err(err(format!(
                "{method}: `{k}` must be a boolean, got {}",
                other.type_name()
            ))),
        };
        match k.as_str() {
            "read" => mode.read = flag(&v)?,
            "write" => mode.write = flag(&v)?,
            "create" => mode.create = flag(&v)?,
            "truncate" => mode.truncate = flag(&v)?,
            "append" => mode.append = flag(&v)?,
            "exclusive" => mode.exclusive = flag(&v)?,
            "perm" => perm = Some(int_arg(&v, &format!("{method}: perm"))? as u32),
            other => {
                return Err(err(format!(
                    "{method}: unknown mode key `{other}` (accepted: read, write, create, truncate, append, exclusive, perm)"
                )))
            }
        }
    }
    mode.check().map_err(|e| rust_err(method, &e))?;
    Ok((mode, perm))
}

/// Lua value of one batched op's result.
fn batch_value(lua: &Lua, v: OpValue) -> mlua::Result<Value> {
    Ok(match v {
        OpValue::Unit => Value::Nil,
        OpValue::Bytes(b) => Value::String(lua.create_string(&b)?),
        OpValue::Stat(s) => Value::Table(stat_table(lua, &s)?),
        OpValue::Entries(e) => Value::Table(entries_table(lua, &e)?),
        OpValue::Syscall(s) => Value::Table(syscall_table(lua, &s)?),
        OpValue::Ran {
            exit,
            stdout,
            stderr,
        } => Value::UserData(lua.create_userdata(RunResult {
            exit,
            stdout,
            stderr,
        })?),
        other => Value::String(lua.create_string(format!("{other:?}"))?),
    })
}

/// The `b` of `vm:batch(function(b) ... end)`: collects ops.
struct BatchBuilder {
    ops: std::sync::Mutex<Vec<Op>>,
}

impl UserData for BatchBuilder {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("run", |_, b, (cmd, second): (String, Option<Table>)| {
            let exec = command::parse_exec("b:run", cmd, second)?;
            b.ops.locked().push(Op::Exec(exec));
            Ok(())
        });
        m.add_method("read_file", |_, b, path: String| {
            b.ops.locked().push(Op::ReadFile { path });
            Ok(())
        });
        m.add_method(
            "write_file",
            |_, b, (path, data): (String, mlua::LuaString)| {
                b.ops.locked().push(Op::WriteFile {
                    path,
                    data: data.as_bytes().to_vec(),
                });
                Ok(())
            },
        );
        m.add_method("stat", |_, b, path: String| {
            b.ops.locked().push(Op::Stat { path });
            Ok(())
        });
        m.add_method("listdir", |_, b, path: String| {
            b.ops.locked().push(Op::ListDir { path });
            Ok(())
        });
        m.add_method("mkdir", |_, b, (path, opts): (String, Option<Table>)| {
            let (parents, perm) = mkdir_opts(opts)?;
            b.ops.locked().push(Op::Mkdir {
                path,
                parents,
                perm,
            });
            Ok(())
        });
        m.add_method("unlink", |_, b, path: String| {
            b.ops.locked().push(Op::Unlink { path });
            Ok(())
        });
        m.add_method("rename", |_, b, (from, to): (String, String)| {
            b.ops.locked().push(Op::Rename { from, to });
            Ok(())
        });
        m.add_method("syscall", |_, b, (nr, rest): (i64, MultiValue)| {
            let spec = parse_syscall("b:syscall", nr, rest, false)?;
            b.ops.locked().push(Op::Syscall(spec));
            Ok(())
        });
    }
}

fn mkdir_opts(opts: Option<Table>) -> mlua::Result<(bool, Option<u32>)> {
    match opts {
        None => Ok((false, None)),
        Some(o) => Ok((
            o.get::<Option<bool>>("parents")?.unwrap_or(false),
            o.get::<Option<u32>>("perm")?,
        )),
    }
}

/// Register the shared guest methods on a userdata type.
pub fn add_guest_methods<T: GuestTarget + UserData, M: UserDataMethods<T>>(m: &mut M) {
    let name = |method: &str| format!("{}:{method}", T::PREFIX);
    m.add_method(
        "run",
        move |_, this, (cmd, second): (String, Option<Table>)| {
            let method = name("run");
            let exec = command::parse_exec(&method, cmd, second)?;
            let ops = this.ops()?;
            let out: RunResult = this.ctx().guard_op(&method, || ops.exec(exec))?;
            Ok(out)
        },
    );
    m.add_method(
        "run_async",
        move |lua, this, (cmd, second): (String, Option<Table>)| {
            let method = name("run_async");
            let spawn = command::parse_spawn(&method, cmd, second)?;
            let ops = this.ops()?;
            let p = ops.spawn(spawn).map_err(|e| client_err(&method, e))?;
            Ok(ProcessUd::new(lua, this.ctx(), p))
        },
    );
    m.add_method("read_file", move |lua, this, path: String| {
        let ops = this.ops()?;
        let data = this
            .ctx()
            .guard_op(&name("read_file"), || ops.read_file(&path))?;
        lua.create_string(&data)
    });
    m.add_method(
        "write_file",
        move |_, this, (path, data): (String, mlua::LuaString)| {
            let ops = this.ops()?;
            this.ctx().guard_op(&name("write_file"), || {
                ops.write_file(&path, &data.as_bytes())
            })
        },
    );
    m.add_method(
        "push_file",
        move |lua, this, (host, guest, opts): (String, String, Option<Table>)| {
            let method = name("push_file");
            push_file_opts(&method, opts)?;
            let base = calling_file_dir(lua, this.ctx().env());
            let hp = std::path::Path::new(&host);
            let hp = if hp.is_absolute() {
                hp.to_path_buf()
            } else {
                base.join(hp)
            };
            let data = std::fs::read(&hp).map_err(|e| {
                rust_err(&format!("{method}: read host file `{}`", hp.display()), &e)
            })?;
            let ops = this.ops()?;
            this.ctx()
                .guard_op(&method, || ops.write_file(&guest, &data))
        },
    );
    m.add_method("stat", move |lua, this, path: String| {
        let ops = this.ops()?;
        let s = this.ctx().guard_op(&name("stat"), || ops.stat(&path))?;
        stat_table(lua, &s)
    });
    m.add_method("listdir", move |lua, this, path: String| {
        let ops = this.ops()?;
        let e = this
            .ctx()
            .guard_op(&name("listdir"), || ops.listdir(&path))?;
        entries_table(lua, &e)
    });
    m.add_method(
        "mkdir",
        move |_, this, (path, opts): (String, Option<Table>)| {
            let (parents, perm) = mkdir_opts(opts)?;
            let ops = this.ops()?;
            this.ctx()
                .guard_op(&name("mkdir"), || ops.mkdir(&path, parents, perm))
        },
    );
    m.add_method("unlink", move |_, this, path: String| {
        let ops = this.ops()?;
        this.ctx().guard_op(&name("unlink"), || ops.unlink(&path))
    });
    m.add_method("rename", move |_, this, (from, to): (String, String)| {
        let ops = this.ops()?;
        this.ctx()
            .guard_op(&name("rename"), || ops.rename(&from, &to))
    });
    m.add_method(
        "open_file",
        move |lua, this, (path, mode): (String, Option<Table>)| {
            let method = name("open_file");
            let mode = mode.ok_or_else(|| {
                err(format!(
                    "{method}: a mode table is required, e.g. {method}(path, {{read = true}})"
                ))
            })?;
            let (mode, perm) = parse_open_mode(&method, &mode)?;
            let ops = this.ops()?;
            let handle = this
                .ctx()
                .guard_op(&method, || ops.open(&path, mode, perm))?;
            Ok(FileUd::new(lua, this.ctx(), ops, handle, path))
        },
    );
    m.add_method(
        "tail_file",
        move |lua, this, (path, opts): (String, Option<Table>)| {
            let method = name("tail_file");
            let start = parse_tail_start(&method, opts)?;
            let ops = this.ops()?;
            let reader = ops
                .tail(TailSource::Path { path: path.clone() }, start)
                .map_err(|e| client_err(&method, e))?;
            Ok(this
                .ctx()
                .open_stream(lua, Box::new(reader), "tail_file", path))
        },
    );
    m.add_method("fd_stream", move |lua, this, v: Value| {
        let method = name("fd_stream");
        let handle = match &v {
            Value::Integer(i) if *i >= 0 => *i as u64,
            Value::UserData(ud) => ud.borrow::<FileUd>()?.handle(),
            other => {
                return Err(err(format!(
                    "{method}: expected a handle id or a File, got {}",
                    other.type_name()
                )))
            }
        };
        let ops = this.ops()?;
        let start = super::file::cursor_start(this.ctx(), &ops, handle, &method)?;
        let reader = ops
            .tail(TailSource::Handle { handle }, start)
            .map_err(|e| client_err(&method, e))?;
        Ok(this.ctx().open_stream(
            lua,
            Box::new(reader),
            "fd_stream",
            format!("handle {handle}"),
        ))
    });
    m.add_method(
        "syscall",
        move |lua, this, (nr, rest): (i64, MultiValue)| {
            let method = name("syscall");
            let spec = parse_syscall(&method, nr, rest, true)?;
            let ops = this.ops()?;
            let r = this.ctx().guard_op(&method, || ops.syscall(spec))?;
            syscall_table(lua, &r)
        },
    );
    m.add_method(
        "ioctl",
        move |lua,
              this,
              (fd, cmd, data, opts): (i64, i64, Option<mlua::LuaString>, Option<Table>)| {
            let method = name("ioctl");
            let fd =
                i32::try_from(fd).map_err(|_| err(format!("{method}: fd {fd} is out of range")))?;
            let (bufs, ptr_offsets) = match opts {
                None => (vec![], vec![]),
                Some(o) => {
                    let bufs = match o.get::<Option<Table>>("bufs")? {
                        Some(b) => bytes_list(&b, &format!("{method}: bufs"))?,
                        None => vec![],
                    };
                    let offs = match o.get::<Option<Table>>("ptr_offsets")? {
                        Some(p) => p
                            .sequence_values::<u32>()
                            .collect::<mlua::Result<Vec<_>>>()?,
                        None => vec![],
                    };
                    (bufs, offs)
                }
            };
            let spec = IoctlSpec {
                fd,
                cmd: cmd as u64,
                data: data.map(|d| d.as_bytes().to_vec()),
                bufs,
                ptr_offsets,
            };
            spec.check().map_err(|e| rust_err(&method, &e))?;
            let ops = this.ops()?;
            let r = this.ctx().guard_op(&method, || ops.ioctl(spec))?;
            ioctl_table(lua, &r)
        },
    );
    m.add_method("batch", move |lua, this, f: mlua::Function| {
        let builder = lua.create_userdata(BatchBuilder {
            ops: Default::default(),
        })?;
        f.call::<()>(builder.clone())?;
        let ops_list = std::mem::take(&mut *builder.borrow::<BatchBuilder>()?.ops.locked());
        let ops = this.ops()?;
        let results = this
            .ctx()
            .guard_op(&name("batch"), || ops.batch(ops_list))?;
        let out = lua.create_table()?;
        for r in results {
            let entry = lua.create_table()?;
            match r {
                Ok(v) => entry.set("ok", batch_value(lua, v)?)?,
                Err(e) => entry.set("err", e.message)?,
            }
            out.push(entry)?;
        }
        Ok(out)
    });
}
