//! Parsing `run`/`run_async` arguments: the shell form `run("echo hi")`, the
//! argv form `run("echo", {"hi"})`, and the opts form
//! `run("echo", {args = {...}, env = {...}, cwd = ..., stdin = ..., timeout = ...})`.

use mlua::{Table, Value};
use provium_protocol::op::{Command, CommandSpec, ExecSpec, SpawnSpec};

use super::{duration, err};

/// Keys whose presence makes the second argument an opts table.
pub const OPTS_KEYS: &[&str] = &[
    "args",
    "env",
    "env_clear",
    "cwd",
    "stdin",
    "timeout",
    "timeout_ms",
];

/// `vm:run`'s arguments as the exec op's args (`b:run` too). `method` names
/// the caller in errors ("vm:run", "worker:run", …).
pub fn parse_exec(method: &str, cmd: String, second: Option<Table>) -> mlua::Result<ExecSpec> {
    parse(method, cmd, second, true)
}

/// `run_async`'s arguments as the spawn op's args. A timeout is refused: a
/// spawned process is bounded by `proc:wait(timeout)`.
pub fn parse_spawn(method: &str, cmd: String, second: Option<Table>) -> mlua::Result<SpawnSpec> {
    Ok(parse(method, cmd, second, false)?.run)
}

fn string_list(t: &Table, what: &str) -> mlua::Result<Vec<String>> {
    let mut out = Vec::new();
    for (i, v) in t.sequence_values::<Value>().enumerate() {
        match v? {
            Value::String(s) => out.push(s.to_str()?.to_string()),
            Value::Integer(n) => out.push(n.to_string()),
            Value::Number(n) => out.push(n.to_string()),
            other => {
                return Err(err(format!(
                    "{what}[{}] must be a string, got {}",
                    i + 1,
                    other.type_name()
                )));
            }
        }
    }
    Ok(out)
}

/// Both forms; `allow_timeout` is false for a spawn, whose result then has
/// no `timeout_ms`.
fn parse(
    method: &str,
    cmd: String,
    second: Option<Table>,
    allow_timeout: bool,
) -> mlua::Result<ExecSpec> {
    let mut exec = ExecSpec::from(CommandSpec::shell(cmd.clone()));
    let Some(t) = second else { return Ok(exec) };
    let run = &mut exec.run;
    let is_opts = OPTS_KEYS
        .iter()
        .any(|k| t.contains_key(*k).unwrap_or(false));
    if !is_opts {
        // The legacy array form: positional args, no shell.
        let args = string_list(&t, &format!("{method}: args"))?;
        run.command = Command::Argv { program: cmd, args };
        return Ok(exec);
    }
    if t.raw_len() > 0 {
        return Err(err(format!(
            "{method}: mixed array entries and opts keys; put positional args in `args = {{...}}` or pass a plain array"
        )));
    }
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let key = k.to_string()?;
        if !OPTS_KEYS.contains(&key.as_str()) {
            return Err(err(format!(
                "{method}: unknown option `{key}` (accepted: {})",
                OPTS_KEYS.join(", ")
            )));
        }
    }
    match t.get::<Value>("args")? {
        Value::Nil => {}
        Value::Table(a) => {
            run.command = Command::Argv {
                program: cmd,
                args: string_list(&a, &format!("{method}: args"))?,
            };
        }
        other => {
            return Err(err(format!(
                "{method}: `args` must be an array of strings, got {}",
                other.type_name()
            )))
        }
    }
    if let Some(env) = t.get::<Option<Table>>("env")? {
        for pair in env.pairs::<String, Value>() {
            let (k, v) = pair?;
            let v = match v {
                Value::String(s) => s.to_str()?.to_string(),
                Value::Integer(i) => i.to_string(),
                Value::Number(n) => n.to_string(),
                Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(err(format!(
                        "{method}: env.{k} must be a string, got {}",
                        other.type_name()
                    )))
                }
            };
            run.env.insert(k, v);
        }
    }
    run.env_clear = t.get::<Option<bool>>("env_clear")?.unwrap_or(false);
    run.cwd = t.get::<Option<String>>("cwd")?;
    run.stdin = t
        .get::<Option<mlua::LuaString>>("stdin")?
        .map(|s| s.as_bytes().to_vec());
    let timeout = t.get::<Value>("timeout")?;
    let timeout_ms = t.get::<Value>("timeout_ms")?;
    let timeout_given = !(timeout.is_nil() && timeout_ms.is_nil());
    if !allow_timeout && timeout_given {
        return Err(err(format!(
            "{method}: `timeout` is not accepted here; use proc:wait(timeout) to bound the wait"
        )));
    }
    if !timeout.is_nil() && !timeout_ms.is_nil() {
        return Err(err(format!(
            "{method}: give either `timeout` or `timeout_ms`, not both"
        )));
    }
    if !timeout.is_nil() {
        let d = duration::from_lua(&timeout, &format!("{method}: timeout"))?;
        exec.timeout_ms = Some(d.as_millis().max(1) as u64);
    }
    match timeout_ms {
        Value::Nil => {}
        Value::Integer(ms) if ms >= 0 => exec.timeout_ms = Some(ms as u64),
        other => {
            return Err(err(format!(
                "{method}: timeout_ms must be a non-negative integer, got {other:?}"
            )))
        }
    }
    Ok(exec)
}
