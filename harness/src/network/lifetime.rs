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
    /// Removes every NIC and the uplink; idempotent. Partitions and
    /// impairments stay declared (there is nothing left to apply them to).
    pub fn close(&self) -> Result<(), NetworkError> {
        let members = {
            let mut st = self.lock();
            if st.closed {
                return Ok(());
            }
            st.closed = true;
            std::mem::take(&mut st.members)
        };
        for (name, m) in members {
            drop(m.nic);
            let _ = self.0.switch.detach(&name);
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
