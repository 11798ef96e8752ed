use std::collections::BTreeMap;

use provium_protocol::op::{CommandSpec, ExecSpec, Op};
use provium_protocol::result::{ErrorCode, ExitInfo, ExitStatus};
use provium_protocol::wire::Channel;
use provium_protocol::{OpValue, STREAM_WINDOW_BYTES};

use crate::client::*;

#[test]
fn shell_and_argv() {
    let a = Agent::start();
    let mut c = a.client();
    let (exit, out, err) = c.sh("echo hi; echo oops >&2; exit 3");
    assert_eq!(exit, ExitInfo::exited(3));
    assert_eq!(out, "hi\n");
    assert_eq!(err, "oops\n");
    // argv: no shell, so no expansion; PATH lookup finds echo.
    let (id, exit) = c.exec(argv("echo", &["a b", "$HOME"]));
    assert_eq!(exit, ExitInfo::exited(0));
    assert_eq!(c.output(id, Channel::Stdout), "a b $HOME\n");
    let e = match c.call(Op::Exec(argv("no-such-program-xyz", &[]))) {
        Err(e) => e,
        other => panic!("{other:?}"),
    };
    assert_code(&e, ErrorCode::Io);
    assert_eq!(e.errno, Some(libc::ENOENT));
    assert!(e.message.contains("no-such-program-xyz"), "{}", e.message);
}

#[test]
fn env_merge_clear_cwd_and_stdin() {
    let a = Agent::start();
    let mut c = a.client();
    let mut env = BTreeMap::new();
    env.insert("FOO".to_string(), "bar".to_string());
    let home = std::env::var("HOME").unwrap_or_default();
    let (id, _) = c.exec(CommandSpec {
        env: env.clone(),
        ..CommandSpec::shell("echo \"$FOO:$HOME\"")
    });
    assert_eq!(c.output(id, Channel::Stdout), format!("bar:{home}\n"));
    let (id, _) = c.exec(CommandSpec {
        env,
        env_clear: true,
        ..CommandSpec::shell("echo \"$FOO:$HOME\"")
    });
    assert_eq!(c.output(id, Channel::Stdout), "bar:\n");
    let dir = a.path("");
    let (id, _) = c.exec(CommandSpec {
        cwd: Some(dir.clone()),
        ..CommandSpec::shell("pwd")
    });
    assert_eq!(
        c.output(id, Channel::Stdout).trim_end(),
        dir.trim_end_matches('/')
    );
    let e = match c.call(Op::Exec(
        CommandSpec {
            cwd: Some("/nonexistent-cwd".into()),
            ..CommandSpec::shell("pwd")
        }
        .into(),
    )) {
        Err(e) => e,
        other => panic!("{other:?}"),
    };
    assert!(e.message.contains("/nonexistent-cwd"), "{}", e.message);
    let (id, exit) = c.exec(CommandSpec {
        stdin: Some(b"hello stdin".to_vec()),
        ..argv("cat", &[]).run
    });
    assert_eq!(exit, ExitInfo::exited(0));
    assert_eq!(c.output(id, Channel::Stdout), "hello stdin");
}

#[test]
fn timeout_kills_the_whole_group() {
    let a = Agent::start();
    let mut c = a.client();
    let (id, exit) = c.exec(ExecSpec {
        timeout_ms: Some(300),
        ..shell("sleep 30 & echo $!; wait")
    });
    assert_eq!(exit, ExitInfo::timed_out());
    assert_eq!(exit.exit_code, -2);
    let pid: u32 = c.output(id, Channel::Stdout).trim().parse().unwrap();
    wait_until("the background sleep to die", || pid_dead(pid));
}

#[test]
fn signalled_exit() {
    let a = Agent::start();
    let mut c = a.client();
    let (exit, _, _) = c.sh("kill -TERM $$");
    assert_eq!(exit.status, ExitStatus::Signalled);
    assert_eq!(exit.exit_code, -1);
    assert_eq!(exit.signal, Some(15));
}

#[test]
fn ping_is_answered_while_an_exec_runs() {
    let a = Agent::start();
    let mut c = a.client();
    let go = a.path("go");
    let exec = c.request(
        None,
        Op::Exec(shell(&format!(
            "while [ ! -e {go} ]; do sleep 0.01; done; echo done"
        ))),
    );
    let ping = c.request(None, Op::Ping);
    assert_eq!(c.response(ping).into_result().unwrap(), OpValue::Unit);
    assert!(
        !c.responses.contains_key(&exec),
        "the exec cannot have finished yet"
    );
    c.ok(Op::WriteFile {
        path: go,
        data: vec![],
    });
    assert_eq!(
        c.response(exec).into_result().unwrap(),
        OpValue::Exit(ExitInfo::exited(0))
    );
    assert_eq!(c.output(exec, Channel::Stdout), "done\n");
}

#[test]
fn large_output_streams_with_bounded_agent_memory() {
    let a = Agent::start();
    let mut c = a.client();
    c.keep_data = false;
    // Warm up the allocator and threads before measuring.
    c.sh("head -c 1048576 /dev/zero");
    let before = a.rss_kib();
    let total: u64 = 64 * 1024 * 1024;
    let (id, exit) = c.exec(shell(&format!("head -c {total} /dev/zero")));
    assert_eq!(exit, ExitInfo::exited(0));
    assert_eq!(c.counts.get(&(id, Channel::Stdout)), Some(&total));
    // Every chunk precedes the terminal response.
    let last_chunk = c.log.iter().rposition(|e| *e == ("chunk", id)).unwrap();
    let resp = c.log.iter().position(|e| *e == ("response", id)).unwrap();
    assert!(last_chunk < resp);
    let after = a.rss_kib();
    assert!(
        after < before + 32 * 1024,
        "agent RSS grew from {before} KiB to {after} KiB while streaming 64 MiB"
    );
}

#[test]
fn without_acks_the_agent_stops_at_the_window() {
    let a = Agent::start();
    let mut c = a.client();
    c.auto_ack = false;
    let id = c.request(None, Op::Exec(shell("head -c 10485760 /dev/zero")));
    c.pump_until("a full window", |c| {
        c.counts.get(&(id, Channel::Stdout)).copied().unwrap_or(0) >= STREAM_WINDOW_BYTES
    });
    assert_eq!(c.counts[&(id, Channel::Stdout)], STREAM_WINDOW_BYTES);
    // The window is full: the next frame must be the ping's answer, not a chunk.
    let ping = c.request(None, Op::Ping);
    assert!(c.pump());
    assert_eq!(c.log.last(), Some(&("response", ping)));
    // Acknowledge everything from now on; the exec completes.
    c.auto_ack = true;
    c.ack(id, Channel::Stdout, STREAM_WINDOW_BYTES);
    let r = c.response(id).into_result().unwrap();
    assert_eq!(r, OpValue::Exit(ExitInfo::exited(0)));
    assert_eq!(c.counts[&(id, Channel::Stdout)], 10 * 1024 * 1024);
}

#[test]
fn output_held_by_the_window_at_exit_is_still_delivered() {
    let a = Agent::start();
    let mut c = a.client();
    c.auto_ack = false;
    c.keep_data = false;
    let exited = a.path("exited");
    // The window (256 KiB) fills; 32 KiB more wait in the pipe while the
    // command exits. A background sleep keeps stderr open and empty.
    let total = STREAM_WINDOW_BYTES + 32 * 1024;
    let id = c.request(
        None,
        Op::Exec(shell(&format!(
            "sleep 2 >/dev/null & head -c {total} /dev/zero; touch {exited}"
        ))),
    );
    c.pump_until("a full window", |c| {
        c.counts.get(&(id, Channel::Stdout)).copied().unwrap_or(0) >= STREAM_WINDOW_BYTES
    });
    wait_until("the command to finish writing", || {
        std::path::Path::new(&exited).exists()
    });
    c.auto_ack = true;
    c.ack(id, Channel::Stdout, STREAM_WINDOW_BYTES);
    let r = c.response(id).into_result().unwrap();
    assert_eq!(r, OpValue::Exit(ExitInfo::exited(0)));
    assert_eq!(c.counts[&(id, Channel::Stdout)], total);
}
