//! Strict decoding: malformed input is refused with a message naming what was
//! wrong, and nothing panics. Closed enums' `ALL`/`as_str` match serde.

mod samples;

use provium_protocol::event::FileStatus;
use provium_protocol::frame::{read_message, write_frame, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::meta::MetaValue;
use provium_protocol::op::{OpKind, Whence};
use provium_protocol::result::{EntryType, ErrorCode, ExitStatus};
use provium_protocol::wire::{Channel, StreamEndReason};
use provium_protocol::{
    decode, encode, AgentFrame, EventFrame, EventKind, HostFrame, ProtocolError,
};
use rmpv::Value;

fn body(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

fn host_err(v: &Value) -> String {
    decode::<HostFrame>(&body(v)).unwrap_err().to_string()
}

fn ping_request(op: Value) -> Value {
    map(vec![
        ("type", "request".into()),
        (
            "body",
            map(vec![("id", 1.into()), ("worker", Value::Nil), ("op", op)]),
        ),
    ])
}

#[test]
fn unknown_op_kind_is_named() {
    let msg = host_err(&ping_request(map(vec![("op", "reboot_universe".into())])));
    assert!(
        msg.contains("host frame") && msg.contains("reboot_universe"),
        "{msg}"
    );
}

#[test]
fn unknown_frame_type_is_named() {
    let msg = host_err(&map(vec![("type", "shout".into()), ("body", Value::Nil)]));
    assert!(msg.contains("shout"), "{msg}");
}

#[test]
fn unknown_field_is_named() {
    let v = map(vec![
        ("type", "hello".into()),
        (
            "body",
            map(vec![("protocol_version", 1.into()), ("extra", 1.into())]),
        ),
    ]);
    let msg = host_err(&v);
    assert!(msg.contains("extra"), "{msg}");
}

/// exec and spawn share one args struct (`CommandSpec`, flattened into
/// exec's map beside `timeout_ms`): each op still refuses a field the other
/// has, an unknown field and a missing one, and a mistyped field inside the
/// flattened part stays an error.
#[test]
fn exec_and_spawn_args_stay_strict() {
    let args = |extra: Vec<(&'static str, Value)>| {
        let mut e = vec![
            (
                "command",
                map(vec![("form", "shell".into()), ("script", "true".into())]),
            ),
            ("env", map(vec![])),
            ("env_clear", false.into()),
            ("cwd", Value::Nil),
            ("stdin", Value::Nil),
        ];
        e.extend(extra);
        map(e)
    };
    let op = |kind: &str, args: Value| map(vec![("op", kind.into()), ("args", args)]);
    let ok = |v: Value| decode::<HostFrame>(&body(&ping_request(v))).is_ok();
    assert!(ok(op("exec", args(vec![("timeout_ms", Value::Nil)]))));
    assert!(ok(op("spawn", args(vec![]))));

    let spawn_timeout = host_err(&ping_request(op(
        "spawn",
        args(vec![("timeout_ms", 5.into())]),
    )));
    assert!(spawn_timeout.contains("timeout_ms"), "{spawn_timeout}");
    let exec_extra = host_err(&ping_request(op(
        "exec",
        args(vec![("timeout_ms", Value::Nil), ("extra", 1.into())]),
    )));
    assert!(exec_extra.contains("extra"), "{exec_extra}");
    // serde reads a missing Option as None; the re-encode check refuses it,
    // as it did before the args were shared.
    let exec_missing = host_err(&ping_request(op("exec", args(vec![]))));
    assert!(exec_missing.contains("non-canonical"), "{exec_missing}");
    let mut wrong = args(vec![("timeout_ms", Value::Nil)]);
    if let Value::Map(entries) = &mut wrong {
        entries[2].1 = "yes".into(); // env_clear as a str
    }
    let exec_wrong = host_err(&ping_request(op("exec", wrong)));
    assert!(
        exec_wrong.contains("cannot decode host frame"),
        "{exec_wrong}"
    );
}

#[test]
fn wrong_type_is_an_error() {
    let v = map(vec![
        ("type", "hello".into()),
        ("body", map(vec![("protocol_version", "one".into())])),
    ]);
    let msg = host_err(&v);
    assert!(msg.contains("cannot decode host frame"), "{msg}");
}

#[test]
fn missing_field_is_an_error() {
    let v = map(vec![("type", "hello".into()), ("body", map(vec![]))]);
    let msg = host_err(&v);
    assert!(msg.contains("protocol_version"), "{msg}");
}

#[test]
fn trailing_bytes_are_refused() {
    let mut b = encode(&samples::host_frames()[0].1).unwrap();
    b.push(0xc0);
    let err = decode::<HostFrame>(&b).unwrap_err();
    assert!(
        matches!(err, ProtocolError::TrailingBytes { trailing: 1, .. }),
        "{err}"
    );
}

#[test]
fn non_canonical_encodings_are_refused() {
    // protocol_version 1 encoded as a u32 (0xce) instead of a positive fixint.
    let mut b = Vec::new();
    rmp::encode::write_map_len(&mut b, 2).unwrap();
    rmp::encode::write_str(&mut b, "type").unwrap();
    rmp::encode::write_str(&mut b, "hello").unwrap();
    rmp::encode::write_str(&mut b, "body").unwrap();
    rmp::encode::write_map_len(&mut b, 1).unwrap();
    rmp::encode::write_str(&mut b, "protocol_version").unwrap();
    rmp::encode::write_u32(&mut b, 1).unwrap();
    let err = decode::<HostFrame>(&b).unwrap_err();
    assert!(matches!(err, ProtocolError::NonCanonical { .. }), "{err}");
}

#[test]
fn empty_chunks_are_refused() {
    let v = map(vec![
        ("type", "stream_chunk".into()),
        (
            "body",
            map(vec![
                ("stream", 1.into()),
                ("channel", "stdout".into()),
                ("data", Value::Binary(vec![])),
            ]),
        ),
    ]);
    let err = decode::<AgentFrame>(&body(&v)).unwrap_err().to_string();
    assert!(err.contains("empty data chunk"), "{err}");
}

#[test]
fn zero_and_oversize_acks_are_refused() {
    for bytes in [0u64, 1 << 40] {
        let v = map(vec![
            ("type", "stdin_ack".into()),
            (
                "body",
                map(vec![("process", 1.into()), ("bytes", bytes.into())]),
            ),
        ]);
        let err = decode::<AgentFrame>(&body(&v)).unwrap_err().to_string();
        assert!(
            err.contains(&format!("acknowledges {bytes} bytes")),
            "{err}"
        );
    }
}

#[test]
fn unknown_event_kind_lists_known_kinds() {
    let v = map(vec![
        ("ts", 1.into()),
        ("kind", "vm_exploded".into()),
        ("payload", map(vec![])),
    ]);
    let err = decode::<EventFrame>(&body(&v)).unwrap_err().to_string();
    assert!(
        err.contains("unknown event kind `vm_exploded`") && err.contains("fixture_cache_hit"),
        "{err}"
    );
}

#[test]
fn event_envelope_keys_are_strict() {
    let v = map(vec![("kind", "fixture_cache_hit".into()), ("ts", 1.into())]);
    let err = decode::<EventFrame>(&body(&v)).unwrap_err().to_string();
    assert!(err.contains("expected key `ts`, found `kind`"), "{err}");
    let v = map(vec![
        ("ts", 1.into()),
        ("kind", "fixture_cache_hit".into()),
        ("payload", map(vec![("path", "p".into())])),
        ("extra", 1.into()),
    ]);
    let err = decode::<EventFrame>(&body(&v)).unwrap_err().to_string();
    assert!(err.contains("unexpected key `extra`"), "{err}");
    let v = map(vec![
        ("ts", 1.into()),
        ("kind", "fixture_cache_hit".into()),
        (
            "payload",
            map(vec![("path", "p".into()), ("bogus", 1.into())]),
        ),
    ]);
    let err = decode::<EventFrame>(&body(&v)).unwrap_err().to_string();
    assert!(err.contains("bogus"), "{err}");
}

#[test]
fn meta_value_dispatches_on_msgpack_type() {
    let (_, frame) = samples::events()
        .into_iter()
        .find(|(n, _)| n == "test_started")
        .unwrap();
    let back: EventFrame = decode(&encode(&frame).unwrap()).unwrap();
    let provium_protocol::Event::TestStarted(p) = back.event else {
        panic!()
    };
    assert_eq!(
        p.meta["bytes"],
        MetaValue::Bytes(b"utf8".to_vec()),
        "valid UTF-8 bin must stay Bytes"
    );
    assert_eq!(p.meta["str"], MetaValue::Str("s".into()));
    assert_eq!(p.meta["int"], MetaValue::Int(-5));
    assert_eq!(p.meta["float"], MetaValue::Float(1.5));
    assert_eq!(p.meta["null"], MetaValue::Null);
}

#[test]
fn framed_stream_errors_name_the_problem() {
    // A frame announcing more than the maximum is refused before reading it.
    let wire = [0x7f, 0xff, 0xff, 0xff];
    let err = read_message::<HostFrame, _>(&mut &wire[..], DEFAULT_MAX_FRAME_BYTES).unwrap_err();
    assert!(err.to_string().contains("exceeds the maximum"), "{err}");
    // A body cut short.
    let mut wire = Vec::new();
    write_frame(
        &mut wire,
        &encode(&samples::host_frames()[0].1).unwrap(),
        1024,
    )
    .unwrap();
    wire.truncate(wire.len() - 3);
    let err = read_message::<HostFrame, _>(&mut &wire[..], 1024).unwrap_err();
    assert!(err.to_string().starts_with("truncated frame"), "{err}");
    // A body truncated inside its msgpack (length prefix consistent).
    let full = encode(&samples::host_frames()[0].1).unwrap();
    let err = decode::<HostFrame>(&full[..full.len() - 1]).unwrap_err();
    assert!(
        err.to_string().contains("cannot decode host frame"),
        "{err}"
    );
}

#[test]
fn every_sample_body_truncated_anywhere_fails_cleanly() {
    for (name, f) in samples::agent_frames() {
        let b = encode(&f).unwrap();
        for cut in 0..b.len() {
            assert!(
                decode::<AgentFrame>(&b[..cut]).is_err(),
                "{name} cut at {cut} decoded"
            );
        }
    }
}

fn serde_name<T: serde::Serialize>(v: &T) -> String {
    let b = rmp_serde::to_vec_named(v).unwrap();
    rmpv::decode::read_value(&mut &b[..])
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

macro_rules! assert_closed_enum {
    ($ty:ty) => {
        for v in <$ty>::ALL {
            assert_eq!(serde_name(v), v.as_str(), "{}::{v:?}", stringify!($ty));
            assert_eq!(<$ty>::from_wire(v.as_str()), Some(*v));
        }
    };
}

#[test]
fn closed_enums_all_and_as_str_match_serde() {
    assert_closed_enum!(OpKind);
    assert_closed_enum!(EventKind);
    assert_closed_enum!(FileStatus);
    assert_closed_enum!(Whence);
    assert_closed_enum!(EntryType);
    assert_closed_enum!(ExitStatus);
    assert_closed_enum!(ErrorCode);
    assert_closed_enum!(Channel);
    assert_closed_enum!(StreamEndReason);
    assert_eq!(OpKind::ALL.len(), 34);
    assert_eq!(EventKind::ALL.len(), 19);
}

#[test]
fn op_tags_match_op_kind() {
    for op in samples::ops() {
        let b = rmp_serde::to_vec_named(&op).unwrap();
        let Value::Map(m) = rmpv::decode::read_value(&mut &b[..]).unwrap() else {
            panic!()
        };
        assert_eq!(m[0].0.as_str(), Some("op"));
        assert_eq!(m[0].1.as_str(), Some(op.kind().as_str()));
    }
}
