//! The one place an error's `source()` chain is turned into text.
//!
//! Each error type's message describes only its own layer and carries its
//! cause as `#[source]` (STYLE.md §2). The chain is rendered exactly once, at
//! the edge: [`numbered`] for the binary's stderr (`main`), [`flatten`] for
//! text that must stay one line (Lua errors, events, log lines).

use std::error::Error;
use std::fmt::Write as _;

/// The messages of `e` and of each of its sources, outermost first.
pub fn messages(e: &dyn Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out
}

/// `e` and its causes joined with ": ", for one-line contexts.
pub fn flatten(e: &dyn Error) -> String {
    messages(e).join(": ")
}

/// `e` on the first line, then each cause numbered on its own line, as
/// `main` prints it:
///
/// ```text
/// cannot restore fixture `base`
///   1: cannot map the restore image /cache/x.img
///   2: No such file or directory (os error 2)
/// ```
pub fn numbered(e: &dyn Error) -> String {
    let mut msgs = messages(e).into_iter();
    let mut out = msgs.next().unwrap_or_default();
    for (i, m) in msgs.enumerate() {
        let _ = write!(out, "\n  {}: {m}", i + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer layer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle layer")]
    struct Middle(#[source] std::io::Error);

    fn three_levels() -> Outer {
        Outer(Middle(std::io::Error::other("inner cause")))
    }

    #[test]
    fn flatten_joins_every_level_once() {
        assert_eq!(
            flatten(&three_levels()),
            "outer layer: middle layer: inner cause"
        );
    }

    #[test]
    fn numbered_puts_each_cause_on_its_own_line() {
        assert_eq!(
            numbered(&three_levels()),
            "outer layer\n  1: middle layer\n  2: inner cause"
        );
    }

    #[test]
    fn an_error_without_sources_is_one_line() {
        let e = std::io::Error::other("alone");
        assert_eq!(numbered(&e), "alone");
        assert_eq!(flatten(&e), "alone");
    }
}
