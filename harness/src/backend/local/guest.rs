//! The local backend behind the boundary: [`LocalBackend`] starts a
//! [`LocalSandbox`] for a [`MachineSpec`] (refusing what only a kernel or a
//! VMM could honour), and [`LocalGuest`] is its [`Guest`] handle. A restore
//! is a fresh sandbox with the snapshot's files put back (see
//! `snapshot.rs`), its interface configuration applied once its NICs are
//! on their bridges again.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use super::net::NetError;
use super::snapshot::{self, SandboxSnapshotError};
use super::{locate_agent, LocalError, LocalOptions, LocalSandbox};
use crate::backend::{
    Backend, BackendError, Capabilities, Guest, MachineSpec, NicKind, Stopped, Support,
};
use crate::client::AgentClient;
use crate::lock::Locked;

/// Refusal for virtio-net configs handed to the local backend.
const LOCAL_NICS: &str = "virtio-net devices need the kvm backend (the local sandbox uses TAPs)";
/// Why a local machine takes no drives (the Disk userdata refuses earlier).
const LOCAL_DISKS: &str = "disks need the kvm backend (the local sandbox has no block devices)";
const LOCAL_NO_KERNEL_CMDLINE: &str =
    "kernel_cmdline needs the kvm backend (the local sandbox has no kernel)";
const LOCAL_NO_RNG_SEED: &str =
    "rng_seed needs the kvm backend (the local sandbox uses the host's random device)";
const LOCAL_NO_INITIAL_TIME: &str =
    "initial_time needs the kvm backend (the local sandbox shares the host's clock)";

/// What a sandbox can do: no kernel of its own, so no reset, power button,
/// console or seeded rng; NICs are TAPs made after boot; no block devices.
pub const LOCAL_CAPABILITIES: Capabilities = Capabilities {
    backend: snapshot::BACKEND,
    disks: Support::No(
        "the local backend has no block devices (a sandbox shares the host's kernel, so there \
         is no virtio-blk disk to give it); run with --vmm kvm",
    ),
    nics: NicKind::HostTaps,
    disks_after_boot: Support::No("the local backend's sandboxes have no block devices"),
    nics_after_boot: Support::No("a sandbox's NICs are TAPs (Guest::open_nic)"),
    reset: Support::No("reset needs the kvm backend (the local sandbox has no kernel to reboot)"),
    power_button: Support::No(
        "power_button needs the kvm backend (the local sandbox has no i8042 to press)",
    ),
    console: Support::No("the local backend has no kernel console (use the kvm backend)"),
    seeded_rng: false,
    device_snapshots: false,
};

/// What the local backend's boundary fails with.
#[derive(Debug, thiserror::Error)]
pub enum LocalGuestError {
    /// The spec or call asks for what only a kernel or VMM has (the text
    /// says which, and to use the kvm backend).
    #[error("{0}")]
    Unsupported(&'static str),
    #[error(transparent)]
    Sandbox(#[from] LocalError),
    #[error("sandbox `{name}` is not running")]
    NotRunning { name: String },
    #[error(transparent)]
    Nic(#[from] NetError),
    #[error(transparent)]
    Snapshot(#[from] SandboxSnapshotError),
    #[error(transparent)]
    Agent(#[from] crate::agent_search::AgentSearchError),
}

/// Starts sandboxes. Stateless: a sandbox has no CID.
pub struct LocalBackend;

impl LocalBackend {
    /// A sandbox for `spec`, after refusing what it cannot honour (the
    /// devices first, then the kernel's options, as the Lua layer says them).
    fn start(spec: &MachineSpec) -> Result<LocalGuest, LocalGuestError> {
        refuse_devices(spec)?;
        // The sandbox has no kernel of its own: refuse what only a kernel
        // could honour instead of silently ignoring it.
        if spec.kernel_cmdline.is_some() {
            return Err(LocalGuestError::Unsupported(LOCAL_NO_KERNEL_CMDLINE));
        }
        if spec.rng_seed.is_some() {
            return Err(LocalGuestError::Unsupported(LOCAL_NO_RNG_SEED));
        }
        if spec.initial_time.is_some() {
            return Err(LocalGuestError::Unsupported(LOCAL_NO_INITIAL_TIME));
        }
        let agent = locate_agent(&spec.settings)?;
        let sandbox = LocalSandbox::start(&spec.vm_name, &LocalOptions::new(agent))?;
        Ok(LocalGuest {
            sandbox: Mutex::new(sandbox),
            shape: spec.snapshot_shape(snapshot::BACKEND),
        })
    }

    fn restore_sandbox(spec: &MachineSpec, path: &Path) -> Result<LocalGuest, LocalGuestError> {
        refuse_devices(spec)?;
        let state = snapshot::read_snapshot(
            path,
            spec.snapshot_shape(snapshot::BACKEND),
            provium_protocol::PROTOCOL_VERSION,
        )?;
        let guest = LocalBackend::start(spec)?;
        let applied = guest.sandbox().restore_fs(&state);
        if let Err(e) = applied {
            guest.kill();
            return Err(e.into());
        }
        guest.sandbox().set_restored_net(state.net);
        Ok(guest)
    }
}

/// Refuses kvm-only devices (NICs first, as the reference lists them).
fn refuse_devices(spec: &MachineSpec) -> Result<(), LocalGuestError> {
    if !spec.nics.is_empty() {
        return Err(LocalGuestError::Unsupported(LOCAL_NICS));
    }
    if !spec.disks.is_empty() {
        return Err(LocalGuestError::Unsupported(LOCAL_DISKS));
    }
    Ok(())
}

impl Backend for LocalBackend {
    fn capabilities(&self) -> Capabilities {
        LOCAL_CAPABILITIES
    }

    /// The sandbox runs once made.
    fn create(&self, spec: &MachineSpec) -> Result<Box<dyn Guest>, BackendError> {
        Ok(Box::new(LocalBackend::start(spec)?))
    }

    fn restore(&self, spec: &MachineSpec, path: &Path) -> Result<Box<dyn Guest>, BackendError> {
        Ok(Box::new(LocalBackend::restore_sandbox(spec, path)?))
    }
}

/// A running sandbox.
pub struct LocalGuest {
    /// Locked for each call; the lock keeps the sandbox (and so its init
    /// pid) alive while a call uses it.
    sandbox: Mutex<LocalSandbox>,
    /// What a snapshot of it records (its spec's sizing).
    shape: provium_snapshot::Shape,
}

impl LocalGuest {
    fn sandbox(&self) -> MutexGuard<'_, LocalSandbox> {
        // A panicked holder left nothing half-done that a kill must avoid.
        self.sandbox.locked()
    }

    /// The running sandbox, or why not.
    fn running(&self) -> Result<MutexGuard<'_, LocalSandbox>, LocalGuestError> {
        let s = self.sandbox();
        if !s.is_running() {
            return Err(LocalGuestError::NotRunning {
                name: s.name().to_string(),
            });
        }
        Ok(s)
    }
}

impl Guest for LocalGuest {
    fn capabilities(&self) -> Capabilities {
        LOCAL_CAPABILITIES
    }

    fn start(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn stopped(&self) -> Option<Stopped> {
        let s = self.sandbox();
        (!s.is_running()).then(|| Stopped {
            why: format!("sandbox `{}`: its init exited", s.name()),
            clean: false,
        })
    }

    fn connect(&self) -> Result<AgentClient, BackendError> {
        Ok(self.sandbox().connect().map_err(LocalGuestError::from)?)
    }

    fn cid(&self) -> Option<u32> {
        None
    }

    fn resident_memory(&self) -> (u64, u64) {
        crate::host_memory::memory_of(&self.sandbox().host_pids())
    }

    fn kill(&self) {
        let _ = self.sandbox().shutdown();
    }

    fn pause(&self) -> Result<(), BackendError> {
        let s = self.running()?;
        signal_all(&s, libc::SIGSTOP);
        Ok(())
    }

    fn resume(&self) -> Result<(), BackendError> {
        let s = self.running()?;
        signal_all(&s, libc::SIGCONT);
        Ok(())
    }

    fn reset(&self) -> Result<AgentClient, BackendError> {
        Err(refused(LOCAL_CAPABILITIES.reset))
    }

    fn power_button(&self) -> Result<(), BackendError> {
        Err(refused(LOCAL_CAPABILITIES.power_button))
    }

    fn open_nic(
        &self,
        ifname: &str,
        mac: provium_netsetup::MacAddr,
    ) -> Result<OwnedFd, BackendError> {
        let s = self.running()?;
        Ok(super::net::open_tap_in_netns(s.init_pid(), ifname, mac)
            .map_err(LocalGuestError::from)?)
    }

    fn apply_restored_net(&self) -> Result<(), BackendError> {
        Ok(self
            .sandbox()
            .apply_restored_net()
            .map_err(LocalGuestError::from)?)
    }

    fn snapshot_to(&self, path: &Path, extra: &[(&str, Vec<u8>)]) -> Result<u64, BackendError> {
        Ok(snapshot::write_snapshot(
            &self.sandbox(),
            path,
            self.shape.clone(),
            provium_protocol::PROTOCOL_VERSION,
            extra,
        )
        .map_err(LocalGuestError::from)?)
    }

    fn console(&self) -> Option<Arc<crate::backend::Console>> {
        None
    }
}

/// The error for an op a capability refuses.
fn refused(support: Support) -> BackendError {
    LocalGuestError::Unsupported(
        support
            .refusal()
            .unwrap_or("not supported by the local backend"),
    )
    .into()
}

/// Signal every process in the sandbox. Enumerates twice so a process forked
/// while the first pass ran is caught by the second.
fn signal_all(s: &LocalSandbox, sig: i32) {
    for _ in 0..2 {
        for pid in s.host_pids() {
            // Pids enumerated from the sandbox's pid namespace, which its
            // init keeps alive while running; one that exited is ESRCH.
            let _ = super::sys::kill(pid, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_refused_before_kernel_options() {
        let port = provium_netsetup::Switch::new("b", Default::default())
            .attach("v", provium_netsetup::MacAddr::local(1))
            .unwrap();
        let spec = MachineSpec {
            nics: vec![crate::backend::NicSpec::on_port(Arc::new(port))],
            rng_seed: Some(1),
            ..MachineSpec::default()
        };
        let e = LocalBackend::start(&spec).err().unwrap();
        assert_eq!(e.to_string(), LOCAL_NICS);
        for (spec, want) in [
            (
                MachineSpec {
                    rng_seed: Some(1),
                    ..MachineSpec::default()
                },
                LOCAL_NO_RNG_SEED,
            ),
            (
                MachineSpec {
                    initial_time: Some(1.0),
                    ..MachineSpec::default()
                },
                LOCAL_NO_INITIAL_TIME,
            ),
        ] {
            assert_eq!(LocalBackend::start(&spec).err().unwrap().to_string(), want);
        }
    }

    #[test]
    fn a_restore_with_devices_is_refused_before_the_file_is_read() {
        let spec = MachineSpec {
            disks: vec![crate::backend::DiskSpec {
                image: "/nonexistent.img".into(),
                id: "vda".into(),
                faults: Default::default(),
            }],
            ..MachineSpec::default()
        };
        let e = LocalBackend::restore_sandbox(&spec, Path::new("/nonexistent.snap"))
            .err()
            .unwrap();
        assert_eq!(e.to_string(), LOCAL_DISKS);
    }
}
