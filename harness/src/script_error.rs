//! [`ScriptError`]: a Lua error as a typed cause.
//!
//! A Rust error whose cause is a Lua script's failure (a fixture chunk, the
//! repl's setup line, a `bridge:attach` refusal) carries it as this type, so
//! the cause stays an error value (`#[source]` or `#[error(transparent)]`)
//! instead of being flattened into a `String` variant early. Its message is
//! what the test author reads: the Lua error without mlua's callback
//! wrappers and tracebacks ([`message`]). It lives outside `lua/` so that
//! `fixture/` can name it without importing the Lua layer.

/// A Lua error, displayed as its author reads it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", message(.0))]
pub struct ScriptError(pub mlua::Error);

/// The message of an mlua error without the Rust-side decoration (callback
/// wrappers, tracebacks), as test authors want to read it.
pub fn message(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError { cause, .. } => message(cause),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::WithContext { cause, .. } => message(cause),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_error_reads_as_the_lua_message_and_has_no_source() {
        let inner = mlua::Error::runtime("vm:boot: no such profile");
        let wrapped = mlua::Error::CallbackError {
            traceback: "stack traceback: ...".into(),
            cause: std::sync::Arc::new(inner),
        };
        let e = ScriptError(wrapped);
        assert_eq!(e.to_string(), "vm:boot: no such profile");
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(
            crate::error_chain::flatten(&e),
            "vm:boot: no such profile",
            "flattened once, with no traceback"
        );
    }
}
