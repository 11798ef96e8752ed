//! `provium kconfig`: prints a `scripts/kconfig/merge_config.sh` fragment
//! with every kernel option Provium uses (harness/src/kernel/needs.rs, the
//! same list `kernel check` checks and docs/vmm.md quotes), so
//! `make defconfig kvm_guest.config` plus this fragment gives a kernel that
//! passes `provium kernel check` with everything built in.

use super::EXIT_OK;

pub fn run() -> i32 {
    print!("{}", crate::kernel::needs::kconfig_fragment());
    EXIT_OK
}

#[cfg(test)]
mod tests {
    use crate::kernel::kconfig::{KernelConfig, Tristate};
    use crate::kernel::needs::{kconfig_fragment, Need, DISCOVERY_ROUTES};

    /// The fragment, read as a kernel config, makes every row usable.
    #[test]
    fn the_fragment_satisfies_every_need() {
        let c = KernelConfig::parse(&kconfig_fragment(), "fragment");
        for n in Need::ALL {
            for p in n.parts() {
                assert_eq!(c.get(p.option), Tristate::Yes, "{}", p.option);
            }
        }
        for route in DISCOVERY_ROUTES {
            for p in route.parts {
                assert_eq!(
                    c.get(p.option),
                    Tristate::Yes,
                    "{}: {}",
                    route.name,
                    p.option
                );
            }
        }
    }
}
