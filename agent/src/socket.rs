//! A host connection as `Read`/`Write`: a connected stream socket (Unix or
//! vsock) as a plain fd, or the virtio-console port's session
//! ([`crate::port::PortFd`]).
//!
//! std has no vsock type, and the agent treats both transports alike, so a
//! socket connection is just an owned fd. Writes use `send(MSG_NOSIGNAL)` so
//! a host that hung up produces `EPIPE`, never a signal.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use crate::port::PortFd;

#[derive(Debug)]
pub struct Socket {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Stream(OwnedFd),
    Port(Arc<PortFd>),
}

impl Socket {
    pub fn from_fd(fd: OwnedFd) -> Self {
        Socket {
            inner: Inner::Stream(fd),
        }
    }

    /// A session on the console port.
    pub fn from_port(port: Arc<PortFd>) -> Self {
        Socket {
            inner: Inner::Port(port),
        }
    }

    /// A second handle on the same socket (the reader keeps one, the writer another).
    pub fn try_clone(&self) -> io::Result<Socket> {
        let inner = match &self.inner {
            Inner::Stream(fd) => Inner::Stream(fd.try_clone()?),
            Inner::Port(p) => Inner::Port(Arc::clone(p)),
        };
        Ok(Socket { inner })
    }

    /// Shut both directions down: a reader blocked on the other handle wakes
    /// with end of stream, and the host sees the connection close.
    pub fn shutdown(&self) {
        match &self.inner {
            // SAFETY: shutdown(2) on an fd we own; it touches no memory.
            Inner::Stream(fd) => unsafe {
                libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR);
            },
            Inner::Port(p) => p.shut(),
        }
    }
}

impl Read for &Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = match &self.inner {
            Inner::Stream(fd) => fd,
            Inner::Port(p) => return p.read(buf),
        };
        loop {
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n.unsigned_abs());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

impl Write for &Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let fd = match &self.inner {
            Inner::Stream(fd) => fd,
            Inner::Port(p) => return p.write(buf),
        };
        loop {
            // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the call.
            let n = unsafe {
                libc::send(
                    fd.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n.unsigned_abs());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn read_write_and_shutdown() {
        let (a, b) = UnixStream::pair().unwrap();
        let a = Socket::from_fd(a.into());
        let mut b = Socket::from_fd(b.into());
        (&a).write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        let reader = b.try_clone().unwrap();
        b.shutdown();
        assert_eq!((&reader).read(&mut buf).unwrap(), 0);
        // The peer has shut down: writing fails with EPIPE instead of a signal.
        drop(reader);
        drop(b);
        assert!((&a).write(b"x").is_err());
    }
}
