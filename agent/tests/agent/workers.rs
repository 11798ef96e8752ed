use provium_protocol::op::{Op, OpenMode};
use provium_protocol::result::{ErrorCode, ExitInfo};
use provium_protocol::OpValue;

use crate::client::*;

fn worker(c: &mut Client) -> u64 {
    match c.ok(Op::WorkerSpawn) {
        OpValue::Worker { worker } => worker,
        other => panic!("{other:?}"),
    }
}

#[test]
fn handles_live_in_their_worker() {
    let a = Agent::start();
    let mut c = a.client();
    let (wa, wb) = (worker(&mut c), worker(&mut c));
    assert_ne!(wa, wb);
    std::fs::write(a.path("f"), b"data").unwrap();
    let OpValue::Handle { handle } = c
        .call_in(
            Some(wa),
            Op::Open {
                path: a.path("f"),
                mode: OpenMode {
                    read: true,
                    ..OpenMode::default()
                },
                perm: None,
            },
        )
        .unwrap()
    else {
        panic!()
    };
    let read = Op::Read { handle, len: 10 };
    assert_eq!(
        c.call_in(Some(wa), read.clone()).unwrap(),
        OpValue::Bytes(b"data".to_vec())
    );
    assert_code(
        &c.call_in(Some(wb), read.clone()).unwrap_err(),
        ErrorCode::UnknownHandle,
    );
    assert_code(
        &c.call_in(None, read.clone()).unwrap_err(),
        ErrorCode::UnknownHandle,
    );
    assert_code(
        &c.call_in(Some(99), Op::Ping).unwrap_err(),
        ErrorCode::UnknownWorker,
    );
    c.ok(Op::WorkerClose { worker: wa });
    assert_code(
        &c.call_in(Some(wa), read).unwrap_err(),
        ErrorCode::UnknownWorker,
    );
    assert_code(
        &c.err(Op::WorkerClose { worker: wa }),
        ErrorCode::UnknownWorker,
    );
}

#[test]
fn workers_run_concurrently_and_join_waits_for_the_queue() {
    let a = Agent::start();
    let mut c = a.client();
    let (wa, wb) = (worker(&mut c), worker(&mut c));
    let go = a.path("go");
    // wa is busy until `go` exists; wb answers meanwhile.
    let busy = c.request(
        Some(wa),
        Op::Exec(shell(&format!("while [ ! -e {go} ]; do sleep 0.01; done"))),
    );
    let queued = c.request(Some(wa), Op::Ping);
    assert_eq!(c.call_in(Some(wb), Op::Ping).unwrap(), OpValue::Unit);
    assert!(!c.responses.contains_key(&busy) && !c.responses.contains_key(&queued));
    let join = c.request(None, Op::WorkerJoin { worker: wa });
    c.call_in(
        Some(wb),
        Op::WriteFile {
            path: go,
            data: vec![],
        },
    )
    .unwrap();
    assert_eq!(c.response(join).into_result().unwrap(), OpValue::Unit);
    // join answered only after both earlier requests on wa.
    let pos = |c: &Client, id| c.log.iter().position(|e| *e == ("response", id)).unwrap();
    assert!(pos(&c, busy) < pos(&c, join) && pos(&c, queued) < pos(&c, join));
    // Joining yourself answers at once.
    assert_eq!(
        c.call_in(Some(wa), Op::WorkerJoin { worker: wa }).unwrap(),
        OpValue::Unit
    );
}

#[test]
fn worker_kill_and_close_clean_up_processes() {
    let a = Agent::start();
    let mut c = a.client();
    let w = worker(&mut c);
    let (p1, _) = c.spawn(Some(w), spawn_sh("sleep 30"));
    c.ok(Op::WorkerKill {
        worker: w,
        signal: 15,
    });
    assert_eq!(
        c.call_in(
            Some(w),
            Op::Wait {
                process: p1,
                timeout_ms: None
            }
        )
        .unwrap(),
        OpValue::Exit(ExitInfo::signalled(15))
    );
    let (_, pid) = c.spawn(Some(w), spawn_sh("sleep 30"));
    let (_, pid2) = c.spawn(Some(w), spawn_sh("sleep 30 & wait"));
    // A running exec of the worker is killed too.
    let started = a.path("started");
    let exec = c.request(
        Some(w),
        Op::Exec(shell(&format!("touch {started}; sleep 30"))),
    );
    wait_until("the exec to start", || {
        std::path::Path::new(&started).exists()
    });
    c.ok(Op::WorkerClose { worker: w });
    wait_until("the worker's processes to die", || {
        pid_dead(pid) && pid_dead(pid2)
    });
    let r = c.response(exec).into_result().unwrap();
    assert_eq!(r, OpValue::Exit(ExitInfo::signalled(9)));
}
