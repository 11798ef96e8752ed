//! `provium console <PROFILE>`: boot the profile on the microVMM and attach
//! the terminal to its serial console (COM1).
//!
//! Without `--agent` the initrd is used as is (no agent injected), so any
//! bzImage boots. When stdin is a terminal it is put in raw mode (every key
//! goes to the guest, Ctrl-C included) and restored on every exit path: the
//! escape, stdin EOF, the VM stopping, SIGTERM/SIGHUP/SIGINT, an error, a
//! panic. Escape: Ctrl-A then `x` (or `X`) quits; Ctrl-A Ctrl-A sends one
//! Ctrl-A; Ctrl-A followed by anything else sends both bytes. When stdin is
//! not a terminal (a pipe), its bytes go to the guest and its EOF detaches.
//! Exit code 0 when detached or the guest powered off, 1 when the VM died.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::ConsoleRead;

use super::load_config;
use super::preflight::{kvm_usable, PreflightError};
use super::run::RunError;
use super::RunArgs;
use crate::backend::{self, BackendError, BackendKind, Guest, MachineSpec, Stopped};
use crate::config::{parse_size, ConfigError, SizeError};
use crate::lua::vm::{DEFAULT_CPUS, DEFAULT_MEMORY_BYTES};

const CTRL_A: u8 = 0x01;

/// The flags of `provium console`.
#[derive(Debug, Clone, Default)]
pub struct ConsoleOpts {
    pub mem: Option<String>,
    pub cpus: Option<u32>,
    pub cmdline: Option<String>,
    pub agent: bool,
}

/// Raw mode on the terminal at fd 0 while alive.
struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    /// `None` when stdin is not a terminal.
    fn enter() -> Option<RawTerminal> {
        // SAFETY: isatty/tcgetattr/tcsetattr on fd 0 with a termios we own.
        unsafe {
            if libc::isatty(0) != 1 {
                return None;
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(0, libc::TCSANOW, &raw) != 0 {
                return None;
            }
            Some(RawTerminal { saved })
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read in `enter`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
    }
}

/// The escape handling, separate so it can be tested.
#[derive(Default)]
pub struct Escape {
    armed: bool,
}

impl Escape {
    /// Feeds input bytes; returns the bytes for the guest and whether to quit.
    pub fn feed(&mut self, input: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(input.len());
        for &b in input {
            if self.armed {
                self.armed = false;
                match b {
                    b'x' | b'X' => return (out, true),
                    CTRL_A => out.push(CTRL_A),
                    other => out.extend([CTRL_A, other]),
                }
            } else if b == CTRL_A {
                self.armed = true;
            } else {
                out.push(b);
            }
        }
        (out, false)
    }
}

enum Ended {
    Detached(&'static str),
    Stopped(String, bool),
}

/// Why `provium console` could not boot the profile.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("console: profile `{profile}` not found in {} (profiles: {known})", config.display())]
    UnknownProfile {
        profile: String,
        config: PathBuf,
        /// The profiles there are, comma-separated, or "none".
        known: String,
    },
    /// The profile's build command could not run or failed.
    #[error(transparent)]
    Build(#[from] RunError),
    #[error("console: the console boots the profile on the microVMM, which needs /dev/kvm")]
    NoKvm(#[source] PreflightError),
    #[error("console: --mem")]
    Mem(#[source] SizeError),
    #[error("console: profile `{profile}`")]
    Boot {
        profile: String,
        #[source]
        source: Box<BackendError>,
    },
    #[error("console: the kvm backend's guest has no console")]
    NoConsole,
}

pub fn run(args: &RunArgs, profile_name: &str, opts: &ConsoleOpts) -> Result<i32, ConsoleError> {
    let config = load_config(&args.config, &args.settings)?;
    let profile = config.profiles.get(profile_name).ok_or_else(|| {
        let known: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
        ConsoleError::UnknownProfile {
            profile: profile_name.into(),
            config: args.config.clone(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        }
    })?;
    // As `provium` does: the profile's build runs before it boots.
    if !args.no_build {
        super::run::run_builds(&config, Some(profile_name))?;
    }
    kvm_usable().map_err(ConsoleError::NoKvm)?;
    let memory_bytes = match &opts.mem {
        Some(m) => parse_size(m).map_err(ConsoleError::Mem)?,
        None => DEFAULT_MEMORY_BYTES,
    };
    let spec = MachineSpec {
        kernel_cmdline: opts.cmdline.clone(),
        settings: config.settings.clone(),
        inject_agent: opts.agent,
        ..MachineSpec::for_profile(
            "console",
            profile_name,
            Some(profile.clone()),
            memory_bytes,
            opts.cpus.unwrap_or(DEFAULT_CPUS),
        )
    };
    let failed = |source: BackendError| ConsoleError::Boot {
        profile: profile_name.into(),
        source: Box::new(source),
    };
    let machine: Arc<dyn Guest> = Arc::from(
        backend::for_kind(BackendKind::Kvm)
            .create(&spec)
            .map_err(failed)?,
    );
    let console = machine.console().ok_or(ConsoleError::NoConsole)?;
    // Subscribe before the first instruction runs: nothing is missed.
    let first = console.subscribe();
    machine.start().map_err(failed)?;
    eprintln!(
        "provium console: {profile_name} on the kvm backend (guest CID {}, {} agent); Ctrl-A X quits",
        machine.cid().unwrap_or_default(),
        if opts.agent { "with the" } else { "no" }
    );
    crate::runner::interrupt::install_for_console();
    let out_done = Arc::new(AtomicBool::new(false));
    let out_thread = {
        let machine = machine.clone();
        let done = out_done.clone();
        std::thread::spawn(move || {
            let mut sub = first;
            let mut stdout = std::io::stdout();
            loop {
                match sub.read_timeout(Duration::from_millis(100)) {
                    ConsoleRead::Data(d) => {
                        let _ = stdout.write_all(&d);
                        let _ = stdout.flush();
                    }
                    ConsoleRead::Timeout => {}
                    // A reset ends the subscription: follow the next boot.
                    ConsoleRead::Eof => match (machine.stopped(), machine.console()) {
                        (None, Some(console)) => sub = console.subscribe(),
                        _ => break,
                    },
                }
                if done.load(Ordering::SeqCst) {
                    break;
                }
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let ended = {
        let _raw = RawTerminal::enter();
        input_loop(machine.as_ref(), &console, &out_done)
    };
    machine.kill();
    out_done.store(true, Ordering::SeqCst);
    let _ = out_thread.join();
    let _ = std::io::stdout().flush();
    match ended {
        Ended::Detached(why) => {
            eprintln!("\nprovium console: detached ({why}); the VM was shut down");
            Ok(0)
        }
        Ended::Stopped(why, ok) => {
            eprintln!("\nprovium console: the VM stopped: {why}");
            Ok(if ok { 0 } else { 1 })
        }
    }
}

fn input_loop(
    machine: &dyn Guest,
    console: &crate::backend::Console,
    out_done: &AtomicBool,
) -> Ended {
    let mut esc = Escape::default();
    let mut buf = [0u8; 1024];
    loop {
        if crate::runner::interrupt::received().is_some() {
            return Ended::Detached("signal");
        }
        let stopped = machine.stopped();
        if stopped.is_some() || out_done.load(Ordering::SeqCst) {
            // Let the output thread print what was left.
            std::thread::sleep(Duration::from_millis(200));
            let s = machine.stopped().or(stopped).unwrap_or(Stopped {
                why: "the console output ended".into(),
                clean: false,
            });
            return Ended::Stopped(s.why, s.clean);
        }
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own.
        let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
        if ready <= 0 {
            continue;
        }
        // SAFETY: reading into a buffer we own, at most its length.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            return Ended::Detached("stdin closed");
        }
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Ended::Detached("stdin unreadable");
        }
        let (bytes, quit) = esc.feed(&buf[..n as usize]);
        let mut left: &[u8] = &bytes;
        while !left.is_empty() {
            let take = left.len().min(4096);
            if console.write_input(&left[..take]).is_ok() {
                left = &left[take..];
            } else {
                // The guest has not read what is queued yet.
                std::thread::sleep(Duration::from_millis(10));
                if machine.stopped().is_some() {
                    break;
                }
            }
        }
        if quit {
            return Ended::Detached("Ctrl-A X");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_profile_lists_the_known_ones() {
        let (_project, cli) = super::super::parse_in_project(
            "[profiles.a]\ncmdline = \"q\"\n[profiles.b]\ncmdline = \"q\"\n",
            &["console", "nope"],
        );
        let opts = ConsoleOpts {
            mem: None,
            cpus: None,
            cmdline: None,
            agent: false,
        };
        let e = run(&cli.run, "nope", &opts).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "console: profile `nope` not found in {} (profiles: a, b)",
                cli.run.config.display()
            )
        );
    }

    #[test]
    fn escape_quits_and_passes_ctrl_a() {
        let mut e = Escape::default();
        assert_eq!(e.feed(b"ab"), (b"ab".to_vec(), false));
        assert_eq!(e.feed(b"c\x01"), (b"c".to_vec(), false));
        assert_eq!(e.feed(b"\x01d"), (b"\x01d".to_vec(), false));
        assert_eq!(e.feed(b"\x01q"), (b"\x01q".to_vec(), false));
        assert_eq!(e.feed(b"z\x01X rest"), (b"z".to_vec(), true));
        let mut e = Escape::default();
        assert_eq!(e.feed(b"\x01"), (Vec::new(), false));
        assert_eq!(e.feed(b"x"), (Vec::new(), true));
    }
}
