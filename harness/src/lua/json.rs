//! The `json` global: `json.encode(value)` and `json.decode(string)` with the
//! reference's array detection, integer precision and null rules.

use mlua::{Lua, Table, Value};
use serde_json::{Map, Number, Value as Json};

const MAX_DEPTH: usize = 128;

pub fn install(lua: &Lua) -> mlua::Result<()> {
    let json = lua.create_table()?;
    json.set(
        "encode",
        lua.create_function(|_, v: Value| encode(&v).map(|j| j.to_string()))?,
    )?;
    json.set(
        "decode",
        lua.create_function(|lua, s: mlua::LuaString| {
            let parsed: Json = serde_json::from_slice(&s.as_bytes())
                .map_err(|e| super::rust_err("json.decode", &e))?;
            to_lua(lua, &parsed)
        })?,
    )?;
    lua.globals().set("json", json)
}

pub fn encode(v: &Value) -> mlua::Result<Json> {
    encode_at(v, 0)
}

fn encode_at(v: &Value, depth: usize) -> mlua::Result<Json> {
    if depth > MAX_DEPTH {
        return Err(mlua::Error::runtime(
            "json.encode: nesting too deep (a cycle?)",
        ));
    }
    Ok(match v {
        Value::Nil => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Integer(i) => Json::Number((*i).into()),
        Value::Number(n) => Number::from_f64(*n).map(Json::Number).ok_or_else(|| {
            mlua::Error::runtime(format!("json.encode: {n} is not representable in JSON"))
        })?,
        Value::String(s) => Json::String(s.to_str()?.to_string()),
        Value::Table(t) => encode_table(t, depth)?,
        other => {
            return Err(mlua::Error::runtime(format!(
                "json.encode: cannot encode a {}",
                other.type_name()
            )));
        }
    })
}

fn encode_table(t: &Table, depth: usize) -> mlua::Result<Json> {
    let mut max_index: i64 = 0;
    let mut all_positive_ints = true;
    let mut count = 0usize;
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        count += 1;
        match k {
            Value::Integer(i) if i >= 1 => max_index = max_index.max(i),
            _ => all_positive_ints = false,
        }
    }
    // Empty tables encode as arrays? The reference leaves it open; `{}` is an
    // object in most Lua JSON libraries' default, and an empty object is the
    // safer reading of "anything else".
    if all_positive_ints && count > 0 {
        if max_index > (count as i64).saturating_mul(4).max(1024) {
            return Err(mlua::Error::runtime(format!(
                "json.encode: sparse array with max index {max_index} and {count} elements"
            )));
        }
        let mut arr = Vec::with_capacity(max_index as usize);
        for i in 1..=max_index {
            arr.push(encode_at(&t.raw_get::<Value>(i)?, depth + 1)?);
        }
        return Ok(Json::Array(arr));
    }
    let mut obj = Map::new();
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        let key = match &k {
            Value::String(s) => s.to_str()?.to_string(),
            Value::Integer(i) => i.to_string(),
            Value::Number(n) => n.to_string(),
            other => {
                return Err(mlua::Error::runtime(format!(
                    "json.encode: cannot use a {} as a key",
                    other.type_name()
                )));
            }
        };
        obj.insert(key, encode_at(&v, depth + 1)?);
    }
    Ok(Json::Object(obj))
}

pub fn to_lua(lua: &Lua, j: &Json) -> mlua::Result<Value> {
    Ok(match j {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Integer(i)
            } else if let Some(u) = n.as_u64() {
                // Above i64::MAX: keep the bit pattern, as tonumber("0xFF…") does.
                Value::Integer(u as i64)
            } else {
                Value::Number(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::String(lua.create_string(s)?),
        Json::Array(a) => {
            let t = lua.create_table_with_capacity(a.len(), 0)?;
            for (i, v) in a.iter().enumerate() {
                // A null leaves a hole: t[i] stays nil.
                t.raw_set(i as i64 + 1, to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
        Json::Object(o) => {
            let t = lua.create_table_with_capacity(0, o.len())?;
            for (k, v) in o {
                t.raw_set(k.as_str(), to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
    })
}
