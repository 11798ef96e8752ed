//! What the backend boundary fails with. Each backend keeps its own error
//! enum (its layer's messages, causes as `#[source]`); [`BackendError`]
//! wraps them without adding text, so a flattened chain reads as the
//! backend wrote it.

use super::kvm::KvmError;
use super::local::guest::LocalGuestError;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Local(#[from] LocalGuestError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// An op the guest's capabilities say it lacks (the Lua layer asks
    /// them first, so this is a harness bug when a user sees it).
    #[error("{0}")]
    Unsupported(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_adds_nothing_to_the_chain() {
        let e = BackendError::from(KvmError::NicAfterBoot {
            ifname: "eth1".into(),
        });
        let flat = crate::error_chain::flatten(&e);
        assert!(
            flat.starts_with("NIC eth1: a kvm VM's NICs are virtio-net devices"),
            "{flat}"
        );
        let e = BackendError::from(LocalGuestError::Unsupported("disks need the kvm backend"));
        assert_eq!(
            crate::error_chain::flatten(&e),
            "disks need the kvm backend"
        );
    }
}
