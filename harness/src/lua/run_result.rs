//! RunResult: what `vm:run`, `worker:run` and `proc:wait` return. It is
//! the agent client's [`RunOutput`] itself (one run-result type for the
//! client and the Lua API), given its Lua face here.

use mlua::{UserData, UserDataFields, UserDataMethods};
use provium_protocol::result::ExitStatus;
use provium_protocol::signal::signal_name;

use super::err;

pub use crate::client::RunOutput;
/// The Lua API's name for a [`RunOutput`].
pub use crate::client::RunOutput as RunResult;

impl RunOutput {
    /// The message of a failed `assert_ok`: status, stdout and stderr.
    pub fn failure_message(&self) -> String {
        let status = match self.exit.status {
            ExitStatus::Exited => format!("exited with code {}", self.exit.exit_code),
            ExitStatus::Signalled => {
                let sig = self.exit.signal.unwrap_or(0);
                match signal_name(sig) {
                    Some(name) => format!("killed by signal {sig} ({name})"),
                    None => format!("killed by signal {sig}"),
                }
            }
            ExitStatus::TimedOut => "timed out (the process group was killed)".to_string(),
        };
        format!(
            "command {status}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&self.stdout),
            String::from_utf8_lossy(&self.stderr)
        )
    }
}

impl UserData for RunOutput {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("exit_code", |_, this| Ok(this.exit.exit_code));
        f.add_field_method_get("stdout", |lua, this| lua.create_string(&this.stdout));
        f.add_field_method_get("stderr", |lua, this| lua.create_string(&this.stderr));
        f.add_field_method_get("status", |_, this| Ok(this.exit.status.as_str()));
        f.add_field_method_get("timed_out", |_, this| {
            Ok(this.exit.status == ExitStatus::TimedOut)
        });
        f.add_field_method_get("signal", |_, this| Ok(this.exit.signal));
    }

    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("ok", |_, this, ()| Ok(this.success()));
        m.add_method("assert_ok", |_, this, ()| {
            if this.success() {
                Ok(this.clone())
            } else {
                Err(err(this.failure_message()))
            }
        });
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!(
                "RunResult({}, exit_code={})",
                this.exit.status, this.exit.exit_code
            ))
        });
    }
}
