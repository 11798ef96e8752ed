//! What a backend's guests can do, asked before acting: the Lua layer
//! refuses an op the guest lacks with the backend's own reason, and
//! chooses how to wire NICs and disks, without knowing which backend runs.

/// Whether a guest can do something; when not, why (the refusal, as a
/// user reads it: what is missing and what to use instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    Yes,
    No(&'static str),
}

impl Support {
    pub fn is_yes(self) -> bool {
        self == Support::Yes
    }

    /// The refusal text, `None` when supported.
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            Support::Yes => None,
            Support::No(why) => Some(why),
        }
    }
}

/// How a guest's NICs come to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicKind {
    /// VMM devices given at boot ([`super::MachineSpec::nics`], one per
    /// bridge attached before boot); a booted guest gets no new one.
    VmmDevices,
    /// Host TAPs created after boot ([`super::Guest::open_nic`]).
    HostTaps,
}

/// What every guest of one backend can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend's name, as `--vmm` spells it.
    pub backend: &'static str,
    /// Block devices ([`super::MachineSpec::drives`]), given at boot only.
    pub disks: Support,
    pub nics: NicKind,
    /// `vm:attach_disk` / `disk:detach()` on a running guest
    /// ([`super::Guest::add_disk`]).
    pub disks_after_boot: Support,
    /// A VMM NIC for a running guest ([`super::Guest::add_nic`]); a
    /// HostTaps guest opens TAPs instead.
    pub nics_after_boot: Support,
    /// A warm reset that reboots the guest's kernel.
    pub reset: Support,
    /// A power button the guest's kernel answers.
    pub power_button: Support,
    /// A serial console the harness reads and writes.
    pub console: Support,
    /// The guest's random device takes [`super::MachineSpec::rng_seed`]
    /// (so a restore may pin the snapshot's seed).
    pub seeded_rng: bool,
    /// A snapshot holds the guest's device state (disks, NICs), so a
    /// restore needs the same devices back.
    pub device_snapshots: bool,
}

impl Capabilities {
    /// Whether NICs are VMM devices given at boot (not TAPs after it).
    pub fn has_vmm_nics(&self) -> bool {
        self.nics == NicKind::VmmDevices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_carries_its_reason() {
        assert_eq!(Support::Yes.refusal(), None);
        assert!(Support::Yes.is_yes());
        let no = Support::No("reset needs the kvm backend");
        assert!(!no.is_yes());
        assert_eq!(no.refusal(), Some("reset needs the kvm backend"));
    }

    #[test]
    fn the_backends_answer_as_they_are_built() {
        let local = crate::backend::local::guest::LOCAL_CAPABILITIES;
        let kvm = crate::backend::kvm::guest::KVM_CAPABILITIES;
        assert!(!local.has_vmm_nics() && kvm.has_vmm_nics());
        assert_eq!(
            local.reset.refusal(),
            Some("reset needs the kvm backend (the local sandbox has no kernel to reboot)")
        );
        assert_eq!(
            local.power_button.refusal(),
            Some("power_button needs the kvm backend (the local sandbox has no i8042 to press)")
        );
        assert!(kvm.reset.is_yes() && kvm.power_button.is_yes() && kvm.console.is_yes());
        assert!(kvm.disks.is_yes() && !local.disks.is_yes());
        assert!(kvm.seeded_rng && kvm.device_snapshots);
        assert!(!local.seeded_rng && !local.device_snapshots);
    }
}
