//! The Capture stream: a switch capture (`bridge:capture()`,
//! `nic:capture()`) read through the shared stream surface (`Stream`, kind
//! `"capture"`).
//!
//! The bytes are classic pcap exactly as the switch writes them: the global
//! header first, then one record per frame (see `docs/networking.md`). Chunks
//! are at most [`MAX_CHUNK_BYTES`] and may split a record; concatenating
//! every chunk gives the file. Closing stops the capture and drops what was
//! still buffered, so nothing stale comes out after `:close()`.

use std::time::Duration;

use provium_netsetup::Capture;

use super::stream::{ByteSource, StreamError};

/// The largest chunk one `:next()` returns.
pub const MAX_CHUNK_BYTES: usize = 64 << 10;

/// A live switch capture as a stream's byte source.
pub struct CaptureSource {
    cap: Capture,
    /// Bytes taken from the capture but not yet handed out.
    held: Vec<u8>,
    eof: bool,
}

impl CaptureSource {
    pub fn new(cap: Capture) -> CaptureSource {
        CaptureSource {
            cap,
            held: Vec::new(),
            eof: false,
        }
    }

    fn take_chunk(&mut self) -> Vec<u8> {
        if self.held.len() <= MAX_CHUNK_BYTES {
            return std::mem::take(&mut self.held);
        }
        let rest = self.held.split_off(MAX_CHUNK_BYTES);
        std::mem::replace(&mut self.held, rest)
    }
}

impl ByteSource for CaptureSource {
    fn next_chunk(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, StreamError> {
        if self.held.is_empty() {
            self.held = self.cap.read_timeout(timeout);
        }
        if self.held.is_empty() {
            // Closed and drained: nothing more will ever come.
            self.eof = !self.cap.is_live();
            return Ok(None);
        }
        Ok(Some(self.take_chunk()))
    }

    fn is_eof(&self) -> bool {
        self.eof
    }

    fn close(&mut self) -> Result<(), StreamError> {
        self.cap.close();
        self.held.clear();
        let _ = self.cap.read_available();
        self.eof = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_netsetup::{MacAddr, Switch, SwitchConfig};

    fn frame(src: u32, len: usize) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&MacAddr::local(src).0);
        f.extend_from_slice(&[0x88, 0xb5]);
        f.resize(len, 0xab);
        f
    }

    #[test]
    fn header_then_records_then_eof_after_close() {
        let sw = Switch::new("lan", SwitchConfig::default());
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        let _b = sw.attach("b", MacAddr::local(2)).unwrap();
        let mut src = CaptureSource::new(sw.capture("t"));
        let head = src.next_chunk(Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!(
            &head[..4],
            &[0xd4, 0xc3, 0xb2, 0xa1],
            "pcap magic, little-endian"
        );
        assert_eq!(head.len(), 24);
        assert_eq!(src.next_chunk(Duration::from_millis(10)).unwrap(), None);
        assert!(
            !src.is_eof(),
            "a live capture with no traffic is not at EOF"
        );
        a.send(&frame(1, 60)).unwrap();
        let rec = src.next_chunk(Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!(rec.len(), 16 + 60);
        assert_eq!(u32::from_le_bytes(rec[8..12].try_into().unwrap()), 60);
        src.close().unwrap();
        assert!(src.is_eof());
        a.send(&frame(1, 60)).unwrap();
        assert_eq!(src.next_chunk(Duration::from_millis(10)).unwrap(), None);
    }

    #[test]
    fn chunks_are_bounded_and_lose_nothing() {
        let sw = Switch::new("lan", SwitchConfig::default());
        let a = sw.attach("a", MacAddr::local(1)).unwrap();
        let _b = sw.attach("b", MacAddr::local(2)).unwrap();
        let cap = sw.capture("t");
        for _ in 0..100 {
            a.send(&frame(1, 1500)).unwrap();
        }
        let mut src = CaptureSource::new(cap);
        let mut all = Vec::new();
        while let Some(c) = src.next_chunk(Duration::from_millis(50)).unwrap() {
            assert!(c.len() <= MAX_CHUNK_BYTES);
            all.extend(c);
        }
        assert_eq!(all.len(), 24 + 100 * (16 + 1500));
    }
}
