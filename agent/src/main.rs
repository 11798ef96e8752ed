//! provium-agent: the guest agent.
//!
//! Not built yet: the agent issue implements it. Until then it says so and
//! exits non-zero, so nothing mistakes it for a working agent.
fn main() {
    eprintln!(
        "provium-agent {}: protocol version {}; the agent is not implemented yet",
        env!("CARGO_PKG_VERSION"),
        provium_protocol::PROTOCOL_VERSION
    );
    std::process::exit(2);
}
