//! Body encoding: msgpack with struct maps, strict and canonical decoding.

use serde::{de::DeserializeOwned, Serialize};

use crate::ProtocolError;

/// A top-level message that travels as one frame body.
pub trait WireMessage: Serialize + DeserializeOwned {
    /// Name used in error messages ("host frame", "event frame", …).
    const WHAT: &'static str;

    /// Semantic checks serde cannot express (empty chunks, argument counts).
    fn validate(&self) -> Result<(), ProtocolError> {
        Ok(())
    }
}

/// Encode a message as a msgpack body (no length prefix).
pub fn encode<T: WireMessage>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let mut out = Vec::with_capacity(64);
    let mut ser = rmp_serde::Serializer::new(&mut out).with_struct_map();
    msg.serialize(&mut ser).map_err(|e| ProtocolError::Encode {
        what: T::WHAT,
        detail: e.to_string(),
    })?;
    Ok(out)
}

/// Decode one msgpack body. Refuses trailing bytes, semantically invalid
/// messages, and encodings this crate would not produce (so that every body
/// that decodes re-encodes to exactly the same bytes).
pub fn decode<T: WireMessage>(body: &[u8]) -> Result<T, ProtocolError> {
    let mut rest: &[u8] = body;
    let msg = T::deserialize(&mut rmp_serde::Deserializer::new(&mut rest)).map_err(|e| {
        ProtocolError::Decode {
            what: T::WHAT,
            detail: e.to_string(),
        }
    })?;
    if !rest.is_empty() {
        return Err(ProtocolError::TrailingBytes {
            what: T::WHAT,
            trailing: rest.len(),
        });
    }
    msg.validate()?;
    if encode(&msg)? != body {
        return Err(ProtocolError::NonCanonical { what: T::WHAT });
    }
    Ok(msg)
}
