//! provium-agent: the guest agent.
//!
//! It serves the Provium wire protocol (`provium-protocol`) to the host: over
//! vsock inside a guest (kvm backend), over a Unix socket in a local sandbox.
//! Each connection runs requests concurrently (see [`conn`]); workers add
//! namespaces with their own serial queues ([`worker`]). As PID 1 it first
//! does an init's minimal duties, loads the kernel modules the harness
//! packed ([`modules`]) and forks ([`pid1`]).
//!
//! It is built as a static binary so it runs from any initrd:
//! `RUSTFLAGS="-C target-feature=+crt-static" cargo build -p provium-agent
//! --release --target x86_64-unknown-linux-gnu`.

mod boot_timer;
mod child;
mod cli;
mod clock;
mod conn;
mod ctx;
mod dispatch;
mod exec;
mod files;
mod listen;
mod locks;
mod modules;
mod namespace;
mod op_error;
mod outbox;
mod pid1;
mod port;
mod power_button;
mod process;
mod socket;
mod stdin;
mod stream;
mod syscall;
mod tail;
mod waker;
mod worker;

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use cli::Parsed;

/// What every connection needs to know about how the agent was started.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentConfig {
    /// `--no-clock`: refuse clock_set/clock_advance.
    pub no_clock: bool,
    /// The channel served ("vsock", "console", "unix"): Hello says it.
    pub channel: &'static str,
}

/// PATH for commands when the agent inherited none (PID 1 gets no PATH).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Bad command line.
const EXIT_USAGE: u8 = 2;
/// Cannot listen.
const EXIT_LISTEN: u8 = 1;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let is_pid1 = pid1::is_pid1();
    let opts = match cli::parse(&args, is_pid1) {
        Ok((Parsed::Run(opts), warnings)) => {
            for w in warnings {
                eprintln!("provium-agent: {w}");
            }
            opts
        }
        Ok((Parsed::Help, _)) => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok((Parsed::Version, _)) => {
            println!(
                "provium-agent {} (protocol version {})",
                env!("CARGO_PKG_VERSION"),
                provium_protocol::PROTOCOL_VERSION
            );
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("provium-agent: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if std::env::var_os("PATH").is_none() {
        // Still single-threaded: nothing else reads the environment yet.
        std::env::set_var("PATH", DEFAULT_PATH);
    }
    if is_pid1 {
        pid1::mount_basics();
        // The kernel modules the harness packed (vsock, virtio...), before
        // anything needs them: the listener below, the initrd's own init.
        modules::load_listed(std::path::Path::new(modules::MODULES_DIR));
        if pid1::split(opts.init.as_deref(), &args) {
            power_button::forward_presses_to_init();
        }
    }
    let listen_addr = listen::resolve(&opts.listen);
    let listener = match listen::bind(&listen_addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "provium-agent: cannot listen on {listen_addr}: {e} (is the path's directory writable, or vsock available in this guest?)"
            );
            return ExitCode::from(EXIT_LISTEN);
        }
    };
    eprintln!(
        "provium-agent {}: listening on {} (protocol version {})",
        env!("CARGO_PKG_VERSION"),
        match &listener {
            listen::Listener::Console(dev) => format!("console port /dev/{dev}"),
            _ => listen_addr.to_string(),
        },
        provium_protocol::PROTOCOL_VERSION
    );
    let config = Arc::new(AgentConfig {
        no_clock: opts.no_clock,
        channel: listener.channel(),
    });
    // The listener is bound, so a Hello connecting now is queued and
    // answered: that is the moment `bench boot --until ready` measures.
    boot_timer::mark_ready();
    listen::serve(&listener, &config);
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_path_has_the_usual_directories() {
        assert!(DEFAULT_PATH.split(':').any(|d| d == "/bin"));
        assert!(!AgentConfig::default().no_clock);
    }
}
