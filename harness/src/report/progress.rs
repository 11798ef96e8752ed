//! The live progress line: files done / running / queued and elapsed time,
//! redrawn in place on a terminal, silent when the output is not a TTY.

use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    enabled: bool,
    started: Instant,
    total: usize,
    done: usize,
    running: usize,
}

impl Progress {
    pub fn new(total: usize, enabled_if_tty: bool) -> Self {
        Progress {
            enabled: enabled_if_tty && std::io::stderr().is_terminal(),
            started: Instant::now(),
            total,
            done: 0,
            running: 0,
        }
    }

    pub fn started_file(&mut self) {
        self.running += 1;
        self.draw();
    }

    pub fn finished_file(&mut self) {
        self.running = self.running.saturating_sub(1);
        self.done += 1;
        self.draw();
    }

    /// Erase the line before other output is printed.
    pub fn clear(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }

    pub fn draw(&self) {
        if !self.enabled {
            return;
        }
        let queued = self.total.saturating_sub(self.done + self.running);
        eprint!(
            "\r\x1b[2K[{}/{}] {} running, {} queued, {:.1}s",
            self.done,
            self.total,
            self.running,
            queued,
            self.started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_running_and_done_files_even_when_silent() {
        let mut p = Progress::new(3, false);
        assert!(!p.enabled, "never drawn off a terminal");
        p.started_file();
        p.started_file();
        p.finished_file();
        assert_eq!((p.done, p.running, p.total), (1, 1, 3));
        p.finished_file();
        p.finished_file();
        assert_eq!((p.done, p.running), (3, 0), "never below zero");
        p.clear();
    }
}
