//! Property tests: every wire type survives `decode(encode(x)) == x`, and no
//! input, however malformed, panics a decoder.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;

use crate::frame::{FrameDecoder, DEFAULT_MAX_FRAME_BYTES};
use crate::meta::MetaValue;
use crate::op::Op;
use crate::result::{OpResult, OpValue};
use crate::{decode, encode, AgentFrame, EventFrame, HostFrame, WireMessage, MAX_CHUNK_BYTES};

/// Non-recursive ops for a batch (a batch nested in a batch is refused by
/// the agent, but still must round-trip: include one level of it).
pub(crate) fn leaf_ops() -> impl Strategy<Value = Vec<Op>> {
    let leaf = prop_oneof![
        Just(Op::Ping),
        any::<String>().prop_map(|path| Op::Stat { path }),
        (any::<String>(), any::<Vec<u8>>()).prop_map(|(path, data)| Op::WriteFile { path, data }),
        Just(Op::Batch {
            ops: vec![Op::ClockGet]
        }),
    ];
    vec(leaf, 0..4)
}

pub(crate) fn leaf_results() -> impl Strategy<Value = Vec<OpResult>> {
    let leaf = prop_oneof![
        Just(OpResult::Ok(OpValue::Unit)),
        any::<Vec<u8>>().prop_map(|b| OpResult::Ok(OpValue::Bytes(b))),
        any::<crate::result::OpError>().prop_map(OpResult::Err),
    ];
    vec(leaf, 0..4)
}

pub(crate) fn chunk() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 1..=64),
        vec(any::<u8>(), MAX_CHUNK_BYTES..=MAX_CHUNK_BYTES)
    ]
}

impl Arbitrary for MetaValue {
    type Parameters = ();
    type Strategy = BoxedStrategy<MetaValue>;

    fn arbitrary_with(_: ()) -> Self::Strategy {
        let leaf = prop_oneof![
            Just(MetaValue::Null),
            any::<bool>().prop_map(MetaValue::Bool),
            any::<i64>().prop_map(MetaValue::Int),
            // NaN != NaN would make equality meaningless; NaN's bytes are pinned elsewhere.
            any::<f64>()
                .prop_filter("not NaN", |f| !f.is_nan())
                .prop_map(MetaValue::Float),
            any::<String>().prop_map(MetaValue::Str),
            any::<Vec<u8>>().prop_map(MetaValue::Bytes),
            // Valid UTF-8 in a bin must stay Bytes.
            "[a-z]{0,8}".prop_map(|s| MetaValue::Bytes(s.into_bytes())),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(MetaValue::Array),
                btree_map(any::<String>(), inner, 0..4).prop_map(MetaValue::Map),
            ]
        })
        .boxed()
    }
}

fn round_trip<T: WireMessage + PartialEq + std::fmt::Debug>(x: &T) -> Result<(), TestCaseError> {
    let bytes = encode(x).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: T = decode(&bytes).map_err(|e| TestCaseError::fail(format!("{e} for {x:?}")))?;
    prop_assert_eq!(&back, x);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn host_frames_round_trip(x in any::<HostFrame>()) { round_trip(&x)?; }

    #[test]
    fn agent_frames_round_trip(x in any::<AgentFrame>()) { round_trip(&x)?; }

    #[test]
    fn event_frames_round_trip(x in any::<EventFrame>()) { round_trip(&x)?; }

    #[test]
    fn arbitrary_bodies_never_panic(body in vec(any::<u8>(), 0..512)) {
        let _ = decode::<HostFrame>(&body);
        let _ = decode::<AgentFrame>(&body);
        let _ = decode::<EventFrame>(&body);
    }

    /// Mutating one byte of a valid body either fails cleanly or yields a
    /// message that re-encodes to exactly the mutated bytes.
    #[test]
    fn mutated_bodies_decode_canonically_or_fail(x in any::<AgentFrame>(), pos in any::<usize>(), byte in any::<u8>()) {
        let mut body = encode(&x).unwrap();
        let i = pos % body.len();
        body[i] = byte;
        if let Ok(y) = decode::<AgentFrame>(&body) {
            prop_assert_eq!(encode(&y).unwrap(), body);
        }
    }

    #[test]
    fn arbitrary_streams_never_panic_the_frame_decoder(bytes in vec(any::<u8>(), 0..1024), split in any::<usize>()) {
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
        let cut = if bytes.is_empty() { 0 } else { split % bytes.len() };
        dec.push(&bytes[..cut]);
        dec.push(&bytes[cut..]);
        while let Ok(Some(body)) = dec.next_frame() {
            let _ = decode::<HostFrame>(&body);
        }
    }
}
