//! Where the agent listens: `unix:PATH` (the local backend, tests),
//! `vsock:PORT` (inside a guest, any CID), `console` (the virtio-console
//! port named `org.provium.agent`, for kernels without vsock: `port.rs`),
//! or `auto` (the default), and the accept loop.
//!
//! `auto` takes the channel the harness named on the kernel command line
//! (`provium.agent_channel=vsock|console`: it attached that device); without
//! the word, vsock when the kernel has it (`socket(AF_VSOCK)` works), else
//! the console port.
//!
//! Every accepted socket connection is served on its own thread and is
//! independent of the others: its own handles, processes, streams and
//! workers. The console port carries one session at a time.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::conn;
use crate::dispatch;
use crate::port;
use crate::socket::Socket;
use crate::AgentConfig;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Vsock(u32),
    Console,
    #[default]
    Auto,
}

/// The kernel command-line word naming the channel.
const CHANNEL_PARAM: &str = "provium.agent_channel=";

/// The channel `cmdline` names (the last word wins), if any.
pub fn channel_from_cmdline(cmdline: &str) -> Result<Option<ListenAddr>, String> {
    let Some(v) = cmdline
        .split_ascii_whitespace()
        .filter_map(|w| w.strip_prefix(CHANNEL_PARAM))
        .next_back()
    else {
        return Ok(None);
    };
    match v {
        "vsock" => Ok(Some(ListenAddr::Vsock(provium_protocol::AGENT_VSOCK_PORT))),
        "console" => Ok(Some(ListenAddr::Console)),
        _ => Err(format!(
            "{CHANNEL_PARAM}{v}: expected vsock or console; choosing by what the kernel has"
        )),
    }
}

/// Whether this kernel has vsock (built in or its module loaded).
fn vsock_available() -> bool {
    // SAFETY: socket(2) with constant arguments; closed right below.
    let raw = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return false;
    }
    // SAFETY: `raw` is a fresh fd nobody else owns.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    true
}

/// `auto` made concrete (see the module docs); other addresses as they are.
pub fn resolve(addr: &ListenAddr) -> ListenAddr {
    if *addr != ListenAddr::Auto {
        return addr.clone();
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    match channel_from_cmdline(&cmdline) {
        Ok(Some(a)) => return a,
        Ok(None) => {}
        Err(e) => eprintln!("provium-agent: {e}"),
    }
    if vsock_available() {
        ListenAddr::Vsock(provium_protocol::AGENT_VSOCK_PORT)
    } else {
        ListenAddr::Console
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(
                    "listen address `unix:` needs a socket path (e.g. unix:/run/a.sock)".into(),
                );
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        if let Some(port) = s.strip_prefix("vsock:") {
            return port.parse::<u32>().map(ListenAddr::Vsock).map_err(|_| {
                format!("listen address `{s}`: the vsock port must be a number (e.g. vsock:1024)")
            });
        }
        match s {
            "console" => Ok(ListenAddr::Console),
            "auto" => Ok(ListenAddr::Auto),
            _ => Err(format!(
                "listen address `{s}` is neither unix:PATH, vsock:PORT, console nor auto"
            )),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Vsock(port) => write!(f, "vsock:{port}"),
            ListenAddr::Console => write!(f, "console"),
            ListenAddr::Auto => write!(f, "auto"),
        }
    }
}

pub enum Listener {
    Unix(UnixListener),
    Vsock(OwnedFd),
    /// The console port's device name (`vport0p0`).
    Console(String),
}

impl Listener {
    /// The channel word Hello carries (`channel:<word>` in the features).
    pub fn channel(&self) -> &'static str {
        match self {
            Listener::Unix(_) => "unix",
            Listener::Vsock(_) => "vsock",
            Listener::Console(_) => "console",
        }
    }
}

/// Bind and listen (`addr` resolved: not `auto`). A stale Unix socket file
/// at the path is replaced; the console port is waited for until the driver
/// names it.
pub fn bind(addr: &ListenAddr) -> io::Result<Listener> {
    match addr {
        ListenAddr::Unix(path) => {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if meta.file_type().is_socket() {
                    std::fs::remove_file(path)?;
                }
            }
            bind_unix(path).map(Listener::Unix)
        }
        ListenAddr::Vsock(port) => bind_vsock(*port).map(Listener::Vsock),
        ListenAddr::Console => Ok(Listener::Console(crate::port::wait_for_port())),
        ListenAddr::Auto => bind(&resolve(addr)),
    }
}

/// Bind a Unix socket that appears at `path` only once it accepts.
///
/// `bind(2)` creates the file before `listen(2)` runs, so a client that waits
/// for the file and connects at once can be refused. Binding a sibling name
/// and renaming it into place once listening closes that window: a bound
/// socket keeps working under its new name. Where the sibling name would not
/// fit a `sun_path`, the socket is bound in place.
fn bind_unix(path: &std::path::Path) -> io::Result<UnixListener> {
    let Some(name) = path.file_name() else {
        return UnixListener::bind(path);
    };
    let mut staged_name = std::ffi::OsString::from(".");
    staged_name.push(name);
    staged_name.push(format!(".{}.binding", std::process::id()));
    let staged = path.with_file_name(staged_name);
    // sun_path holds 108 bytes with its NUL.
    if staged.as_os_str().len() >= 108 {
        return UnixListener::bind(path);
    }
    let _ = std::fs::remove_file(&staged);
    let listener = UnixListener::bind(&staged)?;
    if let Err(err) = std::fs::rename(&staged, path) {
        let _ = std::fs::remove_file(&staged);
        return Err(err);
    }
    Ok(listener)
}

fn bind_vsock(port: u32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the fd is owned right below.
    let raw = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_vm is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = port;
    addr.svm_cid = libc::VMADDR_CID_ANY;
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_vm>())
        .expect("sockaddr_vm is a few bytes");
    // SAFETY: `addr` is a valid sockaddr_vm of `len` bytes for the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::from_ref(&addr).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) on our fd.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

impl Listener {
    pub fn accept(&self) -> io::Result<Socket> {
        match self {
            Listener::Console(dev) => Err(io::Error::other(format!(
                "the console port /dev/{dev} has sessions, not connections"
            ))),
            Listener::Unix(l) => l.accept().map(|(s, _)| Socket::from_fd(s.into())),
            Listener::Vsock(fd) => loop {
                // SAFETY: accept4 with null address pointers is allowed.
                let raw = unsafe {
                    libc::accept4(
                        fd.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                };
                if raw >= 0 {
                    // SAFETY: accept4 returned a fresh fd that we now own.
                    return Ok(Socket::from_fd(unsafe { OwnedFd::from_raw_fd(raw) }));
                }
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            },
        }
    }
}

/// Accept connections forever, each served on its own thread (the
/// console port: one session after another).
pub fn serve(listener: &Listener, config: &Arc<AgentConfig>) {
    if let Listener::Console(dev) = listener {
        serve_port(dev, config);
        return;
    }
    loop {
        match listener.accept() {
            Ok(sock) => {
                let config = Arc::clone(config);
                let spawned = std::thread::Builder::new()
                    .name("provium-conn".into())
                    .spawn(move || conn::serve(sock, config, dispatch::handle));
                if let Err(e) = spawned {
                    eprintln!("provium-agent: cannot start a connection thread: {e}");
                }
            }
            Err(e) => {
                // EMFILE/ENOMEM and the like: back off instead of spinning.
                eprintln!("provium-agent: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Serves host sessions on the console port `dev`, one at a time, forever
/// (the port's own rules are in `crate::port`; the session loop lives here,
/// beside the vsock accept loop, so `port` need not import `conn`).
pub fn serve_port(dev: &str, config: &Arc<AgentConfig>) {
    loop {
        let fd = match port::open_port(dev) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("provium-agent: cannot open console port /dev/{dev}: {e}");
                std::thread::sleep(std::time::Duration::from_secs(1));
                continue;
            }
        };
        if let Err(e) = port::wait_for_host(std::os::fd::AsRawFd::as_raw_fd(&fd)) {
            eprintln!("provium-agent: console port /dev/{dev}: {e}");
            continue;
        }
        let port = match port::PortFd::new(fd) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("provium-agent: console port /dev/{dev}: {e}");
                std::thread::sleep(std::time::Duration::from_secs(1));
                continue;
            }
        };
        conn::serve(
            Socket::from_port(Arc::clone(&port)),
            Arc::clone(config),
            dispatch::handle,
        );
        // The session is over: close the port so the device may start the
        // next one (after our next open).
        port.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            "unix:/tmp/a.sock".parse::<ListenAddr>(),
            Ok(ListenAddr::Unix("/tmp/a.sock".into()))
        );
        assert_eq!(
            "vsock:1024".parse::<ListenAddr>(),
            Ok(ListenAddr::Vsock(1024))
        );
        assert_eq!(ListenAddr::default(), ListenAddr::Auto);
        assert_eq!("console".parse::<ListenAddr>(), Ok(ListenAddr::Console));
        assert_eq!("auto".parse::<ListenAddr>(), Ok(ListenAddr::Auto));
        assert_eq!(ListenAddr::Console.to_string(), "console");
        assert!("vsock:x"
            .parse::<ListenAddr>()
            .unwrap_err()
            .contains("must be a number"));
        assert!("tcp:1"
            .parse::<ListenAddr>()
            .unwrap_err()
            .contains("neither"));
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert_eq!(ListenAddr::Vsock(5).to_string(), "vsock:5");
    }

    #[test]
    fn the_harness_names_the_channel_on_the_command_line() {
        assert_eq!(channel_from_cmdline("quiet console=ttyS0"), Ok(None));
        assert_eq!(
            channel_from_cmdline("provium.agent_channel=vsock provium.agent_channel=console"),
            Ok(Some(ListenAddr::Console)),
            "the last word wins"
        );
        assert_eq!(
            channel_from_cmdline("provium.agent_channel=vsock"),
            Ok(Some(ListenAddr::Vsock(1024)))
        );
        assert!(channel_from_cmdline("provium.agent_channel=tcp")
            .unwrap_err()
            .contains("expected vsock or console"));
        // Concrete addresses are not touched.
        assert_eq!(resolve(&ListenAddr::Console), ListenAddr::Console);
    }

    #[test]
    fn stale_unix_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let addr = ListenAddr::Unix(dir.path().join("a.sock"));
        let first = bind(&addr).unwrap();
        drop(first);
        bind(&addr).unwrap();
    }

    #[test]
    fn a_unix_socket_accepts_as_soon_as_its_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let _listener = bind(&ListenAddr::Unix(path.clone())).unwrap();
        std::os::unix::net::UnixStream::connect(&path).expect("connect at the final name");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("agent.sock")],
            "no staged name is left"
        );
    }
}
