//! What the root lab and its test scopes share for the whole file: the
//! settings (`provium.timeout`, `provium.reset_between_tests`), the
//! one-shot resource claim, and named barriers.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use mlua::{Table, Value};
use provium_protocol::event::{ClaimAcquired, ResourceAmount};

use super::Lab;
use crate::config::parse_size;
use crate::events::Lifecycle;
use crate::lock::Locked;
use crate::lua::{duration, err, rust_err};

/// File-level settings and one-shot primitives.
#[derive(Default)]
pub(super) struct FileScope {
    pub(super) settings: Mutex<FileSettings>,
    pub(super) claim: Mutex<Option<ResourceAmount>>,
    pub(super) barriers: Mutex<BTreeMap<String, Barrier>>,
    pub(super) barrier_cv: Condvar,
    /// The `reset_between_tests` baseline (a lab snapshot directory).
    pub(super) baseline: Mutex<Option<std::path::PathBuf>>,
}

#[derive(Default, Clone)]
pub(super) struct FileSettings {
    pub(super) timeout: Option<Duration>,
    pub(super) reset_between_tests: bool,
}

/// One named `lab:barrier`: `count` callers meet; each meeting bumps
/// `generation`, which is how a waiter tells its release from a timeout.
pub(super) struct Barrier {
    count: usize,
    arrived: usize,
    generation: u64,
}

impl Lab {
    /// `provium.timeout`, the file-default per-test timeout.
    pub fn file_timeout(&self) -> mlua::Result<Option<Duration>> {
        Ok(self.0.file.settings.locked().timeout)
    }

    pub(super) fn claim(&self, spec: Table) -> mlua::Result<()> {
        let mut held = self.0.file.claim.locked();
        if held.is_some() {
            return Err(err("lab claim already held; one-shot per lab"));
        }
        let memory_bytes = match spec.get::<Value>("memory")? {
            Value::Nil => 0,
            Value::Integer(i) if i >= 0 => i as u64,
            Value::String(s) => {
                parse_size(&s.to_str()?).map_err(|e| rust_err("claim: memory", &e))?
            }
            other => {
                return Err(err(format!(
                    "claim: memory must be bytes or a size string, got {}",
                    other.type_name()
                )))
            }
        };
        let cpus = match spec.get::<Value>("cpus")? {
            Value::Nil => 0,
            Value::Integer(i) if i >= 0 && i <= u32::MAX as i64 => i as u32,
            other => {
                return Err(err(format!(
                    "claim: cpus must be a non-negative integer, got {other:?}"
                )))
            }
        };
        for pair in spec.pairs::<Value, Value>() {
            let (k, _) = pair?;
            let key = k.to_string()?;
            if key != "memory" && key != "cpus" {
                return Err(err(format!(
                    "claim: unknown key `{key}` (accepted: memory, cpus)"
                )));
            }
        }
        let amount = ResourceAmount { memory_bytes, cpus };
        *held = Some(amount);
        let env = &self.0.env;
        let path = env.rel_path.clone();
        env.events
            .send(Lifecycle::ClaimAcquired(ClaimAcquired { path, amount }));
        Ok(())
    }

    pub(super) fn barrier(
        &self,
        name: String,
        count: i64,
        timeout: Option<Duration>,
    ) -> mlua::Result<bool> {
        if count < 1 {
            return Err(err(format!(
                "barrier `{name}`: count must be at least 1 (got {count})"
            )));
        }
        let count = count as usize;
        let deadline = Instant::now() + timeout.unwrap_or(Duration::from_secs(60));
        let mut barriers = self.0.file.barriers.locked();
        let b = barriers.entry(name.clone()).or_insert(Barrier {
            count,
            arrived: 0,
            generation: 0,
        });
        if b.count != count {
            eprintln!(
                "provium: warning: barrier `{name}` was created with count {}, called with {count}",
                b.count
            );
            return Ok(false);
        }
        b.arrived += 1;
        if b.arrived >= b.count {
            b.arrived = 0;
            b.generation += 1;
            self.0.file.barrier_cv.notify_all();
            return Ok(true);
        }
        let generation = b.generation;
        loop {
            self.0.env.check_cancelled()?;
            let now = Instant::now();
            if now >= deadline {
                if let Some(b) = barriers.get_mut(&name) {
                    if b.generation == generation {
                        b.arrived = b.arrived.saturating_sub(1);
                    }
                }
                return Ok(false);
            }
            let wait = (deadline - now).min(Duration::from_millis(50));
            barriers = self
                .0
                .file
                .barrier_cv
                .wait_timeout(barriers, wait)
                .unwrap()
                .0;
            if barriers
                .get(&name)
                .is_some_and(|b| b.generation != generation)
            {
                return Ok(true);
            }
        }
    }

    pub(super) fn set_setting(&self, key: &str, value: Value) -> mlua::Result<()> {
        if !self.0.is_root {
            return Err(err(format!(
                "provium.{key} can only be set at file scope on the root lab"
            )));
        }
        let mut s = self.0.file.settings.locked();
        match key {
            "timeout" => {
                s.timeout = match value {
                    Value::Nil => None,
                    v => Some(duration::from_lua(&v, "provium.timeout")?),
                }
            }
            "reset_between_tests" => {
                s.reset_between_tests = match value {
                    Value::Boolean(b) => b,
                    Value::Nil => false,
                    other => {
                        return Err(err(format!(
                            "provium.reset_between_tests must be a boolean, got {}",
                            other.type_name()
                        )))
                    }
                }
            }
            _ => unreachable!(),
        }
        Ok(())
    }

    /// The settings as they stand (read by `provium.timeout` and
    /// `provium.reset_between_tests`).
    pub(super) fn settings(&self) -> FileSettings {
        self.0.file.settings.locked().clone()
    }
}

#[cfg(test)]
mod tests {
    use mlua::Lua;

    use super::super::test_utils::kvm_env;
    use super::*;
    use crate::lua::error_message;

    fn claim_error(lua: &Lua, lab: &Lab, spec: &str) -> String {
        let spec: Table = lua.load(spec).eval().unwrap();
        error_message(&lab.claim(spec).unwrap_err())
    }

    #[test]
    fn a_claim_takes_memory_and_cpus_once() {
        let lua = Lua::new();
        let root = Lab::root(kvm_env());
        assert_eq!(
            claim_error(&lua, &root, "{memory = true}"),
            "claim: memory must be bytes or a size string, got boolean"
        );
        assert_eq!(
            claim_error(&lua, &root, "{cpus = -1}"),
            "claim: cpus must be a non-negative integer, got Integer(-1)"
        );
        assert_eq!(
            claim_error(&lua, &root, "{gpus = 1}"),
            "claim: unknown key `gpus` (accepted: memory, cpus)"
        );
        let spec: Table = lua.load("{memory = '1M', cpus = 2}").eval().unwrap();
        root.claim(spec).unwrap();
        assert_eq!(
            *root.0.file.claim.locked(),
            Some(ResourceAmount {
                memory_bytes: 1 << 20,
                cpus: 2
            })
        );
        let scope = root.child("provium".into(), Some(root.clone()));
        assert_eq!(
            claim_error(&lua, &scope, "{}"),
            "lab claim already held; one-shot per lab",
            "one claim per file, whichever scope makes it"
        );
    }

    #[test]
    fn a_barrier_releases_when_count_callers_arrive() {
        let root = Lab::root(kvm_env());
        assert!(root.barrier("one".into(), 1, None).unwrap());
        let other = root.child("provium".into(), Some(root.clone()));
        let waiter = std::thread::spawn(move || {
            other
                .barrier("two".into(), 2, Some(Duration::from_secs(30)))
                .unwrap()
        });
        // Arrive second, whenever the waiter got there: a generation bump
        // releases it, and a late arrival would be the one to release.
        let deadline = Instant::now() + Duration::from_secs(30);
        while root
            .0
            .file
            .barriers
            .lock()
            .unwrap()
            .get("two")
            .map(|b| b.arrived)
            != Some(1)
        {
            assert!(Instant::now() < deadline, "the waiter never arrived");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(root.barrier("two".into(), 2, None).unwrap());
        assert!(waiter.join().unwrap());
    }

    #[test]
    fn a_barrier_times_out_and_refuses_a_bad_count() {
        let root = Lab::root(kvm_env());
        assert!(!root
            .barrier("b".into(), 2, Some(Duration::from_millis(10)))
            .unwrap());
        assert_eq!(
            root.0.file.barriers.locked()["b"].arrived,
            0,
            "a timed-out caller leaves"
        );
        assert!(
            !root.barrier("b".into(), 3, None).unwrap(),
            "another count: a warning, not a wait"
        );
        assert_eq!(
            error_message(&root.barrier("c".into(), 0, None).unwrap_err()),
            "barrier `c`: count must be at least 1 (got 0)"
        );
    }

    #[test]
    fn settings_are_set_on_the_root_only() {
        let root = Lab::root(kvm_env());
        root.set_setting("timeout", Value::Number(2.5)).unwrap();
        root.set_setting("reset_between_tests", Value::Boolean(true))
            .unwrap();
        let s = root.settings();
        assert_eq!(s.timeout, Some(Duration::from_millis(2500)));
        assert!(s.reset_between_tests);
        assert_eq!(root.file_timeout().unwrap(), s.timeout);
        assert_eq!(
            error_message(
                &root
                    .set_setting("reset_between_tests", Value::Integer(1))
                    .unwrap_err()
            ),
            "provium.reset_between_tests must be a boolean, got integer"
        );
        let scope = root.child("provium".into(), Some(root.clone()));
        assert_eq!(
            error_message(&scope.set_setting("timeout", Value::Nil).unwrap_err()),
            "provium.timeout can only be set at file scope on the root lab"
        );
    }
}
