//! Renderers of a run: plain text (default, -v, -q), line-delimited JSON,
//! JUnit XML, and a live progress line on a terminal.

pub mod json;
pub mod junit;
pub mod plain;
pub mod progress;

/// How much the plain renderer shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    Quiet,
    Normal,
    Verbose,
}
