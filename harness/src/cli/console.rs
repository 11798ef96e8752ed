//! `provium console <PROFILE>`: the serial console of a kvm-backend VM.

use super::RunArgs;

pub fn run(_args: &RunArgs, profile: &str) -> Result<i32, String> {
    Err(format!(
        "provium console {profile}: the console needs the kvm backend, which cannot boot guests end to end in this \
         build yet; nothing was started"
    ))
}
