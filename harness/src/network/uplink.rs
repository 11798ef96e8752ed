//! A bridge's uplink: a host TAP on the switch (port [`UPLINK_PORT`]) that
//! NATs the guests' traffic out through the host's default route.

use provium_netsetup::{disable_uplink, enable_uplink, Tap, TapPort, UplinkEnv};

use super::bridge::{tap_poller, Bridge, UplinkLink};
use super::error::NetworkError;
use super::naming::{nic_mac, uplink_tap_name};
use super::UPLINK_PORT;

impl Bridge {
    /// Whether the uplink is enabled.
    pub fn has_uplink(&self) -> bool {
        self.lock().uplink.is_some()
    }

    /// `bridge:enable_uplink`: the uplink with the guests' gateway at
    /// `addr`; a no-op when enabled. On an error nothing is left behind.
    pub fn enable_uplink(&self, addr: &str) -> Result<(), NetworkError> {
        let mut st = self.open_state("enable_uplink")?;
        if st.uplink.is_some() {
            return Ok(());
        }
        let fail = |e: NetworkError| NetworkError::EnableUplink {
            bridge: self.name().to_owned(),
            source: Box::new(e),
        };
        let tap_name = uplink_tap_name(self.name(), std::process::id());
        let tap = Tap::open(&tap_name).map_err(|e| fail(e.into()))?;
        let mac = nic_mac(UPLINK_PORT, self.name(), &[]);
        let poller = tap_poller(&mut st.taps, self.name()).map_err(|e| fail(e.into()))?;
        let port = TapPort::attach_on(&poller, self.switch(), UPLINK_PORT, mac, tap.into_fd())
            .map_err(|e| fail(e.into()))?;
        // The PATH `Settings` read once, not the process's now.
        let tools = UplinkEnv::from_path(self.env().config.settings.path.clone());
        let uplink =
            enable_uplink(self.name(), port.fd(), addr, &tools).map_err(|e| fail(e.into()))?;
        st.uplink = Some(UplinkLink { port, uplink });
        Ok(())
    }

    /// `bridge:disable_uplink`: removes the uplink; a no-op when there is
    /// none.
    pub fn disable_uplink(&self) -> Result<(), NetworkError> {
        let up = self.lock().uplink.take();
        let Some(UplinkLink { port, uplink }) = up else {
            return Ok(());
        };
        let r = disable_uplink(uplink).map_err(|source| NetworkError::DisableUplink {
            bridge: self.name().to_owned(),
            source,
        });
        drop(port);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::test_env::env;
    use crate::network::DEFAULT_UPLINK_ADDR;

    #[test]
    fn uplink_failure_carries_the_detail_and_leaves_nothing() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/net/tun").exists() {
            eprintln!("SKIP uplink_failure_carries_the_detail_and_leaves_nothing: needs root and /dev/net/tun");
            return;
        }
        // A fresh network namespace for this thread only: it has no default
        // route, so enable_uplink must fail, saying why.
        std::thread::spawn(|| {
            // SAFETY: unshare affects only this thread's network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            let b = Bridge::create(&env(1), "lan");
            let e = crate::error_chain::flatten(&b.enable_uplink(DEFAULT_UPLINK_ADDR).unwrap_err());
            assert!(e.contains("bridge:enable_uplink: bridge `lan`: "), "{e}");
            assert!(
                e.contains("no default route") || e.contains("not found on PATH"),
                "the underlying detail is missing: {e}"
            );
            assert!(b.lock().uplink.is_none());
            assert!(
                !b.0.switch.members().iter().any(|m| m == UPLINK_PORT),
                "the uplink port was left on the switch"
            );
            b.disable_uplink().unwrap();
        })
        .join()
        .unwrap();
    }
}
