//! Where the agent listens: `unix:PATH` (the local backend, tests) or
//! `vsock:PORT` (inside a guest, any CID), and the accept loop.
//!
//! Every accepted connection is served on its own thread and is independent
//! of the others: its own handles, processes, streams and workers.

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
use crate::socket::Socket;
use crate::AgentConfig;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Vsock(u32),
}

impl Default for ListenAddr {
    fn default() -> Self {
        ListenAddr::Vsock(provium_protocol::AGENT_VSOCK_PORT)
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
        Err(format!(
            "listen address `{s}` is neither unix:PATH nor vsock:PORT"
        ))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Vsock(port) => write!(f, "vsock:{port}"),
        }
    }
}

pub enum Listener {
    Unix(UnixListener),
    Vsock(OwnedFd),
}

/// Bind and listen. A stale Unix socket file at the path is replaced.
pub fn bind(addr: &ListenAddr) -> io::Result<Listener> {
    match addr {
        ListenAddr::Unix(path) => {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if meta.file_type().is_socket() {
                    std::fs::remove_file(path)?;
                }
            }
            UnixListener::bind(path).map(Listener::Unix)
        }
        ListenAddr::Vsock(port) => bind_vsock(*port).map(Listener::Vsock),
    }
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

/// Accept connections forever, each served on its own thread.
pub fn serve(listener: &Listener, config: &Arc<AgentConfig>) {
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
        assert_eq!(ListenAddr::default(), ListenAddr::Vsock(1024));
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
    fn stale_unix_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let addr = ListenAddr::Unix(dir.path().join("a.sock"));
        let first = bind(&addr).unwrap();
        drop(first);
        bind(&addr).unwrap();
    }
}
