//! A bridge's end: [`Bridge::close`] (every NIC and the uplink go), run
//! by the scope that made it ([`Closeable`]).

use super::bridge::{Bridge, NicEnd};
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
        // Every port leaves the switch in one change first, so the kernel
        // paths' wires go in one take-down batch, not one per member.
        let names: Vec<&String> = members.keys().collect();
        self.0.switch.detach_many(&names);
        let mut taps = Vec::new();
        for (_, m) in members {
            match m.nic {
                Some((_, end @ NicEnd::Tap { .. })) => taps.push(end),
                other => drop(other),
            }
            if let Some(vm) = m.vm {
                vm.unlink_bridge(self);
            }
        }
        drop_concurrently(taps);
        self.disable_uplink()
    }
}

/// How many TAP ends a closing bridge drops at once.
const TAP_DROPS_AT_ONCE: usize = 24;

/// Drops `taps` from up to [`TAP_DROPS_AT_ONCE`] threads. Why: closing a
/// TAP's descriptor unregisters its interface, and the kernel's wait that
/// ends an unregistration (an RCU barrier) runs outside the lock that
/// serialises them, so drops from several threads overlap their waits.
/// Deleting 100 TAPs took 1.9 s one by one on the 2-vCPU development
/// machine and 0.28 s 25 at a time (docs/benchmarking.md, "Scale").
fn drop_concurrently(taps: Vec<NicEnd>) {
    if taps.len() < 2 {
        return drop(taps);
    }
    let per_thread = taps.len().div_ceil(TAP_DROPS_AT_ONCE);
    let mut taps = taps;
    std::thread::scope(|s| {
        while !taps.is_empty() {
            let chunk: Vec<NicEnd> = taps.drain(..per_thread.min(taps.len())).collect();
            // A spawn that fails drops its closure, and the chunk with it,
            // on this thread: the chunk goes either way.
            let _ = std::thread::Builder::new()
                .name("bridge-close".into())
                .spawn_scoped(s, move || drop(chunk));
        }
    });
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
