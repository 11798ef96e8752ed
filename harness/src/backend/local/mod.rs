//! The `local` backend: the agent runs on this host inside fresh namespaces
//! instead of a VM.
//!
//! A sandbox is a process tree in new mount, pid, uts, ipc and net
//! namespaces (see [`init`] for how it is created and why it cannot outlive
//! us):
//! - `/` is an overlay whose lower layer is the host's root filesystem and
//!   whose upper and work layers are on a tmpfs, so writes inside never reach
//!   the host's files (mounts below `/` on the host, e.g. `/proc` or a
//!   separate `/home`, are not part of the lower layer);
//! - fresh `/proc` (of the new pid namespace), `/sys`, `/tmp`, and a `/dev`
//!   tmpfs holding the host's null, zero, full, random, urandom and tty
//!   bind-mounted, a new-instance `/dev/pts` and a `/dev/shm`;
//! - the hostname is the VM's name; the network namespace has only `lo`, up.
//!
//! The agent listens on a Unix socket in a per-sandbox host directory,
//! `<runtime dir>/<name>-<random>/sock/agent.sock`, which is bind-mounted at
//! the same path inside, so the host connects to it directly. The runtime
//! directory itself is covered by a tmpfs inside, so a sandbox cannot see
//! (or connect to) its siblings' sockets.
//!
//! Teardown kills the sandbox's init (the kernel then kills the rest of its
//! pid namespace), reaps it and removes the sandbox's directory. If
//! `provium` itself is SIGKILLed, the init dies by PDEATHSIG and takes the
//! namespace with it; only the directory (with a socket nobody listens on:
//! connecting is refused) stays behind, and the next sandbox started under
//! the same runtime directory removes directories whose owner is dead.

pub mod guest;
mod init;
pub mod net;
pub mod netconfig;
pub mod snapshot;
mod sys;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::agent_search::{AgentSearch, AgentSearchError};
use crate::client::{AgentClient, ClientError, ClientOptions};
use crate::lock::Locked;
use crate::settings::Settings;
use init::{build_plan, InitPlan};

/// Environment variable naming the agent binary (see [`locate_agent`]).
pub use crate::settings::AGENT_ENV;
/// Where sandboxes keep their sockets and logs unless told otherwise.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/provium/local";
/// The agent binary's file name.
pub use crate::agent_search::AGENT_BIN;

/// Everything that can go wrong creating, using or tearing down a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("the local backend needs root to create mount, pid, uts, ipc and net namespaces (running as uid {euid}); run provium as root, or use the kvm backend")]
    NotRoot { euid: u32 },
    #[error("invalid sandbox name `{name}`: use 1 to 63 characters from a-z, A-Z, 0-9, `-`, `_` and `.` (it becomes the hostname)")]
    InvalidName { name: String },
    #[error("cannot open the agent binary {path}")]
    AgentOpen {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot prepare the sandbox runtime directory {path}")]
    RuntimeDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create the sandbox's namespaces (clone with new mount, pid, uts, ipc and net namespaces); namespaces may be unavailable here (a container without CAP_SYS_ADMIN, or a seccomp policy that forbids them)")]
    Namespaces {
        #[source]
        source: io::Error,
    },
    /// A limit, not a missing capability: each sandbox holds about seven
    /// descriptors and three threads of this process (docs/benchmarking.md,
    /// "Scale").
    #[error(
        "cannot start another sandbox: {limit} ran out (raise it, or run fewer sandboxes at once)"
    )]
    Exhausted {
        limit: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("sandbox `{name}` setup failed: cannot {step}")]
    Setup {
        name: String,
        step: String,
        #[source]
        source: io::Error,
    },
    #[error("sandbox `{name}` setup did not finish within {timeout_ms} ms")]
    SetupTimeout { name: String, timeout_ms: u64 },
    #[error(
        "the agent in sandbox `{name}` exited during start-up ({status}); log {log}: {log_tail}"
    )]
    AgentExited {
        name: String,
        status: String,
        log: PathBuf,
        log_tail: String,
    },
    #[error("the agent in sandbox `{name}` did not accept a connection on {socket} within {timeout_ms} ms; log {log}: {log_tail}")]
    AgentTimeout {
        name: String,
        socket: PathBuf,
        timeout_ms: u64,
        log: PathBuf,
        log_tail: String,
    },
    #[error("cannot connect to the agent in sandbox `{name}`")]
    Connect {
        name: String,
        #[source]
        source: ClientError,
    },
    #[error("sandbox `{name}`: restoring its network configuration")]
    RestoreNet {
        name: String,
        #[source]
        source: netconfig::NetConfigError,
    },
    #[error("sandbox `{name}` is shut down")]
    ShutDown { name: String },
    #[error("cannot remove sandbox directory {path}")]
    Teardown {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The error of a failed sandbox start: a named limit when the errno says
/// one ran out (descriptors, the system's file table, processes or
/// threads), else [`LocalError::Namespaces`].
fn namespaces_error(source: io::Error) -> LocalError {
    let limit = match source.raw_os_error() {
        Some(libc::EMFILE) => "this process's open file descriptors (RLIMIT_NOFILE, `ulimit -n`)",
        Some(libc::ENFILE) => "the system's open files (fs.file-max)",
        Some(libc::EAGAIN) => {
            "processes or threads (RLIMIT_NPROC, kernel.threads-max or kernel.pid_max)"
        }
        _ => return LocalError::Namespaces { source },
    };
    LocalError::Exhausted { limit, source }
}

/// How to start a sandbox.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// The agent binary on the host (see [`locate_agent`]).
    pub agent: PathBuf,
    /// Parent of the per-sandbox directories; created if missing.
    pub runtime_dir: PathBuf,
    /// How long namespace setup plus the agent's first handshake may take.
    pub start_timeout: Duration,
    /// Options for connections made by [`LocalSandbox::connect`].
    pub client: ClientOptions,
}

impl LocalOptions {
    /// Defaults: [`DEFAULT_RUNTIME_DIR`], a 10 s start timeout.
    pub fn new(agent: PathBuf) -> Self {
        LocalOptions {
            agent,
            runtime_dir: PathBuf::from(DEFAULT_RUNTIME_DIR),
            start_timeout: Duration::from_secs(10),
            client: ClientOptions::default(),
        }
    }
}

/// The agent binary for a sandbox: the host search of
/// [`crate::agent_search`] (`PROVIUM_AGENT`, then beside the running
/// executable and in its target dir).
pub fn locate_agent(settings: &Settings) -> Result<PathBuf, AgentSearchError> {
    AgentSearch::from(settings).locate_host()
}

/// The init's exit, shared with the keeper thread that reaps it.
type ExitSlot = Arc<(Mutex<Option<i32>>, Condvar)>;

/// A running sandbox. Dropping it tears it down (see [`LocalSandbox::shutdown`]).
pub struct LocalSandbox {
    name: String,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    init_pid: libc::pid_t,
    pidfd: OwnedFd,
    exit: ExitSlot,
    keeper: Option<JoinHandle<()>>,
    /// Held so the init can tell, at birth, that we are still alive.
    _lifeline: OwnedFd,
    client: ClientOptions,
    down: bool,
    /// The init's descriptor number of the overlay's upper directory.
    upper_fd: RawFd,
    /// A restore's interface configuration, applied once the restored
    /// sandbox's NICs exist again ([`LocalSandbox::apply_restored_net`]).
    restored_net: Option<netconfig::SandboxNet>,
}

impl std::fmt::Debug for LocalSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSandbox")
            .field("name", &self.name)
            .field("init_pid", &self.init_pid)
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl LocalSandbox {
    /// Create the sandbox and wait until its agent answers a handshake.
    pub fn start(name: &str, opts: &LocalOptions) -> Result<LocalSandbox, LocalError> {
        let euid = sys::geteuid();
        if euid != 0 {
            return Err(LocalError::NotRoot { euid });
        }
        check_name(name)?;
        let agent = File::options()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&opts.agent)
            .map_err(|source| LocalError::AgentOpen {
                path: opts.agent.clone(),
                source,
            })?;

        let base = &opts.runtime_dir;
        let rt_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LocalError::RuntimeDir { path, source }
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)
            .map_err(rt_err(base))?;
        let base = fs::canonicalize(base).map_err(rt_err(base))?;
        remove_stale(&base);
        let dir = base.join(format!("{name}-{}", random_hex()?));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(rt_err(&dir))?;
        let mut sandbox_dir = DirGuard(Some(dir.clone()));
        fs::write(dir.join("owner"), owner_record(std::process::id())?).map_err(rt_err(&dir))?;
        let sock_dir = dir.join("sock");
        let fs_dir = dir.join("fs");
        for d in [&sock_dir, &fs_dir] {
            fs::create_dir(d).map_err(rt_err(d))?;
        }
        let socket = sock_dir.join("agent.sock");
        let log = dir.join("agent.log");
        let log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&log)
            .map_err(rt_err(&log))?;

        let (err_r, err_w) = sys::pipe().map_err(rt_err(&dir))?;
        let (life_r, life_w) = sys::pipe().map_err(rt_err(&dir))?;
        let mut plan = build_plan(
            name,
            &base,
            &fs_dir,
            &sock_dir,
            &socket,
            &opts.agent,
            [
                err_w.as_raw_fd(),
                log_file.as_raw_fd(),
                agent.as_raw_fd(),
                life_r.as_raw_fd(),
            ],
        )?;
        plan.seal();
        let upper_fd = plan.fd_base + init::UPPER_FD_OFFSET;

        let exit: ExitSlot = Arc::new((Mutex::new(None), Condvar::new()));
        let (tx, rx) = mpsc::channel();
        let keeper_exit = Arc::clone(&exit);
        // The keeper thread clones the init and then blocks reaping it. The
        // init's PDEATHSIG fires when *this thread* exits, so it must live
        // exactly as long as the sandbox: not the caller's thread, which may
        // end first.
        let keeper = thread::Builder::new()
            .name(format!("sandbox-{name}"))
            .spawn(move || keep(plan, tx, keeper_exit))
            .map_err(namespaces_error)?;
        let started = rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the sandbox keeper thread died")));
        let (init_pid, pidfd, plan_descriptions) = match started {
            Ok(v) => v,
            Err(source) => {
                let _ = keeper.join();
                return Err(namespaces_error(source));
            }
        };
        // Our copies: the init holds its own; EOF on err_r now means the agent exec'd.
        drop(err_w);
        drop(life_r);
        drop(log_file);
        drop(agent);

        let mut sandbox = LocalSandbox {
            name: name.to_string(),
            dir: dir.clone(),
            socket,
            log,
            init_pid,
            pidfd,
            exit,
            keeper: Some(keeper),
            _lifeline: life_w,
            client: opts.client.clone(),
            down: false,
            upper_fd,
            restored_net: None,
        };
        sandbox_dir.0 = None; // the sandbox owns the directory now
        let deadline = Instant::now() + opts.start_timeout;
        sandbox.await_setup(err_r, &plan_descriptions, deadline, opts.start_timeout)?;
        sandbox.await_agent(deadline, opts.start_timeout)?;
        Ok(sandbox)
    }

    /// The sandbox's (and VM's) name; also its hostname.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's socket on the host.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// This sandbox's host directory (socket, agent log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The agent's log (its stdout and stderr) on the host.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Keeps a restored snapshot's interface configuration until the
    /// restored sandbox's NICs exist again.
    pub fn set_restored_net(&mut self, net: netconfig::SandboxNet) {
        self.restored_net = Some(net).filter(|n| !n.is_empty());
    }

    /// Applies (once) the interface configuration a restore kept, now that
    /// the NICs were re-created on the bridges.
    pub fn apply_restored_net(&mut self) -> Result<(), LocalError> {
        match self.restored_net.take() {
            Some(net) => {
                netconfig::apply(self.init_pid, &net).map_err(|source| LocalError::RestoreNet {
                    name: self.name.clone(),
                    source,
                })
            }
            None => Ok(()),
        }
    }

    /// Host pid of the sandbox's init (pid 1 inside).
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// Host pids of every process in the sandbox's pid namespace.
    pub fn host_pids(&self) -> Vec<i32> {
        pids_in_pid_ns_of(self.init_pid)
    }

    /// Whether the sandbox's init is still running.
    pub fn is_running(&self) -> bool {
        self.exit.0.locked().is_none()
    }

    /// A new connection to the agent, handshake done.
    pub fn connect(&self) -> Result<AgentClient, LocalError> {
        if self.down {
            return Err(LocalError::ShutDown {
                name: self.name.clone(),
            });
        }
        AgentClient::connect_unix(&self.socket, self.client.clone()).map_err(|source| {
            LocalError::Connect {
                name: self.name.clone(),
                source,
            }
        })
    }

    /// Kill everything in the sandbox, reap it and remove its directory.
    /// Connections to it see "agent connection closed". Idempotent.
    pub fn shutdown(&mut self) -> Result<(), LocalError> {
        if self.down {
            return Ok(());
        }
        self.down = true;
        // Through the pidfd: a reused pid can never be hit. It fails only
        // when the init is already gone, which is what this wants.
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
        if let Some(keeper) = self.keeper.take() {
            // The kernel reaps the pid namespace before the init's wait
            // returns, so after this no sandbox process is left.
            let _ = keeper.join();
        }
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(LocalError::Teardown {
                path: self.dir.clone(),
                source,
            }),
        }
    }

    fn exit_status(&self) -> Option<i32> {
        *self.exit.0.locked()
    }

    fn log_tail(&self) -> String {
        let text = fs::read(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        let tail = String::from_utf8_lossy(&text[start..]).trim().to_string();
        if tail.is_empty() {
            "(empty)".into()
        } else {
            tail
        }
    }

    fn exited_error(&self, status: i32) -> LocalError {
        LocalError::AgentExited {
            name: self.name.clone(),
            status: describe_wait_status(status),
            log: self.log.clone(),
            log_tail: self.log_tail(),
        }
    }

    /// Wait for the init to report a failed step, or for EOF on the error
    /// pipe (every copy closed: the agent was exec'd).
    fn await_setup(
        &mut self,
        err_r: OwnedFd,
        descriptions: &InitPlanDescriptions,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), LocalError> {
        let mut rec = [0u8; 8];
        let mut got = 0;
        let mut file = File::from(err_r);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
            // A failed poll (EINTR) falls through to the read, which blocks
            // only until the init writes or exits.
            if matches!(sys::poll_readable(file.as_fd(), ms), Ok(false)) {
                return Err(LocalError::SetupTimeout {
                    name: self.name.clone(),
                    timeout_ms: millis(timeout),
                });
            }
            match file.read(&mut rec[got..]) {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    if got == rec.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(LocalError::Namespaces { source });
                }
            }
        }
        if got == rec.len() {
            let step = u32::from_ne_bytes([rec[0], rec[1], rec[2], rec[3]]);
            let errno = i32::from_ne_bytes([rec[4], rec[5], rec[6], rec[7]]);
            return Err(LocalError::Setup {
                name: self.name.clone(),
                step: descriptions.describe(step),
                source: io::Error::from_raw_os_error(errno),
            });
        }
        if let Some(status) = self.exit_status() {
            if got == 0 {
                // Died without a report (e.g. killed): say how.
                return Err(self.exited_error(status));
            }
        }
        Ok(())
    }

    /// Poll the socket until a handshake succeeds.
    fn await_agent(&mut self, deadline: Instant, timeout: Duration) -> Result<(), LocalError> {
        loop {
            if let Some(status) = self.exit_status() {
                return Err(self.exited_error(status));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let opts = ClientOptions {
                handshake_timeout: left.max(Duration::from_millis(1)),
                ..self.client.clone()
            };
            match AgentClient::connect_unix(&self.socket, opts) {
                Ok(client) => {
                    client.close();
                    return Ok(());
                }
                Err(ClientError::Connect { .. }) if !left.is_zero() => {
                    thread::sleep(Duration::from_millis(5));
                }
                Err(ClientError::Connect { .. }) | Err(ClientError::HandshakeTimeout { .. }) => {
                    return Err(LocalError::AgentTimeout {
                        name: self.name.clone(),
                        socket: self.socket.clone(),
                        timeout_ms: millis(timeout),
                        log: self.log.clone(),
                        log_tail: self.log_tail(),
                    });
                }
                Err(source) => {
                    return Err(LocalError::Connect {
                        name: self.name.clone(),
                        source,
                    })
                }
            }
        }
    }
}

impl Drop for LocalSandbox {
    fn drop(&mut self) {
        // Errors here can only be reported by calling shutdown() first.
        let _ = self.shutdown();
    }
}

/// Removes a half-made sandbox directory if start-up fails before the
/// sandbox owns it.
struct DirGuard(Option<PathBuf>);

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// The step descriptions, kept on the host after the plan moved to the keeper.
struct InitPlanDescriptions(Vec<String>);

impl InitPlanDescriptions {
    fn describe(&self, step: u32) -> String {
        init::describe_step(&self.0, step)
    }
}

type Started = io::Result<(libc::pid_t, OwnedFd, InitPlanDescriptions)>;

/// The keeper thread: clone the init, report, then reap it.
fn keep(plan: InitPlan, tx: mpsc::Sender<Started>, exit: ExitSlot) {
    // SAFETY: the plan is sealed; the child runs only `init::run_init`.
    let pid = match unsafe { init::clone_init(&plan) } {
        Ok(pid) => pid,
        Err(e) => {
            let _ = tx.send(Err(e));
            return;
        }
    };
    // Our own unreaped child: its pid cannot have been reused.
    let pidfd = sys::pidfd_open(pid);
    let descriptions = InitPlanDescriptions(plan.descriptions.clone());
    let failed = pidfd.is_err();
    let _ = tx.send(pidfd.map(|fd| (pid, fd, descriptions)));
    if failed {
        // Our own unreaped child: its pid is still its own.
        let _ = sys::kill(pid, libc::SIGKILL);
    }
    let status = sys::wait_child(pid).unwrap_or(0);
    let (lock, cond) = &*exit;
    *lock.locked() = Some(status);
    cond.notify_all();
    drop(plan);
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn describe_wait_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit code {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status:#x}")
    }
}

fn check_name(name: &str) -> Result<(), LocalError> {
    let ok = !name.is_empty()
        && name.len() < 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(LocalError::InvalidName {
            name: name.to_string(),
        })
    }
}

fn random_hex() -> Result<String, LocalError> {
    let mut buf = [0u8; 8];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|source| LocalError::RuntimeDir {
            path: "/dev/urandom".into(),
            source,
        })?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// "<pid> <start time>": identifies a process even if its pid is reused.
fn owner_record(pid: u32) -> Result<String, LocalError> {
    let start = process_start_time(pid).ok_or_else(|| LocalError::RuntimeDir {
        path: format!("/proc/{pid}/stat").into(),
        source: io::Error::other("cannot read this process's start time"),
    })?;
    Ok(format!("{pid} {start}\n"))
}

fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; fields after the command (which may hold spaces) start at 3.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

/// Remove sandbox directories under `base` whose owning process is gone
/// (left behind when `provium` was killed). Best effort.
fn remove_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(owner) = fs::read_to_string(path.join("owner")) else {
            continue;
        };
        let mut parts = owner.split_whitespace();
        let pid = parts.next().and_then(|p| p.parse::<u32>().ok());
        let start = parts.next().and_then(|s| s.parse::<u64>().ok());
        let alive = match (pid, start) {
            (Some(pid), Some(start)) => process_start_time(pid) == Some(start),
            _ => true, // not ours to judge
        };
        if !alive {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Host pids whose pid namespace is `pid`'s.
pub fn pids_in_pid_ns_of(pid: i32) -> Vec<i32> {
    let Ok(ns) = fs::read_link(format!("/proc/{pid}/ns/pid")) else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|l| l == ns))
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_that_ran_out_is_named_not_blamed_on_namespaces() {
        let named = |errno| namespaces_error(io::Error::from_raw_os_error(errno)).to_string();
        assert!(named(libc::EMFILE).contains("RLIMIT_NOFILE"));
        assert!(named(libc::ENFILE).contains("fs.file-max"));
        assert!(named(libc::EAGAIN).contains("kernel.pid_max"));
        assert!(named(libc::EPERM).contains("CAP_SYS_ADMIN"));
    }

    #[test]
    fn names_must_be_hostnames() {
        for good in ["a", "vm-1", "node_2.lab"] {
            check_name(good).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "sp ace", &"x".repeat(64)] {
            let err = check_name(bad).unwrap_err();
            assert!(err.to_string().contains("invalid sandbox name"), "{err}");
        }
    }

    #[test]
    fn start_time_identifies_this_process() {
        let me = std::process::id();
        assert!(process_start_time(me).is_some());
        let rec = owner_record(me).unwrap();
        assert!(rec.starts_with(&format!("{me} ")), "{rec}");
    }
}
