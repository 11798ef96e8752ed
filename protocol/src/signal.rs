//! Signal names as the Process page accepts them, mapped to Linux x86-64 numbers.

/// Every recognised name (lowercase, without the `sig` prefix) and its number.
pub const SIGNALS: &[(&str, i32)] = &[
    ("hup", 1),
    ("int", 2),
    ("quit", 3),
    ("kill", 9),
    ("usr1", 10),
    ("usr2", 12),
    ("pipe", 13),
    ("alrm", 14),
    ("term", 15),
    ("chld", 17),
    ("cont", 18),
    ("stop", 19),
    ("winch", 28),
];

/// SIGTERM's number: the polite stop (`release` sends it first).
pub const SIGTERM: i32 = 15;
/// SIGKILL's number: timeouts, namespace closes and `release`'s second step.
pub const SIGKILL: i32 = 9;

/// Parse a signal as the Lua API accepts it: a name with or without `sig`
/// (any case) or a decimal number. Errors read "unknown signal name `X`".
pub fn parse_signal(spec: &str) -> Result<i32, String> {
    let lower = spec.trim().to_ascii_lowercase();
    if let Ok(n) = lower.parse::<i32>() {
        if (1..=64).contains(&n) {
            return Ok(n);
        }
        return Err(format!("signal number {n} is out of range 1..=64"));
    }
    let bare = lower.strip_prefix("sig").unwrap_or(&lower);
    SIGNALS
        .iter()
        .find(|(name, _)| *name == bare)
        .map(|(_, n)| *n)
        .ok_or_else(|| format!("unknown signal name `{spec}`"))
}

/// The conventional name of a signal number ("SIGTERM"), for messages.
pub fn signal_name(n: i32) -> Option<String> {
    SIGNALS
        .iter()
        .find(|(_, num)| *num == n)
        .map(|(name, _)| format!("SIG{}", name.to_ascii_uppercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_prefixes() {
        assert_eq!(parse_signal("TERM"), Ok(15));
        assert_eq!(parse_signal("sigkill"), Ok(9));
        assert_eq!(parse_signal("SigUsr1"), Ok(10));
        assert_eq!(parse_signal("2"), Ok(2));
        assert_eq!(parse_signal("winch"), Ok(28));
        assert_eq!(
            parse_signal("bogus"),
            Err("unknown signal name `bogus`".to_string())
        );
        assert!(parse_signal("99").unwrap_err().contains("out of range"));
        assert_eq!(signal_name(9).as_deref(), Some("SIGKILL"));
        assert_eq!(signal_name(63), None);
    }
}
