//! The File userdata: a guest file handle opened by `open_file`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mlua::{Lua, UserData, UserDataMethods, Value};
use provium_protocol::op::{HandleId, TailSource, TailStart, Whence};

use super::phase::Phase;
use super::vm_ctx::{Ops, VmCtx};
use super::{err, rust_err};
use crate::runner::{CloseKind, Closeable};

/// Largest single read the agent answers; `read_all` loops over it.
const READ_CHUNK: u64 = 1 << 20;

struct FileInner {
    vm: VmCtx,
    ops: Ops,
    handle: HandleId,
    path: String,
    closed: AtomicBool,
}

#[derive(Clone)]
pub struct FileUd(Arc<FileInner>);

impl Closeable for FileUd {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        self.close().map_err(|e| super::error_message(&e).into())
    }
}

impl FileUd {
    pub fn new(_lua: &Lua, vm: &VmCtx, ops: Ops, handle: HandleId, path: String) -> FileUd {
        vm.file_counter().fetch_add(1, Ordering::SeqCst);
        let f = FileUd(Arc::new(FileInner {
            vm: vm.clone(),
            ops,
            handle,
            path,
            closed: AtomicBool::new(false),
        }));
        vm.env()
            .register_closeable(CloseKind::File, Arc::new(f.clone()));
        f
    }

    pub fn handle(&self) -> HandleId {
        self.0.handle
    }

    fn open(&self, method: &str) -> mlua::Result<()> {
        if self.0.closed.load(Ordering::SeqCst) {
            return Err(err(format!("file:{method}: `{}` is closed", self.0.path)));
        }
        Ok(())
    }

    fn close(&self) -> mlua::Result<()> {
        if self.0.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.0.vm.file_counter().fetch_sub(1, Ordering::SeqCst);
        // The VM may already be gone (shut down first): nothing left to close.
        if self.0.vm.phase() != Phase::Booted {
            return Ok(());
        }
        let (ops, h) = (self.0.ops.clone(), self.0.handle);
        self.0.vm.guard_op("file:close", || ops.close(h))
    }
}

/// Where a tail of an open handle starts: the handle's current cursor (the
/// reference's `file:tail_stream()` and `vm:fd_stream`), read with `tell`.
/// A handle with no cursor (a pipe or tty: `tell` fails with ESPIPE) starts
/// at the beginning; the tail op itself then reports a bad handle by name.
pub fn cursor_start(
    vm: &VmCtx,
    ops: &Ops,
    handle: HandleId,
    method: &str,
) -> mlua::Result<TailStart> {
    match vm.guard_op(method, || ops.tell(handle)) {
        Ok(offset) => Ok(TailStart::Offset { offset }),
        Err(_) if vm.phase() == Phase::Booted => Ok(TailStart::Beginning),
        Err(e) => Err(e),
    }
}

impl UserData for FileUd {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("read", |lua, this, n: i64| {
            this.open("read")?;
            if n < 0 {
                return Err(err(format!("file:read: n must be non-negative (got {n})")));
            }
            let (ops, h) = (this.0.ops.clone(), this.0.handle);
            let data = this.0.vm.guard_op("file:read", || ops.read(h, n as u64))?;
            lua.create_string(&data)
        });
        m.add_method("read_all", |lua, this, ()| {
            this.open("read_all")?;
            let mut out = Vec::new();
            loop {
                let (ops, h) = (this.0.ops.clone(), this.0.handle);
                let chunk = this
                    .0
                    .vm
                    .guard_op("file:read_all", || ops.read(h, READ_CHUNK))?;
                if chunk.is_empty() {
                    break;
                }
                out.extend_from_slice(&chunk);
            }
            lua.create_string(&out)
        });
        m.add_method("write", |_, this, data: mlua::LuaString| {
            this.open("write")?;
            let (ops, h) = (this.0.ops.clone(), this.0.handle);
            this.0
                .vm
                .guard_op("file:write", || ops.write(h, &data.as_bytes()))
        });
        m.add_method(
            "seek",
            |_, this, (offset, whence): (i64, Option<String>)| {
                this.open("seek")?;
                let whence = match whence.as_deref().unwrap_or("set") {
                    "set" => Whence::Set,
                    "cur" => Whence::Cur,
                    "end" => Whence::End,
                    other => {
                        return Err(err(format!(
                            "file:seek: whence `{other}` must be \"set\", \"cur\" or \"end\""
                        )))
                    }
                };
                let (ops, h) = (this.0.ops.clone(), this.0.handle);
                this.0
                    .vm
                    .guard_op("file:seek", || ops.seek(h, offset, whence))
            },
        );
        m.add_method("tell", |_, this, ()| {
            this.open("tell")?;
            let (ops, h) = (this.0.ops.clone(), this.0.handle);
            this.0.vm.guard_op("file:tell", || ops.tell(h))
        });
        m.add_method("close", |_, this, ()| this.close());
        // The reference: 0 on a closed file, else the handle's id.
        m.add_method("fd", |_, this, ()| {
            Ok(if this.0.closed.load(Ordering::SeqCst) {
                0
            } else {
                this.0.handle
            })
        });
        m.add_method("tail_stream", |lua, this, ()| {
            this.open("tail_stream")?;
            let start = cursor_start(&this.0.vm, &this.0.ops, this.0.handle, "file:tail_stream")?;
            let reader = this
                .0
                .ops
                .tail(
                    TailSource::Handle {
                        handle: this.0.handle,
                    },
                    start,
                )
                .map_err(|e| rust_err("file:tail_stream", &e))?;
            Ok(this.0.vm.open_stream(
                lua,
                Box::new(reader),
                "file_tail_stream",
                this.0.path.clone(),
            ))
        });
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("File({}, handle {})", this.0.path, this.0.handle))
        });
        let _ = Value::Nil;
    }
}
