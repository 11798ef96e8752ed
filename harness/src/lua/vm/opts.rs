//! What configures a VM from Lua: the sizing `lab:vm(name, profile, opts)`
//! declares (the scheduler reserves it), and the `vm:boot(opts)` options,
//! merged per field into the pending ones a boot (or a restore's rng seed)
//! reads. [`boot_spec`] makes the backend's [`MachineSpec`] of them.

use mlua::{Table, Value};

use crate::backend::MachineSpec;
use crate::config::parse_size;
use crate::lua::{err, rust_err};

pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;
pub const DEFAULT_CPUS: u32 = 1;

/// `lab:vm` opts: the sizing the scheduler needs at declaration.
#[derive(Debug, Clone, Copy)]
pub struct VmSizing {
    pub memory_bytes: u64,
    pub cpus: u32,
}

const BOOT_KEYS: &[&str] = &["kernel_cmdline", "rng_seed", "initial_time", "files"];

impl VmSizing {
    pub fn from_opts(opts: Option<&Table>) -> mlua::Result<VmSizing> {
        let mut s = VmSizing {
            memory_bytes: DEFAULT_MEMORY_BYTES,
            cpus: DEFAULT_CPUS,
        };
        let Some(o) = opts else { return Ok(s) };
        for pair in o.pairs::<String, Value>() {
            let (k, v) = pair?;
            match k.as_str() {
                "memory" => {
                    s.memory_bytes = match v {
                        Value::Integer(i) if i > 0 => i as u64,
                        Value::String(t) => {
                            parse_size(&t.to_str()?).map_err(|e| rust_err("vm opts: memory", &e))?
                        }
                        other => {
                            return Err(err(format!(
                                "vm opts: memory must be bytes or \"512M\", got {other:?}"
                            )))
                        }
                    }
                }
                "cpus" => {
                    s.cpus = match v {
                        Value::Integer(i) if (1..=256).contains(&i) => i as u32,
                        other => {
                            return Err(err(format!(
                                "vm opts: cpus must be an integer 1..=256, got {other:?}"
                            )))
                        }
                    }
                }
                k if BOOT_KEYS.contains(&k) => {
                    return Err(err(format!(
                        "vm opts: `{k}` is a boot option; pass it to vm:boot({{{k} = ...}})"
                    )))
                }
                other => {
                    return Err(err(format!(
                        "vm opts: unknown key `{other}` (accepted: memory, cpus)"
                    )))
                }
            }
        }
        Ok(s)
    }
}

/// `vm:boot` opts, merged per field into the pending options.
#[derive(Debug, Clone, Default)]
pub struct BootOpts {
    pub kernel_cmdline: Option<String>,
    pub rng_seed: Option<u64>,
    pub initial_time: Option<f64>,
    pub files: Vec<(String, Vec<u8>)>,
}

impl BootOpts {
    pub(super) fn merge(&mut self, t: &Table) -> mlua::Result<()> {
        for pair in t.pairs::<String, Value>() {
            let (k, v) = pair?;
            match k.as_str() {
                "kernel_cmdline" => self.kernel_cmdline = Some(String::from_lua_value(v, "kernel_cmdline")?),
                "rng_seed" => {
                    self.rng_seed = Some(match v {
                        Value::Integer(i) => i as u64,
                        other => return Err(err(format!("boot: rng_seed must be an integer, got {other:?}"))),
                    })
                }
                "initial_time" => {
                    self.initial_time = Some(match v {
                        Value::Integer(i) => i as f64,
                        Value::Number(n) if n.is_finite() => n,
                        other => return Err(err(format!("boot: initial_time must be finite seconds, got {other:?}"))),
                    })
                }
                "files" => {
                    let Value::Table(list) = v else {
                        return Err(err("boot: files must be an array of {path=..., content=...}"));
                    };
                    for (i, f) in list.sequence_values::<Table>().enumerate() {
                        let f = f.map_err(|_| err(format!("boot: files[{}] must be a table", i + 1)))?;
                        let path: String =
                            f.get("path").map_err(|_| err(format!("boot: files[{}].path must be a string", i + 1)))?;
                        let content: mlua::LuaString = f
                            .get("content")
                            .map_err(|_| err(format!("boot: files[{}].content must be a string", i + 1)))?;
                        self.files.push((path, content.as_bytes().to_vec()));
                    }
                }
                "memory" | "cpus" => {
                    return Err(err(format!("boot: `{k}` is a sizing option; pass it to lab:vm(name, profile, {{{k} = ...}})")))
                }
                other => {
                    return Err(err(format!("boot: unknown option `{other}` (accepted: {})", BOOT_KEYS.join(", "))))
                }
            }
        }
        Ok(())
    }
}

trait FromLuaValue: Sized {
    fn from_lua_value(v: Value, what: &str) -> mlua::Result<Self>;
}

impl FromLuaValue for String {
    fn from_lua_value(v: Value, what: &str) -> mlua::Result<Self> {
        match v {
            Value::String(s) => Ok(s.to_str()?.to_string()),
            other => Err(err(format!(
                "boot: {what} must be a string, got {}",
                other.type_name()
            ))),
        }
    }
}

/// The spec a boot builds: the declaration's, with the `vm:boot` opts and
/// the VM's disks and (VMM-device) NICs.
pub(super) fn boot_spec(
    declared: MachineSpec,
    opts: &BootOpts,
    disks: Vec<crate::backend::DiskSpec>,
    nics: Vec<crate::backend::NicSpec>,
) -> MachineSpec {
    MachineSpec {
        kernel_cmdline: opts.kernel_cmdline.clone(),
        rng_seed: opts.rng_seed,
        initial_time: opts.initial_time,
        files: opts.files.clone(),
        disks,
        nics,
        ..declared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(lua: &mlua::Lua, code: &str) -> Table {
        lua.load(code).eval().unwrap()
    }

    fn message(e: mlua::Error) -> String {
        crate::lua::error_message(&e)
    }

    #[test]
    fn sizing_defaults_and_accepts_bytes_or_a_size() {
        let lua = mlua::Lua::new();
        let s = VmSizing::from_opts(None).unwrap();
        assert_eq!(
            (s.memory_bytes, s.cpus),
            (DEFAULT_MEMORY_BYTES, DEFAULT_CPUS)
        );
        let s = VmSizing::from_opts(Some(&table(&lua, "{memory = '64M', cpus = 2}"))).unwrap();
        assert_eq!((s.memory_bytes, s.cpus), (64 << 20, 2));
        let s = VmSizing::from_opts(Some(&table(&lua, "{memory = 4096}"))).unwrap();
        assert_eq!(s.memory_bytes, 4096);
    }

    #[test]
    fn sizing_refusals_say_where_the_key_belongs() {
        let lua = mlua::Lua::new();
        let e = |code: &str| message(VmSizing::from_opts(Some(&table(&lua, code))).unwrap_err());
        assert!(
            e("{cpus = 0}").contains("vm opts: cpus must be an integer 1..=256"),
            "{}",
            e("{cpus = 0}")
        );
        assert!(e("{rng_seed = 1}").contains(
            "vm opts: `rng_seed` is a boot option; pass it to vm:boot({rng_seed = ...})"
        ));
        assert!(
            e("{colour = 1}").contains("vm opts: unknown key `colour` (accepted: memory, cpus)")
        );
    }

    #[test]
    fn boot_opts_merge_per_field() {
        let lua = mlua::Lua::new();
        let mut o = BootOpts::default();
        o.merge(&table(
            &lua,
            "{rng_seed = 7, files = {{path = '/etc/a', content = 'x'}}}",
        ))
        .unwrap();
        o.merge(&table(
            &lua,
            "{kernel_cmdline = 'quiet', initial_time = 1.5}",
        ))
        .unwrap();
        assert_eq!(o.rng_seed, Some(7), "an earlier field stays");
        assert_eq!(o.kernel_cmdline.as_deref(), Some("quiet"));
        assert_eq!(o.initial_time, Some(1.5));
        assert_eq!(o.files, [("/etc/a".to_string(), b"x".to_vec())]);
    }

    #[test]
    fn boot_opt_refusals_name_the_key() {
        let lua = mlua::Lua::new();
        let e = |code: &str| message(BootOpts::default().merge(&table(&lua, code)).unwrap_err());
        assert!(e("{memory = '1G'}").contains(
            "boot: `memory` is a sizing option; pass it to lab:vm(name, profile, {memory = ...})"
        ));
        assert!(e("{rng_seed = 'x'}").contains("boot: rng_seed must be an integer"));
        assert!(e("{initial_time = 0/0}").contains("boot: initial_time must be finite seconds"));
        assert!(e("{kernel_cmdline = 3}")
            .contains("boot: kernel_cmdline must be a string, got integer"));
        assert!(e("{files = {{path = '/a'}}}").contains("boot: files[1].content must be a string"));
        assert!(e("{nope = 1}").contains(
            "boot: unknown option `nope` (accepted: kernel_cmdline, rng_seed, initial_time, files)"
        ));
    }

    #[test]
    fn a_boot_spec_is_the_declaration_with_the_opts_and_devices() {
        let declared = MachineSpec::for_profile("v", "p", None, 64 << 20, 2);
        let opts = BootOpts {
            kernel_cmdline: Some("quiet".into()),
            rng_seed: Some(3),
            initial_time: Some(9.0),
            files: vec![("/f".into(), b"c".to_vec())],
        };
        let spec = boot_spec(declared, &opts, Vec::new(), Vec::new());
        assert_eq!(
            (spec.vm_name.as_str(), spec.memory_bytes, spec.cpus),
            ("v", 64 << 20, 2)
        );
        assert_eq!(spec.kernel_cmdline.as_deref(), Some("quiet"));
        assert_eq!((spec.rng_seed, spec.initial_time), (Some(3), Some(9.0)));
        assert_eq!(spec.files, opts.files);
    }
}
