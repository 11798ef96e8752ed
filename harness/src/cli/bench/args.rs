//! The clap arguments of `provium bench`: the subcommands and the options
//! every bench shares ([`CommonArgs`]).

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use crate::cli::VmmChoice;

#[derive(Debug, Subcommand)]
pub enum BenchOp {
    /// Boot a profile's kernel (or the built-in tiny guest) N times; phases
    /// from the VMM's boot timer.
    Boot(BootArgs),
    /// Restore a cached vm_fixture N times (P at once) and time it to the
    /// first agent answer; resident memory per restored VM.
    Restore(RestoreArgs),
    /// Agent round trips: no-op, run("true"), 4 KiB read, 1 MiB write+read.
    Ops(OpsArgs),
    /// Fork a running VM n ways (`vm:fork`): latency per n, Pss per copy,
    /// how long the source is paused; `--tiny-guest` also times a snapshot
    /// plus n fixture restores in the same run.
    Fork(ForkArgs),
    /// Compare two `--json` outputs: new/old median per phase.
    Compare {
        /// The baseline (`--json` output of an earlier run).
        old: PathBuf,
        /// The run to check against it.
        new: PathBuf,
        /// Fail (exit 1) when a median grew by more than this ("10%", "25").
        #[arg(long, default_value = "10%")]
        max_regression: String,
    },
}

#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Timed iterations (boot/restore default 10, ops default 200).
    #[arg(short = 'n', long = "runs")]
    pub runs: Option<usize>,
    /// Untimed iterations first (boot/restore default 1, ops default 10).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// One JSON object per phase per line on stdout (see docs/benchmarking.md).
    #[arg(long)]
    pub json: bool,
    /// Compare with an earlier `--json` output; exit 1 on a regression.
    #[arg(long, value_name = "OLD.json")]
    pub compare: Option<PathBuf>,
    /// With --compare: the largest allowed growth of a median ("10%", "25").
    #[arg(long, default_value = "10%")]
    pub max_regression: String,
    /// Pin this process (and the vCPU threads and sandboxes it starts) to one CPU.
    #[arg(long, value_name = "CPU")]
    pub pin: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Until {
    /// The first console byte.
    Console,
    /// Linux's "Run /init as init process".
    Init,
    /// The guest's write of 123 to the boot-timer port.
    Ready,
}

#[derive(Debug, Clone, Args)]
pub struct BootArgs {
    /// Profile (from provium.toml) whose kernel, initrd and command line boot.
    #[arg(required_unless_present = "tiny_guest", conflicts_with = "tiny_guest")]
    pub profile: Option<String>,
    /// Boot the tiny test guest built into provium-vmm instead of a profile.
    #[arg(long)]
    pub tiny_guest: bool,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Guest memory in MiB (default: 32 for the tiny guest, 256 for a profile).
    #[arg(long, value_name = "MIB")]
    pub mem: Option<u64>,
    /// vCPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u8,
    /// Replace the profile's kernel command line.
    #[arg(long)]
    pub cmdline: Option<String>,
    /// The last mark each boot waits for (default: ready; init for a Linux
    /// guest on kvm_pvm, where guest kernel code is emulated and slow).
    #[arg(long, value_enum)]
    pub until: Option<Until>,
    /// Seconds one boot may take to reach --until before the bench fails.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// With --until ready on a Linux guest: seconds to wait for the boot-timer
    /// write after "Run /init" before reporting the phase unavailable.
    #[arg(long, default_value_t = 30)]
    pub ready_timeout: u64,
    /// Tiny guest: build every boot's RAM and KVM VM on its own path, as
    /// a run's first boot does, instead of taking one prepared while the
    /// previous guest ran (the default, as in a test run).
    #[arg(long)]
    pub no_prepared: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// The vm_fixture (path below a test root, without `.fixture.lua`); built
    /// first if the cache has no entry for it.
    #[arg(required_unless_present = "tiny_guest", conflicts_with = "tiny_guest")]
    pub fixture: Option<String>,
    /// Restore the built-in tiny-guest fixture on the VMM instead (booted to
    /// READY and snapshotted into the fixture cache once): restore to first
    /// guest instruction and resident guest memory per restored VM.
    #[arg(long)]
    pub tiny_guest: bool,
    /// With --tiny-guest: guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub mem: u64,
    /// Restores running at once; memory is measured while all of a batch live.
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// Backend (only `local` can restore today).
    #[arg(long, value_enum, default_value = "auto")]
    pub vmm: VmmChoice,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ForkArgs {
    /// Profile whose VM is booted once and forked (through `vm:fork`);
    /// optional with --vmm local.
    #[arg(conflicts_with = "tiny_guest")]
    pub profile: Option<String>,
    /// Fork the built-in tiny guest on the VMM instead (no agent).
    #[arg(long)]
    pub tiny_guest: bool,
    /// Copies per fork, one phase each.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 10, 100])]
    pub copies: Vec<usize>,
    /// Guest memory in MiB (default: 32 for the tiny guest; for a
    /// profile's VM, what `provium:vm` gives one, 512: a Linux guest
    /// panics at boot in 32).
    #[arg(long, value_name = "MIB")]
    pub mem: Option<u64>,
    /// Backend for a profile's VM.
    #[arg(long, value_enum, default_value = "auto")]
    pub vmm: VmmChoice,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    /// Profile to boot (optional with --vmm local, whose sandbox boots no kernel).
    pub profile: Option<String>,
    /// Backend: `local` times one sandbox; `kvm` boots the profile's guest
    /// once per agent channel (`--channel`).
    #[arg(long, value_enum, default_value = "auto")]
    pub vmm: VmmChoice,
    /// kvm: the agent channel(s) to time, one boot each (phases prefixed
    /// `vsock_` / `console_`).
    #[arg(long, value_enum, default_value = "both")]
    pub channel: OpsChannel,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `bench ops --channel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OpsChannel {
    Vsock,
    Console,
    Both,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Bench {
        #[command(subcommand)]
        op: BenchOp,
    }

    fn parse(args: &[&str]) -> BenchOp {
        Bench::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .op
    }

    #[test]
    fn each_bench_parses_its_options() {
        let BenchOp::Boot(b) = parse(&["boot", "--tiny-guest", "--runs", "3", "--json"]) else {
            panic!("boot")
        };
        assert!(b.tiny_guest);
        assert_eq!(b.common.runs, Some(3));
        assert!(b.common.json);
        let BenchOp::Ops(o) = parse(&["ops", "--pin", "1"]) else {
            panic!("ops")
        };
        assert_eq!(o.common.pin, Some(1));
        let BenchOp::Fork(f) = parse(&["fork", "--tiny-guest", "--copies", "1,10,100"]) else {
            panic!("fork")
        };
        assert!(f.tiny_guest && f.profile.is_none());
        assert_eq!(f.copies, [1, 10, 100]);
        let BenchOp::Fork(f) = parse(&["fork", "linux", "--vmm", "local"]) else {
            panic!("fork")
        };
        assert_eq!(f.profile.as_deref(), Some("linux"));
        assert_eq!(f.copies, [1, 10, 100], "the default");
        assert_eq!(f.mem, None, "each target picks its own default size");
        assert!(matches!(
            parse(&["compare", "old.json", "new.json"]),
            BenchOp::Compare { .. }
        ));
    }
}
