//! The boot-timer mark: once the agent can accept the harness's Hello it
//! writes 123 to the VMM's boot-timer I/O port, so `provium bench boot
//! --until ready` can time "kernel entry to agent listening" from the VMM's
//! own clock (the same mark Firecracker's boot timer uses).
//!
//! The port comes only from the kernel command line parameter
//! `provium.boot_timer=<port>` (hex `0x440` or decimal `1088`), which the
//! harness's kvm backend appends when it injects the agent. Without the
//! parameter nothing is written: an agent run in a local sandbox reads the
//! HOST's /proc/cmdline, which never carries it, so it never pokes a host
//! I/O port (and it would have no ioperm rights there anyway).
//!
//! If the parameter appears more than once the LAST one wins, like the
//! kernel's own `key=value` parameters, so a profile's cmdline can be
//! overridden by what is appended after it. A malformed value (not a number,
//! or over 0xffff) means no write, and a warning.

/// The value the VMM's boot timer treats as "guest ready".
pub const READY_MAGIC: u8 = 123;

const PARAM: &str = "provium.boot_timer=";

/// The boot-timer port named on `cmdline`: `Ok(None)` when the parameter is
/// absent, `Err` (with the bad value) when the last one is malformed.
pub fn port_from_cmdline(cmdline: &str) -> Result<Option<u16>, String> {
    let Some(value) = cmdline
        .split_ascii_whitespace()
        .filter_map(|w| w.strip_prefix(PARAM))
        .next_back()
    else {
        return Ok(None);
    };
    let parsed = match value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        Some(hex) => u16::from_str_radix(hex, 16),
        None => value.parse::<u16>(),
    };
    parsed.map(Some).map_err(|e| {
        format!("{PARAM}{value}: not a port number (hex 0x.. or decimal, at most 0xffff): {e}")
    })
}

/// Reads /proc/cmdline and, when it names a boot-timer port, writes
/// [`READY_MAGIC`] there. Every failure is logged to stderr and ignored:
/// the mark only feeds a benchmark, it must never stop the agent serving.
pub fn mark_ready() {
    let cmdline = match std::fs::read_to_string("/proc/cmdline") {
        Ok(c) => c,
        // No /proc (not mounted yet, or not Linux): no parameter to honour.
        Err(_) => return,
    };
    match port_from_cmdline(&cmdline) {
        Ok(None) => {}
        Ok(Some(port)) => {
            if let Err(e) = write_port(port, READY_MAGIC) {
                eprintln!("provium-agent: boot-timer mark on port {port:#x} failed: {e}");
            }
        }
        Err(e) => eprintln!("provium-agent: boot-timer mark skipped: {e}"),
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn write_port(port: u16, value: u8) -> Result<(), String> {
    // SAFETY: ioperm only changes this process's I/O permission bitmap.
    let rc = unsafe { libc::ioperm(libc::c_ulong::from(port), 1, 1) };
    if rc != 0 {
        return Err(format!("ioperm: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: ioperm above granted exactly this one port; a one-byte `out`
    // touches no memory. In a guest the VMM traps it as a PIO exit.
    unsafe {
        core::arch::asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags));
    }
    Ok(())
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn write_port(_port: u16, _value: u8) -> Result<(), String> {
    // Port I/O is an x86 notion; other guests have no boot-timer port.
    Err("no port I/O on this architecture".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_means_no_port() {
        assert_eq!(port_from_cmdline(""), Ok(None));
        assert_eq!(
            port_from_cmdline("quiet console=ttyS0 rdinit=/init"),
            Ok(None)
        );
        // A near miss is not the parameter.
        assert_eq!(port_from_cmdline("provium.boot_timerx=0x440"), Ok(None));
        assert_eq!(port_from_cmdline("xprovium.boot_timer=0x440"), Ok(None));
    }

    #[test]
    fn both_radixes() {
        assert_eq!(
            port_from_cmdline("quiet provium.boot_timer=0x440\n"),
            Ok(Some(0x440))
        );
        assert_eq!(
            port_from_cmdline("provium.boot_timer=0X44f"),
            Ok(Some(0x44f))
        );
        assert_eq!(
            port_from_cmdline("provium.boot_timer=1088 quiet"),
            Ok(Some(0x440))
        );
        assert_eq!(
            port_from_cmdline("provium.boot_timer=65535"),
            Ok(Some(0xffff))
        );
    }

    #[test]
    fn last_one_wins() {
        assert_eq!(
            port_from_cmdline("provium.boot_timer=0x80 provium.boot_timer=0x440"),
            Ok(Some(0x440))
        );
        // Even when the earlier one was malformed: only the last counts.
        assert_eq!(
            port_from_cmdline("provium.boot_timer=zz provium.boot_timer=16"),
            Ok(Some(16))
        );
        assert!(port_from_cmdline("provium.boot_timer=16 provium.boot_timer=zz").is_err());
    }

    #[test]
    fn malformed_is_an_error_naming_the_value() {
        for bad in ["", "0x", "0xg1", "-1", "65536", "0x10000", "44 0"] {
            let line = format!("provium.boot_timer={bad}");
            let r = port_from_cmdline(&line);
            if bad == "44 0" {
                // Whitespace ends the word: `44` is the value.
                assert_eq!(r, Ok(Some(44)));
                continue;
            }
            let e = r.expect_err(bad);
            assert!(e.contains(&format!("provium.boot_timer={bad}")), "{e}");
        }
    }

    #[test]
    fn host_cmdline_has_no_parameter_so_nothing_is_written() {
        // Tests run on the host: its /proc/cmdline must not carry the
        // parameter, or mark_ready would try to poke a host I/O port.
        if let Ok(c) = std::fs::read_to_string("/proc/cmdline") {
            assert_eq!(port_from_cmdline(&c), Ok(None), "host cmdline: {c}");
        }
        mark_ready();
    }
}
