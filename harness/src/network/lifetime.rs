//! A bridge's end: [`Bridge::close`] (every NIC and the uplink go), run
//! by the scope that made it ([`Closeable`]).

use super::bridge::Bridge;
use super::error::NetworkError;
use crate::runner::Closeable;

impl Closeable for Bridge {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        self.close()
            .map_err(|e| crate::error_chain::flatten(&e).into())
    }
}

impl Bridge {
    /// Lets go of every NIC and the uplink; idempotent. Partitions and
    /// impairments stay declared (there is nothing left to apply them to).
    ///
    /// A kvm VM's NIC goes link down in the guest (its device stays). A
    /// sandbox's TAP is parked ([`provium_netsetup::TapPort::park`]): the
    /// interface stays in the sandbox without carrier, like a VM's NIC
    /// whose host side is gone, and the kernel removes it with the
    /// sandbox's network namespace, together with every namespace that
    /// ends then. Removing each TAP here instead costs each an RCU wait
    /// under the kernel's rtnl lock: 0.2 s for 100 from 24 threads, more
    /// than the rest of a close (docs/benchmarking.md, "Scale").
    pub fn close(&self) -> Result<(), NetworkError> {
        let members = {
            let mut st = self.lock();
            if st.closed {
                return Ok(());
            }
            st.closed = true;
            std::mem::take(&mut st.members)
        };
        // Every port leaves the switch in one change first, so the kernel
        // paths' wires go in one take-down batch, not one per member.
        let names: Vec<&String> = members.keys().collect();
        self.0.switch.detach_many(&names);
        for (_, m) in members {
            if let Some((_, end)) = m.nic {
                end.let_go();
            }
            if let Some(vm) = m.vm {
                vm.unlink_bridge(self);
            }
        }
        self.disable_uplink()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::test_env::env;

    #[test]
    fn close_drops_members_and_is_idempotent() {
        let b = Bridge::create(&env(1), "lan");
        b.attach_all(vec![("x".into(), None), ("y".into(), None)])
            .unwrap();
        assert_eq!(b.members_sorted(), vec!["x", "y"]);
        b.close().unwrap();
        b.close().unwrap();
        assert!(b.members_sorted().is_empty());
        assert!(b.attach_all(vec![("x".into(), None)]).is_err());
    }
}
