//! One reader thread for many TAP fds.
//!
//! A [`TapPoller`] waits in `epoll_wait(2)` on every TAP fd registered with
//! it and forwards what they hand over into their switch ports, one batch
//! per ready fd per round (level-triggered, so a fd with more waiting comes
//! back in the next round and no fd starves the others).
//!
//! # Why one thread for a bridge's TAPs
//! Forwarding runs in the reader's thread, and a frame written into a
//! receiving TAP is processed by the receiving sandbox's stack right there,
//! inside our `writev`: an ICMP echo reply, or the ACK for a TCP segment, is
//! already queued on the receiving TAP when the write returns. With a
//! thread per TAP that reply wakes a second, sleeping reader; with one
//! poller for the bridge the thread that wrote the request is still running
//! and finds the reply in its next, non-sleeping `epoll_wait`. An echo then
//! costs one wake-up of ours instead of two, and a TCP stream's data and
//! ACKs no longer bounce between two threads. The price is one core per
//! poller for all of its TAPs; [`TapPort::attach`](super::TapPort::attach)
//! still gives a port a poller of its own where that matters more.
//!
//! Registration and removal go through a command list and an eventfd, so
//! the poller thread is the only one that touches its registrations;
//! [`TapPoller::remove`] waits until the thread has dropped the fd, so a
//! removed TAP is neither read nor held open afterwards.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{read_one, RX_BATCH};
use crate::mac::MAX_FRAME_BYTES;
use crate::offload::{VnetHdr, VNET_HDR_BYTES};
use crate::switch::Port;

/// The epoll token of the command eventfd; TAP tokens start above it.
const COMMAND_TOKEN: u64 = 0;

/// Ready fds taken from one `epoll_wait`.
const EVENTS_PER_WAIT: usize = 64;

/// One TAP fd and the port its frames go to.
struct Registration {
    port: Arc<Port>,
    fd: Arc<OwnedFd>,
    vnet: bool,
}

enum Command {
    Add(u64, Registration),
    /// Forget the fd; the sender is told once the thread has dropped it.
    Remove(u64, mpsc::Sender<()>),
    /// Ends the thread as a bug in the forwarding path would.
    #[cfg(test)]
    Panic,
}

/// Commands for the poller thread, and whether it still takes them.
#[derive(Default)]
struct Commands {
    pending: Vec<Command>,
    /// The thread has ended: a command would never be read.
    thread_gone: bool,
}

/// What the poller thread and its handles share.
struct Shared {
    epoll: Epoll,
    commands_ready: EventFd,
    commands: Mutex<Commands>,
    next_token: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn lock_commands(&self) -> std::sync::MutexGuard<'_, Commands> {
        self.commands.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn submit(&self, cmd: Command) {
        let mut commands = self.lock_commands();
        if commands.thread_gone {
            // Dropped here: a waiting `remove` sees its channel close.
            return;
        }
        commands.pending.push(cmd);
        drop(commands);
        // An eventfd write fails only when its counter would overflow,
        // which a pending wake-up already covers.
        let _ = self.commands_ready.write(1);
    }
}

/// Marks the thread gone however it ends (a broken epoll fd, or a panic
/// in the forwarding path), dropping what it will never read, so no
/// [`TapPoller::remove`] waits for it forever.
struct GoneOnExit(Arc<Shared>);

impl Drop for GoneOnExit {
    fn drop(&mut self) {
        let mut commands = self.0.lock_commands();
        commands.thread_gone = true;
        commands.pending.clear();
    }
}

/// Stops and joins the thread when the last handle goes.
struct Thread {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Thread {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.commands_ready.write(1);
        if let Some(h) = self.handle.take() {
            // Never join ourselves (a handle dropped on the poller thread).
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// A reader thread serving any number of TAP fds; cloning shares it. The
/// thread stops when the last clone (including those held by the
/// [`TapPort`](super::TapPort)s on it) is dropped.
#[derive(Clone)]
pub struct TapPoller {
    shared: Arc<Shared>,
    _thread: Arc<Thread>,
}

impl std::fmt::Debug for TapPoller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapPoller").finish_non_exhaustive()
    }
}

impl TapPoller {
    /// Starts a poller thread named `tap-poll-{name}`.
    pub fn new(name: &str) -> io::Result<TapPoller> {
        let epoll = Epoll::new()?;
        let commands_ready = EventFd::new(EFD_NONBLOCK)?;
        epoll.ctl(
            ControlOperation::Add,
            commands_ready.as_raw_fd(),
            EpollEvent::new(EventSet::IN, COMMAND_TOKEN),
        )?;
        let shared = Arc::new(Shared {
            epoll,
            commands_ready,
            commands: Mutex::new(Commands::default()),
            next_token: AtomicU64::new(COMMAND_TOKEN + 1),
            stop: AtomicBool::new(false),
        });
        let handle = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("tap-poll-{name}"))
                .spawn(move || {
                    let _gone = GoneOnExit(Arc::clone(&shared));
                    PollLoop::new(shared).run();
                })?
        };
        let thread = Arc::new(Thread {
            shared: Arc::clone(&shared),
            handle: Some(handle),
        });
        Ok(TapPoller {
            shared,
            _thread: thread,
        })
    }

    /// Starts reading `fd` into `port`; returns the token that removes it.
    pub(super) fn add(&self, port: Arc<Port>, fd: Arc<OwnedFd>, vnet: bool) -> u64 {
        let token = self.shared.next_token.fetch_add(1, Ordering::Relaxed);
        self.shared
            .submit(Command::Add(token, Registration { port, fd, vnet }));
        token
    }

    /// Stops reading the fd registered as `token` and returns once the
    /// poller thread no longer holds it (at once if the thread has ended:
    /// its registrations went with it).
    pub(super) fn remove(&self, token: u64) {
        let (done, wait) = mpsc::channel();
        self.shared.submit(Command::Remove(token, done));
        // An error means the thread is gone, and with it the fd.
        let _ = wait.recv();
    }
}

/// The poller thread's state: its registrations and one set of read
/// buffers, shared by every fd because the thread reads one fd at a time.
struct PollLoop {
    shared: Arc<Shared>,
    registered: HashMap<u64, Registration>,
    /// One byte more than the largest accepted frame, so an oversized frame
    /// is seen as oversized (and counted) rather than silently cut.
    bufs: Vec<Vec<u8>>,
    hdrs: [[u8; VNET_HDR_BYTES]; RX_BATCH],
    lens: [usize; RX_BATCH],
}

impl PollLoop {
    fn new(shared: Arc<Shared>) -> PollLoop {
        PollLoop {
            shared,
            registered: HashMap::new(),
            bufs: (0..RX_BATCH)
                .map(|_| vec![0u8; MAX_FRAME_BYTES + 1])
                .collect(),
            hdrs: [[0u8; VNET_HDR_BYTES]; RX_BATCH],
            lens: [0; RX_BATCH],
        }
    }

    fn run(mut self) {
        let mut events = [EpollEvent::default(); EVENTS_PER_WAIT];
        loop {
            let n = match self.shared.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Only a broken epoll fd fails here; nothing more can be read.
                Err(_) => return,
            };
            for ev in &events[..n] {
                let token = ev.data();
                if token == COMMAND_TOKEN {
                    let _ = self.shared.commands_ready.read();
                    if self.shared.stop.load(Ordering::Acquire) {
                        return;
                    }
                    self.apply_commands();
                    continue;
                }
                let hung_up = ev
                    .event_set()
                    .intersects(EventSet::ERROR | EventSet::HANG_UP);
                if hung_up {
                    // The TAP is gone or broken: stop polling it (its port
                    // stays attached until its TapPort is dropped).
                    self.forget(token);
                } else {
                    self.forward_one_batch(token);
                }
            }
        }
    }

    fn apply_commands(&mut self) {
        let commands = std::mem::take(&mut self.shared.lock_commands().pending);
        for cmd in commands {
            match cmd {
                Command::Add(token, reg) => {
                    let added = self.shared.epoll.ctl(
                        ControlOperation::Add,
                        reg.fd.as_raw_fd(),
                        EpollEvent::new(EventSet::IN, token),
                    );
                    // A fd epoll refuses (never for a TAP) is not read, as
                    // the thread-per-TAP reader did not read a fd poll
                    // reported broken.
                    if added.is_ok() {
                        self.registered.insert(token, reg);
                    }
                }
                Command::Remove(token, done) => {
                    self.forget(token);
                    let _ = done.send(());
                }
                #[cfg(test)]
                Command::Panic => panic!("poller thread ended by a test"),
            }
        }
    }

    fn forget(&mut self, token: u64) {
        if let Some(reg) = self.registered.remove(&token) {
            let _ = self.shared.epoll.ctl(
                ControlOperation::Delete,
                reg.fd.as_raw_fd(),
                EpollEvent::default(),
            );
        }
    }

    /// Reads up to [`RX_BATCH`] frames from one fd and forwards them as one
    /// batch; what is left waits for the next round.
    fn forward_one_batch(&mut self, token: u64) {
        let Some(reg) = self.registered.get(&token) else {
            // Removed earlier in this round.
            return;
        };
        let mut n = 0;
        while n < RX_BATCH {
            match read_one(
                std::os::fd::AsFd::as_fd(&*reg.fd),
                reg.vnet,
                &mut self.hdrs[n],
                &mut self.bufs[n],
            ) {
                Some(len) => {
                    self.lens[n] = len;
                    n += 1;
                }
                None => break,
            }
        }
        if n == 0 {
            return;
        }
        let (hdrs, bufs, lens, vnet) = (&self.hdrs, &self.bufs, &self.lens, reg.vnet);
        // Refusals are counted on the port; the poller carries on.
        reg.port.send_batch((0..n).map(|i| {
            let hdr = if vnet {
                VnetHdr::from_bytes(&hdrs[i]).unwrap_or_default()
            } else {
                VnetHdr::default()
            };
            (hdr, &bufs[i][..lens[i]])
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use super::{Command, TapPoller};
    use crate::mac::MacAddr;
    use crate::switch::{Switch, SwitchConfig};

    /// A fd the poller can watch: the read end of a pipe.
    fn pipe_read_end() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two fresh fds into the array.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both fds are fresh and ours.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn removing_from_a_poller_whose_thread_ended_returns() {
        // The whole scenario runs in a thread of its own, so that a
        // regression fails this test after the timeout instead of hanging.
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            let sw = Switch::new("lan", SwitchConfig::default());
            let port = Arc::new(sw.attach("p", MacAddr::local(1)).unwrap());
            let poller = TapPoller::new("gone").unwrap();
            let (read, _write) = pipe_read_end();
            let token = poller.add(Arc::clone(&port), Arc::new(read), false);
            poller.shared.submit(Command::Panic);
            // Queued before or after the thread ends, the removal must come
            // back rather than wait forever.
            poller.remove(token);
            // So must a later one, and the last handle's drop joins the
            // ended thread.
            let (read2, _write2) = pipe_read_end();
            let token2 = poller.add(port, Arc::new(read2), false);
            poller.remove(token2);
            drop(poller);
            let _ = done.send(());
        });
        assert!(
            finished.recv_timeout(Duration::from_secs(20)).is_ok(),
            "remove() or drop hung on a poller whose thread had ended"
        );
    }
}
