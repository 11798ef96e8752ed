//! What a lab contains (its VMs, bridges and sub-labs, by name), the
//! lookups through a test scope's parent chain, and the naming rules: a
//! name is taken once per lab, is never one of [`RESERVED_NAMES`], and in a
//! test scope does not shadow a name of the file root.

use std::collections::BTreeMap;

use mlua::{Lua, Table, Value};

use super::{Lab, RESERVED_NAMES};
use crate::lock::Locked;
use crate::lua::err;
use crate::lua::vm::Vm;
use crate::network::Bridge;

/// One lab's own members; the scope chain is [`Lab::find_in_chain`]'s.
#[derive(Default)]
pub(super) struct LabState {
    pub(super) vms: BTreeMap<String, Vm>,
    pub(super) bridges: BTreeMap<String, Bridge>,
    pub(super) sub_labs: BTreeMap<String, Lab>,
    /// Numbers the anonymous sub-labs (`__lab_N`) of `lab:lab()` and
    /// `lab_fixture`.
    pub(super) next_anon: usize,
}

impl Lab {
    /// VMs of this lab and its sub-labs (downward), with their sub-lab path.
    pub(super) fn vms_downward(&self, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Vm)>) {
        self.collect_downward(path, out, &|st| st.vms.values().cloned().collect());
    }

    /// What `pick` takes from this lab and from each sub-lab below it, depth
    /// first in name order, each with its sub-lab path below this lab
    /// (`path` is the prefix so far).
    pub(super) fn collect_downward<T>(
        &self,
        path: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, T)>,
        pick: &dyn Fn(&LabState) -> Vec<T>,
    ) {
        let (mine, subs): (Vec<T>, Vec<(String, Lab)>) = {
            let st = self.0.state.locked();
            (
                pick(&st),
                st.sub_labs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )
        };
        out.extend(mine.into_iter().map(|x| (path.clone(), x)));
        for (name, lab) in subs {
            path.push(name);
            lab.collect_downward(path, out, pick);
            path.pop();
        }
    }

    /// The sub-lab at `path` below this lab, created where missing.
    pub(super) fn sub_lab_at(&self, path: &[String]) -> mlua::Result<Lab> {
        let mut lab = self.clone();
        for name in path {
            let existing = lab.0.state.locked().sub_labs.get(name).cloned();
            lab = match existing {
                Some(l) => l,
                None => {
                    lab.check_new_name("lab", name)?;
                    let l = lab.child(name.clone(), None);
                    lab.put_sub_lab(name.clone(), &l);
                    l
                }
            };
        }
        Ok(lab)
    }

    /// Scope chain lookup: this lab, then (for a test scope) its parents;
    /// `pick` reads one lab's state.
    pub(super) fn find_in_chain<T>(&self, pick: impl Fn(&LabState) -> Option<T>) -> Option<T> {
        let mut lab = Some(self.clone());
        while let Some(l) = lab {
            if let Some(found) = pick(&l.0.state.locked()) {
                return Some(found);
            }
            lab = l.0.parent.clone();
        }
        None
    }

    pub(super) fn find_vm(&self, name: &str) -> Option<Vm> {
        self.find_in_chain(|st| st.vms.get(name).cloned())
    }

    pub(super) fn find_bridge(&self, name: &str) -> Option<Bridge> {
        self.find_in_chain(|st| st.bridges.get(name).cloned())
    }

    pub(super) fn find_sub_lab(&self, name: &str) -> Option<Lab> {
        self.find_in_chain(|st| st.sub_labs.get(name).cloned())
    }

    /// A name may be taken once per lab, never reserved, and (in a test
    /// scope) not shadow a name of the file root.
    pub(super) fn check_new_name(&self, kind: &str, name: &str) -> mlua::Result<()> {
        if name.is_empty() {
            return Err(err(format!("{kind} name must not be empty")));
        }
        if RESERVED_NAMES.contains(&name) {
            return Err(err(format!(
                "`{name}` is a reserved name on a lab ({}); pick another {kind} name",
                RESERVED_NAMES.join(", ")
            )));
        }
        let st = self.0.state.locked();
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
            let st = p.0.state.locked();
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

    pub(super) fn vms(&self) -> Vec<Vm> {
        self.0.state.locked().vms.values().cloned().collect()
    }

    pub(super) fn members_of(&self, lua: &Lua) -> mlua::Result<Table> {
        let st = self.0.state.locked();
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

    pub(super) fn include_one(&self, v: &Value) -> mlua::Result<()> {
        let Value::UserData(ud) = v else {
            return Err(err(format!(
                "include: expected a VM or a Lab, got {}",
                v.type_name()
            )));
        };
        if let Ok(vm) = ud.borrow::<Vm>() {
            let name = vm.name().to_string();
            self.check_new_name("vm", &name)?;
            self.put_vm(name, &vm);
            return Ok(());
        }
        if let Ok(b) = ud.borrow::<Bridge>() {
            let name = b.name().to_string();
            self.check_new_name("bridge", &name)?;
            self.put_bridge(name, &b);
            return Ok(());
        }
        if let Ok(lab) = ud.borrow::<Lab>() {
            let name = lab.name().to_string();
            self.check_new_name("lab", &name)?;
            self.put_sub_lab(name, &lab);
            return Ok(());
        }
        Err(err("include: expected a VM, a Bridge or a Lab userdata"))
    }

    /// Put `vm` in this lab under `name` (the caller checked the name).
    pub(super) fn put_vm(&self, name: String, vm: &Vm) {
        self.0.state.locked().vms.insert(name, vm.clone());
    }

    /// Put bridge `b` in this lab under `name` (the caller checked the name).
    pub(super) fn put_bridge(&self, name: String, b: &Bridge) {
        self.0.state.locked().bridges.insert(name, b.clone());
    }

    /// Put `lab` in this lab as sub-lab `name` (the caller checked the name).
    pub(super) fn put_sub_lab(&self, name: String, lab: &Lab) {
        self.0
            .state
            .lock()
            .unwrap()
            .sub_labs
            .insert(name, lab.clone());
    }

    /// A fresh `__lab_N` name for an anonymous sub-lab.
    pub(super) fn next_anon_lab_name(&self) -> String {
        let mut st = self.0.state.locked();
        let n = format!("__lab_{}", st.next_anon);
        st.next_anon += 1;
        n
    }

    /// `lab:vm_names()`, `lab:bridge_names()`, `lab:sub_lab_names()`: this
    /// lab's own members of one kind, sorted.
    pub(super) fn vm_names(&self) -> Vec<String> {
        self.0.state.locked().vms.keys().cloned().collect()
    }

    pub(super) fn bridge_names(&self) -> Vec<String> {
        self.0
            .state
            .lock()
            .unwrap()
            .bridges
            .keys()
            .cloned()
            .collect()
    }

    pub(super) fn sub_lab_names(&self) -> Vec<String> {
        self.0
            .state
            .lock()
            .unwrap()
            .sub_labs
            .keys()
            .cloned()
            .collect()
    }

    /// `lab:remove(name)`: drops the member of that name from this lab
    /// (the resource itself lives on until its scope closes).
    pub(super) fn remove_named(&self, name: &str) -> mlua::Result<()> {
        let mut st = self.0.state.locked();
        if st.vms.remove(name).is_some()
            || st.bridges.remove(name).is_some()
            || st.sub_labs.remove(name).is_some()
        {
            Ok(())
        } else {
            Err(err(format!(
                "remove: nothing named `{name}` in lab `{}`",
                self.0.name
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_utils::{add_bridge, add_vm, kvm_env, vm};
    use super::*;
    use crate::lua::error_message;

    fn name_error(lab: &Lab, kind: &str, name: &str) -> String {
        error_message(&lab.check_new_name(kind, name).unwrap_err())
    }

    #[test]
    fn a_name_is_refused_when_empty_reserved_or_taken() {
        let root = Lab::root(kvm_env());
        assert_eq!(name_error(&root, "vm", ""), "vm name must not be empty");
        assert_eq!(
            name_error(&root, "bridge", "timeout"),
            "`timeout` is a reserved name on a lab (pack, unpack, vm_fixture, lab_fixture, timeout, \
             reset_between_tests); pick another bridge name"
        );
        add_vm(&root, &vm(&root, "a"));
        assert_eq!(
            name_error(&root, "bridge", "a"),
            "DuplicateVmName: vm `a` already exists in lab `provium`; use provium:vm(\"a\") to look it up"
        );
        add_bridge(&root, "lan");
        assert_eq!(
            name_error(&root, "vm", "lan"),
            "DuplicateBridgeName: bridge `lan` already exists in lab `provium`; use provium:bridge(\"lan\") to look it up"
        );
        root.sub_lab_at(&["site".into()]).unwrap();
        assert_eq!(
            name_error(&root, "lab", "site"),
            "DuplicateLabName: sub-lab `site` already exists in lab `provium`"
        );
        assert!(root.check_new_name("vm", "b").is_ok());
    }

    /// A test scope may not shadow the root's names, but a sub-lab (no
    /// parent chain) may reuse them.
    #[test]
    fn a_test_scope_cannot_shadow_the_root() {
        let root = Lab::root(kvm_env());
        add_vm(&root, &vm(&root, "a"));
        let scope = root.child("provium".into(), Some(root.clone()));
        assert_eq!(
            name_error(&scope, "vm", "a"),
            "name `a` already declared at parent scope (lab `provium`). Pick a different name, \
             or use `provium:vm(\"a\")` to reuse it."
        );
        let sub = root.child("site".into(), None);
        assert!(sub.check_new_name("vm", "a").is_ok());
    }

    #[test]
    fn lookups_walk_the_scope_chain() {
        let root = Lab::root(kvm_env());
        add_vm(&root, &vm(&root, "a"));
        add_bridge(&root, "lan");
        let site = root.sub_lab_at(&["site".into()]).unwrap();
        let scope = root.child("provium".into(), Some(root.clone()));
        assert_eq!(scope.find_vm("a").unwrap().name(), "a");
        assert_eq!(scope.find_bridge("lan").unwrap().name(), "lan");
        assert!(Arc::ptr_eq(&scope.find_sub_lab("site").unwrap().0, &site.0));
        assert!(site.find_vm("a").is_none(), "a sub-lab has no parent chain");
        assert!(scope.find_vm("b").is_none());
    }

    #[test]
    fn sub_labs_are_made_once_along_a_path_and_vms_listed_downward() {
        let root = Lab::root(kvm_env());
        let deep = root.sub_lab_at(&["a".into(), "b".into()]).unwrap();
        let again = root.sub_lab_at(&["a".into(), "b".into()]).unwrap();
        assert!(Arc::ptr_eq(&deep.0, &again.0));
        assert_eq!(root.sub_lab_names(), ["a"]);
        add_vm(&root, &vm(&root, "top"));
        add_vm(&deep, &vm(&deep, "leaf"));
        let mut out = Vec::new();
        root.vms_downward(&mut Vec::new(), &mut out);
        let got: Vec<(Vec<String>, String)> = out
            .iter()
            .map(|(p, v)| (p.clone(), v.name().to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (vec![], "top".to_string()),
                (vec!["a".to_string(), "b".to_string()], "leaf".to_string())
            ]
        );
    }

    #[test]
    fn members_are_removed_by_name_and_anonymous_labs_numbered() {
        let root = Lab::root(kvm_env());
        add_vm(&root, &vm(&root, "a"));
        add_bridge(&root, "lan");
        assert_eq!(root.vm_names(), ["a"]);
        assert_eq!(root.bridge_names(), ["lan"]);
        root.remove_named("a").unwrap();
        root.remove_named("lan").unwrap();
        assert!(root.vm_names().is_empty() && root.bridge_names().is_empty());
        assert_eq!(
            error_message(&root.remove_named("a").unwrap_err()),
            "remove: nothing named `a` in lab `provium`"
        );
        assert_eq!(root.next_anon_lab_name(), "__lab_0");
        assert_eq!(root.next_anon_lab_name(), "__lab_1");
    }

    #[test]
    fn members_lists_each_kind_in_name_order() {
        let lua = Lua::new();
        let root = Lab::root(kvm_env());
        add_bridge(&root, "lan");
        add_vm(&root, &vm(&root, "b"));
        add_vm(&root, &vm(&root, "a"));
        root.sub_lab_at(&["site".into()]).unwrap();
        let t = root.members_of(&lua).unwrap();
        let got: Vec<(String, String)> = t
            .sequence_values::<Table>()
            .map(|e| {
                let e = e.unwrap();
                (e.get("kind").unwrap(), e.get("name").unwrap())
            })
            .collect();
        let want = [
            ("vm", "a"),
            ("vm", "b"),
            ("bridge", "lan"),
            ("sub_lab", "site"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, n)| (k.to_string(), n.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn include_takes_vms_bridges_and_labs_under_their_names() {
        let lua = Lua::new();
        let root = Lab::root(kvm_env());
        let other = Lab::root(kvm_env());
        let v = vm(&other, "v");
        let lan = Bridge::create(&other.0.env, "lan");
        let site = other.child("site".into(), None);
        for ud in [
            lua.create_userdata(v).unwrap(),
            lua.create_userdata(lan).unwrap(),
            lua.create_userdata(site).unwrap(),
        ] {
            root.include_one(&Value::UserData(ud)).unwrap();
        }
        assert_eq!(root.vm_names(), ["v"]);
        assert_eq!(root.bridge_names(), ["lan"]);
        assert_eq!(root.sub_lab_names(), ["site"]);
        assert_eq!(
            error_message(&root.include_one(&Value::Integer(1)).unwrap_err()),
            "include: expected a VM or a Lab, got integer"
        );
    }
}
