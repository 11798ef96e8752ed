use provium_protocol::op::{Op, SpawnSpec};
use provium_protocol::result::{ErrorCode, ExitInfo, OpResult};
use provium_protocol::wire::AgentFrame;
use provium_protocol::OpValue;

use crate::client::*;

#[test]
fn handshake_ok_and_version_mismatch() {
    let a = Agent::start();
    let mut c = a.raw();
    let AgentFrame::HelloOk(ok) = c.hello(provium_protocol::PROTOCOL_VERSION) else {
        panic!()
    };
    assert!(ok.guest_os.starts_with("linux "), "{}", ok.guest_os);
    assert!(
        !ok.agent_features.iter().any(|f| f == "clock_set"),
        "--no-clock"
    );
    let mut c = a.raw();
    let AgentFrame::HelloErr(err) = c.hello(999) else {
        panic!()
    };
    assert_eq!(err.host_protocol_version, 999);
    assert_eq!(
        err.agent_protocol_version,
        provium_protocol::PROTOCOL_VERSION
    );
    assert!(
        err.message.contains("host speaks version 999"),
        "{}",
        err.message
    );
    assert!(err.message.contains(&format!(
        "agent speaks version {}",
        provium_protocol::PROTOCOL_VERSION
    )));
    assert!(c.recv().is_none(), "the agent closes after HelloErr");
}

#[test]
fn bad_frames_close_only_that_connection() {
    let mut a = Agent::start();
    // Garbage body after a good handshake.
    let mut c = a.client();
    c.send_raw(&[0, 0, 0, 4, 0xde, 0xad, 0xbe, 0xef]);
    assert!(c.recv().is_none(), "garbage closes the connection");
    // An oversize length prefix.
    let mut c = a.client();
    c.send_raw(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    assert!(
        c.recv().is_none(),
        "an oversize frame closes the connection"
    );
    // A request before hello.
    let mut c = a.raw();
    c.request(None, Op::Ping);
    assert!(
        c.recv().is_none(),
        "a request before hello closes the connection"
    );
    // Garbage instead of hello.
    let mut c = a.raw();
    c.send_raw(b"GET / HTTP/1.1\r\n\r\n");
    assert!(c.recv().is_none());
    // A second hello.
    let mut c = a.client();
    c.send(&provium_protocol::HostFrame::Hello(
        provium_protocol::Hello::current(),
    ));
    assert!(c.recv().is_none());
    // The agent lives on and serves new connections.
    assert!(a.alive());
    let mut c = a.client();
    assert_eq!(c.ok(Op::Ping), OpValue::Unit);
}

#[test]
fn stdin_window_overrun_is_a_protocol_violation() {
    let a = Agent::start();
    let mut c = a.client();
    // A process that never reads stdin: acks stall after the pipe fills.
    let (id, pid) = c.spawn(None, spawn_sh("sleep 30"));
    let chunk = vec![0u8; provium_protocol::MAX_CHUNK_BYTES];
    for _ in 0..64 {
        c.stdin(id, &chunk);
    }
    while c.pump() {}
    wait_until("the connection's process to be killed", || pid_dead(pid));
}

#[test]
fn batch_runs_every_op_in_order() {
    let a = Agent::start();
    let mut c = a.client();
    let f = a.path("b");
    let OpValue::Batch(results) = c.ok(Op::Batch {
        ops: vec![
            Op::WriteFile {
                path: f.clone(),
                data: b"x".to_vec(),
            },
            Op::ReadFile {
                path: a.path("missing"),
            },
            Op::Exec(shell("echo ran; echo err >&2; exit 4")),
            Op::Spawn(SpawnSpec { ..spawn_sh("true") }),
            Op::Batch { ops: vec![] },
            Op::ReadFile { path: f.clone() },
        ],
    }) else {
        panic!()
    };
    assert_eq!(results.len(), 6);
    assert_eq!(results[0], OpResult::Ok(OpValue::Unit));
    let OpResult::Err(e) = &results[1] else {
        panic!()
    };
    assert_eq!(e.errno, Some(libc::ENOENT));
    assert_eq!(
        results[2],
        OpResult::Ok(OpValue::Ran {
            exit: ExitInfo::exited(4),
            stdout: b"ran\n".to_vec(),
            stderr: b"err\n".to_vec(),
        })
    );
    for r in &results[3..5] {
        let OpResult::Err(e) = r else { panic!() };
        assert_eq!(e.code, ErrorCode::NotAllowed);
    }
    assert_eq!(results[5], OpResult::Ok(OpValue::Bytes(b"x".to_vec())));
    // Output too big for an answer is refused, not truncated.
    let OpValue::Batch(results) = c.ok(Op::Batch {
        ops: vec![Op::Exec(shell("head -c 9000000 /dev/zero"))],
    }) else {
        panic!()
    };
    let OpResult::Err(e) = &results[0] else {
        panic!()
    };
    assert_eq!(e.code, ErrorCode::TooLarge);
}
