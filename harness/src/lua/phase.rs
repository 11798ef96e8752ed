//! A VM's lifecycle states (the reference's state machine) and the hint
//! each gives an op that needs the VM booted.

/// Where a VM is in its life: created → booted ⇄ paused → shutdown, or
/// dead when its agent or machine went away under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Created,
    Booted,
    Paused,
    Shutdown,
    Dead,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Created => "created",
            Phase::Booted => "booted",
            Phase::Paused => "paused",
            Phase::Shutdown => "shutdown",
            Phase::Dead => "dead",
        }
    }

    /// The reference's wrong-state hint for an op that needs a booted VM:
    /// what the state is and what to do about it.
    pub fn hint(self) -> &'static str {
        match self {
            Phase::Created => "VM not booted; call vm:boot() first",
            Phase::Booted => "VM is booted",
            Phase::Paused => "VM is paused; use resume()",
            Phase::Shutdown => "VM is shutdown; create a new one",
            Phase::Dead => "VM is dead (its agent or machine is gone); create a new one",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phase_has_its_name_and_its_hint() {
        let all = [
            (
                Phase::Created,
                "created",
                "VM not booted; call vm:boot() first",
            ),
            (Phase::Booted, "booted", "VM is booted"),
            (Phase::Paused, "paused", "VM is paused; use resume()"),
            (
                Phase::Shutdown,
                "shutdown",
                "VM is shutdown; create a new one",
            ),
            (
                Phase::Dead,
                "dead",
                "VM is dead (its agent or machine is gone); create a new one",
            ),
        ];
        for (phase, name, hint) in all {
            assert_eq!((phase.as_str(), phase.hint()), (name, hint));
        }
    }
}
