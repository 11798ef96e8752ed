//! Test doubles for the renderers.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::lock::Locked;

/// A `Write` whose bytes the test reads back after the writer is gone.
#[derive(Clone, Default)]
pub struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    pub fn bytes(&self) -> Vec<u8> {
        self.0.locked().clone()
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.bytes()).expect("renderers write UTF-8")
    }
}

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.locked().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_buffer() {
        let b = SharedBuffer::default();
        b.clone().write_all(b"hi").unwrap();
        assert_eq!(b.text(), "hi");
    }
}
