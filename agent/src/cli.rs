//! Command-line options.
//!
//! ```text
//! provium-agent [--listen unix:PATH|vsock:PORT|console|auto] [--no-clock] [--init PATH]
//! ```
//!
//! Run as PID 1 (`rdinit=`), the kernel passes its leftover command-line words
//! as arguments; parsing is then lenient: unknown words are ignored with a
//! warning instead of refusing to start (a guest without its agent is useless).

use std::ffi::OsString;
use std::path::PathBuf;

use crate::listen::ListenAddr;

pub const USAGE: &str = "\
usage: provium-agent [--listen unix:PATH|vsock:PORT|console|auto] [--no-clock] [--init PATH]

  --listen ADDR  where to accept host connections (default auto: the kernel
                 command line's provium.agent_channel=vsock|console, else
                 vsock:1024 when the kernel has vsock, else the virtio-console
                 port named org.provium.agent)
  --no-clock     refuse clock_set/clock_advance (the local backend shares the host clock)
  --init PATH    as PID 1: the init to exec after forking the agent (default /init if present)
";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub listen: ListenAddr,
    pub no_clock: bool,
    pub init: Option<PathBuf>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Run(Options),
    Help,
    Version,
}

/// Parse `args` (without argv\[0\]). With `lenient`, unknown words become
/// warnings; the second value lists them.
pub fn parse(args: &[OsString], lenient: bool) -> Result<(Parsed, Vec<String>), String> {
    let mut opts = Options::default();
    let mut warnings = Vec::new();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value\n\n{USAGE}"))
        };
        match flag.as_str() {
            "--listen" => opts.listen = value("--listen")?.parse()?,
            "--init" => opts.init = Some(PathBuf::from(value("--init")?)),
            "--no-clock" => opts.no_clock = true,
            "-h" | "--help" => return Ok((Parsed::Help, warnings)),
            "-V" | "--version" => return Ok((Parsed::Version, warnings)),
            _ if lenient => warnings.push(format!("ignoring unknown argument `{arg}`")),
            _ => return Err(format!("unknown argument `{arg}`\n\n{USAGE}")),
        }
    }
    Ok((Parsed::Run(opts), warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn flags_and_defaults() {
        let (p, w) = parse(&args(&[]), false).unwrap();
        assert_eq!(p, Parsed::Run(Options::default()));
        assert!(w.is_empty());
        let (p, _) = parse(
            &args(&[
                "--listen",
                "unix:/x.sock",
                "--no-clock",
                "--init=/sbin/init",
            ]),
            false,
        )
        .unwrap();
        assert_eq!(
            p,
            Parsed::Run(Options {
                listen: ListenAddr::Unix("/x.sock".into()),
                no_clock: true,
                init: Some("/sbin/init".into()),
            })
        );
        assert_eq!(parse(&args(&["--help"]), false).unwrap().0, Parsed::Help);
    }

    #[test]
    fn unknown_words_fail_unless_lenient() {
        assert!(parse(&args(&["quiet"]), false)
            .unwrap_err()
            .contains("unknown argument `quiet`"));
        let (p, w) = parse(&args(&["quiet", "--no-clock"]), true).unwrap();
        assert!(matches!(p, Parsed::Run(Options { no_clock: true, .. })));
        assert_eq!(w, vec!["ignoring unknown argument `quiet`".to_string()]);
        assert!(parse(&args(&["--listen"]), false)
            .unwrap_err()
            .contains("needs a value"));
    }
}
