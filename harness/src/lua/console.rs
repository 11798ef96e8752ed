//! The Console userdata (`vm:console()` on the kvm backend): the guest's
//! serial console as the VMM keeps it. `read` opens a ConsoleStream (a
//! [`Stream`] of kind "console") fed by a live VMM console subscriber: bytes
//! the guest writes from then on, in chunks of at most 64 KiB; a reset or
//! shutdown reads as EOF. `read_log` is the log so far (the VMM keeps the
//! newest 1 MiB), `expect` polls it, `write` queues input for the UART,
//! `close` is a no-op (the VMM owns the console), as the reference says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Console, ConsoleRead, ConsoleSubscriber};
use mlua::{Table, UserData, UserDataMethods, Value};

use super::phase::Phase;
use super::stream::{ByteSource, StreamError};
use super::vm_ctx::VmCtx;
use super::{duration, err, rust_err};
use crate::backend::Guest;

/// Largest chunk a ConsoleStream returns (the reference's 64 KiB).
pub const CHUNK_MAX_BYTES: usize = 64 << 10;
const EXPECT_DEFAULT: Duration = Duration::from_secs(30);
const WRITE_DEFAULT: Duration = Duration::from_secs(10);

/// The running VM's machine, looked up at each call (the console is checked
/// at first use, not at `vm:console()`).
pub type MachineLookup = Box<dyn Fn() -> Option<Arc<dyn Guest>> + Send + Sync>;

pub struct ConsoleUd {
    vm: VmCtx,
    machine: MachineLookup,
}

impl ConsoleUd {
    pub fn new(vm: VmCtx, machine: MachineLookup) -> ConsoleUd {
        ConsoleUd { vm, machine }
    }

    fn console(&self, method: &str) -> mlua::Result<Arc<Console>> {
        if let Some(why) = self.vm.capabilities().console.refusal() {
            return Err(err(format!(
                "console:{method}: vm `{}`: {why}",
                self.vm.name()
            )));
        }
        let m = (self.machine)().ok_or_else(|| {
            err(format!(
                "console:{method}: vm `{}`: {}",
                self.vm.name(),
                self.vm.phase().hint()
            ))
        })?;
        m.console().ok_or_else(|| {
            err(format!(
                "console:{method}: VMM does not expose a console socket"
            ))
        })
    }

    fn expect(&self, pattern: &[u8], timeout: Duration) -> mlua::Result<()> {
        let c = self.console("expect")?;
        let end = Instant::now() + timeout;
        loop {
            self.vm.env().check_cancelled()?;
            let left = end.saturating_duration_since(Instant::now());
            if c.wait_for(pattern, 1, left.min(Duration::from_millis(50))) {
                return Ok(());
            }
            if left.is_zero() {
                return Err(err(format!(
                    "console:expect timed out after {timeout:?} waiting for `{}`",
                    String::from_utf8_lossy(pattern)
                )));
            }
        }
    }

    fn write(&self, data: &[u8], timeout: Option<Duration>) -> mlua::Result<()> {
        let c = self.console("write")?;
        let phase = self.vm.phase();
        if matches!(phase, Phase::Shutdown | Phase::Dead) {
            return Err(err(format!(
                "console:write: vm `{}` is {}; nothing reads the console",
                self.vm.name(),
                phase.as_str()
            )));
        }
        let end = timeout.map(|t| Instant::now() + t);
        loop {
            match c.write_input(data) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.vm.env().check_cancelled()?;
                    if end.is_some_and(|end| Instant::now() >= end) {
                        return Err(rust_err("console:write", &e));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

/// `console:write` opts: `timeout` (0 = no timeout); `timeout_ms` is refused.
fn write_timeout(opts: Option<Table>) -> mlua::Result<Option<Duration>> {
    let Some(o) = opts else {
        return Ok(Some(WRITE_DEFAULT));
    };
    let mut t = Some(WRITE_DEFAULT);
    for pair in o.pairs::<String, Value>() {
        let (k, v) = pair?;
        match k.as_str() {
            "timeout" => {
                let d = duration::from_lua(&v, "console:write: timeout")?;
                t = (!d.is_zero()).then_some(d);
            }
            "timeout_ms" => {
                return Err(err(
                    "console:write: opts.timeout_ms is not supported (use timeout = \"500ms\" or timeout = 0.5)",
                ))
            }
            other => {
                return Err(err(format!(
                    "console:write: unknown option `{other}` (accepted: timeout)"
                )))
            }
        }
    }
    Ok(t)
}

/// A ConsoleStream's bytes: a VMM console subscriber.
pub struct ConsoleSource {
    sub: Option<ConsoleSubscriber>,
    held: Vec<u8>,
    eof: bool,
}

impl ConsoleSource {
    pub fn new(sub: ConsoleSubscriber) -> ConsoleSource {
        ConsoleSource {
            sub: Some(sub),
            held: Vec::new(),
            eof: false,
        }
    }

    fn take_chunk(&mut self) -> Vec<u8> {
        let n = self.held.len().min(CHUNK_MAX_BYTES);
        let rest = self.held.split_off(n);
        std::mem::replace(&mut self.held, rest)
    }
}

impl ByteSource for ConsoleSource {
    fn next_chunk(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, StreamError> {
        if !self.held.is_empty() {
            return Ok(Some(self.take_chunk()));
        }
        let Some(sub) = &self.sub else {
            return Ok(None);
        };
        match sub.read_timeout(timeout) {
            ConsoleRead::Data(d) => {
                self.held = d;
                Ok(Some(self.take_chunk()))
            }
            ConsoleRead::Timeout => Ok(None),
            ConsoleRead::Eof => {
                self.eof = true;
                Ok(None)
            }
        }
    }

    fn is_eof(&self) -> bool {
        self.held.is_empty() && (self.eof || self.sub.is_none())
    }

    fn close(&mut self) -> Result<(), StreamError> {
        self.sub = None;
        self.held.clear();
        Ok(())
    }
}

impl UserData for ConsoleUd {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("read", |lua, this, ()| {
            let c = this.console("read")?;
            let mut source = ConsoleSource::new(c.subscribe());
            if matches!(this.vm.phase(), Phase::Shutdown | Phase::Dead) {
                // Nothing will ever write: the stream starts at EOF.
                let _ = source.close();
            }
            let source = Box::new(source);
            Ok(this
                .vm
                .open_stream(lua, source, "console", this.vm.name().to_string()))
        });
        m.add_method("read_log", |lua, this, ()| {
            lua.create_string(this.console("read_log")?.log())
        });
        m.add_method("expect", |_, this, (p, t): (mlua::LuaString, Value)| {
            let t = match t {
                Value::Nil => EXPECT_DEFAULT,
                v => duration::from_lua(&v, "console:expect: timeout")?,
            };
            this.expect(&p.as_bytes(), t)?;
            Ok(p)
        });
        m.add_method(
            "write",
            |_, this, (data, opts): (mlua::LuaString, Option<Table>)| {
                this.write(&data.as_bytes(), write_timeout(opts)?)
            },
        );
        m.add_method("close", |_, _, ()| Ok(()));
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Console({})", this.vm.name()))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_source_chunks_and_eof() {
        let c = Console::new(1 << 20);
        let mut s = ConsoleSource::new(c.subscribe());
        assert_eq!(s.next_chunk(Duration::from_millis(1)).unwrap(), None);
        assert!(!s.is_eof());
        c.push_output(&vec![b'x'; CHUNK_MAX_BYTES + 10]);
        let a = s.next_chunk(Duration::ZERO).unwrap().unwrap();
        assert_eq!(a.len(), CHUNK_MAX_BYTES);
        let b = s.next_chunk(Duration::ZERO).unwrap().unwrap();
        assert_eq!(b.len(), 10);
        c.push_output(b"tail");
        c.close_subscribers();
        assert_eq!(s.next_chunk(Duration::ZERO).unwrap().unwrap(), b"tail");
        assert!(!s.is_eof());
        assert_eq!(s.next_chunk(Duration::ZERO).unwrap(), None);
        assert!(s.is_eof());
    }

    #[test]
    fn closed_source_reads_nothing() {
        let c = Console::new(1024);
        let mut s = ConsoleSource::new(c.subscribe());
        c.push_output(b"x");
        s.close().unwrap();
        assert_eq!(s.next_chunk(Duration::ZERO).unwrap(), None);
        assert!(s.is_eof());
    }
}
