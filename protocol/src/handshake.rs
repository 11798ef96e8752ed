//! The connection handshake. The host speaks first with [`Hello`]; the agent
//! answers [`HelloOk`] or, when the versions differ, [`HelloErr`] naming both.

use serde::{Deserialize, Serialize};

use crate::PROTOCOL_VERSION;

/// The host's first frame: the protocol version it speaks.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The host's [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
}

impl Hello {
    /// The hello of this build: [`PROTOCOL_VERSION`].
    pub fn current() -> Self {
        Hello {
            protocol_version: PROTOCOL_VERSION,
        }
    }
}

/// The agent accepts the connection: who it is and what it can do.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelloOk {
    /// The agent's crate version (`CARGO_PKG_VERSION`).
    pub agent_version: String,
    /// What the guest is, for diagnostics: e.g. "linux 6.1.0 x86_64".
    pub guest_os: String,
    /// Optional capabilities of this agent (e.g. "clock_set", "netns").
    pub agent_features: Vec<String>,
}

/// The `agent_features` word that names the channel serving the
/// connection: `channel:vsock`, `channel:console` or `channel:unix`. A
/// feature word, not a field: no wire change, and an agent without it
/// (older) says nothing.
pub const CHANNEL_FEATURE_PREFIX: &str = "channel:";

impl HelloOk {
    /// The channel the agent serves this connection on, if it says.
    pub fn channel(&self) -> Option<&str> {
        self.agent_features
            .iter()
            .find_map(|f| f.strip_prefix(CHANNEL_FEATURE_PREFIX))
    }
}

/// The agent refuses the connection: the versions differ. The agent closes
/// the connection after sending it.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelloErr {
    /// The version the agent speaks.
    pub agent_protocol_version: u32,
    /// The version the host's `hello` asked for.
    pub host_protocol_version: u32,
    /// Both versions and the fix (rebuild both from one Provium version).
    pub message: String,
}

/// The agent's answer to a Hello: Ok when versions match, else a HelloErr
/// whose message names both versions.
pub fn answer_hello(hello: &Hello, ok: impl FnOnce() -> HelloOk) -> Result<HelloOk, HelloErr> {
    if hello.protocol_version == PROTOCOL_VERSION {
        Ok(ok())
    } else {
        Err(HelloErr {
            agent_protocol_version: PROTOCOL_VERSION,
            host_protocol_version: hello.protocol_version,
            message: format!(
                "protocol version mismatch: host speaks version {}, agent speaks version {}; \
                 rebuild the agent and the host from the same Provium version",
                hello.protocol_version, PROTOCOL_VERSION
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_names_both_versions() {
        let err = answer_hello(
            &Hello {
                protocol_version: 7,
            },
            || unreachable!(),
        )
        .unwrap_err();
        assert_eq!(err.host_protocol_version, 7);
        assert_eq!(err.agent_protocol_version, PROTOCOL_VERSION);
        assert!(
            err.message.contains("host speaks version 7"),
            "{}",
            err.message
        );
        assert!(err
            .message
            .contains(&format!("agent speaks version {PROTOCOL_VERSION}")));
    }

    #[test]
    fn match_answers_ok() {
        let ok = answer_hello(&Hello::current(), || HelloOk {
            agent_version: "0.1.0".into(),
            guest_os: "linux".into(),
            agent_features: vec![],
        })
        .unwrap();
        assert_eq!(ok.agent_version, "0.1.0");
        assert_eq!(ok.channel(), None);
        let with = HelloOk {
            agent_features: vec!["exec".into(), "channel:console".into()],
            ..ok.clone()
        };
        assert_eq!(with.channel(), Some("console"));
    }
}
