//! virtio-vsock snapshot state.
//!
//! Saved: the guest CID (for the record: a restoring VM may give another,
//! which the guest re-reads on TRANSPORT_RESET) and, through
//! the transport, the three queues. Not saved: connections. Their host ends
//! are sockets held by whoever talked to the guest (the harness's agent
//! client); a restored VM starts with none, posts TRANSPORT_RESET on the
//! event queue so the guest driver drops its side too, and host clients
//! connect again (the harness re-runs Hello).

use serde::{Deserialize, Serialize};

/// The vsock device's own state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// The CID the guest was given.
    pub guest_cid: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::persist::{decode_state, encode_state};

    #[test]
    fn state_round_trips() {
        let s = VsockState { guest_cid: 42 };
        let back: VsockState = decode_state("virtio-vsock", &encode_state(&s)).expect("decodes");
        assert_eq!(back, s);
    }
}
