use std::io::Write;

use provium_protocol::op::{Op, OpenMode, TailSource, TailStart};
use provium_protocol::result::ErrorCode;
use provium_protocol::wire::{Channel, StreamEndReason};
use provium_protocol::OpValue;

use crate::client::*;

fn tail(c: &mut Client, source: TailSource, start: TailStart) -> (u64, u64) {
    match c.ok(Op::Tail { source, start }) {
        OpValue::Tail { stream, offset } => (stream, offset),
        other => panic!("{other:?}"),
    }
}

fn append(path: &str, data: &[u8]) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(data)
        .unwrap();
}

#[test]
fn start_positions_and_appended_data() {
    let a = Agent::start();
    let mut c = a.client();
    let p = a.path("log");
    std::fs::write(&p, b"0123456789").unwrap();
    let src = || TailSource::Path { path: p.clone() };
    let (b, off) = tail(&mut c, src(), TailStart::Beginning);
    assert_eq!(off, 0);
    let (e, off) = tail(&mut c, src(), TailStart::End);
    assert_eq!(off, 10);
    let (o, off) = tail(&mut c, src(), TailStart::Offset { offset: 4 });
    assert_eq!(off, 4);
    let (past, off) = tail(&mut c, src(), TailStart::Offset { offset: 400 });
    assert_eq!(off, 10, "offsets past the end clamp to the end");
    let (fe, off) = tail(&mut c, src(), TailStart::FromEnd { bytes: 3 });
    assert_eq!(off, 7);
    append(&p, b"abc");
    let want = |c: &Client, id: u64, s: &str| c.output(id, Channel::Data) == s;
    c.pump_until("all tails to see the append", |c| {
        want(c, b, "0123456789abc")
            && want(c, e, "abc")
            && want(c, o, "456789abc")
            && want(c, past, "abc")
            && want(c, fe, "789abc")
    });
    c.ok(Op::CloseStream { stream: b });
    assert_eq!(c.ends[&(b, Channel::Data)], StreamEndReason::Closed);
    append(&p, b"def");
    c.pump_until("the open tail to see more", |c| want(c, e, "abcdef"));
    assert_eq!(
        c.output(b, Channel::Data),
        "0123456789abc",
        "closed tail gets nothing"
    );
    assert_code(
        &c.err(Op::CloseStream { stream: b }),
        ErrorCode::UnknownStream,
    );
}

#[test]
fn tail_a_handle_until_it_closes() {
    let a = Agent::start();
    let mut c = a.client();
    let p = a.path("log");
    std::fs::write(&p, b"abc").unwrap();
    let OpValue::Handle { handle } = c.ok(Op::Open {
        path: p.clone(),
        mode: OpenMode {
            read: true,
            ..OpenMode::default()
        },
        perm: None,
    }) else {
        panic!()
    };
    let (t, off) = tail(&mut c, TailSource::Handle { handle }, TailStart::Beginning);
    assert_eq!(off, 0);
    c.pump_until("data", |c| c.output(t, Channel::Data) == "abc");
    // The tail reads with pread: the handle's own cursor did not move.
    assert_eq!(c.ok(Op::Tell { handle }), OpValue::Offset { offset: 0 });
    c.ok(Op::Close { handle });
    c.pump_until("the tail to end", |c| {
        c.ends.contains_key(&(t, Channel::Data))
    });
    assert_eq!(c.ends[&(t, Channel::Data)], StreamEndReason::Eof);
    assert_code(
        &c.err(Op::Tail {
            source: TailSource::Handle { handle: 4242 },
            start: TailStart::End,
        }),
        ErrorCode::UnknownHandle,
    );
    assert_code(
        &c.err(Op::Tail {
            source: TailSource::Path {
                path: a.path("missing"),
            },
            start: TailStart::End,
        }),
        ErrorCode::Io,
    );
}
