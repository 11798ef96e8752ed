//! Arbitrary bytes into the wire decoder: nothing a peer (a hostile guest) sends
//! may panic the host, and decoding is canonical-only, so every body that
//! decodes must re-encode to exactly the same bytes and round-trip to an equal
//! value.
//!
//! Input layout: byte 0 selects how the rest is fed.
//! - even: the rest is a byte stream, pushed into a `FrameDecoder` in chunks of
//!   `byte 1` bytes (0 means all at once), popping frames after every push, as a
//!   transport would; each frame body is decoded as every frame type.
//! - odd: the rest is one frame body, decoded as every frame type directly (so
//!   the fuzzer needn't discover the 4-byte length prefix to reach the decoder).

#![no_main]

use libfuzzer_sys::fuzz_target;
use provium_protocol::frame::{FrameDecoder, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::{decode, encode, AgentFrame, EventFrame, HostFrame};

/// If `body` decodes as `T`, it must re-encode to `body` exactly and decode
/// back to an equal value.
macro_rules! check_canonical {
    ($ty:ty, $body:expr) => {{
        let body: &[u8] = $body;
        if let Ok(value) = decode::<$ty>(body) {
            let again = encode(&value).unwrap_or_else(|e| {
                panic!(
                    "{} decoded but does not re-encode: {e:?}\nvalue: {value:?}",
                    stringify!($ty)
                )
            });
            assert_eq!(
                again,
                body,
                "{} decoded from a non-canonical body\nvalue: {value:?}",
                stringify!($ty)
            );
            let back = decode::<$ty>(&again).unwrap_or_else(|e| {
                panic!(
                    "{} re-encoding does not decode: {e:?}\nvalue: {value:?}",
                    stringify!($ty)
                )
            });
            assert_eq!(
                back,
                value,
                "{} round trip changed the value",
                stringify!($ty)
            );
        }
    }};
}

fn check_body(body: &[u8]) {
    check_canonical!(HostFrame, body);
    check_canonical!(AgentFrame, body);
    check_canonical!(EventFrame, body);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 1 {
        check_body(rest);
        return;
    }
    let Some((&chunk, stream)) = rest.split_first() else {
        return;
    };
    let chunk = if chunk == 0 {
        stream.len().max(1)
    } else {
        usize::from(chunk)
    };
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
    for piece in stream.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(body)) => {
                    assert!(body.len() <= DEFAULT_MAX_FRAME_BYTES);
                    check_body(&body);
                }
                Ok(None) => break,
                // Framing is lost (oversize length): a transport drops the
                // connection here, so stop feeding this decoder.
                Err(_) => return,
            }
        }
    }
});
