//! virtio-console snapshot state.
//!
//! Saved: the port's state as the control messages made it (announced,
//! named, opened by the guest, what the guest was last told about the
//! host) and the control messages still owed to the guest; the four queues
//! go through the transport. Not saved: the host session. Its host end is a
//! socket held by whoever talked to the guest (the harness's agent client),
//! and bytes staged between that socket and the queues belong to it. A
//! restored device starts with no host stream; if the guest was told the
//! host was there, it is told PORT_OPEN 0, and its current open of the port
//! is stale: the next host session starts only after the guest has closed
//! and reopened the port (see the `console` module docs), so no byte from
//! before the snapshot is read as part of the new session.

use std::collections::VecDeque;
use std::sync::Arc;

use provium_snapshot::Persist;
use serde::{Deserialize, Serialize};
use virtio_queue::Queue;

use super::active::{ActiveConsole, ControlOut, PortState};
use super::defs::{DEVICE_ADD, MAX_PENDING_CONTROL, PORT_NAME, PORT_OPEN};
use super::host::ConsoleHost;
use crate::devices::virtio::{VirtioInterrupt, VirtioPersistError};
use crate::guest_memory::GuestMemoryMmap;

/// The console device's own state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsoleState {
    /// The port.
    pub port: PortState,
    /// Control messages owed to the guest, oldest first.
    pub control_out: Vec<ControlOut>,
}

/// What an activated console is rebuilt from besides its state.
pub struct ConsoleConstructorArgs {
    /// The restoring VM's host side.
    pub host: ConsoleHost,
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// The four queues, rebuilt and checked from the file.
    pub queues: Vec<Queue>,
    /// The device's interrupt.
    pub interrupt: Arc<dyn VirtioInterrupt>,
}

impl Persist for ActiveConsole {
    type State = ConsoleState;
    type ConstructorArgs = ConsoleConstructorArgs;
    type Error = VirtioPersistError;

    fn save(&self) -> ConsoleState {
        ConsoleState {
            port: self.port,
            control_out: self.control_out.iter().copied().collect(),
        }
    }

    fn restore(args: ConsoleConstructorArgs, state: &ConsoleState) -> Result<Self, Self::Error> {
        let bad = |detail: String| VirtioPersistError::State {
            what: "virtio-console",
            detail,
        };
        if state.control_out.len() > MAX_PENDING_CONTROL {
            return Err(bad(format!(
                "{} control messages owed, at most {MAX_PENDING_CONTROL}",
                state.control_out.len()
            )));
        }
        if let Some(m) = state
            .control_out
            .iter()
            .find(|m| !matches!(m.event, DEVICE_ADD | PORT_NAME | PORT_OPEN) || m.value > 1)
        {
            return Err(bad(format!(
                "control message event {} value {} is not one the device sends",
                m.event, m.value
            )));
        }
        let mut port = state.port;
        let mut control_out: VecDeque<ControlOut> = state.control_out.iter().copied().collect();
        // The old host side is gone: the guest hears so, and its open
        // belongs to the session that ended.
        if port.host_open_sent {
            port.host_open_sent = false;
            port.guest_open_fresh = false;
            if control_out.len() >= MAX_PENDING_CONTROL {
                control_out.pop_front();
            }
            control_out.push_back(ControlOut {
                event: PORT_OPEN,
                value: 0,
            });
        }
        Ok(ActiveConsole::new(
            args.host,
            args.mem,
            args.queues,
            args.interrupt,
            port,
            control_out,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::console::active::tests::{host_read, Rig};
    use crate::devices::virtio::console::defs::PORT_ID;
    use crate::devices::virtio::persist::{decode_state, encode_state, QueueSnapshot};
    use crate::devices::virtio::test_utils::guest_memory;
    use std::io::Read;
    use std::time::Duration;

    /// save → encode → decode → restore in the middle of a session: the
    /// port's state comes back, the restored device has no host session,
    /// tells the guest PORT_OPEN 0, and a new connect starts only once the
    /// guest has closed and reopened the port.
    #[test]
    fn a_session_does_not_survive_save_encode_decode_restore() {
        let mem = guest_memory();
        let mut r = Rig::new(&mem);
        r.bring_up();
        r.guest_control(PORT_ID, PORT_OPEN, 1);
        let t = r.connect();
        r.take_connect();
        let mut old = t.join().expect("session");
        assert_eq!(r.controls(), [(0, PORT_OPEN, 1, vec![])]);

        let bytes = encode_state(&r.dev.save());
        let decoded: ConsoleState = decode_state("virtio-console", &bytes).expect("decodes");
        assert_eq!(decoded, r.dev.save());
        assert!(decoded.port.host_open_sent && decoded.port.guest_open);

        // The restoring VM's host side is new; the queues are the same
        // guest rings.
        let host = ConsoleHost::new().expect("host");
        host.set_active(true);
        // The queues as the transport saves and rebuilds them.
        let queues = r
            .dev
            .queues()
            .iter()
            .enumerate()
            .map(|(i, q)| QueueSnapshot::of(q).to_queue(i, 64, &mem).expect("valid"))
            .collect();
        let restored = ActiveConsole::restore(
            ConsoleConstructorArgs {
                host: host.clone(),
                mem: mem.clone(),
                queues,
                interrupt: r.irq.clone(),
            },
            &decoded,
        )
        .expect("restores");
        // The old device is gone with its VM: its host end reads EOF.
        let original = std::mem::replace(&mut r.dev, restored);
        drop(original);
        old.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut rest = Vec::new();
        old.read_to_end(&mut rest).expect("EOF");
        r.host = host;
        r.dev.after_event();
        assert_eq!(r.controls(), [(0, PORT_OPEN, 0, vec![])]);
        let state = r.dev.save();
        assert!(!state.port.host_open_sent && !state.port.guest_open_fresh);

        let t = r.connect();
        r.take_connect();
        assert!(!r.host.is_live(), "the guest's open is from before");
        r.guest_control(PORT_ID, PORT_OPEN, 0);
        r.guest_control(PORT_ID, PORT_OPEN, 1);
        let mut new = t.join().expect("fresh session");
        assert_eq!(r.controls(), [(0, PORT_OPEN, 1, vec![])]);
        r.guest_write(b"fresh");
        assert_eq!(host_read(&mut new, 5), b"fresh");
    }

    #[test]
    fn a_state_from_a_file_is_checked() {
        let mem = guest_memory();
        let r = Rig::new(&mem);
        let args = || ConsoleConstructorArgs {
            host: ConsoleHost::new().expect("host"),
            mem: mem.clone(),
            queues: r
                .q
                .iter()
                .map(|m| m.create_queue().expect("queue"))
                .collect(),
            interrupt: r.irq.clone(),
        };
        let too_many = ConsoleState {
            port: PortState::default(),
            control_out: vec![
                ControlOut {
                    event: DEVICE_ADD,
                    value: 0
                };
                MAX_PENDING_CONTROL + 1
            ],
        };
        let e = ActiveConsole::restore(args(), &too_many)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("control messages owed"), "{e}");
        let odd = ConsoleState {
            port: PortState::default(),
            control_out: vec![ControlOut { event: 5, value: 0 }],
        };
        let e = ActiveConsole::restore(args(), &odd).err().expect("refused");
        assert!(e.to_string().contains("event 5"), "{e}");
        assert!(decode_state::<ConsoleState>("virtio-console", &[0xc1]).is_err());
    }
}
