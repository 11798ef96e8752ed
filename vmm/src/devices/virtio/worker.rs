//! The one worker mechanism every virtio device uses: a thread running an
//! event-manager `EventManager` with the device's `MutEventSubscriber` (its
//! `event_handler.rs`) and a stop eventfd.
//!
//! The thread sleeps in epoll until an fd the subscriber registered is ready
//! (queue notify eventfds, backend fds, a [`DeadlineTimer`]) or the device
//! asks it to stop; nothing wakes it periodically. `DeviceWorker::stop`
//! hands the subscriber back, with the queues and in-flight work it owns, so
//! a snapshot can read them and a new worker can take them over.
//!
//! A subscriber maps each readiness event to one `handle_*` method: a
//! device lists its fds with their methods ([`ReadyHandlers`]) and
//! [`ready_subscriber!`] makes that its `MutEventSubscriber`. An event for an
//! fd it does not know goes to [`unexpected_event`], which counts it, logs it
//! and takes the fd out of the set (so a stray level-triggered fd cannot spin
//! the worker), and never panics.

use std::os::fd::{AsRawFd, RawFd};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::ActivateError;

/// The device's subscriber plus the worker's stop eventfd.
struct Stoppable<S> {
    inner: S,
    stop: EventFd,
    stopped: bool,
}

impl<S: MutEventSubscriber> MutEventSubscriber for Stoppable<S> {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events.fd() == self.stop.as_raw_fd() {
            let _ = self.stop.read();
            self.stopped = true;
        } else {
            self.inner.process(events, ops);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        // Without the stop fd the worker could never be stopped; a failure
        // here (out of memory in epoll) leaves it stopped at once instead.
        if ops.add(Events::new(&self.stop, EventSet::IN)).is_err() {
            self.stopped = true;
        }
        self.inner.init(ops);
    }
}

/// A running device worker thread; `stop` gets the subscriber back.
pub struct DeviceWorker<S> {
    stop: EventFd,
    thread: JoinHandle<S>,
}

impl<S: MutEventSubscriber + Send + 'static> DeviceWorker<S> {
    /// Starts a thread called `name` that runs `subscriber`'s events until
    /// `stop`.
    pub fn spawn(name: &str, subscriber: S) -> Result<DeviceWorker<S>, ActivateError> {
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(ActivateError::Worker)?;
        let theirs = stop.try_clone().map_err(ActivateError::Worker)?;
        let mut manager = EventManager::<Stoppable<S>>::new()
            .map_err(|e| ActivateError::Worker(std::io::Error::other(e)))?;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let id = manager.add_subscriber(Stoppable {
                    inner: subscriber,
                    stop: theirs,
                    stopped: false,
                });
                loop {
                    if manager
                        .subscriber_mut(id)
                        .map_or(true, |s: &mut Stoppable<S>| s.stopped)
                    {
                        break;
                    }
                    // epoll_wait only fails for a bad epoll fd or buffer,
                    // which are the manager's own: then stop rather than spin.
                    if manager.run().is_err() {
                        break;
                    }
                }
                manager
                    .remove_subscriber(id)
                    .map(|s| s.inner)
                    .expect("the subscriber added above is still there")
            })
            .map_err(ActivateError::Worker)?;
        Ok(DeviceWorker { stop, thread })
    }

    /// Stops the thread and returns the subscriber (`None` if it panicked).
    pub fn stop(self) -> Option<S> {
        // The eventfd counter holds the request even if the thread is not
        // in epoll_wait yet, so the wait ends either way.
        let _ = self.stop.write(1);
        self.thread.join().ok()
    }
}

/// One fd a worker watches for readability, and the method that handles it.
pub type ReadyHandler<S> = (RawFd, fn(&mut S));

/// A device worker's event sources: `N` fds, each readable-or-not, each
/// with one `handle_*` method.
pub trait ReadyHandlers<const N: usize>: Sized {
    /// Names the device in logs ("virtio-blk").
    const DEVICE: &'static str;

    /// Every fd the worker watches, with the method that handles it.
    fn ready_handlers(&self) -> [ReadyHandler<Self>; N];

    /// The count of events for fds not in `ready_handlers`.
    fn unexpected_events(&mut self) -> &mut u64;

    /// Runs after the fds are watched (`init`): a subscriber taken over
    /// from a stopped worker re-arms its timers here.
    fn after_watch(&mut self) {}

    /// `MutEventSubscriber::process`: the handler for the event's fd, or
    /// [`unexpected_event`].
    fn dispatch(&mut self, events: Events, ops: &mut EventOps) {
        let handler = self
            .ready_handlers()
            .into_iter()
            .find(|(fd, _)| *fd == events.fd());
        match handler {
            Some((_, handle)) => handle(self),
            None => unexpected_event(Self::DEVICE, self.unexpected_events(), events, ops),
        }
    }

    /// `MutEventSubscriber::init`: watch every handler's fd.
    fn watch_all(&mut self, ops: &mut EventOps) {
        for (fd, _) in self.ready_handlers() {
            // Adding a fresh fd to a fresh epoll set only fails when the
            // kernel is out of memory; the device then stays quiet, as it
            // would with a worker that could not start.
            let _ = ops.add(Events::new_raw(fd, EventSet::IN));
        }
        self.after_watch();
    }
}

/// Implements `MutEventSubscriber` for a type that implements
/// [`ReadyHandlers`]: `process` dispatches, `init` watches every fd.
macro_rules! ready_subscriber {
    ($ty:ty, $n:literal) => {
        impl ::event_manager::MutEventSubscriber for $ty {
            fn process(
                &mut self,
                events: ::event_manager::Events,
                ops: &mut ::event_manager::EventOps,
            ) {
                $crate::devices::virtio::worker::ReadyHandlers::<$n>::dispatch(self, events, ops)
            }

            fn init(&mut self, ops: &mut ::event_manager::EventOps) {
                $crate::devices::virtio::worker::ReadyHandlers::<$n>::watch_all(self, ops)
            }
        }
    };
}
pub(crate) use ready_subscriber;

/// What a subscriber does with an event for an fd it does not know: count
/// it, log it and stop watching the fd. Never a panic: the fd set is the
/// subscriber's own, so this is a bug in the VMM, not something to die for.
pub fn unexpected_event(device: &str, count: &mut u64, events: Events, ops: &mut EventOps) {
    *count = count.saturating_add(1);
    eprintln!(
        "provium-vmm: {device} worker got an event for unknown fd {} ({:?}); no longer watching it",
        events.fd(),
        events.event_set()
    );
    let _ = ops.remove(events);
}

/// A one-shot timer for the nearest deadline of a worker (block's `slow`
/// completions, vsock's connection timeouts): a non-blocking timerfd.
pub struct DeadlineTimer {
    timer: TimerFd,
}

impl DeadlineTimer {
    /// A disarmed timer.
    pub fn new() -> std::io::Result<DeadlineTimer> {
        let timer = TimerFd::new()?;
        // SAFETY: fcntl on an fd this function owns; F_SETFL with O_NONBLOCK
        // touches no memory.
        let rc = unsafe { libc::fcntl(timer.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(DeadlineTimer { timer })
    }

    /// Arms the timer for `at` (a deadline already past fires at once), or
    /// disarms it for `None`.
    pub fn arm(&mut self, at: Option<Instant>) {
        let result = match at {
            // A zero `it_value` would disarm the timer: fire in 1 ns instead.
            Some(at) => self.timer.reset(
                at.saturating_duration_since(Instant::now())
                    .max(Duration::from_nanos(1)),
                None,
            ),
            None => self.timer.clear(),
        };
        // timerfd_settime only fails for invalid arguments, which these are not.
        debug_assert!(result.is_ok(), "timerfd_settime: {result:?}");
    }

    /// Consumes an expiry (after the timer's fd was readable). A timer
    /// re-armed meanwhile reads nothing, which is fine: it is non-blocking.
    pub fn acknowledge(&mut self) {
        let _ = self.timer.wait();
    }
}

impl AsRawFd for DeadlineTimer {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.timer.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::assert_stray_fd_is_counted;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Counts kicks on one eventfd.
    struct Counter {
        kick: EventFd,
        kicks: Arc<AtomicU64>,
        unexpected: u64,
    }

    impl MutEventSubscriber for Counter {
        fn process(&mut self, events: Events, ops: &mut EventOps) {
            if events.fd() == self.kick.as_raw_fd() {
                let _ = self.kick.read();
                self.kicks.fetch_add(1, Ordering::SeqCst);
            } else {
                unexpected_event("test", &mut self.unexpected, events, ops);
            }
        }
        fn init(&mut self, ops: &mut EventOps) {
            ops.add(Events::new(&self.kick, EventSet::IN))
                .expect("register kick");
        }
    }

    fn counter() -> (Counter, EventFd, Arc<AtomicU64>) {
        let kick = EventFd::new(libc::EFD_NONBLOCK).expect("eventfd");
        let mine = kick.try_clone().expect("clone");
        let kicks = Arc::new(AtomicU64::new(0));
        let c = Counter {
            kick,
            kicks: kicks.clone(),
            unexpected: 0,
        };
        (c, mine, kicks)
    }

    #[test]
    fn a_worker_handles_kicks_and_hands_its_subscriber_back_on_stop() {
        let (c, kick, kicks) = counter();
        let worker = DeviceWorker::spawn("test-worker", c).expect("spawn");
        kick.write(1).expect("kick");
        let deadline = Instant::now() + Duration::from_secs(10);
        while kicks.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the kick was never handled");
            std::thread::yield_now();
        }
        let back = worker.stop().expect("the worker did not panic");
        assert_eq!(back.unexpected, 0);
    }

    #[test]
    fn an_unknown_fd_is_counted_and_dropped_from_the_set() {
        let (c, _kick, _) = counter();
        let mut em = EventManager::<Counter>::new().expect("event manager");
        let id = em.add_subscriber(c);
        assert_stray_fd_is_counted(&mut em, id, |c| c.unexpected);
    }

    #[test]
    fn a_deadline_timer_fires_once_and_can_be_disarmed() {
        let mut t = DeadlineTimer::new().expect("timer");
        let mut em = EventManager::<Counter>::new().expect("event manager");
        let (c, _kick, _) = counter();
        let id = em.add_subscriber(c);
        em.event_ops(id)
            .expect("ops")
            .add(Events::new(&t, EventSet::IN))
            .expect("add timer");
        t.arm(Some(Instant::now()));
        assert_eq!(em.run_with_timeout(1000).expect("run"), 1);
        t.acknowledge();
        // Acknowledging again neither blocks nor fails.
        t.acknowledge();
        t.arm(Some(Instant::now() + Duration::from_secs(60)));
        t.arm(None);
        // The stray-fd path removed the timer; re-add and check it is quiet.
        em.event_ops(id)
            .expect("ops")
            .add(Events::new(&t, EventSet::IN))
            .expect("re-add timer");
        assert_eq!(em.run_with_timeout(20).expect("run"), 0);
    }
}
