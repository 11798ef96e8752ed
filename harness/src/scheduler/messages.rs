//! The one message type between the dispatcher and its executors. An
//! executor owns nothing of the run's state: it tells the dispatcher what
//! happened to its file (every lifecycle event, then the file's end), and
//! the dispatcher updates the pool, emits the events and calls the
//! reporters.

use provium_protocol::event::ResourceAmount;

use crate::events::Stamped;
use crate::runner::outcome::FileOutcome;

/// What a file holds while it runs: memory and vCPUs from the pool, and
/// host cores for emulated VMs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation {
    pub resources: ResourceAmount,
    /// Host cores held for the file's emulated VMs (0 off kvm_pvm).
    pub emulated_vm_slots: u32,
}

/// Executor → dispatcher. (Signals and pool ticks the dispatcher polls
/// for itself, between messages.)
#[derive(Debug)]
pub enum ExecutorMessage {
    /// A lifecycle event of a running file: sent by the executor itself
    /// (file and test events) and by what runs below it (VM, claim and
    /// fixture events), through the file's `crate::events::EventSender`.
    /// Each file's events come before its [`ExecutorMessage::FileFinished`].
    Lifecycle(Stamped),
    /// The file ran to its end (or crashed); its reservation goes back to
    /// the pool.
    FileFinished {
        outcome: FileOutcome,
        reservation: Reservation,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_reservation_holds_nothing() {
        let r = Reservation::default();
        assert_eq!(r.resources, ResourceAmount::default());
        assert_eq!(r.emulated_vm_slots, 0);
    }
}
