//! The Lab userdata. The `provium` global is the root Lab of the file; each
//! test runs with `provium` set to a test-scope Lab whose lookups fall
//! through to the root, and whose resources are closed when the test ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use mlua::{Lua, MetaMethod, MultiValue, Table, UserData, UserDataMethods, Value};
use provium_protocol::event::{ClaimAcquired, ClaimReleased, Event, ResourceAmount};

use super::bridge::Bridge;
use super::vm::{RestoreError, Vm, VmSizing};
use super::{duration, err};
use crate::config::parse_size;
use crate::runner::FileEnv;

/// Keys of the `provium` table that never resolve to a resource.
pub const RESERVED_NAMES: &[&str] = &[
    "pack",
    "unpack",
    "vm_fixture",
    "lab_fixture",
    "timeout",
    "reset_between_tests",
];

#[derive(Clone)]
pub struct Lab(Arc<LabInner>);

struct LabInner {
    name: String,
    env: Arc<FileEnv>,
    /// Set for a test scope: lookups fall through to the file root.
    parent: Option<Lab>,
    state: Mutex<LabState>,
    /// File-scope coordination shared by the root and its test scopes.
    file: Arc<FileScope>,
    /// The file's root lab (the `provium` global outside tests).
    is_root: bool,
}

#[derive(Default)]
struct LabState {
    vms: BTreeMap<String, Vm>,
    bridges: BTreeMap<String, Bridge>,
    sub_labs: BTreeMap<String, Lab>,
    next_anon: usize,
}

/// File-level settings and one-shot primitives.
#[derive(Default)]
struct FileScope {
    settings: Mutex<FileSettings>,
    claim: Mutex<Option<ResourceAmount>>,
    barriers: Mutex<BTreeMap<String, Barrier>>,
    barrier_cv: Condvar,
    /// The `reset_between_tests` baseline (a lab snapshot directory).
    baseline: Mutex<Option<std::path::PathBuf>>,
}

#[derive(Default, Clone)]
struct FileSettings {
    timeout: Option<Duration>,
    reset_between_tests: bool,
}

struct Barrier {
    count: usize,
    arrived: usize,
    generation: u64,
}

/// Handle for a test scope entered by the runner.
pub struct TestScope {
    root_global: Lab,
}

impl Lab {
    pub fn root(env: Arc<FileEnv>) -> Lab {
        Lab(Arc::new(LabInner {
            name: "provium".into(),
            env,
            parent: None,
            state: Mutex::new(LabState::default()),
            file: Arc::new(FileScope::default()),
            is_root: true,
        }))
    }

    fn child(&self, name: String, parent: Option<Lab>) -> Lab {
        Lab(Arc::new(LabInner {
            name,
            env: self.0.env.clone(),
            parent,
            state: Mutex::new(LabState::default()),
            file: self.0.file.clone(),
            is_root: false,
        }))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// `provium.timeout`, the file-default per-test timeout.
    pub fn file_timeout(&self) -> mlua::Result<Option<Duration>> {
        Ok(self.0.file.settings.lock().unwrap().timeout)
    }

    /// `provium.reset_between_tests = true`: after the chunk, snapshot the
    /// root lab as the baseline every test is restored to.
    pub fn prepare_reset_between_tests(&self) -> mlua::Result<()> {
        if !self.0.file.settings.lock().unwrap().reset_between_tests {
            return Ok(());
        }
        let mut vms = Vec::new();
        self.vms_downward(&mut Vec::new(), &mut vms);
        let live: Vec<String> = vms.iter().flat_map(|(_, vm)| vm.live_streams()).collect();
        if !live.is_empty() {
            return Err(err(format!(
                "provium.reset_between_tests would auto-snapshot a live stream: {}",
                super::snapshot::live_streams_refusal(
                    "the baseline snapshot",
                    &self.0.env.rel_path,
                    &live
                )
            )));
        }
        let dir = super::snapshot::temp_path(".lab");
        *self.0.file.baseline.lock().unwrap() = Some(dir.clone());
        self.snapshot_into(&dir).map_err(|e| {
            err(format!(
                "provium.reset_between_tests: taking the baseline failed: {}",
                super::error_message(&e)
            ))
        })
    }

    /// Restore the baseline after a test (only with reset_between_tests).
    pub fn restore_between_tests(&self) -> Result<(), String> {
        let Some(dir) = self.0.file.baseline.lock().unwrap().clone() else {
            return Ok(());
        };
        self.restore_from_dir(&dir)
            .map_err(|e| format!("reset_between_tests: {}", super::error_message(&e)))
    }

    /// VMs of this lab and its sub-labs (downward), with their sub-lab path.
    fn vms_downward(&self, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Vm)>) {
        let (vms, subs): (Vec<Vm>, Vec<(String, Lab)>) = {
            let st = self.0.state.lock().unwrap();
            (
                st.vms.values().cloned().collect(),
                st.sub_labs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )
        };
        out.extend(vms.into_iter().map(|vm| (path.clone(), vm)));
        for (name, lab) in subs {
            path.push(name);
            lab.vms_downward(path, out);
            path.pop();
        }
    }

    /// Bridges of this lab and its sub-labs (downward), with their sub-lab
    /// path.
    fn bridges_downward(&self, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Bridge)>) {
        let (bridges, subs): (Vec<Bridge>, Vec<(String, Lab)>) = {
            let st = self.0.state.lock().unwrap();
            (
                st.bridges.values().cloned().collect(),
                st.sub_labs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )
        };
        out.extend(bridges.into_iter().map(|b| (path.clone(), b)));
        for (name, lab) in subs {
            path.push(name);
            lab.bridges_downward(path, out);
            path.pop();
        }
    }

    /// `lab:snapshot()` into `dir`: one snapshot per booted VM (this lab and
    /// its sub-labs) and `lab.json`. Refuses while any of them has live streams.
    pub fn snapshot_into(&self, dir: &std::path::Path) -> mlua::Result<()> {
        use provium_snapshot::{LabIndex, LabVm};
        let mut vms = Vec::new();
        self.vms_downward(&mut Vec::new(), &mut vms);
        let live: Vec<String> = vms.iter().flat_map(|(_, vm)| vm.live_streams()).collect();
        if !live.is_empty() {
            return Err(err(super::snapshot::live_streams_refusal(
                "lab:snapshot()",
                &self.0.env.rel_path,
                &live,
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            err(format!(
                "lab:snapshot: cannot create {}: {e}",
                dir.display()
            ))
        })?;
        let mut bridges = Vec::new();
        self.bridges_downward(&mut Vec::new(), &mut bridges);
        let bridge_lab = |b: &Bridge| {
            bridges
                .iter()
                .find(|(_, x)| x.ptr_eq(b))
                .map(|(p, _)| p.clone())
        };
        let mut index = LabIndex::new(&self.0.name);
        index.bridges = bridges.iter().map(|(p, b)| b.record(p)).collect();
        for (path, vm) in vms {
            if !matches!(
                vm.phase(),
                super::vm::Phase::Booted | super::vm::Phase::Paused
            ) {
                continue;
            }
            let file = index.file_name_for(&path, vm.name());
            vm.snapshot_in(&dir.join(&file), &bridge_lab)?;
            let sizing = vm.sizing();
            index.vms.push(LabVm {
                lab_path: path,
                name: vm.name().to_string(),
                profile: vm.profile_name().to_string(),
                memory_bytes: sizing.memory_bytes,
                cpus: sizing.cpus,
                file,
            });
        }
        index
            .write(dir)
            .map_err(|e| err(format!("lab:snapshot: {}", crate::error_chain::flatten(&e))))
    }

    /// `vm_fixture(path)` / `lab_fixture(path)`, either call form.
    fn fixture_call(&self, lua: &Lua, which: &str, args: MultiValue) -> mlua::Result<Value> {
        let mut args = args.into_iter();
        let name = match args.next() {
            Some(Value::String(s)) => s.to_str()?.to_string(),
            other => {
                return Err(err(format!(
                    "{which}: expected a fixture path like \"fixtures/base\", got {}",
                    other.map_or("nothing", |v| v.type_name())
                )))
            }
        };
        if which == "vm_fixture" {
            let vm_name = fixture_vm_name_opt(args.next())?;
            Ok(Value::UserData(lua.create_userdata(
                self.vm_fixture(&name, vm_name.as_deref())?,
            )?))
        } else {
            Ok(Value::UserData(
                lua.create_userdata(self.lab_fixture(&name)?)?,
            ))
        }
    }

    /// A VM restored from fixture `name` (built first if not cached), added
    /// to this lab under the fixture VM's name, with the fixture VM's
    /// devices: its disks (the recorded images, as they are now) and its
    /// NICs, on bridges of the recorded names found or made by
    /// [`Lab::bridge_for_restore`] from this lab.
    ///
    /// Each call restores a fresh VM. It is named `vm_name` when given
    /// (`vm_fixture(path, {name = ...})`; a taken name is an error), else
    /// the fixture VM's recorded name, or when that is taken in this scope
    /// (an earlier call, even of a VM since shut down), the first free of
    /// `<name>-2`, `<name>-3`, ...
    fn vm_fixture(&self, name: &str, vm_name: Option<&str>) -> mlua::Result<Vm> {
        use crate::fixture::RestoreFailure;
        let env = self.0.env.clone();
        let mut restore = |path: &std::path::Path| -> Result<Vm, RestoreFailure> {
            let mut decl = super::snapshot::VmDecl::read(path).map_err(RestoreFailure::Corrupt)?;
            let other = |e: mlua::Error| RestoreFailure::Other(super::error_message(&e));
            decl.name = match vm_name {
                Some(n) => {
                    self.check_new_name("vm", n).map_err(other)?;
                    n.to_string()
                }
                None => self.free_fixture_vm_name(&decl.name).map_err(other)?,
            };
            let sizing = VmSizing {
                memory_bytes: decl.memory_bytes,
                cpus: decl.cpus,
            };
            let vm = Vm::create(env.clone(), decl.name.clone(), decl.profile.clone(), sizing)
                .map_err(other)?;
            let r = match super::snapshot::VmDevices::read_if_present(path) {
                Ok(devices) => self
                    .join_recorded_bridges(&vm, &devices.unwrap_or_default())
                    .and_then(|()| vm.restore_checked(path)),
                Err(e) => Err(RestoreError::Failed(err(e))),
            };
            if let Err(e) = r {
                let _ = vm.shutdown();
                return Err(restore_failure(e));
            }
            self.0
                .state
                .lock()
                .unwrap()
                .vms
                .insert(decl.name, vm.clone());
            Ok(vm)
        };
        crate::fixture::obtain(&env, name, provium_snapshot::EntryKind::Vm, &mut restore)
            .map_err(|e| err(format!("vm_fixture(\"{name}\"): {e}")))
    }

    /// The bridge a restored VM's NIC on bridge `name` joins, for a restore
    /// into this lab: the one of that name in `lab` (the lab that held the
    /// bridge when the snapshot was taken, mapped onto the restoring tree;
    /// this lab for a VM fixture) or up its scope chain (so a test scope
    /// finds the file's bridges); if there is none, a new bridge of that
    /// name is made in `lab` (closed with the current scope, like any
    /// bridge). The NICs of VMs restored together thus share the bridges
    /// they shared when snapshotted.
    fn bridge_for_restore(lab: &Lab, name: &str) -> Result<Bridge, String> {
        if let Some(b) = lab.find_bridge(name) {
            return Ok(b);
        }
        lab.check_new_name("bridge", name).map_err(|e| {
            format!(
                "cannot make bridge `{name}` for the restored NICs in lab `{}`: {}",
                lab.0.name,
                super::error_message(&e)
            )
        })?;
        let b = Bridge::create(&lab.0.env, name);
        lab.0
            .state
            .lock()
            .unwrap()
            .bridges
            .insert(name.to_string(), b.clone());
        Ok(b)
    }

    /// kvm: makes `vm` (created or shut down) a member of the bridges its
    /// snapshot's NICs were on, with the recorded MACs and link states.
    /// For each recorded NIC, in this order: a bridge of that name the VM
    /// is on, or one it left when it last shut down (`lab:restore` shuts a
    /// running VM down first), is kept (`vm.restore_checked` puts the NIC
    /// there); else [`Lab::bridge_for_restore`] finds or makes one, from
    /// the NIC's recorded sub-lab path below this lab.
    fn join_recorded_bridges(
        &self,
        vm: &Vm,
        devices: &super::snapshot::VmDevices,
    ) -> Result<(), RestoreError> {
        if self.0.env.backend != crate::runner::BackendKind::Kvm {
            return Ok(());
        }
        let mismatch = |e: String| {
            RestoreError::Mismatch(format!(
                "vm `{}`: the snapshot's NICs do not fit this lab (a configuration mismatch): {e}",
                vm.name()
            ))
        };
        let left = vm.left_bridges();
        for n in devices.nics.iter().filter(|n| n.attached) {
            // On one of that name, or left one at its shutdown (a running
            // VM that `lab:restore` shut down): `restore_checked` uses it.
            let on = vm
                .bridges()
                .iter()
                .any(|b| b.name() == n.bridge && b.has_vm(vm));
            if on || left.iter().any(|b| b.name() == n.bridge && !b.is_closed()) {
                continue;
            }
            let lab = match &n.bridge_lab {
                Some(p) => self
                    .sub_lab_at(p)
                    .map_err(|e| mismatch(super::error_message(&e)))?,
                None => self.clone(),
            };
            let b = Lab::bridge_for_restore(&lab, &n.bridge).map_err(mismatch)?;
            let mac = n.mac_addr().map_err(mismatch)?;
            b.restore_member(vm, mac, Some(n.connected))
                .map_err(|e| mismatch(format!("bridge `{}`: {e}", n.bridge)))?;
        }
        Ok(())
    }

    /// A fresh sub-lab of this lab with fixture `name` restored into it.
    fn lab_fixture(&self, name: &str) -> mlua::Result<Lab> {
        use crate::fixture::RestoreFailure;
        let env = self.0.env.clone();
        let mut restore = |path: &std::path::Path| -> Result<Lab, RestoreFailure> {
            let lab_name = {
                let mut st = self.0.state.lock().unwrap();
                let n = format!("__lab_{}", st.next_anon);
                st.next_anon += 1;
                n
            };
            let lab = self.child(lab_name.clone(), None);
            if let Err(e) = lab.restore_from_dir_checked(path) {
                let mut vms = Vec::new();
                lab.vms_downward(&mut Vec::new(), &mut vms);
                for (_, vm) in vms {
                    let _ = vm.shutdown();
                }
                return Err(restore_failure(e));
            }
            self.0
                .state
                .lock()
                .unwrap()
                .sub_labs
                .insert(lab_name, lab.clone());
            Ok(lab)
        };
        crate::fixture::obtain(&env, name, provium_snapshot::EntryKind::Lab, &mut restore)
            .map_err(|e| err(format!("lab_fixture(\"{name}\"): {e}")))
    }

    /// The sub-lab at `path` below this lab, created where missing.
    fn sub_lab_at(&self, path: &[String]) -> mlua::Result<Lab> {
        let mut lab = self.clone();
        for name in path {
            let existing = lab.0.state.lock().unwrap().sub_labs.get(name).cloned();
            lab = match existing {
                Some(l) => l,
                None => {
                    lab.check_new_name("lab", name)?;
                    let l = lab.child(name.clone(), None);
                    lab.0
                        .state
                        .lock()
                        .unwrap()
                        .sub_labs
                        .insert(name.clone(), l.clone());
                    l
                }
            };
        }
        Ok(lab)
    }

    /// `lab:restore(dir)`: every VM in `dir/lab.json` is restored into the
    /// VM of that name (created from its recorded declaration where this
    /// lab has none; shut down first where it runs), with its snapshot's
    /// devices: on kvm it joins bridges of the recorded names (see
    /// [`Lab::join_recorded_bridges`]), so VMs that shared a bridge share
    /// one again.
    pub fn restore_from_dir(&self, dir: &std::path::Path) -> mlua::Result<()> {
        self.restore_from_dir_checked(dir)
            .map_err(RestoreError::into_lua)
    }

    /// [`Lab::restore_from_dir`], telling a device mismatch from other
    /// failures.
    fn restore_from_dir_checked(&self, dir: &std::path::Path) -> Result<(), RestoreError> {
        use RestoreError::Failed;
        let index = provium_snapshot::LabIndex::read(dir).map_err(|e| {
            Failed(err(format!(
                "lab:restore: {}",
                crate::error_chain::flatten(&e)
            )))
        })?;
        let kvm = self.0.env.backend == crate::runner::BackendKind::Kvm;
        // The topology first, so restored VMs find their bridges.
        for rec in &index.bridges {
            let lab = self.sub_lab_at(&rec.lab_path).map_err(Failed)?;
            let vm_names: Vec<String> = index.vms.iter().map(|v| v.name.clone()).collect();
            Lab::bridge_for_restore(&lab, &rec.name)
                .and_then(|b| b.apply_record(rec, &vm_names))
                .map_err(|e| {
                    RestoreError::Mismatch(format!(
                        "lab:restore: bridge `{}`: {e} (a configuration mismatch)",
                        rec.name
                    ))
                })?;
        }
        for v in &index.vms {
            let lab = self.sub_lab_at(&v.lab_path).map_err(Failed)?;
            let existing = lab.0.state.lock().unwrap().vms.get(&v.name).cloned();
            let vm = match existing {
                Some(vm) => vm,
                None => {
                    lab.check_new_name("vm", &v.name).map_err(Failed)?;
                    let sizing = VmSizing {
                        memory_bytes: v.memory_bytes,
                        cpus: v.cpus,
                    };
                    let vm = Vm::create(
                        self.0.env.clone(),
                        v.name.clone(),
                        v.profile.clone(),
                        sizing,
                    )
                    .map_err(Failed)?;
                    lab.0
                        .state
                        .lock()
                        .unwrap()
                        .vms
                        .insert(v.name.clone(), vm.clone());
                    vm
                }
            };
            if !matches!(
                vm.phase(),
                super::vm::Phase::Created | super::vm::Phase::Shutdown
            ) {
                vm.shutdown().map_err(Failed)?;
            }
            let file = dir.join(&v.file);
            if !kvm {
                // Local: the sandbox joins the recorded bridges it was on
                // (its NICs and their configuration come back with it).
                for rec in index.bridges.iter().filter(|b| b.members.contains(&v.name)) {
                    let lab = self.sub_lab_at(&rec.lab_path).map_err(Failed)?;
                    Lab::bridge_for_restore(&lab, &rec.name)
                        .and_then(|b| b.attach_vm(&vm))
                        .map_err(|e| {
                            RestoreError::Mismatch(format!(
                                "lab:restore: vm `{}` on bridge `{}`: {e} (a configuration mismatch)",
                                v.name, rec.name
                            ))
                        })?;
                }
            }
            if kvm {
                let devices = super::snapshot::VmDevices::read_if_present(&file)
                    .map_err(|e| Failed(err(format!("lab:restore: vm `{}`: {e}", v.name))))?;
                if let Some(devices) = devices {
                    self.join_recorded_bridges(&vm, &devices)?;
                }
            }
            vm.restore_checked(&file)?;
        }
        Ok(())
    }

    /// Swap the `provium` global for a fresh test-scope lab.
    pub fn enter_test_scope(&self, lua: &Lua) -> TestScope {
        let scope = self.child(self.0.name.clone(), Some(self.clone()));
        self.0.env.push_scope();
        let _ = lua.globals().set("provium", scope);
        TestScope {
            root_global: self.clone(),
        }
    }

    /// Close what the test created (streams, processes, files, workers,
    /// bridges, VMs, in that order) and put the root back.
    pub fn leave_test_scope(&self, lua: &Lua, scope: TestScope) -> Result<(), String> {
        let r = self.0.env.pop_scope();
        let _ = lua.globals().set("provium", scope.root_global);
        r
    }

    /// File end: close everything at file scope and release the claim.
    pub fn close_all(&self, lua: &Lua) {
        let _ = self.0.env.pop_scope();
        if let Some(dir) = self.0.file.baseline.lock().unwrap().take() {
            super::snapshot::remove_any(&dir);
        }
        if let Some(amount) = self.0.file.claim.lock().unwrap().take() {
            self.0.env.events.emit(Event::ClaimReleased(ClaimReleased {
                path: self.0.env.rel_path.clone(),
                amount,
            }));
        }
        let _ = lua.globals().set("provium", Value::Nil);
    }

    /// Scope chain lookup: this lab, then (for a test scope) its parents;
    /// `pick` reads one lab's state.
    fn find_in_chain<T>(&self, pick: impl Fn(&LabState) -> Option<T>) -> Option<T> {
        let mut lab = Some(self.clone());
        while let Some(l) = lab {
            if let Some(found) = pick(&l.0.state.lock().unwrap()) {
                return Some(found);
            }
            lab = l.0.parent.clone();
        }
        None
    }

    fn find_vm(&self, name: &str) -> Option<Vm> {
        self.find_in_chain(|st| st.vms.get(name).cloned())
    }

    fn find_bridge(&self, name: &str) -> Option<Bridge> {
        self.find_in_chain(|st| st.bridges.get(name).cloned())
    }

    fn find_sub_lab(&self, name: &str) -> Option<Lab> {
        self.find_in_chain(|st| st.sub_labs.get(name).cloned())
    }

    /// A name may be taken once per lab, never reserved, and (in a test
    /// scope) not shadow a name of the file root.
    /// `base` when it is free in this scope, else the first free
    /// `<base>-N` (N from 2); the error for `base` when none is.
    fn free_fixture_vm_name(&self, base: &str) -> mlua::Result<String> {
        let first = match self.check_new_name("vm", base) {
            Ok(()) => return Ok(base.to_string()),
            Err(e) => e,
        };
        (2..=MAX_FIXTURE_COPIES)
            .map(|n| format!("{base}-{n}"))
            .find(|n| self.check_new_name("vm", n).is_ok())
            .ok_or(first)
    }

    fn check_new_name(&self, kind: &str, name: &str) -> mlua::Result<()> {
        if name.is_empty() {
            return Err(err(format!("{kind} name must not be empty")));
        }
        if RESERVED_NAMES.contains(&name) {
            return Err(err(format!(
                "`{name}` is a reserved name on a lab ({}); pick another {kind} name",
                RESERVED_NAMES.join(", ")
            )));
        }
        let st = self.0.state.lock().unwrap();
        if st.vms.contains_key(name) {
            return Err(err(format!(
                "DuplicateVmName: vm `{name}` already exists in lab `{}`; use {}:vm(\"{name}\") to look it up",
                self.0.name, self.0.name
            )));
        }
        if st.sub_labs.contains_key(name) {
            return Err(err(format!(
                "DuplicateLabName: sub-lab `{name}` already exists in lab `{}`",
                self.0.name
            )));
        }
        if st.bridges.contains_key(name) {
            return Err(err(format!(
                "DuplicateBridgeName: bridge `{name}` already exists in lab `{}`; use {}:bridge(\"{name}\") to look it up",
                self.0.name, self.0.name
            )));
        }
        drop(st);
        let mut parent = self.0.parent.clone();
        while let Some(p) = parent {
            let st = p.0.state.lock().unwrap();
            if st.vms.contains_key(name)
                || st.sub_labs.contains_key(name)
                || st.bridges.contains_key(name)
            {
                return Err(err(format!(
                    "name `{name}` already declared at parent scope (lab `{}`). Pick a different name, \
                     or use `provium:vm(\"{name}\")` to reuse it.",
                    p.0.name
                )));
            }
            drop(st);
            parent = p.0.parent.clone();
        }
        Ok(())
    }

    fn vms(&self) -> Vec<Vm> {
        self.0.state.lock().unwrap().vms.values().cloned().collect()
    }

    fn claim(&self, spec: Table) -> mlua::Result<()> {
        let mut held = self.0.file.claim.lock().unwrap();
        if held.is_some() {
            return Err(err("lab claim already held; one-shot per lab"));
        }
        let memory_bytes = match spec.get::<Value>("memory")? {
            Value::Nil => 0,
            Value::Integer(i) if i >= 0 => i as u64,
            Value::String(s) => {
                parse_size(&s.to_str()?).map_err(|e| err(format!("claim: memory: {e}")))?
            }
            other => {
                return Err(err(format!(
                    "claim: memory must be bytes or a size string, got {}",
                    other.type_name()
                )))
            }
        };
        let cpus = match spec.get::<Value>("cpus")? {
            Value::Nil => 0,
            Value::Integer(i) if i >= 0 && i <= u32::MAX as i64 => i as u32,
            other => {
                return Err(err(format!(
                    "claim: cpus must be a non-negative integer, got {other:?}"
                )))
            }
        };
        for pair in spec.pairs::<Value, Value>() {
            let (k, _) = pair?;
            let key = k.to_string()?;
            if key != "memory" && key != "cpus" {
                return Err(err(format!(
                    "claim: unknown key `{key}` (accepted: memory, cpus)"
                )));
            }
        }
        let amount = ResourceAmount { memory_bytes, cpus };
        *held = Some(amount);
        self.0.env.events.emit(Event::ClaimAcquired(ClaimAcquired {
            path: self.0.env.rel_path.clone(),
            amount,
        }));
        Ok(())
    }

    fn barrier(&self, name: String, count: i64, timeout: Option<Duration>) -> mlua::Result<bool> {
        if count < 1 {
            return Err(err(format!(
                "barrier `{name}`: count must be at least 1 (got {count})"
            )));
        }
        let count = count as usize;
        let deadline = Instant::now() + timeout.unwrap_or(Duration::from_secs(60));
        let mut barriers = self.0.file.barriers.lock().unwrap();
        let b = barriers.entry(name.clone()).or_insert(Barrier {
            count,
            arrived: 0,
            generation: 0,
        });
        if b.count != count {
            eprintln!(
                "provium: warning: barrier `{name}` was created with count {}, called with {count}",
                b.count
            );
            return Ok(false);
        }
        b.arrived += 1;
        if b.arrived >= b.count {
            b.arrived = 0;
            b.generation += 1;
            self.0.file.barrier_cv.notify_all();
            return Ok(true);
        }
        let generation = b.generation;
        loop {
            self.0.env.check_cancelled()?;
            let now = Instant::now();
            if now >= deadline {
                if let Some(b) = barriers.get_mut(&name) {
                    if b.generation == generation {
                        b.arrived = b.arrived.saturating_sub(1);
                    }
                }
                return Ok(false);
            }
            let wait = (deadline - now).min(Duration::from_millis(50));
            barriers = self
                .0
                .file
                .barrier_cv
                .wait_timeout(barriers, wait)
                .unwrap()
                .0;
            if barriers
                .get(&name)
                .is_some_and(|b| b.generation != generation)
            {
                return Ok(true);
            }
        }
    }

    fn set_setting(&self, key: &str, value: Value) -> mlua::Result<()> {
        if !self.0.is_root {
            return Err(err(format!(
                "provium.{key} can only be set at file scope on the root lab"
            )));
        }
        let mut s = self.0.file.settings.lock().unwrap();
        match key {
            "timeout" => {
                s.timeout = match value {
                    Value::Nil => None,
                    v => Some(duration::from_lua(&v, "provium.timeout")?),
                }
            }
            "reset_between_tests" => {
                s.reset_between_tests = match value {
                    Value::Boolean(b) => b,
                    Value::Nil => false,
                    other => {
                        return Err(err(format!(
                            "provium.reset_between_tests must be a boolean, got {}",
                            other.type_name()
                        )))
                    }
                }
            }
            _ => unreachable!(),
        }
        Ok(())
    }

    fn members_of(&self, lua: &Lua) -> mlua::Result<Table> {
        let st = self.0.state.lock().unwrap();
        let out = lua.create_table()?;
        for name in st.vms.keys() {
            let e = lua.create_table()?;
            e.set("kind", "vm")?;
            e.set("name", name.as_str())?;
            out.push(e)?;
        }
        for name in st.bridges.keys() {
            let e = lua.create_table()?;
            e.set("kind", "bridge")?;
            e.set("name", name.as_str())?;
            out.push(e)?;
        }
        for name in st.sub_labs.keys() {
            let e = lua.create_table()?;
            e.set("kind", "sub_lab")?;
            e.set("name", name.as_str())?;
            out.push(e)?;
        }
        Ok(out)
    }

    fn include_one(&self, v: &Value) -> mlua::Result<()> {
        let Value::UserData(ud) = v else {
            return Err(err(format!(
                "include: expected a VM or a Lab, got {}",
                v.type_name()
            )));
        };
        if let Ok(vm) = ud.borrow::<Vm>() {
            let name = vm.name().to_string();
            self.check_new_name("vm", &name)?;
            self.0.state.lock().unwrap().vms.insert(name, vm.clone());
            return Ok(());
        }
        if let Ok(b) = ud.borrow::<Bridge>() {
            let name = b.name().to_string();
            self.check_new_name("bridge", &name)?;
            self.0.state.lock().unwrap().bridges.insert(name, b.clone());
            return Ok(());
        }
        if let Ok(lab) = ud.borrow::<Lab>() {
            let name = lab.name().to_string();
            self.check_new_name("lab", &name)?;
            self.0
                .state
                .lock()
                .unwrap()
                .sub_labs
                .insert(name, lab.clone());
            return Ok(());
        }
        Err(err("include: expected a VM, a Bridge or a Lab userdata"))
    }
}

/// A failed fixture restore's verdict: a device mismatch keeps the entry
/// (rebuilding it would not help), anything else evicts and rebuilds it.
/// How many VMs one scope can restore from one fixture under its recorded
/// name before `vm_fixture` needs an explicit `{name = ...}`.
const MAX_FIXTURE_COPIES: usize = 1000;

/// `vm_fixture(path, opts?)`'s opts: only `name`, a string.
fn fixture_vm_name_opt(opts: Option<Value>) -> mlua::Result<Option<String>> {
    let t = match opts {
        None | Some(Value::Nil) => return Ok(None),
        Some(Value::Table(t)) => t,
        Some(other) => {
            return Err(err(format!(
                "vm_fixture: opts must be a table like {{name = \"node2\"}}, got {}",
                other.type_name()
            )))
        }
    };
    let mut name = None;
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        match (k.to_string()?.as_str(), v) {
            ("name", Value::String(s)) => name = Some(s.to_str()?.to_string()),
            ("name", other) => {
                return Err(err(format!(
                    "vm_fixture: `name` must be a string, got {}",
                    other.type_name()
                )))
            }
            (key, _) => {
                return Err(err(format!(
                    "vm_fixture: unknown option `{key}` (accepted: name)"
                )))
            }
        }
    }
    Ok(name)
}

fn restore_failure(e: RestoreError) -> crate::fixture::RestoreFailure {
    use crate::fixture::RestoreFailure;
    match e {
        RestoreError::Mismatch(m) => RestoreFailure::Mismatch(m),
        RestoreError::Failed(e) => RestoreFailure::Corrupt(super::error_message(&e)),
    }
}

/// The reserved keys work in both call forms, `provium:pack(...)` and
/// `provium.pack(...)`: a leading Lab argument is the method form's self.
fn drop_self(args: MultiValue) -> MultiValue {
    let mut v: Vec<Value> = args.into_iter().collect();
    if matches!(v.first(), Some(Value::UserData(ud)) if ud.is::<Lab>()) {
        v.remove(0);
    }
    v.into_iter().collect()
}

fn pack(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let string: Table = lua.globals().get("string")?;
    string.get::<mlua::Function>("pack")?.call(drop_self(args))
}

fn unpack(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let string: Table = lua.globals().get("string")?;
    string
        .get::<mlua::Function>("unpack")?
        .call(drop_self(args))
}

impl UserData for Lab {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("name", |_, this, ()| Ok(this.0.name.clone()));
        m.add_method("vm", |_, this, (name, profile, opts): (String, Option<String>, Option<Table>)| {
            match profile {
                None => {
                    if opts.is_some() {
                        return Err(err(format!("vm(\"{name}\", nil, opts): sizing opts need a profile")));
                    }
                    this.find_vm(&name).ok_or_else(|| {
                        err(format!(
                            "no vm named `{name}` in lab `{}`; create it with {}:vm(\"{name}\", \"<profile>\")",
                            this.0.name, this.0.name
                        ))
                    })
                }
                Some(profile) => {
                    this.check_new_name("vm", &name)?;
                    let sizing = VmSizing::from_opts(opts.as_ref())?;
                    let vm = Vm::create(this.0.env.clone(), name.clone(), profile, sizing)?;
                    this.0.state.lock().unwrap().vms.insert(name, vm.clone());
                    Ok(vm)
                }
            }
        });
        m.add_method("bridge", |_, this, (name, opts): (String, Option<Table>)| {
            if let Some(o) = &opts {
                if let Some(pair) = o.pairs::<Value, Value>().next() {
                    let (k, _) = pair?;
                    return Err(err(format!(
                        "bridge(\"{name}\", opts): unknown option {k:?} (bridge opts are reserved; none are accepted yet)"
                    )));
                }
            }
            // Lookup walks up the scope chain; otherwise create here.
            if let Some(b) = this.find_bridge(&name) {
                return Ok(b);
            }
            this.check_new_name("bridge", &name)?;
            let b = Bridge::create(&this.0.env, &name);
            this.0.state.lock().unwrap().bridges.insert(name, b.clone());
            Ok(b)
        });
        m.add_method("lab", |_, this, name: Option<String>| {
            let name = match name {
                Some(n) => n,
                None => {
                    let mut st = this.0.state.lock().unwrap();
                    let n = format!("__lab_{}", st.next_anon);
                    st.next_anon += 1;
                    n
                }
            };
            this.check_new_name("lab", &name)?;
            // Federation sub-labs have no parent chain: no fall-through.
            let lab = this.child(name.clone(), None);
            this.0
                .state
                .lock()
                .unwrap()
                .sub_labs
                .insert(name, lab.clone());
            Ok(lab)
        });
        m.add_method("include", |_, this, v: Value| {
            match &v {
                Value::Table(t) => {
                    for item in t.sequence_values::<Value>() {
                        this.include_one(&item?)?;
                    }
                }
                other => this.include_one(other)?,
            }
            Ok(())
        });
        m.add_method("remove", |_, this, v: Value| {
            let name = match &v {
                Value::String(s) => s.to_str()?.to_string(),
                Value::UserData(ud) => {
                    if let Ok(vm) = ud.borrow::<Vm>() {
                        vm.name().to_string()
                    } else if let Ok(b) = ud.borrow::<Bridge>() {
                        b.name().to_string()
                    } else if let Ok(l) = ud.borrow::<Lab>() {
                        l.name().to_string()
                    } else {
                        return Err(err("remove: expected a name, a VM, a Bridge or a Lab"));
                    }
                }
                other => {
                    return Err(err(format!(
                        "remove: expected a name or a userdata, got {}",
                        other.type_name()
                    )))
                }
            };
            let mut st = this.0.state.lock().unwrap();
            if st.vms.remove(&name).is_some()
                || st.bridges.remove(&name).is_some()
                || st.sub_labs.remove(&name).is_some()
            {
                Ok(())
            } else {
                Err(err(format!(
                    "remove: nothing named `{name}` in lab `{}`",
                    this.0.name
                )))
            }
        });
        m.add_method("members", |lua, this, ()| this.members_of(lua));
        m.add_method("vm_names", |_, this, ()| {
            Ok(this
                .0
                .state
                .lock()
                .unwrap()
                .vms
                .keys()
                .cloned()
                .collect::<Vec<_>>())
        });
        m.add_method("bridge_names", |_, this, ()| {
            Ok(this
                .0
                .state
                .lock()
                .unwrap()
                .bridges
                .keys()
                .cloned()
                .collect::<Vec<_>>())
        });
        m.add_method("sub_lab_names", |_, this, ()| {
            Ok(this
                .0
                .state
                .lock()
                .unwrap()
                .sub_labs
                .keys()
                .cloned()
                .collect::<Vec<_>>())
        });
        m.add_method("boot", |_, this, ()| {
            // All at once: a boot is mostly waiting for the guest's kernel
            // and agent, and where kernels are emulated (kvm_pvm) each VM
            // has a host core of its own (the dispatcher's slots), so a
            // serial loop would take the sum of the boots instead of the
            // longest. The first error (in name order) is the one raised.
            let vms = this.vms();
            let results: Vec<mlua::Result<Vm>> = std::thread::scope(|scope| {
                let handles: Vec<_> = vms
                    .iter()
                    .map(|vm| scope.spawn(move || vm.boot(None)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(mlua::Error::runtime("provium:boot(): a VM's boot panicked"))
                        })
                    })
                    .collect()
            });
            for r in results {
                r?;
            }
            Ok(this.clone())
        });
        m.add_method("shutdown", |_, this, ()| {
            for vm in this.vms() {
                vm.shutdown()?;
            }
            Ok(())
        });
        m.add_method("pause", |_, this, ()| {
            for vm in this.vms() {
                vm.pause()?;
            }
            Ok(())
        });
        m.add_method("resume", |_, this, ()| {
            for vm in this.vms() {
                vm.resume()?;
            }
            Ok(())
        });
        m.add_method("claim", |_, this, spec: Table| this.claim(spec));
        m.add_method(
            "barrier",
            |_, this, (name, count, timeout): (String, i64, Value)| {
                let timeout = match timeout {
                    Value::Nil => None,
                    v => Some(duration::from_lua(&v, "barrier: timeout")?),
                };
                this.barrier(name, count, timeout)
            },
        );
        // The reference: `lab:snapshot(dir)` writes there and returns the
        // dir as a string; `lab:snapshot()` a LabSnapshot in a temp dir
        // (deleted with the scope).
        m.add_method("snapshot", |lua, this, path: Option<String>| {
            use super::snapshot::{delete_at_scope_end, temp_path, LabSnapshotUd};
            if let Some(p) = path {
                this.snapshot_into(std::path::Path::new(&p))?;
                return Ok(Value::String(lua.create_string(&p)?));
            }
            let path = temp_path(".lab");
            if let Err(e) = this.snapshot_into(&path) {
                super::snapshot::remove_any(&path);
                return Err(e);
            }
            delete_at_scope_end(&this.0.env, &path);
            Ok(Value::UserData(
                lua.create_userdata(LabSnapshotUd { path })?,
            ))
        });
        m.add_method("restore", |_, this, v: Value| {
            let path = super::snapshot::snapshot_path_arg(&v, "lab:restore")?;
            this.restore_from_dir(&path)?;
            Ok(this.clone())
        });
        // vm_fixture / lab_fixture are served by __index (below), so both
        // `provium:vm_fixture(p)` and `provium.vm_fixture(p)` work.
        // A marker for the fixture-key scanner; nothing happens at run time.
        m.add_method("depends_on_file", |_, _, path: String| {
            if path.is_empty() {
                return Err(err("depends_on_file: the path must not be empty"));
            }
            Ok(())
        });

        m.add_meta_method(
            MetaMethod::Index,
            |lua, this, key: Value| -> mlua::Result<Value> {
                let Value::String(s) = &key else {
                    return Ok(Value::Nil);
                };
                let key = s.to_str()?.to_string();
                match key.as_str() {
                    "pack" => {
                        return Ok(Value::Function(
                            lua.create_function(|lua, args: MultiValue| pack(lua, args))?,
                        ))
                    }
                    "unpack" => {
                        return Ok(Value::Function(
                            lua.create_function(|lua, args: MultiValue| unpack(lua, args))?,
                        ))
                    }
                    "vm_fixture" | "lab_fixture" => {
                        let this = this.clone();
                        let which: &'static str = if key == "vm_fixture" {
                            "vm_fixture"
                        } else {
                            "lab_fixture"
                        };
                        return Ok(Value::Function(lua.create_function(
                            move |lua, args: MultiValue| {
                                this.fixture_call(lua, which, drop_self(args))
                            },
                        )?));
                    }
                    "timeout" => {
                        let s = this.0.file.settings.lock().unwrap().timeout;
                        return Ok(s.map_or(Value::Nil, |d| Value::Number(d.as_secs_f64())));
                    }
                    "reset_between_tests" => {
                        return Ok(Value::Boolean(
                            this.0.file.settings.lock().unwrap().reset_between_tests,
                        ))
                    }
                    _ => {}
                }
                if let Some(vm) = this.find_vm(&key) {
                    return Ok(Value::UserData(lua.create_userdata(vm)?));
                }
                if let Some(b) = this.find_bridge(&key) {
                    return Ok(Value::UserData(lua.create_userdata(b)?));
                }
                if let Some(l) = this.find_sub_lab(&key) {
                    return Ok(Value::UserData(lua.create_userdata(l)?));
                }
                Ok(Value::Nil)
            },
        );
        m.add_meta_method(MetaMethod::NewIndex, |_, this, (key, value): (String, Value)| match key.as_str() {
            "timeout" | "reset_between_tests" => this.set_setting(&key, value),
            other => Err(err(format!(
                "cannot assign provium.{other}: only `timeout` and `reset_between_tests` can be set; \
                 create resources with provium:vm(name, profile)"
            ))),
        });
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Lab({})", this.0.name))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::events::EventSender;
    use crate::lua::snapshot::{NicDecl, VmDevices};
    use crate::runner::BackendKind;

    fn kvm_env() -> Arc<FileEnv> {
        Arc::new(FileEnv::new(
            "t.test.lua".into(),
            "/t.test.lua".into(),
            Vec::new(),
            Arc::new(Config::default()),
            BackendKind::Kvm,
            EventSender::disabled(),
        ))
    }

    fn vm(lab: &Lab, name: &str) -> Vm {
        let sizing = VmSizing {
            memory_bytes: 64 << 20,
            cpus: 1,
        };
        Vm::create(lab.0.env.clone(), name.into(), "p".into(), sizing).unwrap()
    }

    fn decl(nics: Vec<NicDecl>) -> VmDevices {
        VmDevices {
            disks: vec![],
            nics,
        }
    }

    fn nic(bridge: &str, mac: &str, lab: Option<&[&str]>) -> NicDecl {
        NicDecl {
            bridge: bridge.into(),
            mac: mac.into(),
            attached: true,
            connected: true,
            bridge_lab: lab.map(|p| p.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn bridge_names(lab: &Lab) -> Vec<String> {
        lab.0
            .state
            .lock()
            .unwrap()
            .bridges
            .keys()
            .cloned()
            .collect()
    }

    /// A VM fixture's NICs: a bridge of the recorded name is made in the
    /// lab when it has none, with the recorded MAC and link state; VMs
    /// restored together share it.
    #[test]
    fn a_restored_vm_joins_a_new_bridge_of_the_recorded_name() {
        let root = Lab::root(kvm_env());
        let v = vm(&root, "v");
        let mut n = nic("lan", "02:00:00:00:00:0a", None);
        n.connected = false;
        root.join_recorded_bridges(&v, &decl(vec![n])).unwrap();
        assert_eq!(bridge_names(&root), ["lan"]);
        let lan = root.find_bridge("lan").unwrap();
        assert!(lan.has_vm(&v));
        assert_eq!(lan.mac_of("v").unwrap().to_string(), "02:00:00:00:00:0a");
        assert!(!lan.is_connected("v"));
        let w = vm(&root, "w");
        root.join_recorded_bridges(&w, &decl(vec![nic("lan", "02:00:00:00:00:0b", None)]))
            .unwrap();
        assert_eq!(lan.members_sorted(), ["v", "w"], "one bridge, shared");
        // Idempotent: already on a bridge of that name.
        root.join_recorded_bridges(&w, &decl(vec![nic("lan", "02:00:00:00:00:0b", None)]))
            .unwrap();
        assert_eq!(bridge_names(&root), ["lan"]);
    }

    /// From a test scope the file's bridge of that name is found; a lab
    /// snapshot's NIC names the sub-lab that held its bridge.
    #[test]
    fn recorded_bridges_are_found_up_the_scope_chain_and_at_their_sub_lab() {
        let root = Lab::root(kvm_env());
        let lan = Bridge::create(&root.0.env, "lan");
        root.0
            .state
            .lock()
            .unwrap()
            .bridges
            .insert("lan".into(), lan.clone());
        let scope = root.child("provium".into(), Some(root.clone()));
        let v = vm(&scope, "v");
        scope
            .join_recorded_bridges(&v, &decl(vec![nic("lan", "02:00:00:00:00:0a", None)]))
            .unwrap();
        assert!(lan.has_vm(&v), "the file's bridge");
        assert!(
            bridge_names(&scope).is_empty(),
            "no new bridge in the test scope"
        );
        let w = vm(&scope, "w");
        scope
            .join_recorded_bridges(
                &w,
                &decl(vec![nic("dmz", "02:00:00:00:00:0b", Some(&["site"]))]),
            )
            .unwrap();
        let site = scope.find_sub_lab("site").expect("the sub-lab is made");
        assert_eq!(bridge_names(&site), ["dmz"]);
        assert!(site.find_bridge("dmz").unwrap().has_vm(&w));
        // A name taken by a VM of that lab cannot be a bridge: a mismatch.
        let x = vm(&scope, "x");
        scope
            .0
            .state
            .lock()
            .unwrap()
            .vms
            .insert("wan".into(), x.clone());
        match scope.join_recorded_bridges(&x, &decl(vec![nic("wan", "02:00:00:00:00:0c", None)])) {
            Err(RestoreError::Mismatch(m)) => assert!(
                m.contains("cannot make bridge `wan` for the restored NICs in lab `provium`"),
                "{m}"
            ),
            _ => panic!("a mismatch expected"),
        }
    }

    /// `site:restore(s)` of a VM on a bridge outside `site`: `lab:restore`
    /// shuts it down, and it goes back to the bridge it left rather than
    /// to a new one of that name in `site`.
    #[test]
    fn a_vm_restored_by_its_lab_keeps_the_bridges_it_left() {
        let root = Lab::root(kvm_env());
        let lan = Bridge::create(&root.0.env, "lan");
        root.0
            .state
            .lock()
            .unwrap()
            .bridges
            .insert("lan".into(), lan.clone());
        let site = root.sub_lab_at(&["site".into()]).unwrap();
        let v = vm(&site, "v");
        let mac = crate::lua::bridge::nic_mac("v", "lan", &[]);
        lan.restore_member(&v, mac, None).unwrap();
        v.shutdown().unwrap();
        let devices = decl(vec![nic("lan", &mac.to_string(), None)]);
        site.join_recorded_bridges(&v, &devices).unwrap();
        assert!(bridge_names(&site).is_empty(), "no second `lan`");
        let ports = crate::lua::nic::restore_ports(&v, &devices.nics, &v.left_bridges()).unwrap();
        assert_eq!(ports.configs.len(), 1);
        assert!(lan.has_vm(&v), "back on the bridge it left");
    }

    /// `lab:snapshot()` records each bridge's sub-lab path.
    #[test]
    fn bridges_are_listed_with_their_sub_lab_paths() {
        let root = Lab::root(kvm_env());
        let lan = Bridge::create(&root.0.env, "lan");
        root.0
            .state
            .lock()
            .unwrap()
            .bridges
            .insert("lan".into(), lan.clone());
        let site = root.sub_lab_at(&["site".into()]).unwrap();
        let dmz = Bridge::create(&root.0.env, "dmz");
        site.0
            .state
            .lock()
            .unwrap()
            .bridges
            .insert("dmz".into(), dmz.clone());
        let mut out = Vec::new();
        root.bridges_downward(&mut Vec::new(), &mut out);
        let got: Vec<(Vec<String>, String)> = out
            .iter()
            .map(|(p, b)| (p.clone(), b.name().to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (vec![], "lan".to_string()),
                (vec!["site".to_string()], "dmz".to_string())
            ]
        );
    }
}
