//! The console channel: the agent's session on the virtio-console port
//! named [`AGENT_PORT_NAME`], for guest kernels without vsock.
//!
//! The port is found by its name in `/sys/class/virtio-ports/*/name` (the
//! `/dev/virtio-ports/<name>` links are udev's, and there is no udev here)
//! and opened raw: it is a character device, not a tty, so no line
//! discipline touches the bytes (a tty is refused).
//!
//! One session at a time, and sessions never mix (the device's side of the
//! rule is in the VMM's `devices/virtio/console` docs):
//! 1. open the port (the device hears PORT_OPEN 1);
//! 2. wait until the host is connected: poll reports POLLHUP while it is
//!    not, and Linux has no event for "host connected" but SIGIO, so this
//!    waits in [`HOST_POLL_MS`] steps;
//! 3. serve one connection (`crate::conn::serve`, from `crate::listen::serve_port`) until end of file: the
//!    host closed, or the device ended the session (a new host connect, a
//!    restore from a snapshot);
//! 4. close the port. Linux discards what the port still buffers, and the
//!    device starts the next session only after this close and the next
//!    open, so half a frame from before can never start the next session.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The port's name (the VMM's `AGENT_PORT_NAME`).
pub const AGENT_PORT_NAME: &str = "org.provium.agent";

/// How often the agent looks for the host while it is not connected.
pub const HOST_POLL_MS: u64 = 10;

/// How often the agent looks for the port while the driver has not named it yet.
const FIND_POLL_MS: u64 = 20;

/// The port of one session: the fd, and a way to wake and end every
/// reader and writer of it before it is closed (a blocked read on a virtio
/// port is not woken by a close on another thread).
#[derive(Debug)]
pub struct PortFd {
    /// `None` once closed. Readers and writers hold the read lock only
    /// around non-blocking calls and polls that `wake` ends.
    fd: RwLock<Option<OwnedFd>>,
    /// An eventfd, readable once the session is shut.
    wake: OwnedFd,
    shut: AtomicBool,
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with constant flags; the fd is owned right below.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Polls `fd` for `events` and `wake` for readability; returns `fd`'s
/// revents, or `None` when `wake` fired.
fn poll2(fd: RawFd, events: libc::c_short, wake: RawFd) -> io::Result<Option<libc::c_short>> {
    let mut fds = [
        libc::pollfd {
            fd,
            events,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds for the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    if fds[1].revents != 0 {
        return Ok(None);
    }
    Ok(Some(fds[0].revents))
}

impl PortFd {
    /// A session over `fd` (made non-blocking here).
    pub fn new(fd: OwnedFd) -> io::Result<Arc<PortFd>> {
        set_nonblocking(fd.as_raw_fd())?;
        Ok(Arc::new(PortFd {
            fd: RwLock::new(Some(fd)),
            wake: eventfd()?,
            shut: AtomicBool::new(false),
        }))
    }

    /// Ends the session: readers see end of file, writers `EPIPE`.
    pub fn shut(&self) {
        self.shut.store(true, Ordering::Release);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from `one` to our eventfd. It cannot
        // overflow: it is written at most a few times per session.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Shuts the session and closes the port fd (once every reader and
    /// writer has let go of it, which `shut` makes them do at once).
    pub fn close(&self) {
        self.shut();
        let mut fd = self.fd.write().unwrap_or_else(|e| e.into_inner());
        *fd = None;
    }

    fn is_shut(&self) -> bool {
        self.shut.load(Ordering::Acquire)
    }

    /// Reads; 0 is end of file (the host went away, or the session was shut).
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let guard = self.fd.read().unwrap_or_else(|e| e.into_inner());
            let Some(fd) = guard.as_ref() else {
                return Ok(0);
            };
            if self.is_shut() {
                return Ok(0);
            }
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n.unsigned_abs());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    if poll2(fd.as_raw_fd(), libc::POLLIN, self.wake.as_raw_fd())?.is_none() {
                        return Ok(0);
                    }
                }
                _ => return Err(e),
            }
        }
    }

    /// Writes some of `buf`; `EPIPE` once the host is gone or the session shut.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        let gone = || io::Error::from(io::ErrorKind::BrokenPipe);
        loop {
            let guard = self.fd.read().unwrap_or_else(|e| e.into_inner());
            let Some(fd) = guard.as_ref() else {
                return Err(gone());
            };
            if self.is_shut() {
                return Err(gone());
            }
            // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
            let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n.unsigned_abs());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    match poll2(fd.as_raw_fd(), libc::POLLOUT, self.wake.as_raw_fd())? {
                        None => return Err(gone()),
                        // A port whose host is gone reports POLLHUP and
                        // never becomes writable.
                        Some(r) if r & libc::POLLOUT == 0 && r & libc::POLLHUP != 0 => {
                            return Err(gone())
                        }
                        Some(_) => {}
                    }
                }
                _ => return Err(e),
            }
        }
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd the caller owns; no memory is touched.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The `/dev` node of the virtio port named `name`, from `sys` (normally
/// `/sys/class/virtio-ports`): the directory whose `name` file says so.
pub fn find_port(sys: &Path, name: &str) -> Option<String> {
    let mut found: Vec<String> = fs::read_dir(sys)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim_end() == name))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Opens `/dev/<dev>` raw (read-write, no controlling tty), creating the
/// node from sysfs's `dev` when devtmpfs has not; refuses a tty.
pub fn open_port(dev: &str) -> io::Result<OwnedFd> {
    let path = PathBuf::from("/dev").join(dev);
    if !path.exists() {
        let majmin =
            fs::read_to_string(Path::new("/sys/class/virtio-ports").join(dev).join("dev"))?;
        let (maj, min) = majmin
            .trim()
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
            .ok_or_else(|| io::Error::other(format!("bad dev number `{}`", majmin.trim())))?;
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        // SAFETY: mknod with a NUL-terminated path; no memory is kept.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(maj, min)) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: open with a NUL-terminated path; the fd is owned right below.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: isatty on our fd; no memory is touched.
    if unsafe { libc::isatty(fd.as_raw_fd()) } == 1 {
        return Err(io::Error::other(format!(
            "{} is a tty (a console port): its line discipline would change the bytes",
            path.display()
        )));
    }
    Ok(fd)
}

/// Waits until the host is connected to the open port `fd` (poll reports
/// no POLLHUP).
pub fn wait_for_host(fd: RawFd) -> io::Result<()> {
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        let rc = unsafe { libc::poll(&mut p, 1, 0) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else if p.revents & libc::POLLHUP == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(HOST_POLL_MS));
    }
}

/// Waits for the port to be named (the driver announces it after boot),
/// saying once when that takes long.
pub fn wait_for_port() -> String {
    let start = Instant::now();
    let mut told = false;
    loop {
        if let Some(dev) = find_port(Path::new("/sys/class/virtio-ports"), AGENT_PORT_NAME) {
            return dev;
        }
        if !told && start.elapsed() > Duration::from_secs(10) {
            told = true;
            eprintln!(
                "provium-agent: no virtio-console port named {AGENT_PORT_NAME} yet \
                 (does the guest kernel have CONFIG_VIRTIO_CONSOLE, and the VMM a console device?)"
            );
        }
        std::thread::sleep(Duration::from_millis(FIND_POLL_MS));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::Socket;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_port_is_found_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for (dev, name) in [("vport1p1", "other"), ("vport0p0", AGENT_PORT_NAME)] {
            fs::create_dir(dir.path().join(dev)).unwrap();
            fs::write(dir.path().join(dev).join("name"), format!("{name}\n")).unwrap();
        }
        fs::create_dir(dir.path().join("vport2p0")).unwrap();
        assert_eq!(
            find_port(dir.path(), AGENT_PORT_NAME).as_deref(),
            Some("vport0p0")
        );
        assert_eq!(find_port(dir.path(), "nothing"), None);
        assert_eq!(
            find_port(&dir.path().join("missing"), AGENT_PORT_NAME),
            None
        );
    }

    /// A session reads and writes; shutting it wakes a blocked reader with
    /// end of file and fails writes; after close nothing touches the fd.
    #[test]
    fn a_session_is_shut_and_closed_under_its_readers() {
        let (a, mut host) = UnixStream::pair().unwrap();
        let port = PortFd::new(OwnedFd::from(a)).unwrap();
        let sock = Socket::from_port(Arc::clone(&port));
        (&sock).write_all(b"to host").unwrap();
        let mut b = [0u8; 7];
        host.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"to host");
        host.write_all(b"hi").unwrap();
        let mut r = [0u8; 8];
        assert_eq!((&sock).read(&mut r).unwrap(), 2);
        let reader = sock.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            let mut r = [0u8; 8];
            (&reader).read(&mut r).unwrap()
        });
        // The reader blocks (nothing to read) until the session is shut.
        std::thread::sleep(Duration::from_millis(50));
        sock.shutdown();
        assert_eq!(t.join().unwrap(), 0, "a shut session reads end of file");
        assert!((&sock).write(b"x").is_err());
        port.close();
        assert_eq!((&sock).read(&mut r).unwrap(), 0);
        // The host end sees the port closed.
        let mut rest = Vec::new();
        host.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn a_host_that_hangs_up_is_end_of_file() {
        let (a, host) = UnixStream::pair().unwrap();
        let port = PortFd::new(OwnedFd::from(a)).unwrap();
        drop(host);
        let mut r = [0u8; 8];
        assert_eq!(port.read(&mut r).unwrap(), 0);
        assert!(port.write(b"x").is_err());
    }
}
