//! Joining a bridge: `bridge:attach` ([`Bridge::attach_all`]), a local
//! restore re-joining ([`Bridge::attach_vm`]) and a kvm restore's member
//! with the snapshot's MAC ([`Bridge::restore_member`]). Leaving is
//! [`Bridge::detach_name`] and [`NetMember::leave_all`].

use provium_netsetup::MacAddr;

use super::bridge::{Bridge, Member, NetMember};
use super::error::NetworkError;
use super::naming::nic_mac;
use super::realise::realise_on;

impl Bridge {
    /// Attaches `vm` (a local restore re-joining the bridges its sandbox
    /// was on); a no-op when it is a member already.
    pub fn attach_vm(&self, vm: &NetMember) -> Result<(), NetworkError> {
        if self.has_vm(vm) {
            return Ok(());
        }
        self.attach_all(vec![(vm.name().to_string(), Some(vm.clone()))])
    }

    /// `bridge:attach`: attaches every item, or none: all are validated and
    /// recorded first, then booted VMs are realised; any failure undoes the
    /// whole call.
    pub fn attach_all(&self, items: Vec<(String, Option<NetMember>)>) -> Result<(), NetworkError> {
        let refused = |e| NetworkError::refused("attach", e);
        let mut added: Vec<(String, Option<NetMember>)> = Vec::new();
        {
            let mut st = self.open_state("attach")?;
            let mut seen: Vec<&str> = Vec::new();
            for (name, vm) in &items {
                if seen.contains(&name.as_str()) {
                    return Err(refused(NetworkError::Twice { name: name.clone() }));
                }
                seen.push(name);
                if let Some(m) = st.members.get(name) {
                    let same = match (&m.vm, vm) {
                        (Some(a), Some(b)) => a.same(b),
                        (None, None) => true,
                        _ => false,
                    };
                    let stale = m.vm.as_ref().is_some_and(NetMember::is_gone);
                    if !same && !stale {
                        return Err(refused(NetworkError::NameTaken {
                            vm: name.clone(),
                            bridge: self.0.name.clone(),
                        }));
                    }
                }
            }
            for (name, vm) in items {
                if let Some(m) = st.members.get(&name) {
                    let same = match (&m.vm, &vm) {
                        (Some(a), Some(b)) => a.same(b),
                        (None, None) => true,
                        _ => false,
                    };
                    if same {
                        continue; // already attached: attach is idempotent
                    }
                    st.members.remove(&name);
                    let _ = self.0.switch.detach(&name);
                }
                let taken: Vec<MacAddr> = st.members.values().map(|m| m.mac).collect();
                let mac = nic_mac(&name, &self.0.name, &taken);
                st.members.insert(
                    name.clone(),
                    Member {
                        vm: vm.clone(),
                        mac,
                        nic: None,
                        link_down: false,
                    },
                );
                added.push((name, vm));
            }
        }
        for (_, vm) in &added {
            if let Some(vm) = vm {
                vm.link_bridge(self);
            }
        }
        for (name, vm) in &added {
            let Some(vm) = vm else { continue };
            if !vm.is_booted() {
                continue;
            }
            if let Err(e) = realise_on(vm, self) {
                for (n, _) in &added {
                    self.detach_name(n);
                }
                return Err(refused(NetworkError::NothingAttached {
                    bridge: self.0.name.clone(),
                    vm: name.clone(),
                    source: Box::new(e),
                }));
            }
        }
        Ok(())
    }

    /// For a restore: makes `vm` a member with the snapshot's `mac` (the
    /// restored guest has it cached), link down when `connected` is
    /// `Some(false)`. A member that is already this VM keeps its link
    /// state and takes `mac`; a member of that name that is another VM
    /// which is shut down or dead is replaced. Errors (nothing changed)
    /// when the bridge is closed, a live VM of that name is attached, or
    /// another member has the MAC. Returns whether a member was added.
    /// The VM is not realised here: the restore does it.
    pub fn restore_member(
        &self,
        vm: &NetMember,
        mac: MacAddr,
        connected: Option<bool>,
    ) -> Result<bool, NetworkError> {
        let name = vm.name();
        let mut st = self.lock();
        if st.closed {
            return Err(NetworkError::ClosedRefuses {
                bridge: self.0.name.clone(),
            });
        }
        if let Some((other, _)) = st
            .members
            .iter()
            .find(|(n, m)| n.as_str() != name && m.mac == mac)
        {
            return Err(NetworkError::MacTaken {
                other: other.clone(),
                bridge: self.0.name.clone(),
                mac,
            });
        }
        let mut replace = false;
        if let Some(m) = st.members.get_mut(name) {
            match &m.vm {
                Some(v) if v.same(vm) => {
                    if m.nic.is_some() {
                        return Err(NetworkError::LiveNic {
                            vm: name.to_owned(),
                            bridge: self.0.name.clone(),
                        });
                    }
                    m.mac = mac;
                    return Ok(false);
                }
                Some(v) if v.is_gone() => replace = true,
                _ => {
                    return Err(NetworkError::NameTaken {
                        vm: name.to_owned(),
                        bridge: self.0.name.clone(),
                    })
                }
            }
        }
        if replace {
            if let Some(old) = st.members.remove(name) {
                drop(old.nic);
                let _ = self.0.switch.detach(name);
                if let Some(v) = old.vm {
                    drop(st);
                    v.unlink_bridge(self);
                    st = self.lock();
                }
            }
        }
        st.members.insert(
            name.to_owned(),
            Member {
                vm: Some(vm.clone()),
                mac,
                nic: None,
                link_down: connected == Some(false),
            },
        );
        drop(st);
        vm.link_bridge(self);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::phase::Phase;
    use crate::network::test_env::{env, vm};

    #[test]
    fn a_restored_member_has_the_snapshots_mac_and_link() {
        let env = env(1);
        let b = Bridge::create(&env, "lan");
        let v = vm(&env, "v");
        let mac: MacAddr = "02:00:00:00:00:42".parse().unwrap();
        assert!(
            b.restore_member(&v.net(), mac, Some(false)).unwrap(),
            "a member was added"
        );
        assert!(b.has_vm(&v.net()) && v.bridges().iter().any(|x| x.ptr_eq(&b)));
        assert_eq!(b.mac_of("v"), Some(mac));
        assert!(!b.is_connected("v"), "the snapshot's NIC was disconnected");
        // Already this VM: takes the MAC, keeps its link state.
        let mac2: MacAddr = "02:00:00:00:00:43".parse().unwrap();
        assert!(
            !b.restore_member(&v.net(), mac2, Some(true)).unwrap(),
            "already a member"
        );
        assert_eq!(b.mac_of("v"), Some(mac2));
        assert!(!b.is_connected("v"));
        // Another member has the MAC.
        let w = vm(&env, "w");
        let e = b
            .restore_member(&w.net(), mac2, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("vm `v` on bridge `lan` already has MAC 02:00:00:00:00:43"),
            "{e}"
        );
        assert!(!b.is_member("w"));
        // A live VM of that name is attached: refused; a shut-down one is replaced.
        let v2 = vm(&env, "v");
        let e = b
            .restore_member(&v2.net(), mac, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a vm named `v` is already attached"), "{e}");
        v.shutdown().unwrap();
        assert!(!b.is_member("v"), "shutdown leaves the bridge");
        b.attach_all(vec![("v".into(), Some(v.net()))]).unwrap();
        assert_eq!(v.phase(), Phase::Shutdown);
        assert!(
            b.restore_member(&v2.net(), mac, None).unwrap(),
            "a member was added"
        );
        assert!(b.has_vm(&v2.net()) && !b.has_vm(&v.net()));
        assert!(
            !v.bridges().iter().any(|x| x.ptr_eq(&b)),
            "the old VM forgets it"
        );
        assert_eq!(v2.phase(), Phase::Created);
        b.close().unwrap();
        let e = b
            .restore_member(&w.net(), mac, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bridge `lan` is closed"), "{e}");
    }

    #[test]
    fn an_attach_refusal_names_the_method_then_why() {
        let env = env(1);
        let b = Bridge::create(&env, "lan");
        let v = vm(&env, "v");
        let msg = |e: NetworkError| crate::error_chain::flatten(&e);
        let e = msg(b
            .attach_all(vec![("x".into(), None), ("x".into(), None)])
            .unwrap_err());
        assert_eq!(e, "bridge:attach: `x` appears twice in the list");
        assert!(!b.is_member("x"), "nothing was attached");
        b.attach_all(vec![("v".into(), None)]).unwrap();
        let e = msg(b.attach_vm(&v.net()).unwrap_err());
        assert!(
            e.starts_with("bridge:attach: a vm named `v` is already attached to bridge `lan`"),
            "{e}"
        );
        b.close().unwrap();
        let e = msg(b.attach_all(vec![("y".into(), None)]).unwrap_err());
        assert!(
            e.starts_with("bridge:attach: bridge `lan` is closed; create another"),
            "{e}"
        );
    }

    /// A booted VM whose machine is gone: its NIC cannot be made.
    struct NoMachine;

    impl crate::network::MemberVm for NoMachine {
        fn name(&self) -> &str {
            "v"
        }
        fn is_booted(&self) -> bool {
            true
        }
        fn is_gone(&self) -> bool {
            false
        }
        fn running_machine(&self) -> Option<std::sync::Arc<dyn crate::backend::Guest>> {
            None
        }
        fn same_vm(&self, other: &dyn crate::network::MemberVm) -> bool {
            other.as_any().is::<NoMachine>()
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn a_booted_vm_whose_nic_fails_attaches_nothing_and_says_why() {
        let b = Bridge::create(&env(1), "lan");
        let v = NetMember::new(
            std::sync::Arc::new(NoMachine),
            std::sync::Arc::new(crate::network::VmLinks::default()),
        );
        let e = b
            .attach_all(vec![("w".into(), None), ("v".into(), Some(v.clone()))])
            .unwrap_err();
        assert_eq!(
            crate::error_chain::flatten(&e),
            "bridge:attach: bridge `lan`: nothing was attached: vm `v`'s NIC failed: \
             vm `v` has no running machine"
        );
        assert!(b.members_sorted().is_empty(), "the whole call was undone");
        assert!(v.bridges().is_empty(), "the VM forgot the bridge");
    }
}
