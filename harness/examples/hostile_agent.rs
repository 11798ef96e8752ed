//! A test-only double of `provium-agent` that misbehaves on purpose
//! (harness/tests/hostile_agent.rs; docs/reliability.md, "A hostile agent").
//!
//! It is started where the real agent would be (`PROVIUM_AGENT` points at
//! it) with the real agent's arguments. The local backend names the sandbox
//! after the VM (`PROVIUM_SANDBOX`): a VM named `hostile-<mode>` gets the
//! misbehaving double; any other VM gets the real agent, exec'ed from
//! `../provium-agent` next to this example's directory (`target/<profile>/`),
//! so the other VMs of a file behave normally.
//!
//! The double listens, answers every Hello with a valid HelloOk, and
//! misbehaves on the first request of a connection according to `<mode>`:
//! - `garbage`: a 4096-byte frame of random bytes, then 1 MiB more;
//! - `hugelen`: a frame whose length field is 2^32-1, then bytes forever;
//! - `stall`: a 1000-byte frame of which 10 bytes come, then nothing;
//! - `unknownid`: an answer to a request id never sent, and no other;
//! - `dupanswer`: a correct exec answer, sent twice;
//! - `dupend`: the exec's stdout ended twice;
//! - `flood`: stdout chunks at full speed (within the window) that never end;
//! - `stdin`: spawn succeeds, stdin is never acknowledged;
//! - `connflood`: exec's script is a Unix socket path; opens `CONNFLOOD`
//!   connections to it and answers with how many succeeded.
//!
//! Afterwards it keeps the connection open and reads (and ignores)
//! whatever the host sends, until the host hangs up or the sandbox is killed.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use provium_protocol::frame::{read_message, write_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::handshake::HelloOk;
use provium_protocol::op::{Command, Op};
use provium_protocol::result::{ExitInfo, OpResult, OpValue};
use provium_protocol::wire::{
    AgentFrame, Channel, HostFrame, Request, Response, StreamChunk, StreamEnd, StreamEndReason,
};
use provium_protocol::{MAX_CHUNK_BYTES, STREAM_WINDOW_BYTES};

/// Connections `connflood` opens.
const CONNFLOOD: usize = 4000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = std::env::var("PROVIUM_SANDBOX").unwrap_or_default();
    let Some(mode) = name.strip_prefix("hostile-").map(str::to_string) else {
        exec_real_agent(&args);
    };
    let Some(path) = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.strip_prefix("unix:"))
    else {
        eprintln!("hostile_agent: expected `--listen unix:PATH` in {args:?}");
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap_or_else(|e| {
        eprintln!("hostile_agent: bind {path}: {e}");
        std::process::exit(2);
    });
    eprintln!("hostile_agent: mode `{mode}` on {path}");
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let mode = mode.clone();
        std::thread::spawn(move || serve(conn, &mode));
    }
}

/// Replace this process with the real agent (same arguments).
fn exec_real_agent(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    let me = std::path::Path::new(&args[0]);
    let real = me
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("provium-agent"))
        .unwrap_or_default();
    let err = std::process::Command::new(&real).args(&args[1..]).exec();
    eprintln!(
        "hostile_agent: cannot exec the real agent {}: {err}",
        real.display()
    );
    std::process::exit(2);
}

fn send(conn: &mut UnixStream, frame: &AgentFrame) -> bool {
    write_message(conn, frame, DEFAULT_MAX_FRAME_BYTES).is_ok()
}

fn recv(conn: &mut UnixStream) -> Option<HostFrame> {
    read_message(conn, DEFAULT_MAX_FRAME_BYTES).ok().flatten()
}

fn serve(mut conn: UnixStream, mode: &str) {
    match recv(&mut conn) {
        Some(HostFrame::Hello(_)) => {}
        _ => return,
    }
    let ok = AgentFrame::HelloOk(HelloOk {
        agent_version: "0.0.0-hostile".into(),
        guest_os: format!("hostile double ({mode})"),
        agent_features: Vec::new(),
    });
    if !send(&mut conn, &ok) {
        return;
    }
    let req = loop {
        match recv(&mut conn) {
            Some(HostFrame::Request(r)) => break r,
            Some(_) => continue,
            None => return,
        }
    };
    misbehave(&mut conn, mode, &req);
    // Keep the connection open; ignore what the host sends.
    let mut sink = [0u8; 64 * 1024];
    while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
}

fn answer(id: u64, value: OpValue) -> AgentFrame {
    AgentFrame::Response(Response {
        id,
        result: OpResult::Ok(value),
    })
}

fn end(stream: u64, channel: Channel) -> AgentFrame {
    AgentFrame::StreamEnd(StreamEnd {
        stream,
        channel,
        reason: StreamEndReason::Eof,
        message: None,
    })
}

fn misbehave(conn: &mut UnixStream, mode: &str, req: &Request) {
    let id = req.id;
    match mode {
        "garbage" => {
            // A frame of a plausible length whose body is a fixed xorshift
            // stream (no valid msgpack, the same every run), then more.
            let _ = conn.write_all(&4096u32.to_be_bytes());
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let bytes: Vec<u8> = (0..1 << 20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8 | 0x80
                })
                .collect();
            let _ = conn.write_all(&bytes);
        }
        "hugelen" => {
            let _ = conn.write_all(&u32::MAX.to_be_bytes());
            let junk = vec![0x5a_u8; 1 << 20];
            while conn.write_all(&junk).is_ok() {}
        }
        "stall" => {
            let _ = conn.write_all(&1000u32.to_be_bytes());
            let _ = conn.write_all(&[0x82; 10]);
            std::thread::sleep(Duration::from_secs(100_000));
        }
        "unknownid" => {
            let _ = send(conn, &answer(id + 1000, OpValue::Unit));
        }
        "dupanswer" | "dupend" => {
            for ch in [Channel::Stdout, Channel::Stderr] {
                let _ = send(conn, &end(id, ch));
            }
            if mode == "dupend" {
                let _ = send(conn, &end(id, Channel::Stdout));
            }
            let done = answer(id, OpValue::Exit(ExitInfo::exited(0)));
            let _ = send(conn, &done);
            let _ = send(conn, &done);
        }
        "flood" => flood(conn, id),
        "stdin" => {
            // Spawned; whatever stdin comes is never acknowledged.
            let _ = send(conn, &answer(id, OpValue::Spawned { pid: 4242 }));
        }
        "connflood" => {
            let target = match &req.op {
                Op::Exec(spec) => match &spec.command {
                    Command::Shell { script } => script.trim().to_string(),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            let mut held = Vec::new();
            let mut refused = String::new();
            for _ in 0..CONNFLOOD {
                match UnixStream::connect(&target) {
                    Ok(c) => held.push(c),
                    Err(e) => {
                        refused = e.to_string();
                        break;
                    }
                }
            }
            let report = format!("connected {} of {CONNFLOOD}: {refused}\n", held.len());
            let _ = send(
                conn,
                &AgentFrame::StreamChunk(StreamChunk {
                    stream: id,
                    channel: Channel::Stdout,
                    data: report.into_bytes(),
                }),
            );
            for ch in [Channel::Stdout, Channel::Stderr] {
                let _ = send(conn, &end(id, ch));
            }
            let _ = send(conn, &answer(id, OpValue::Exit(ExitInfo::exited(0))));
            std::mem::forget(held);
        }
        other => {
            eprintln!("hostile_agent: unknown mode `{other}`");
            std::process::exit(2);
        }
    }
}

/// Stdout of request `id` at full speed, never ending, keeping within the
/// stream window (acks are read as they come), so only a cap on what the
/// host collects can stop it.
fn flood(conn: &mut UnixStream, id: u64) {
    let Ok(mut acks) = conn.try_clone() else {
        return;
    };
    let unacked = std::sync::Arc::new((std::sync::Mutex::new(0u64), std::sync::Condvar::new()));
    let u2 = unacked.clone();
    std::thread::spawn(move || {
        while let Some(frame) = recv(&mut acks) {
            if let HostFrame::StreamAck(a) = frame {
                let (m, c) = &*u2;
                let mut n = m.lock().unwrap();
                *n = n.saturating_sub(a.bytes);
                c.notify_all();
            }
        }
        let (m, c) = &*u2;
        *m.lock().unwrap() = u64::MAX;
        c.notify_all();
    });
    let chunk = vec![b'y'; MAX_CHUNK_BYTES];
    let (m, c) = &*unacked;
    loop {
        {
            let mut n = m.lock().unwrap();
            while *n != u64::MAX && *n + chunk.len() as u64 > STREAM_WINDOW_BYTES {
                n = c.wait(n).unwrap();
            }
            if *n == u64::MAX {
                return;
            }
            *n += chunk.len() as u64;
        }
        let frame = AgentFrame::StreamChunk(StreamChunk {
            stream: id,
            channel: Channel::Stdout,
            data: chunk.clone(),
        });
        if !send(conn, &frame) {
            return;
        }
    }
}
