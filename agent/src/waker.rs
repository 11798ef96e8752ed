//! An eventfd that wakes a thread blocked in poll(2): an ack arrived, a stream
//! was closed, a process was released.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd(2) with constant flags; the fd is owned right below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker {
            // SAFETY: a fresh fd nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN) means
        // a wake-up is already pending, which is all we need.
        unsafe {
            libc::write(self.fd.as_raw_fd(), std::ptr::from_ref(&one).cast(), 8);
        }
    }

    /// Reset the counter after poll reported the fd readable.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN (nothing pending) is fine.
        unsafe {
            libc::read(self.fd.as_raw_fd(), std::ptr::from_mut(&mut v).cast(), 8);
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(w: &Waker) -> bool {
        let mut p = libc::pollfd {
            fd: w.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn wake_then_drain() {
        let w = Waker::new().unwrap();
        assert!(!readable(&w));
        w.wake();
        w.wake();
        assert!(readable(&w));
        w.drain();
        assert!(!readable(&w));
    }
}
