//! Per-test metadata: a map of native msgpack values.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, Serializer};

/// A test's metadata: names to values, in key order on the wire.
pub type MetaMap = BTreeMap<String, MetaValue>;

/// A value tagged by its msgpack type. Deserialisation dispatches on the
/// input's type (never on declaration-order fallthrough), so `bin` stays
/// [`MetaValue::Bytes`] even when it is valid UTF-8.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// msgpack `nil`.
    Null,
    /// msgpack bool.
    Bool(bool),
    /// msgpack integer; one above `i64::MAX` is refused.
    Int(i64),
    /// msgpack float, encoded as float 64.
    Float(f64),
    /// msgpack `str`: UTF-8 text.
    Str(String),
    /// msgpack `bin`, even when it is valid UTF-8.
    Bytes(Vec<u8>),
    /// msgpack array.
    Array(Vec<MetaValue>),
    /// msgpack map with string keys.
    Map(MetaMap),
}

impl Serialize for MetaValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MetaValue::Null => s.serialize_unit(),
            MetaValue::Bool(b) => s.serialize_bool(*b),
            MetaValue::Int(i) => s.serialize_i64(*i),
            MetaValue::Float(f) => s.serialize_f64(*f),
            MetaValue::Str(v) => s.serialize_str(v),
            MetaValue::Bytes(b) => s.serialize_bytes(b),
            MetaValue::Array(a) => a.serialize(s),
            MetaValue::Map(m) => m.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for MetaValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MetaVisitor)
    }
}

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = MetaValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a msgpack nil, bool, integer, float, str, bin, array or map")
    }

    fn visit_unit<E>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }
    fn visit_none<E>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<MetaValue, E> {
        Ok(MetaValue::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<MetaValue, E> {
        Ok(MetaValue::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<MetaValue, E> {
        i64::try_from(v)
            .map(MetaValue::Int)
            .map_err(|_| E::custom(format!("meta integer {v} does not fit in i64")))
    }
    fn visit_f64<E>(self, v: f64) -> Result<MetaValue, E> {
        Ok(MetaValue::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<MetaValue, E> {
        Ok(MetaValue::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<MetaValue, E> {
        Ok(MetaValue::Str(v))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<MetaValue, E> {
        Ok(MetaValue::Bytes(v.to_vec()))
    }
    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<MetaValue, E> {
        Ok(MetaValue::Bytes(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MetaValue, A::Error> {
        // Bound the pre-allocation: the length comes from the peer.
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(256));
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(MetaValue::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetaValue, A::Error> {
        let mut out = MetaMap::new();
        while let Some((k, v)) = map.next_entry::<String, MetaValue>()? {
            out.insert(k, v);
        }
        Ok(MetaValue::Map(out))
    }
}
