//! Lua values <-> [`MetaValue`], for test metadata in events and filters.

use mlua::{Table, Value};
use provium_protocol::meta::{MetaMap, MetaValue};

const MAX_DEPTH: usize = 32;

pub fn table_to_meta(t: &Table) -> MetaMap {
    match to_meta(&Value::Table(t.clone()), 0) {
        MetaValue::Map(m) => m,
        // An array-shaped meta table: keep its entries under their indices.
        MetaValue::Array(a) => a
            .into_iter()
            .enumerate()
            .map(|(i, v)| ((i + 1).to_string(), v))
            .collect(),
        _ => MetaMap::new(),
    }
}

fn to_meta(v: &Value, depth: usize) -> MetaValue {
    if depth > MAX_DEPTH {
        return MetaValue::Str("<nested too deep>".into());
    }
    match v {
        Value::Nil => MetaValue::Null,
        Value::Boolean(b) => MetaValue::Bool(*b),
        Value::Integer(i) => MetaValue::Int(*i),
        Value::Number(n) => MetaValue::Float(*n),
        Value::String(s) => match s.to_str() {
            Ok(text) => MetaValue::Str(text.to_string()),
            Err(_) => MetaValue::Bytes(s.as_bytes().to_vec()),
        },
        Value::Table(t) => {
            let len = t.raw_len();
            let mut count = 0;
            let mut map = MetaMap::new();
            for (k, val) in t.pairs::<Value, Value>().flatten() {
                count += 1;
                let key = match &k {
                    Value::String(s) => s.to_string_lossy().to_string(),
                    Value::Integer(i) => i.to_string(),
                    other => format!("<{}>", other.type_name()),
                };
                map.insert(key, to_meta(&val, depth + 1));
            }
            if len > 0 && count == len {
                MetaValue::Array(
                    (1..=len)
                        .map(|i| to_meta(&t.raw_get(i).unwrap_or(Value::Nil), depth + 1))
                        .collect(),
                )
            } else {
                MetaValue::Map(map)
            }
        }
        other => MetaValue::Str(format!("<{}>", other.type_name())),
    }
}
