//! [`NetworkError`]: why a bridge or a VM's attachment refused; and
//! [`NicMacError`], a snapshot's NIC record that does not parse.

use provium_netsetup::MacAddr;

use crate::backend::BackendError;

/// Why a bridge or a VM's attachment refused, each naming the bridge or VM
/// and the fix. The layers below (switch, TAP, uplink, backend) come as
/// sources, or transparently where their message is the whole story. The
/// Lua layer raises it with its chain flattened (`lua::network`).
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("bridge `{bridge}` is closed")]
    Closed { bridge: String },
    /// A closed bridge takes no member, capture or uplink.
    #[error("bridge `{bridge}` is closed; create another with lab:bridge(name)")]
    ClosedRefuses { bridge: String },
    /// A bridge method (`bridge:attach`, a restore's re-attach) refused:
    /// the method, then why.
    #[error("bridge:{method}")]
    Refused {
        method: &'static str,
        #[source]
        source: Box<NetworkError>,
    },
    #[error("`{name}` appears twice in the list")]
    Twice { name: String },
    /// A booted VM's NIC could not be made, so the whole `bridge:attach`
    /// was undone.
    #[error("bridge `{bridge}`: nothing was attached: vm `{vm}`'s NIC failed")]
    NothingAttached {
        bridge: String,
        vm: String,
        #[source]
        source: Box<NetworkError>,
    },
    #[error("vm `{vm}` is not attached to bridge `{bridge}`")]
    NotAttached { vm: String, bridge: String },
    /// One end of a directional rule is not a member.
    #[error("vm `{vm}` is not attached to bridge `{bridge}`; call bridge:attach first")]
    EndNotAttached { vm: String, bridge: String },
    /// One end of a directional rule is a member whose VM is not booted.
    #[error(
        "vm `{vm}` is attached to bridge `{bridge}` but not booted; \
         directional rules need both ends booted (call vm:boot() first)"
    )]
    EndNotBooted { vm: String, bridge: String },
    #[error(
        "vm `{vm}` has no TAP on bridge `{bridge}` (not booted?). Call lab:boot() / vm:boot() first."
    )]
    NoTap { vm: String, bridge: String },
    #[error("vm `{vm}` has no running machine")]
    NoMachine { vm: String },
    #[error(
        "vm `{other}` on bridge `{bridge}` already has MAC {mac}, the snapshot's NIC's; \
         detach it (bridge:detach) or restore under another VM name"
    )]
    MacTaken {
        other: String,
        bridge: String,
        mac: MacAddr,
    },
    #[error("vm `{vm}` already has a live NIC on bridge `{bridge}`")]
    LiveNic { vm: String, bridge: String },
    #[error("a vm named `{vm}` is already attached to bridge `{bridge}`; detach it first")]
    NameTaken { vm: String, bridge: String },
    #[error("drop rate")]
    DropRate(#[source] provium_netsetup::SwitchError),
    #[error("drop rate {from} -> {to}")]
    PairDropRate {
        from: String,
        to: String,
        #[source]
        source: provium_netsetup::SwitchError,
    },
    /// The snapshot's NICs do not fit the VM's bridges (its text is the
    /// whole story).
    #[error(transparent)]
    Plan(#[from] crate::backend::NicPlanError),
    #[error("cannot create its NIC on bridge `{bridge}`")]
    CreateNic {
        bridge: String,
        #[source]
        source: Box<NetworkError>,
    },
    #[error("bridge:enable_uplink: bridge `{bridge}`")]
    EnableUplink {
        bridge: String,
        #[source]
        source: Box<NetworkError>,
    },
    #[error("bridge:disable_uplink: bridge `{bridge}`")]
    DisableUplink {
        bridge: String,
        #[source]
        source: provium_netsetup::UplinkError,
    },
    #[error(transparent)]
    Mac(#[from] NicMacError),
    #[error(transparent)]
    Guest(#[from] BackendError),
    #[error(transparent)]
    Switch(#[from] provium_netsetup::SwitchError),
    #[error(transparent)]
    Tap(#[from] provium_netsetup::TapError),
    #[error(transparent)]
    Uplink(#[from] provium_netsetup::UplinkError),
}

impl NetworkError {
    /// `bridge:{method}` refused for `source`.
    pub fn refused(method: &'static str, source: NetworkError) -> NetworkError {
        NetworkError::Refused {
            method,
            source: Box::new(source),
        }
    }
}

/// A recorded NIC's MAC does not parse (a hand-edited or foreign file).
#[derive(Debug, thiserror::Error)]
#[error("the snapshot's NIC on bridge `{bridge}`")]
pub struct NicMacError {
    pub bridge: String,
    #[source]
    pub source: provium_netsetup::mac::MacParseError,
}
