//! A VM's context: what every userdata made from a VM (files, processes,
//! workers, clocks, consoles, NICs, bridge members) needs of it, and
//! nothing more. Its name, its file's environment, its phase and agent
//! connection, its running machine, and the counters and streams a
//! snapshot checks.
//!
//! The `Vm` userdata holds one and hands out clones; the userdata hold the
//! clone, never the `Vm`. So this module depends on no other userdata
//! module and the Lua layer's imports form no circle: `vm` builds the
//! userdata, and they reach the VM only through this context.
//!
//! # Locking
//! The state lock is held only by the VM's own thread; the machine slot is
//! held only briefly, so the watchdog can always reach the kill switch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use mlua::Lua;

use super::phase::Phase;
use super::stream::{ByteSource, Stream};
use super::{err, rust_err};
use crate::backend::{Capabilities, Guest};
use crate::client::{AgentClient, AgentOps, ClientError};
use crate::lock::Locked;
use crate::runner::{FileEnv, LiveResource};

/// The agent operations a guest op runs on (the VM's or a worker's).
pub type Ops = Arc<dyn AgentOps + Send + Sync>;

/// What the VM's state lock guards: its phase and, while booted, the agent
/// connection and the boot time.
pub struct VmState {
    pub phase: Phase,
    pub client: Option<AgentClient>,
    pub booted_at: Option<Instant>,
}

struct VmShared {
    name: String,
    env: Arc<FileEnv>,
    state: Mutex<VmState>,
    machine: Mutex<Option<Arc<dyn Guest>>>,
    open_files: Arc<AtomicUsize>,
    open_streams: Arc<AtomicUsize>,
    /// Streams opened on this VM, so a snapshot can name the live ones.
    streams: Mutex<Vec<Stream>>,
    in_flight: AtomicUsize,
}

/// A VM's context; clones share the VM.
#[derive(Clone)]
pub struct VmCtx(Arc<VmShared>);

impl LiveResource for VmShared {
    fn teardown(&self) {
        // Only the machine's kill switch: never wait on the state lock, which
        // the file's thread may hold while blocked on the agent.
        if let Some(m) = self.machine.locked().as_ref() {
            m.kill();
        }
    }

    fn console_excerpt(&self) -> Option<String> {
        let m = self.machine.locked().clone()?;
        m.console_tail(crate::runner::file::CONSOLE_EXCERPT_BYTES)
            .map(|t| format!("--- {} console ---\n{t}", self.name))
    }
}

impl VmCtx {
    /// A created VM's context, tracked by `env` (the watchdog kills its
    /// machine when the file is cancelled).
    pub fn new(env: Arc<FileEnv>, name: String) -> VmCtx {
        let ctx = VmCtx(Arc::new(VmShared {
            name,
            env: env.clone(),
            state: Mutex::new(VmState {
                phase: Phase::Created,
                client: None,
                booted_at: None,
            }),
            machine: Mutex::new(None),
            open_files: Arc::new(AtomicUsize::new(0)),
            open_streams: Arc::new(AtomicUsize::new(0)),
            streams: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
        }));
        let live: Arc<dyn LiveResource> = ctx.0.clone();
        env.track(Arc::downgrade(&live));
        ctx
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn env(&self) -> &Arc<FileEnv> {
        &self.0.env
    }

    pub fn phase(&self) -> Phase {
        self.0.state.locked().phase
    }

    /// The state lock (the VM's own thread only; see the module docs).
    pub fn lock_state(&self) -> MutexGuard<'_, VmState> {
        self.0.state.locked()
    }

    /// True when both contexts are the same VM.
    pub fn same(&self, other: &VmCtx) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// What every guest of this file's backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.0.env.machines().capabilities()
    }

    /// The machine, whatever the phase (None before boot and after
    /// shutdown).
    pub fn current_machine(&self) -> Option<Arc<dyn Guest>> {
        self.0.machine.locked().clone()
    }

    /// The machine, while booted (for creating NICs).
    pub fn running_machine(&self) -> Option<Arc<dyn Guest>> {
        if self.phase() != Phase::Booted {
            return None;
        }
        self.current_machine()
    }

    /// The machine, or an error naming the VM when it has none.
    pub fn machine(&self) -> mlua::Result<Arc<dyn Guest>> {
        self.current_machine()
            .ok_or_else(|| err(format!("vm `{}` has no running machine", self.0.name)))
    }

    /// Puts a just-built machine in the slot (boot, restore).
    pub fn set_machine(&self, machine: Arc<dyn Guest>) {
        *self.0.machine.locked() = Some(machine);
    }

    /// Empties the slot (shutdown), returning the machine that was there.
    pub fn take_machine(&self) -> Option<Arc<dyn Guest>> {
        self.0.machine.locked().take()
    }

    /// Open `file` handles on this VM (`vm:open_file_count()`).
    pub fn file_counter(&self) -> Arc<AtomicUsize> {
        self.0.open_files.clone()
    }

    /// Open streams on this VM (`vm:open_stream_count()`).
    pub fn stream_count(&self) -> usize {
        self.0.open_streams.load(Ordering::SeqCst)
    }

    /// Agent calls running now.
    pub fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// The hint for an op refused in `phase` that needs the VM `wanted`.
    pub fn wrong_state(&self, method: &str, phase: Phase, wanted: &str) -> mlua::Error {
        err(format!(
            "vm:{method}: vm `{}`: {}; {method} needs it {wanted}",
            self.0.name,
            phase.hint()
        ))
    }

    /// The connection for guest ops: only while booted.
    pub fn client(&self, method: &str) -> mlua::Result<AgentClient> {
        let st = self.0.state.locked();
        match (st.phase, &st.client) {
            (Phase::Booted, Some(c)) => Ok(c.clone()),
            (phase, _) => Err(err(format!(
                "{method}: vm `{}`: {}",
                self.0.name,
                phase.hint()
            ))),
        }
    }

    /// Run an agent call, counted as in flight, with the watchdog's reason
    /// taking precedence over the connection error it causes.
    pub fn guard_op<T>(
        &self,
        method: &str,
        f: impl FnOnce() -> Result<T, ClientError>,
    ) -> mlua::Result<T> {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        let r = f();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        r.map_err(|e| {
            if let Some(reason) = self.0.env.cancel_reason() {
                if let ClientError::StdinUnacknowledged { .. } = e {
                    // What the call was stuck on, besides why it was stopped.
                    return err(format!(
                        "{method}: {} (vm `{}`: {})",
                        reason.message(),
                        self.0.name,
                        crate::error_chain::flatten(&e)
                    ));
                }
                return err(format!("{method}: {}", reason.message()));
            }
            if e.is_connection_lost() {
                let mut st = self.0.state.locked();
                if st.phase == Phase::Booted {
                    st.phase = Phase::Dead;
                }
            }
            if blames_the_agent(&e) {
                // Name the VM whose agent misbehaved: a file may have many.
                return rust_err(&format!("{method}: vm `{}`", self.0.name), &e);
            }
            client_err(method, e)
        })
    }

    /// A stream on this VM: counted in its open streams and named by
    /// [`VmCtx::own_streams`] until closed.
    pub fn open_stream(
        &self,
        lua: &Lua,
        source: Box<dyn ByteSource>,
        kind: &'static str,
        detail: String,
    ) -> Stream {
        let s = Stream::open(
            lua,
            self.0.env.clone(),
            source,
            kind,
            detail,
            Some(self.0.open_streams.clone()),
        );
        let mut streams = self.0.streams.locked();
        streams.retain(Stream::is_open);
        streams.push(s.clone());
        s
    }

    /// The streams opened on this VM that are still open.
    pub fn own_streams(&self) -> Vec<Stream> {
        let mut own = self.0.streams.locked();
        own.retain(Stream::is_open);
        own.clone()
    }
}

/// An agent error as a Lua error, its causes included ([`rust_err`]).
pub fn client_err(method: &str, e: ClientError) -> mlua::Error {
    rust_err(method, &e)
}

/// Errors about the agent or its connection rather than an op the agent
/// ran and reported failed.
fn blames_the_agent(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::ConnectionClosed { .. }
            | ClientError::ConnectionBroken { .. }
            | ClientError::Timeout { .. }
            | ClientError::OutputTooLarge { .. }
            | ClientError::StdinUnacknowledged { .. }
            | ClientError::UnexpectedValue { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::error_message;
    use crate::lua::vm::test_utils::env;
    use crate::runner::BackendKind;

    #[test]
    fn a_new_context_is_created_with_no_machine_and_says_so() {
        let ctx = VmCtx::new(env(BackendKind::Local), "v".into());
        assert_eq!((ctx.name(), ctx.phase()), ("v", Phase::Created));
        assert!(ctx.running_machine().is_none());
        let e = error_message(&ctx.machine().err().unwrap());
        assert_eq!(e, "vm `v` has no running machine");
        let e = error_message(&ctx.client("file:read").err().unwrap());
        assert_eq!(e, "file:read: vm `v`: VM not booted; call vm:boot() first");
    }

    #[test]
    fn clones_are_the_same_vm_and_new_contexts_are_not() {
        let env = env(BackendKind::Local);
        let a = VmCtx::new(env.clone(), "v".into());
        let b = VmCtx::new(env, "v".into());
        assert!(a.same(&a.clone()));
        assert!(!a.same(&b), "two VMs of one name are two VMs");
    }

    #[test]
    fn an_agent_error_names_the_vm_and_kills_nothing_when_not_booted() {
        let ctx = VmCtx::new(env(BackendKind::Local), "v".into());
        let e = ctx
            .guard_op("vm:run", || -> Result<(), ClientError> {
                Err(ClientError::ConnectionClosed {
                    reason: "eof".into(),
                })
            })
            .err()
            .unwrap();
        assert!(error_message(&e).starts_with("vm:run: vm `v`: "), "{e}");
        assert_eq!(ctx.phase(), Phase::Created);
        assert_eq!(ctx.in_flight(), 0, "the call is no longer in flight");
    }

    /// An op the client cannot send reaches Lua with its reason (the
    /// `#[source]` of `ClientError::Encode`), the method named once.
    #[test]
    fn an_unsendable_op_says_why() {
        let ctx = VmCtx::new(env(BackendKind::Local), "v".into());
        let e = ctx
            .guard_op("vm:write_file", || -> Result<(), ClientError> {
                Err(ClientError::Encode {
                    what: "write_file".into(),
                    source: provium_protocol::ProtocolError::FrameTooLarge {
                        len: 17 << 20,
                        max: 16 << 20,
                    },
                })
            })
            .err()
            .unwrap();
        assert_eq!(
            error_message(&e),
            "vm:write_file: cannot send `write_file` to the agent: frame of 17825792 bytes \
             exceeds the maximum of 16777216 bytes"
        );
    }
}
