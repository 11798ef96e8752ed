//! Streams (Tail now; Capture and ConsoleStream share this surface): next,
//! read_until, expect, drain, close, eof, creation_site. Bytes past a match
//! are kept as `pending` and replayed first, so nothing is lost.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlua::{Lua, UserData, UserDataMethods, Value};

use super::{duration, err};
use crate::client::{ClientError, StreamReader};
use crate::lock::Locked;
use crate::runner::{CloseKind, Closeable, FileEnv};

const DEFAULT_NEXT: Duration = Duration::from_secs(10);
const DEFAULT_DRAIN: Duration = Duration::from_millis(500);

/// Why a stream's source failed. Console and capture sources cannot; an
/// agent stream fails as its connection does.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Agent(#[from] ClientError),
}

/// Where a stream's bytes come from.
pub trait ByteSource: Send {
    /// Next chunk; `Ok(None)` on timeout or EOF (see `is_eof`).
    fn next_chunk(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, StreamError>;
    fn is_eof(&self) -> bool;
    fn close(&mut self) -> Result<(), StreamError>;
}

impl ByteSource for StreamReader {
    fn next_chunk(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, StreamError> {
        Ok(self.next(timeout)?)
    }
    fn is_eof(&self) -> bool {
        StreamReader::is_eof(self)
    }
    fn close(&mut self) -> Result<(), StreamError> {
        Ok(StreamReader::close(self)?)
    }
}

/// Where the test author opened the stream.
#[derive(Clone, Debug)]
pub struct CreationSite {
    pub file: String,
    pub line: i64,
}

/// The first stack frame in a `*.test.lua` / `*.fixture.lua` file.
pub fn creation_site(lua: &Lua) -> Option<CreationSite> {
    for level in 0..32 {
        let found = lua.inspect_stack(level, |d| {
            let src = d.source();
            let file = src
                .source
                .as_deref()
                .unwrap_or("")
                .trim_start_matches('@')
                .to_string();
            let line = d.current_line().unwrap_or(0) as i64;
            (file, line)
        });
        match found {
            None => break,
            Some((file, line)) if file.ends_with(".test.lua") || file.ends_with(".fixture.lua") => {
                return Some(CreationSite { file, line })
            }
            Some(_) => continue,
        }
    }
    None
}

struct StreamState {
    source: Box<dyn ByteSource>,
    pending: Vec<u8>,
    closed: bool,
}

/// A Tail stream userdata (a cheap handle; clones share the stream).
#[derive(Clone)]
pub struct Stream {
    state: Arc<Mutex<StreamState>>,
    /// `tail_file`, `fd_stream`, `file_tail_stream`, `proc_stdout_stream`, …
    pub kind: &'static str,
    pub detail: String,
    pub site: Option<CreationSite>,
    env: Arc<FileEnv>,
    counter: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl Closeable for Stream {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        self.close_now();
        Ok(())
    }
}

impl Stream {
    /// Wrap a source; registers for auto-close in the current scope and
    /// counts toward `open_stream_count` through `counter`.
    pub fn open(
        lua: &Lua,
        env: Arc<FileEnv>,
        source: Box<dyn ByteSource>,
        kind: &'static str,
        detail: String,
        counter: Option<Arc<std::sync::atomic::AtomicUsize>>,
    ) -> Stream {
        if let Some(c) = &counter {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let s = Stream {
            state: Arc::new(Mutex::new(StreamState {
                source,
                pending: Vec::new(),
                closed: false,
            })),
            kind,
            detail,
            site: creation_site(lua),
            env: env.clone(),
            counter,
        };
        env.register_closeable(CloseKind::Stream, Arc::new(s.clone()));
        s
    }

    /// Whether the stream is still open (a stream whose state is busy, being
    /// read right now, counts as open).
    pub fn is_open(&self) -> bool {
        self.state.try_lock().map_or(true, |st| !st.closed)
    }

    /// `kind(detail) at file:line`, as a VM's open streams are listed
    /// (snapshot refusals).
    pub fn described_at(&self) -> String {
        match &self.site {
            Some(site) => format!("{} at {}:{}", self.describe(), site.file, site.line),
            None => format!("{} at (unknown site)", self.describe()),
        }
    }

    /// `kind("detail")`, or `kind(handle=N)` for handle-numbered streams, as
    /// snapshot refusals name a stream.
    pub fn describe(&self) -> String {
        let numbered = ["handle ", "process "]
            .iter()
            .find_map(|p| self.detail.strip_prefix(p));
        match numbered {
            Some(n) => format!("{}(handle={n})", self.kind),
            None => format!("{}({:?})", self.kind, self.detail),
        }
    }

    fn close_now(&self) {
        let mut st = self.state.locked();
        if !st.closed {
            st.closed = true;
            st.pending.clear();
            let _ = st.source.close();
            if let Some(c) = &self.counter {
                c.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    fn next(&self, timeout: Duration) -> mlua::Result<Option<Vec<u8>>> {
        let mut st = self.state.locked();
        if st.closed {
            return Ok(None);
        }
        if !st.pending.is_empty() {
            return Ok(Some(std::mem::take(&mut st.pending)));
        }
        self.pull(&mut st, timeout)
    }

    /// One chunk from the source, in watchdog-sized slices.
    fn pull(&self, st: &mut StreamState, timeout: Duration) -> mlua::Result<Option<Vec<u8>>> {
        let end = Instant::now() + timeout;
        loop {
            self.env.check_cancelled()?;
            let left = end.saturating_duration_since(Instant::now());
            let slice = left.min(Duration::from_millis(200));
            if let Some(chunk) = st
                .source
                .next_chunk(slice)
                .map_err(|e| err(crate::error_chain::flatten(&e)))?
            {
                return Ok(Some(chunk));
            }
            if st.source.is_eof() || left <= slice {
                return Ok(None);
            }
        }
    }

    fn read_until(&self, pattern: &[u8], timeout: Duration) -> mlua::Result<Vec<u8>> {
        let shown = String::from_utf8_lossy(pattern).into_owned();
        let end = Instant::now() + timeout;
        let mut st = self.state.locked();
        if st.closed {
            return Err(err("stream closed"));
        }
        let mut buf = std::mem::take(&mut st.pending);
        loop {
            if let Some(pos) = find(&buf, pattern) {
                let split = pos + pattern.len();
                st.pending = buf.split_off(split);
                return Ok(buf);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                st.pending = buf;
                return Err(err(format!("read_until timed out waiting for `{shown}`")));
            }
            match self.pull(&mut st, left)? {
                Some(chunk) => buf.extend_from_slice(&chunk),
                None if st.source.is_eof() => {
                    st.pending = buf;
                    return Err(err(format!("stream EOF while waiting for `{shown}`")));
                }
                None => {}
            }
        }
    }

    fn drain(&self, timeout: Duration) -> mlua::Result<Vec<Vec<u8>>> {
        let mut st = self.state.locked();
        let mut out = Vec::new();
        if st.closed {
            return Ok(out);
        }
        if !st.pending.is_empty() {
            out.push(std::mem::take(&mut st.pending));
        }
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.pull(&mut st, left)? {
                Some(c) => out.push(c),
                None => break,
            }
        }
        Ok(out)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn timeout_arg(v: Value, default: Duration, what: &str) -> mlua::Result<Duration> {
    match v {
        Value::Nil => Ok(default),
        v => duration::from_lua(&v, what),
    }
}

impl UserData for Stream {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("next", |lua, this, t: Value| {
            let t = timeout_arg(t, DEFAULT_NEXT, "next: timeout")?;
            match this.next(t)? {
                Some(b) => Ok(Value::String(lua.create_string(&b)?)),
                None => Ok(Value::Nil),
            }
        });
        m.add_method(
            "read_until",
            |lua, this, (p, t): (mlua::LuaString, Value)| {
                let t = timeout_arg(t, DEFAULT_NEXT, "read_until: timeout")?;
                lua.create_string(&this.read_until(&p.as_bytes(), t)?)
            },
        );
        m.add_method("expect", |_, this, (p, t): (mlua::LuaString, Value)| {
            let t = timeout_arg(t, DEFAULT_NEXT, "expect: timeout")?;
            this.read_until(&p.as_bytes(), t).map(|_| ())
        });
        m.add_method("drain", |lua, this, t: Value| {
            let t = timeout_arg(t, DEFAULT_DRAIN, "drain: timeout")?;
            let frames = this.drain(t)?;
            let out = lua.create_table()?;
            for f in frames {
                out.push(lua.create_string(&f)?)?;
            }
            Ok(out)
        });
        m.add_method("close", |_, this, ()| {
            this.close_now();
            Ok(())
        });
        m.add_method("eof", |_, this, ()| {
            let st = this.state.locked();
            Ok(st.pending.is_empty() && (st.closed || st.source.is_eof()))
        });
        m.add_method("creation_site", |lua, this, ()| match &this.site {
            Some(s) => {
                let t = lua.create_table()?;
                t.set("file", s.file.as_str())?;
                t.set("line", s.line)?;
                Ok(Value::Table(t))
            }
            None => Ok(Value::Nil),
        });
        m.add_method("kind", |_, this, ()| Ok(this.kind));
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Tail({} {})", this.kind, this.detail))
        });
    }
}
