//! A mock [`VsockBackend`] for unit tests: host connects are pushed by the
//! test, guest connects are accepted on the ports it names (or refused),
//! and every call is recorded.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Mutex, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use super::{ConnectRequest, VsockBackend, VsockConnectError};

#[derive(Default)]
struct MockState {
    active: bool,
    connects: Vec<ConnectRequest>,
    listening: HashSet<u32>,
    /// Host ends of accepted guest connections, with their port.
    accepted: Vec<(u32, UnixStream)>,
    /// `set_active` calls, in order.
    activations: Vec<bool>,
    /// Guest connects asked for, by port (accepted or not).
    guest_connects: Vec<u32>,
}

/// The mock backend.
pub struct TestBackend {
    guest_cid: u64,
    wake: EventFd,
    state: Mutex<MockState>,
}

impl TestBackend {
    /// A backend for a guest with `guest_cid`.
    pub fn new(guest_cid: u64) -> TestBackend {
        TestBackend {
            guest_cid,
            wake: EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
            state: Mutex::new(MockState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, MockState> {
        self.state
            .lock()
            .expect("no test thread panicked holding it")
    }

    /// Guest connects to `port` are accepted from now on.
    pub fn listen(&self, port: u32) {
        self.state().listening.insert(port);
    }

    /// The host asks to connect to guest `port`: returns the host's end and
    /// where the outcome arrives.
    pub fn push_connect(&self, port: u32) -> (UnixStream, Receiver<Result<(), VsockConnectError>>) {
        let (mine, theirs) = UnixStream::pair().expect("socketpair");
        let (reply, rx) = channel();
        self.state().connects.push(ConnectRequest {
            port,
            stream: theirs,
            reply,
        });
        self.wake.write(1).expect("wake");
        (mine, rx)
    }

    /// Whether the device last said its driver runs.
    pub fn is_active(&self) -> bool {
        self.state().active
    }

    /// `set_active` calls so far.
    pub fn activations(&self) -> Vec<bool> {
        self.state().activations.clone()
    }

    /// Host connects the device has not taken yet.
    pub fn waiting_connects(&self) -> usize {
        self.state().connects.len()
    }

    /// Ports the guest asked to connect to.
    pub fn guest_connects(&self) -> Vec<u32> {
        self.state().guest_connects.clone()
    }

    /// Takes the host end of the oldest accepted guest connection.
    pub fn take_accepted(&self) -> Option<(u32, UnixStream)> {
        let mut st = self.state();
        (!st.accepted.is_empty()).then(|| st.accepted.remove(0))
    }
}

impl VsockBackend for TestBackend {
    fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    fn clear_wake(&self) {
        let _ = self.wake.read();
    }

    fn take_connects(&self) -> Vec<ConnectRequest> {
        std::mem::take(&mut self.state().connects)
    }

    fn accept_guest_connect(&self, port: u32) -> Option<UnixStream> {
        let mut st = self.state();
        st.guest_connects.push(port);
        if !st.listening.contains(&port) {
            return None;
        }
        let (mine, theirs) = UnixStream::pair().expect("socketpair");
        st.accepted.push((port, theirs));
        Some(mine)
    }

    fn set_active(&self, active: bool) {
        let mut st = self.state();
        st.active = active;
        st.activations.push(active);
        if !active {
            st.connects.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mock_accepts_only_where_it_listens_and_records_calls() {
        let b = TestBackend::new(9);
        assert_eq!(b.guest_cid(), 9);
        assert!(b.accept_guest_connect(5).is_none());
        b.listen(5);
        assert!(b.accept_guest_connect(5).is_some());
        assert_eq!(b.guest_connects(), [5, 5]);
        assert_eq!(b.take_accepted().map(|(p, _)| p), Some(5));
        let (_s, rx) = b.push_connect(7);
        assert_eq!(b.waiting_connects(), 1);
        b.set_active(true);
        b.set_active(false);
        assert_eq!(b.activations(), [true, false]);
        assert_eq!(b.waiting_connects(), 0);
        assert!(rx.recv().is_err(), "a dropped connect closes its reply");
    }
}
