use provium_protocol::op::{Op, SpawnSpec};
use provium_protocol::result::{ErrorCode, ExitInfo, ProcessState};
use provium_protocol::wire::{Channel, StreamEndReason};
use provium_protocol::{OpValue, MAX_CHUNK_BYTES, STREAM_WINDOW_BYTES};

use crate::client::*;

#[test]
fn spawn_stdin_streaming_and_wait() {
    let a = Agent::start();
    let mut c = a.client();
    let (id, pid) = c.spawn(
        None,
        SpawnSpec {
            stdin: Some(b"first;".to_vec()),
            ..spawn_sh("cat; echo bye >&2")
        },
    );
    assert!(pid > 0);
    assert_eq!(c.ok(Op::Pid { process: id }), OpValue::Pid { pid });
    // 1 MiB of stdin, more than the window: respect it by waiting for acks.
    let input: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let mut sent = 0u64;
    for chunk in input.chunks(MAX_CHUNK_BYTES) {
        c.pump_until("stdin window room", |c| {
            sent - c.stdin_acked.get(&id).copied().unwrap_or(0) + chunk.len() as u64
                <= STREAM_WINDOW_BYTES
        });
        c.stdin(id, chunk);
        sent += chunk.len() as u64;
    }
    c.ok(Op::StdinClose { process: id });
    let exit = c.ok(Op::Wait {
        process: id,
        timeout_ms: None,
    });
    assert_eq!(exit, OpValue::Exit(ExitInfo::exited(0)));
    let mut expected = b"first;".to_vec();
    expected.extend_from_slice(&input);
    assert_eq!(c.data.get(&(id, Channel::Stdout)), Some(&expected));
    c.pump_until("both stream ends", |c| {
        c.ends.contains_key(&(id, Channel::Stdout)) && c.ends.contains_key(&(id, Channel::Stderr))
    });
    assert_eq!(c.ends[&(id, Channel::Stdout)], StreamEndReason::Eof);
    assert_eq!(c.output(id, Channel::Stderr), "bye\n");
    // wait freed the slot.
    assert_code(
        &c.err(Op::ProcessStatus { process: id }),
        ErrorCode::UnknownProcess,
    );
}

#[test]
fn wait_timeout_kills_and_frees_the_slot() {
    let a = Agent::start();
    let mut c = a.client();
    let (id, pid) = c.spawn(None, spawn_sh("sleep 30"));
    let exit = c.ok(Op::Wait {
        process: id,
        timeout_ms: Some(100),
    });
    assert_eq!(exit, OpValue::Exit(ExitInfo::timed_out()));
    wait_until("the sleep to die", || pid_dead(pid));
    assert_code(
        &c.err(Op::Wait {
            process: id,
            timeout_ms: None,
        }),
        ErrorCode::UnknownProcess,
    );
}

#[test]
fn status_signal_and_release() {
    let a = Agent::start();
    let mut c = a.client();
    let (id, pid) = c.spawn(None, spawn_sh("sleep 30"));
    assert_eq!(
        c.ok(Op::ProcessStatus { process: id }),
        OpValue::ProcessStatus(ProcessState {
            running: true,
            pid,
            exit: None
        })
    );
    c.ok(Op::Signal {
        process: id,
        signal: 15,
    });
    // status turns to not running once reaped (poll, no sleeping guess).
    let mut state = None;
    wait_until("the process to be reaped", || {
        match c.ok(Op::ProcessStatus { process: id }) {
            OpValue::ProcessStatus(s) if !s.running => {
                state = Some(s);
                true
            }
            _ => false,
        }
    });
    assert_eq!(state.unwrap().exit, Some(ExitInfo::signalled(15)));
    assert_eq!(
        c.ok(Op::Wait {
            process: id,
            timeout_ms: Some(5000)
        }),
        OpValue::Exit(ExitInfo::signalled(15))
    );
    // release: SIGTERM, slot freed at once, streams end `closed`.
    let (id2, pid2) = c.spawn(None, spawn_sh("sleep 30"));
    c.ok(Op::Release { process: id2 });
    assert_code(&c.err(Op::Pid { process: id2 }), ErrorCode::UnknownProcess);
    wait_until("the released sleep to die", || pid_dead(pid2));
    c.pump_until("closed ends", |c| {
        c.ends.contains_key(&(id2, Channel::Stdout))
    });
    assert_eq!(c.ends[&(id2, Channel::Stdout)], StreamEndReason::Closed);
    // release escalates to SIGKILL for a process that ignores SIGTERM.
    let (id3, pid3) = c.spawn(
        None,
        spawn_sh("trap '' TERM; echo ready; while :; do sleep 0.05; done"),
    );
    c.pump_until("ready", |c| c.output(id3, Channel::Stdout) == "ready\n");
    c.ok(Op::Release { process: id3 });
    wait_until("SIGKILL after the grace period", || pid_dead(pid3));
    assert_code(
        &c.err(Op::Signal {
            process: 999,
            signal: 9,
        }),
        ErrorCode::UnknownProcess,
    );
}

#[test]
fn close_stream_stops_output_but_not_the_process() {
    let a = Agent::start();
    let mut c = a.client();
    let (id, _) = c.spawn(None, spawn_sh("echo one; read x; echo two"));
    c.pump_until("one", |c| c.output(id, Channel::Stdout) == "one\n");
    c.ok(Op::CloseStream { stream: id });
    assert_eq!(c.ends[&(id, Channel::Stdout)], StreamEndReason::Closed);
    c.stdin(id, b"go\n");
    assert_eq!(
        c.ok(Op::Wait {
            process: id,
            timeout_ms: None
        }),
        OpValue::Exit(ExitInfo::exited(0))
    );
    assert_eq!(
        c.output(id, Channel::Stdout),
        "one\n",
        "nothing after close_stream"
    );
    assert_code(
        &c.err(Op::CloseStream { stream: 12345 }),
        ErrorCode::UnknownStream,
    );
}

#[test]
fn connection_close_kills_spawned_processes() {
    let a = Agent::start();
    let mut c = a.client();
    let (_, pid) = c.spawn(None, spawn_sh("sleep 30"));
    let (_, pid2) = c.spawn(None, spawn_sh("sleep 30 & wait"));
    assert!(!pid_dead(pid));
    drop(c);
    wait_until("the spawned sleep to die with its connection", || {
        pid_dead(pid) && pid_dead(pid2)
    });
    // The agent itself carries on.
    let mut c = a.client();
    c.ok(Op::Ping);
}
