//! `vm:fork(n)`: n new running copies of a running VM, from one instant.
//!
//! The source is frozen once: paused (kvm), snapshotted to a temporary
//! file, its disk images copied once, then resumed, so what it pays is one
//! snapshot and one copy of its disks whatever `n` is. Each copy is then a
//! new VM `<name>.<i>` restored from that snapshot (`Vm::restore_checked`,
//! the path every restore takes): its own vsock CID and agent connection,
//! its own copy of each disk (from the frozen copy), and its own bridge of
//! each name its source's NICs were on, with the source's MACs, so copies
//! with the same addresses never meet. On kvm the restores map the
//! snapshot's guest RAM from one sealed memfd, privately: the copies share
//! the source's pages until they write them (see `lua::fork`).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use provium_protocol::event::VmForked;

use super::{Phase, Vm};
use crate::events::Lifecycle;
use crate::lock::Locked;
use crate::lua::fork::{self, ForkError};
use crate::lua::snapshot::{self, VmDevices};
use crate::lua::{err, rust_err};
use crate::network::Bridge;
use crate::runner::Closeable;

const M: &str = "vm:fork";

/// The source at the fork's instant: its snapshot, devices and one frozen
/// copy of each disk image (source image, frozen copy).
pub(crate) struct Frozen {
    pub path: PathBuf,
    pub devices: VmDevices,
    pub images: Vec<(PathBuf, PathBuf)>,
    /// How long the source was paused (or, where nothing pauses it, how
    /// long the snapshot took), in nanoseconds.
    pub paused_ns: u64,
}

impl Frozen {
    /// Deletes the snapshot and the frozen disk copies (the copies have
    /// their own by then, and on kvm their RAM is the memfd's, not the
    /// file's), and lets the backend forget the snapshot's RAM, so the
    /// frozen image lives as long as the copies that map it.
    pub fn remove(&self, backend: &dyn crate::backend::Backend) {
        backend.forget_restore_image(&self.path);
        snapshot::remove_any(&self.path);
        for (_, frozen) in &self.images {
            snapshot::remove_any(frozen);
        }
    }
}

/// What one copy took, for a fork that fails to give back.
#[derive(Default)]
pub(crate) struct Made {
    pub vms: Vec<Vm>,
    pub bridges: Vec<Bridge>,
    pub images: Vec<PathBuf>,
}

impl Made {
    /// Undoes a fork that failed halfway: every copy shut down, its
    /// bridges closed, its disk copies deleted.
    pub fn undo(&self) {
        for vm in &self.vms {
            let _ = vm.shutdown();
        }
        for b in &self.bridges {
            let _ = b.auto_close();
        }
        for img in &self.images {
            snapshot::remove_any(img);
        }
    }
}

impl Vm {
    /// Makes this (created) VM restore onto `remap`'s disk copies: (the
    /// snapshot's image, this VM's copy), for a fork's copy.
    pub(crate) fn set_image_remap(&self, remap: Vec<(PathBuf, PathBuf)>) {
        *self.0.image_remap.locked() = remap;
    }

    fn fork_err(&self, e: &ForkError) -> mlua::Error {
        rust_err(&format!("{M}: vm `{}`", self.name()), e)
    }

    /// The checks every fork makes before it touches the source: `n`, the
    /// pool's budget, a running VM, no live stream or capture.
    pub(crate) fn check_forkable(&self, what: &str, n: u64) -> mlua::Result<()> {
        fork::check_budget(
            n,
            self.0.sizing.memory_bytes,
            self.env().run_resources().pool(),
        )
        .map_err(|e| self.fork_err(&e))?;
        let phase = self.phase();
        if !matches!(phase, Phase::Booted | Phase::Paused) {
            return Err(self.fork_err(&ForkError::NotBooted {
                vm: self.name().to_string(),
                phase: phase.as_str().to_string(),
            }));
        }
        let live = self.live_streams();
        if !live.is_empty() {
            return Err(err(snapshot::live_streams_refusal(
                what,
                &self.env().rel_path,
                &live,
            )
            .replace("before snapshotting", "before forking")));
        }
        Ok(())
    }

    /// Pauses a running kvm VM (a sandbox's snapshot needs no pause: its
    /// files are captured through its init), returning whether it did.
    pub(crate) fn pause_for_fork(&self) -> mlua::Result<bool> {
        if self.capabilities().device_snapshots && self.phase() == Phase::Booted {
            self.pause()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Snapshots this (paused) VM to `path` and copies its disk images
    /// once; `bridge_lab` as for [`Vm::snapshot_in`].
    pub(crate) fn freeze_to(
        &self,
        path: &Path,
        bridge_lab: &dyn Fn(&Bridge) -> Option<Vec<String>>,
    ) -> mlua::Result<(VmDevices, Vec<(PathBuf, PathBuf)>)> {
        self.snapshot_in(path, bridge_lab)?;
        let devices = VmDevices::read_if_present(path)
            .map_err(|e| rust_err(&format!("{M}: vm `{}`", self.name()), &e))?
            .unwrap_or_default();
        let mut images = Vec::new();
        for img in fork::images_of(&devices) {
            match fork::copy_image(&img, &format!("{}.frozen", self.name())) {
                Ok(to) => images.push((img, to)),
                Err(e) => {
                    for (_, f) in &images {
                        snapshot::remove_any(f);
                    }
                    return Err(self.fork_err(&e));
                }
            }
        }
        Ok((devices, images))
    }

    /// Freezes this VM for a fork (see the module doc).
    fn freeze(&self) -> mlua::Result<Frozen> {
        let path = snapshot::temp_path(".fork.snap");
        let t0 = Instant::now();
        let paused = self.pause_for_fork()?;
        let r = self.freeze_to(&path, &|_| None);
        let paused_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if paused {
            self.resume()?;
        }
        match r {
            Ok((devices, images)) => Ok(Frozen {
                path,
                devices,
                images,
                paused_ns,
            }),
            Err(e) => {
                snapshot::remove_any(&path);
                Err(e)
            }
        }
    }

    /// `vm:fork(n)`: n running copies of this VM (see the module doc).
    pub fn fork(&self, n: &mlua::Value) -> mlua::Result<Vec<Vm>> {
        self.fork_timed(n).map(|(copies, _)| copies)
    }

    /// [`Vm::fork`], also returning how long the source was paused, in
    /// nanoseconds (`provium bench fork`).
    pub fn fork_timed(&self, n: &mlua::Value) -> mlua::Result<(Vec<Vm>, u64)> {
        let n = fork::copy_count(n).map_err(|e| self.fork_err(&e))?;
        self.check_forkable("vm:fork()", n)?;
        let frozen = self.freeze()?;
        let mut made = Made::default();
        let r = (0..n).try_for_each(|_| {
            let i = self.0.forks.fetch_add(1, Ordering::SeqCst) + 1;
            let name = fork::copy_name(self.name(), i);
            self.make_copy(&name, &frozen, &mut made)
        });
        frozen.remove(self.env().machines().as_ref());
        if let Err(e) = r {
            made.undo();
            return Err(e);
        }
        let env = self.env();
        for img in &made.images {
            snapshot::delete_at_scope_end(env, img);
        }
        env.events.send(Lifecycle::VmForked(VmForked {
            file: env.rel_path.clone(),
            source: self.name().to_string(),
            copies: made.vms.iter().map(|v| v.name().to_string()).collect(),
            source_paused_ns: frozen.paused_ns,
        }));
        Ok((made.vms, frozen.paused_ns))
    }

    /// Copy `name` of this VM from `frozen`, on bridges of its own.
    fn make_copy(&self, name: &str, frozen: &Frozen, made: &mut Made) -> mlua::Result<()> {
        let copy = Vm::create(
            self.env().clone(),
            name.to_string(),
            self.0.profile.clone(),
            self.0.sizing,
        )?;
        made.vms.push(copy.clone());
        let remap = copy_images(&frozen.images, name, made).map_err(|e| self.fork_err(&e))?;
        copy.set_image_remap(remap);
        let env = self.env();
        let from = made.bridges.len();
        if self.capabilities().has_vmm_nics() {
            // kvm: a member of a bridge of each recorded NIC's name, with
            // its MAC, as a lab restore makes it (`restore_checked` puts
            // the NIC there).
            let nics = frozen
                .devices
                .nics
                .iter()
                .chain(frozen.devices.slot_nics.iter().map(|s| &s.nic));
            for nic in nics.filter(|n| n.attached) {
                let b = own_bridge(env, &nic.bridge, made, from);
                let mac = nic.mac_addr().map_err(|e| rust_err(M, &e))?;
                b.restore_member(&copy.net(), mac, Some(nic.connected))
                    .map_err(|e| rust_err(&format!("{M}: copy `{name}`"), &e))?;
            }
        } else {
            // Host TAPs (local): the copy joins a bridge of each name its
            // source is on; its interface configuration comes back with
            // the snapshot.
            for src in self.bridges() {
                let b = own_bridge(env, src.name(), made, from);
                b.attach_vm(&copy.net())
                    .map_err(|e| rust_err(&format!("{M}: copy `{name}`"), &e))?;
            }
        }
        copy.restore_checked(&frozen.path)
            .map_err(|e| err(format!("{M}: copy `{name}`: {}", e.message())))?;
        Ok(())
    }
}

/// This copy's bridge `name`: the one this copy made already (its bridges
/// are those in `made` from `from` on), else a new one.
fn own_bridge(
    env: &std::sync::Arc<crate::runner::FileEnv>,
    name: &str,
    made: &mut Made,
    from: usize,
) -> Bridge {
    if let Some(b) = made.bridges[from..].iter().find(|b| b.name() == name) {
        return b.clone();
    }
    let b = Bridge::create(env, name);
    made.bridges.push(b.clone());
    b
}

/// The copy `name`'s own disk images, copied from the frozen ones:
/// (source image, copy's image).
fn copy_images(
    frozen: &[(PathBuf, PathBuf)],
    name: &str,
    made: &mut Made,
) -> Result<Vec<(PathBuf, PathBuf)>, ForkError> {
    let mut remap = Vec::new();
    for (src, frozen) in frozen {
        let to = fork::copy_image(frozen, name)?;
        made.images.push(to.clone());
        remap.push((src.clone(), to));
    }
    Ok(remap)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_utils::{file_env, message, vm};
    use super::*;
    use crate::runner::{BackendKind, RunResources};

    fn fork_err(v: &Vm, n: mlua::Value) -> String {
        message(v.fork(&n).err().expect("refused"))
    }

    /// Each refusal comes before anything is made: the VM stays as it
    /// was, and the next copy would still be the first.
    #[test]
    fn a_fork_is_refused_before_it_makes_anything() {
        let env = super::super::test_utils::env(BackendKind::Kvm);
        let v = vm(&env);
        assert_eq!(
            fork_err(&v, mlua::Value::Integer(2)),
            "vm:fork: vm `v`: vm `v` is created, and only a running VM forks (call vm:boot() or \
             vm:restore() first)"
        );
        assert!(fork_err(&v, mlua::Value::Integer(0)).contains("got 0 (call fork(1) or more)"));
        assert!(fork_err(&v, mlua::Value::Boolean(true)).contains("got boolean"));
        assert_eq!(v.phase(), Phase::Created);
        assert_eq!(v.0.forks.load(Ordering::SeqCst), 0, "no copy was numbered");
    }

    /// Under a pool budget, n copies of the VM's memory past it are
    /// refused, naming the sizes and the fix, before the phase is looked at.
    #[test]
    fn copies_past_the_pool_are_refused() {
        let pool = provium_protocol::ResourceAmount {
            memory_bytes: 128 << 20,
            cpus: 2,
        };
        let env = Arc::new(
            file_env(BackendKind::Local).with_run_resources(RunResources::with_pool(pool)),
        );
        let v = vm(&env);
        let e = fork_err(&v, mlua::Value::Integer(3));
        assert!(
            e.starts_with(
                "vm:fork: vm `v`: 3 copies of 67108864 bytes of guest memory each need 201326592 \
                 bytes, over the pool's memory budget of 134217728 bytes"
            ),
            "{e}"
        );
        assert!(fork_err(&v, mlua::Value::Integer(2)).contains("is created"));
    }
}
