//! Length-prefixed framing: a 4-byte big-endian body length, then the body.
//!
//! The length is checked against the caller's maximum before any buffer is
//! allocated, so a peer cannot make us allocate more than `max` bytes per frame.

use std::io::{self, Read, Write};

use crate::{decode, encode, ProtocolError, WireMessage};

/// Default maximum body size: 16 MiB. Data-carrying ops are chunked well below it.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

const LEN_BYTES: usize = 4;

/// Read one frame body. `Ok(None)` on a clean end of stream before a frame
/// starts; an error if the stream ends inside a frame or the length exceeds `max`.
pub fn read_frame<R: Read>(reader: &mut R, max: usize) -> Result<Option<Vec<u8>>, ProtocolError> {
    let mut len_buf = [0u8; LEN_BYTES];
    let got = read_full(reader, &mut len_buf)?;
    if got == 0 {
        return Ok(None);
    }
    if got < LEN_BYTES {
        return Err(ProtocolError::Truncated {
            expected: LEN_BYTES,
            got,
        });
    }
    let len = u32::from_be_bytes(len_buf) as usize;
    if len > max {
        return Err(ProtocolError::FrameTooLarge {
            len: len as u64,
            max,
        });
    }
    let mut body = vec![0u8; len];
    let got = read_full(reader, &mut body)?;
    if got < len {
        return Err(ProtocolError::Truncated { expected: len, got });
    }
    Ok(Some(body))
}

/// Write one frame (length prefix + body) and flush.
pub fn write_frame<W: Write>(writer: &mut W, body: &[u8], max: usize) -> Result<(), ProtocolError> {
    if body.len() > max {
        return Err(ProtocolError::FrameTooLarge {
            len: body.len() as u64,
            max,
        });
    }
    let len = (body.len() as u32).to_be_bytes();
    writer.write_all(&len)?;
    writer.write_all(body)?;
    writer.flush()?;
    Ok(())
}

/// Read and decode one message; `Ok(None)` on a clean end of stream.
pub fn read_message<T: WireMessage, R: Read>(
    reader: &mut R,
    max: usize,
) -> Result<Option<T>, ProtocolError> {
    match read_frame(reader, max)? {
        Some(body) => decode(&body).map(Some),
        None => Ok(None),
    }
}

/// Encode and write one message.
pub fn write_message<T: WireMessage, W: Write>(
    writer: &mut W,
    msg: &T,
    max: usize,
) -> Result<(), ProtocolError> {
    write_frame(writer, &encode(msg)?, max)
}

/// Fill `buf` from `reader`, stopping early only at end of stream; returns bytes read.
fn read_full<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Incremental decoder for non-blocking transports (the VMM's vsock device,
/// event-loop clients): push bytes as they arrive, pop whole frame bodies.
/// It buffers at most one partial frame (bounded by `max`) plus what was pushed.
#[derive(Debug)]
pub struct FrameDecoder {
    max: usize,
    buf: Vec<u8>,
}

impl FrameDecoder {
    /// A decoder that refuses frames whose body is over `max_frame_bytes`.
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameDecoder {
            max: max_frame_bytes,
            buf: Vec::new(),
        }
    }

    /// Append received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame body, `Ok(None)` if more bytes are needed, or an
    /// error if the announced length exceeds the maximum (the stream is then
    /// unusable: framing is lost).
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, ProtocolError> {
        if self.buf.len() < LEN_BYTES {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.max {
            return Err(ProtocolError::FrameTooLarge {
                len: len as u64,
                max: self.max,
            });
        }
        if self.buf.len() < LEN_BYTES + len {
            return Ok(None);
        }
        let body = self.buf[LEN_BYTES..LEN_BYTES + len].to_vec();
        self.buf.drain(..LEN_BYTES + len);
        Ok(Some(body))
    }

    /// Call at end of stream: an error if a partial frame is left over.
    pub fn finish(&self) -> Result<(), ProtocolError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let expected = if self.buf.len() < LEN_BYTES {
            LEN_BYTES
        } else {
            LEN_BYTES
                + u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize
        };
        Err(ProtocolError::Truncated {
            expected,
            got: self.buf.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_clean_eof() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello", DEFAULT_MAX_FRAME_BYTES).unwrap();
        write_frame(&mut wire, b"", DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(&wire[..4], &[0, 0, 0, 5]);
        let mut r = &wire[..];
        assert_eq!(read_frame(&mut r, 16).unwrap().unwrap(), b"hello");
        assert_eq!(read_frame(&mut r, 16).unwrap().unwrap(), b"");
        assert!(read_frame(&mut r, 16).unwrap().is_none());
    }

    #[test]
    fn oversize_length_is_refused_before_allocation() {
        // Announce 4 GiB - 1; a reader that allocated first would abort here.
        let wire = [0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        let err = read_frame(&mut &wire[..], 1024).unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::FrameTooLarge {
                    len: 4294967295,
                    max: 1024
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("exceeds the maximum of 1024"));
    }

    #[test]
    fn truncated_frames_are_errors() {
        let err = read_frame(&mut &[0u8, 0][..], 1024).unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::Truncated {
                    expected: 4,
                    got: 2
                }
            ),
            "{err}"
        );
        let err = read_frame(&mut &[0u8, 0, 0, 9, 1, 2][..], 1024).unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::Truncated {
                    expected: 9,
                    got: 2
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn write_refuses_oversize_body() {
        let err = write_frame(&mut Vec::new(), &[0u8; 10], 4).unwrap_err();
        assert!(matches!(
            err,
            ProtocolError::FrameTooLarge { len: 10, max: 4 }
        ));
    }

    #[test]
    fn incremental_decoder_byte_by_byte() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"abc", 64).unwrap();
        write_frame(&mut wire, b"defg", 64).unwrap();
        let mut dec = FrameDecoder::new(64);
        let mut frames = Vec::new();
        for b in &wire {
            dec.push(std::slice::from_ref(b));
            while let Some(f) = dec.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames, vec![b"abc".to_vec(), b"defg".to_vec()]);
        dec.finish().unwrap();
        dec.push(&[0, 0, 0, 3, 1]);
        assert!(dec.next_frame().unwrap().is_none());
        assert!(matches!(
            dec.finish().unwrap_err(),
            ProtocolError::Truncated {
                expected: 7,
                got: 5
            }
        ));
        let mut dec = FrameDecoder::new(2);
        dec.push(&[0, 0, 0, 3]);
        assert!(matches!(
            dec.next_frame().unwrap_err(),
            ProtocolError::FrameTooLarge { len: 3, max: 2 }
        ));
    }
}
