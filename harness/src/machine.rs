//! What `provium bench` still boots through: a thin façade over the
//! backend boundary ([`crate::backend::Backend`]), whose errors it reads as
//! flattened text. Everything else (the Lua layer) holds a
//! [`crate::backend::Guest`] itself. Delete this module once bench builds a
//! [`MachineSpec`] and calls the backend it picked with
//! [`crate::backend::for_kind`].

use crate::backend::{self, BackendKind, Guest, MachineSpec};
use crate::client::AgentClient;
use crate::config::Profile;

/// A VM's declaration and `vm:boot` opts, as bench gives them.
#[derive(Debug, Clone)]
pub struct BootSpec {
    pub vm_name: String,
    pub profile_name: String,
    pub profile: Option<Profile>,
    pub memory_bytes: u64,
    pub cpus: u32,
    pub kernel_cmdline: Option<String>,
    pub rng_seed: Option<u64>,
    pub initial_time: Option<f64>,
    /// The environment `cli::main` read (the agent search, kvm overrides).
    pub settings: crate::settings::Settings,
}

impl BootSpec {
    /// The boundary's shape of it (no files or devices).
    pub fn machine_spec(&self) -> MachineSpec {
        MachineSpec {
            kernel_cmdline: self.kernel_cmdline.clone(),
            rng_seed: self.rng_seed,
            initial_time: self.initial_time,
            settings: self.settings.clone(),
            ..MachineSpec::for_profile(
                &self.vm_name,
                &self.profile_name,
                self.profile.clone(),
                self.memory_bytes,
                self.cpus,
            )
        }
    }
}

/// A running guest. Each one gets a backend value of its own, so kvm ones
/// all have the first CID (bench's guests never meet).
pub struct Machine {
    guest: Box<dyn Guest>,
}

impl Machine {
    pub fn boot(kind: BackendKind, spec: &BootSpec) -> Result<Machine, String> {
        let guest = backend::for_kind(kind)
            .boot(&spec.machine_spec())
            .map_err(|e| crate::error_chain::flatten(&e))?;
        Ok(Machine { guest })
    }

    /// A new machine restored from the snapshot at `path`.
    pub fn restore(
        kind: BackendKind,
        spec: &BootSpec,
        path: &std::path::Path,
    ) -> Result<Machine, String> {
        let guest = backend::for_kind(kind)
            .restore(&spec.machine_spec(), path)
            .map_err(|e| crate::error_chain::flatten(&e))?;
        Ok(Machine { guest })
    }

    pub fn connect(&self) -> Result<AgentClient, String> {
        self.guest
            .connect()
            .map_err(|e| crate::error_chain::flatten(&e))
    }

    /// See [`Guest::resident_memory`].
    pub fn resident_memory(&self) -> (u64, u64) {
        self.guest.resident_memory()
    }

    /// Stop it now; safe to call more than once.
    pub fn kill(&self) {
        self.guest.kill()
    }

    pub fn shutdown(&self) {
        self.guest.kill()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_spec_becomes_a_machine_spec_whole() {
        let spec = BootSpec {
            vm_name: "v".into(),
            profile_name: "p".into(),
            profile: None,
            memory_bytes: 64 << 20,
            cpus: 2,
            kernel_cmdline: Some("quiet".into()),
            rng_seed: Some(7),
            initial_time: Some(1.5),
            settings: Default::default(),
        };
        let m = spec.machine_spec();
        assert_eq!((m.vm_name.as_str(), m.profile_name.as_str()), ("v", "p"));
        assert_eq!((m.memory_bytes, m.cpus), (64 << 20, 2));
        assert_eq!(m.kernel_cmdline.as_deref(), Some("quiet"));
        assert_eq!((m.rng_seed, m.initial_time), (Some(7), Some(1.5)));
        assert!(!m.inject_agent && m.files.is_empty() && m.nics.is_empty());
    }

    #[test]
    fn errors_reach_bench_as_the_flattened_chain() {
        let spec = BootSpec {
            vm_name: "v".into(),
            profile_name: "gone".into(),
            profile: None,
            memory_bytes: 64 << 20,
            cpus: 1,
            kernel_cmdline: None,
            rng_seed: None,
            initial_time: None,
            settings: Default::default(),
        };
        let e = Machine::boot(BackendKind::Kvm, &spec).err().unwrap();
        assert!(e.contains("profile `gone` is not in provium.toml"), "{e}");
    }
}
