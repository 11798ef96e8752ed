//! Conformance pins: the exact bytes of every wire variant under
//! PROTOCOL_VERSION. A changed tag, field order or enum order fails here.
//!
//! `pins.txt` holds, per sample, its name, the body's hex and a readable view
//! of the same msgpack. After an intended wire change: bump PROTOCOL_VERSION,
//! run with `PROVIUM_BLESS_PINS=1`, and review the diff of `pins.txt`.

mod samples;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use provium_protocol::op::OpKind;
use provium_protocol::{encode, EventKind, WireMessage, PROTOCOL_VERSION};

const PINNED_VERSION: u32 = 3;

fn line<T: WireMessage>(name: &str, msg: &T) -> String {
    let body = encode(msg).unwrap();
    let view = rmpv::decode::read_value(&mut &body[..]).unwrap();
    format!("{name} | {} | {view}\n", hex::encode(&body))
}

fn all_lines() -> String {
    let mut out = String::new();
    for (name, f) in samples::host_frames() {
        out += &line(&format!("host.{name}"), &f);
    }
    for (name, f) in samples::agent_frames() {
        out += &line(&format!("agent.{name}"), &f);
    }
    for (name, f) in samples::events() {
        out += &line(&format!("event.{name}"), &f);
    }
    out
}

#[test]
fn pins_match_the_locked_bytes() {
    assert_eq!(
        PROTOCOL_VERSION, PINNED_VERSION,
        "PROTOCOL_VERSION changed: re-bless pins.txt (PROVIUM_BLESS_PINS=1) and update PINNED_VERSION"
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pins.txt");
    let now = all_lines();
    if std::env::var_os("PROVIUM_BLESS_PINS").is_some() {
        std::fs::write(path, &now).unwrap();
        return;
    }
    let locked = std::fs::read_to_string(path).expect("tests/pins.txt is missing");
    let locked: Vec<&str> = locked.lines().collect();
    let now: Vec<&str> = now.lines().collect();
    let mut diff = String::new();
    for (i, (a, b)) in locked.iter().zip(&now).enumerate() {
        if a != b {
            writeln!(diff, "line {}:\n  locked: {a}\n  now:    {b}", i + 1).unwrap();
        }
    }
    if locked.len() != now.len() {
        writeln!(
            diff,
            "locked has {} pins, the code produces {}",
            locked.len(),
            now.len()
        )
        .unwrap();
    }
    assert!(
        diff.is_empty(),
        "wire shape changed without a version bump:\n{diff}"
    );
}

/// The items protocol-version.md names, asserted on their own so a failure
/// reads as the rule it breaks.
#[test]
fn named_pins_from_the_version_policy() {
    let hello = samples::host_frames().remove(0).1;
    // {"type": "hello", "body": {"protocol_version": 1}}
    assert_eq!(
        hex::encode(encode(&hello).unwrap()),
        "82a474797065a568656c6c6fa4626f647981b070726f746f636f6c5f76657273696f6e01"
    );
    let pins = all_lines();
    let find = |name: &str| {
        pins.lines()
            .find(|l| l.starts_with(&format!("{name} |")))
            .unwrap()
            .to_string()
    };
    let ok = find("agent.hello_ok");
    assert!(ok.ends_with(
        r#"{"type": "hello_ok", "body": {"agent_version": "0.1.0", "guest_os": "linux 6.1.0 x86_64", "agent_features": ["clock_set"]}}"#
    ), "{ok}");
    let unit = find("agent.response.ok.0");
    assert!(unit.ends_with(r#"{"type": "response", "body": {"id": 1, "result": {"outcome": "ok", "value": {"type": "unit"}}}}"#), "{unit}");
    let err = find("agent.response.err.io");
    assert!(
        err.contains(
            r#""result": {"outcome": "err", "value": {"code": "io", "errno": nil, "message": "m"}}"#
        ),
        "{err}"
    );
    // SyscallResult: ret, errno, and out_bufs only when non-empty.
    let sys_empty = find("agent.response.ok.15");
    assert!(
        sys_empty.contains(r#"{"type": "syscall", "data": {"ret": 0, "errno": 0}}"#),
        "{sys_empty}"
    );
    let sys_bufs = find("agent.response.ok.16");
    assert!(
        sys_bufs.contains(r#"{"ret": -1, "errno": 25, "out_bufs": [[1, 2]]}"#),
        "{sys_bufs}"
    );
    // OpenMode: six named booleans in this order, then perm beside it.
    let open = pins
        .lines()
        .find(|l| l.starts_with("host.request.open."))
        .unwrap();
    assert!(open.contains(
        r#""mode": {"read": true, "write": true, "create": true, "truncate": false, "append": false, "exclusive": true}, "perm": 384"#
    ), "{open}");
    // Events: the envelope is flat {ts, kind, payload}.
    let ev = find("event.fixture_cache_hit");
    assert!(ev.ends_with(r#"{"ts": 1700000000000000000, "kind": "fixture_cache_hit", "payload": {"path": "base"}}"#), "{ev}");
    // MetaValue: bin stays bin even when it is valid UTF-8.
    let started = find("event.test_started");
    assert!(
        started.contains(r#""bytes": [117, 116, 102, 56]"#),
        "{started}"
    );
}

/// Every op kind and every event kind has a pinned sample.
#[test]
fn samples_cover_every_variant() {
    let ops: BTreeSet<OpKind> = samples::ops().iter().map(|o| o.kind()).collect();
    let all_ops: BTreeSet<OpKind> = OpKind::ALL.iter().copied().collect();
    assert_eq!(ops, all_ops);
    let events: BTreeSet<String> = samples::events().into_iter().map(|(n, _)| n).collect();
    let all_events: BTreeSet<String> = EventKind::ALL.iter().map(|k| k.to_string()).collect();
    assert_eq!(events, all_events);
    let value_tags: BTreeSet<String> = samples::values()
        .iter()
        .map(|v| {
            let body = rmp_serde::to_vec_named(v).unwrap();
            match rmpv::decode::read_value(&mut &body[..]).unwrap() {
                rmpv::Value::Map(m) => m[0].1.as_str().unwrap().to_string(),
                other => panic!("{other}"),
            }
        })
        .collect();
    let expected = [
        "unit",
        "exit",
        "ran",
        "spawned",
        "process_status",
        "pid",
        "bytes",
        "stat",
        "entries",
        "handle",
        "written",
        "offset",
        "tail",
        "syscall",
        "ioctl",
        "clock",
        "worker",
        "batch",
    ];
    assert_eq!(value_tags, expected.iter().map(|s| s.to_string()).collect());
}
