//! The lifecycle of a device's worker, written once for every device that
//! has one (block, net, vsock, console).
//!
//! A device holds a [`WorkerSlot`] over its worker-side state `A` (what
//! the worker thread owns: queues, in-flight work, connections). The slot
//! starts a `worker::DeviceWorker` on `A`, keeps a clone of `A`'s notify
//! eventfd so a queue notification from a vCPU thread is one eventfd write,
//! stops the worker and takes `A` back, and for a snapshot parks `A` (the
//! worker stopped, nothing writing guest memory) until the VM resumes, when
//! the same `A` goes to a new worker. Dropping the slot stops the worker.
//!
//! What is the device's own stays in the device: what it tells its host
//! side when a worker starts or stops (vsock's and console's backends,
//! net's port hooks) and how it reads `A` into a snapshot.

use event_manager::MutEventSubscriber;
use vmm_sys_util::eventfd::EventFd;

use super::worker::DeviceWorker;
use super::ActivateError;

/// A device's worker-side state: the subscriber a worker thread runs.
pub trait SlotWorker: MutEventSubscriber + Send + 'static {
    /// The eventfd a queue notification writes (the worker watches it).
    fn notify_fd(&self) -> &EventFd;
}

struct Running<A> {
    worker: DeviceWorker<A>,
    /// A clone of the worker's notify eventfd.
    notify: EventFd,
}

/// A device's worker: none, running, or parked by a snapshot.
pub struct WorkerSlot<A: SlotWorker> {
    /// Names the worker threads ("virtio-blk").
    name: &'static str,
    running: Option<Running<A>>,
    /// What `park` took from the worker, until `resume` or `stop`.
    parked: Option<A>,
}

impl<A: SlotWorker> WorkerSlot<A> {
    /// An empty slot whose worker threads will be called `name`.
    pub fn new(name: &'static str) -> WorkerSlot<A> {
        WorkerSlot {
            name,
            running: None,
            parked: None,
        }
    }

    /// Whether a worker runs.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// What a snapshot parked, if anything.
    pub fn parked(&self) -> Option<&A> {
        self.parked.as_ref()
    }

    /// Runs `active` on a new worker thread. Whatever ran or was parked
    /// before is stopped and dropped first: a device has one worker.
    pub fn start(&mut self, active: A) -> Result<(), ActivateError> {
        drop(self.stop());
        let notify = active
            .notify_fd()
            .try_clone()
            .map_err(ActivateError::Worker)?;
        let worker = DeviceWorker::spawn(self.name, active)?;
        self.running = Some(Running { worker, notify });
        Ok(())
    }

    /// A queue notification: wakes the worker, if one runs.
    pub fn notify(&self) {
        if let Some(r) = &self.running {
            // Only fails when the counter would overflow: a wake-up is
            // pending then, which is all a notification needs.
            let _ = r.notify.write(1);
        }
    }

    /// Stops the worker and returns what it owned (`None` when none ran,
    /// or if it panicked). What was parked stays parked.
    pub fn take(&mut self) -> Option<A> {
        self.running.take()?.worker.stop()
    }

    /// Stops the worker and forgets what was parked (reset, drop). Returns
    /// what the running worker owned, for a device that must shut it down.
    pub fn stop(&mut self) -> Option<A> {
        self.parked = None;
        self.take()
    }

    /// A snapshot: stops the worker and keeps what it owned, quiesced,
    /// until [`Self::resume`]. Returns it for the snapshot to read (what
    /// an earlier `park` kept, if no worker ran since); `None` when the
    /// device was not activated.
    pub fn park(&mut self) -> Option<&A> {
        if let Some(active) = self.take() {
            self.parked = Some(active);
        }
        self.parked.as_ref()
    }

    /// Takes what `park` kept, for a device that restarts it itself.
    pub fn unpark(&mut self) -> Option<A> {
        self.parked.take()
    }

    /// After a snapshot: what `park` kept goes to a new worker (nothing
    /// happens when nothing was parked). A failed spawn leaves the slot
    /// empty, as a failed activation would.
    pub fn resume(&mut self) -> Result<(), ActivateError> {
        match self.parked.take() {
            Some(active) => self.start(active),
            None => Ok(()),
        }
    }
}

impl<A: SlotWorker> Drop for WorkerSlot<A> {
    fn drop(&mut self) {
        // A worker left running would sleep in epoll forever.
        drop(self.stop());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use event_manager::{EventOps, Events};
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use vmm_sys_util::epoll::EventSet;

    /// Counts notifications; `generation` tells one worker's state from another.
    struct Kicks {
        notify: EventFd,
        seen: Arc<AtomicU64>,
        generation: u32,
    }

    impl MutEventSubscriber for Kicks {
        fn process(&mut self, events: Events, _ops: &mut EventOps) {
            if events.fd() == self.notify.as_raw_fd() {
                let _ = self.notify.read();
                self.seen.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn init(&mut self, ops: &mut EventOps) {
            ops.add(Events::new(&self.notify, EventSet::IN))
                .expect("watch notify");
        }
    }

    impl SlotWorker for Kicks {
        fn notify_fd(&self) -> &EventFd {
            &self.notify
        }
    }

    fn kicks(generation: u32) -> (Kicks, Arc<AtomicU64>) {
        let seen = Arc::new(AtomicU64::new(0));
        let k = Kicks {
            notify: EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
            seen: seen.clone(),
            generation,
        };
        (k, seen)
    }

    fn wait_for(seen: &AtomicU64, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "notification never handled");
            std::thread::yield_now();
        }
    }

    #[test]
    fn notify_park_resume_and_stop() {
        let mut slot = WorkerSlot::new("test-slot");
        slot.notify(); // nothing runs: nothing to wake, no panic
        assert!(slot.park().is_none(), "not activated: nothing to park");
        let (k, seen) = kicks(1);
        slot.start(k).expect("start");
        assert!(slot.is_running());
        slot.notify();
        wait_for(&seen, 1);

        // Parked: no worker, the state readable, a notify goes nowhere.
        assert_eq!(slot.park().map(|k| k.generation), Some(1));
        assert!(!slot.is_running());
        slot.notify();
        // A second save before resuming still sees the parked state.
        assert_eq!(slot.park().map(|k| k.generation), Some(1));

        // The same state goes to a new worker, which handles notifies.
        slot.resume().expect("resume");
        assert!(slot.is_running() && slot.parked().is_none());
        slot.notify();
        wait_for(&seen, 2);
        slot.resume().expect("nothing parked: nothing to do");

        // Stop hands the state back and forgets a parked one.
        let back = slot.stop().expect("the worker hands its state back");
        assert_eq!(back.generation, 1);
        assert!(!slot.is_running());
        let (k, _) = kicks(2);
        slot.start(k).expect("start");
        slot.park();
        assert!(slot.stop().is_none(), "nothing ran");
        assert!(slot.parked().is_none(), "a stopped slot keeps nothing");
    }

    #[test]
    fn start_replaces_and_drop_stops() {
        let (a, seen_a) = kicks(1);
        let (b, seen_b) = kicks(2);
        let a_fd = a.notify.try_clone().expect("clone");
        let mut slot = WorkerSlot::new("test-slot");
        slot.start(a).expect("start a");
        slot.start(b).expect("start b replaces a");
        slot.notify();
        wait_for(&seen_b, 1);
        // a's worker is gone: its fd is watched by no one.
        a_fd.write(1).expect("write");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(seen_a.load(Ordering::SeqCst), 0);
        assert_eq!(slot.unpark().map(|k| k.generation), None);
        drop(slot); // joins b's worker: a hang here is the failure
    }
}
