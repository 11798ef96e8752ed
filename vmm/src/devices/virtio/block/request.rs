//! Parses a guest descriptor chain into a block request (virtio 1.2, 5.2.6):
//! a device-readable 16-byte header, data buffers, and a final device-writable
//! status byte. The chain is guest data: every shape is checked, nothing is
//! trusted; virtio-queue has already bounded the chain length and rejected
//! loops.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use super::defs::{QUEUE_SIZE, REQUEST_HEADER_BYTES};

/// Upper bound on descriptors examined per chain.
pub const MAX_CHAIN_DESCRIPTORS: usize = QUEUE_SIZE as usize;

/// What the guest asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestType {
    /// Read sectors.
    In,
    /// Write sectors.
    Out,
    /// Flush the write cache.
    Flush,
    /// Return the device ID string.
    GetId,
    /// Anything else (answered with UNSUPP).
    Unsupported(u32),
}

impl From<u32> for RequestType {
    fn from(t: u32) -> Self {
        match t {
            VIRTIO_BLK_T_IN => RequestType::In,
            VIRTIO_BLK_T_OUT => RequestType::Out,
            VIRTIO_BLK_T_FLUSH => RequestType::Flush,
            VIRTIO_BLK_T_GET_ID => RequestType::GetId,
            other => RequestType::Unsupported(other),
        }
    }
}

/// A parsed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Kind.
    pub kind: RequestType,
    /// First sector (512-byte units).
    pub sector: u64,
    /// Data buffers (gpa, len) in order.
    pub data: Vec<(GuestAddress, u32)>,
    /// Where the status byte goes.
    pub status_gpa: GuestAddress,
}

/// Why a chain is not a request. No status can be reported for these when the
/// status descriptor itself is missing; the chain is returned with length 0.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Too few descriptors.
    #[error("descriptor chain has {0} descriptor(s); a request needs a header and a status")]
    TooShort(usize),
    /// Header descriptor is writable or short.
    #[error("request header descriptor is device-writable or shorter than 16 bytes")]
    BadHeader,
    /// Header not readable from guest memory.
    #[error("request header at {0:#x} is not in guest memory")]
    HeaderMemory(u64),
    /// Status descriptor is read-only or empty.
    #[error("status descriptor is device-readable or empty")]
    BadStatus,
    /// A data buffer points the wrong way for the request.
    #[error("data descriptor has the wrong direction for a {0:?} request")]
    DataDirection(RequestType),
}

impl Request {
    /// Parses the descriptors of one chain; `mem` is the guest memory they
    /// point into. At most `MAX_CHAIN_DESCRIPTORS` are looked at (virtio-queue
    /// already stops at the queue size).
    pub fn parse<M: GuestMemory + ?Sized>(
        chain: impl Iterator<Item = Descriptor>,
        mem: &M,
    ) -> Result<Request, RequestError> {
        let descs: Vec<Descriptor> = chain.take(MAX_CHAIN_DESCRIPTORS).collect();
        if descs.len() < 2 {
            return Err(RequestError::TooShort(descs.len()));
        }
        let head = descs[0];
        if head.is_write_only() || head.len() < REQUEST_HEADER_BYTES {
            return Err(RequestError::BadHeader);
        }
        let mut hdr = [0u8; 16];
        mem.read_slice(&mut hdr, head.addr())
            .map_err(|_| RequestError::HeaderMemory(head.addr().0))?;
        let kind = RequestType::from(u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]));
        let sector = u64::from_le_bytes(hdr[8..16].try_into().expect("8 bytes"));
        let status = descs[descs.len() - 1];
        if !status.is_write_only() || status.len() < 1 {
            return Err(RequestError::BadStatus);
        }
        let mut data = Vec::with_capacity(descs.len() - 2);
        for d in &descs[1..descs.len() - 1] {
            let want_writable = match kind {
                RequestType::In | RequestType::GetId => Some(true),
                RequestType::Out => Some(false),
                RequestType::Flush | RequestType::Unsupported(_) => None,
            };
            if want_writable.is_some_and(|w| w != d.is_write_only()) {
                return Err(RequestError::DataDirection(kind));
            }
            data.push((d.addr(), d.len()));
        }
        Ok(Request {
            kind,
            sector,
            data,
            status_gpa: status.addr(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::guest_memory;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;

    const W: u16 = VRING_DESC_F_WRITE as u16;

    fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    fn header(mem: &crate::guest_memory::GuestMemoryMmap, at: u64, t: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&t.to_le_bytes());
        h[8..].copy_from_slice(&sector.to_le_bytes());
        mem.write_slice(&h, GuestAddress(at)).expect("in memory");
    }

    #[test]
    fn parses_a_read() {
        let mem = guest_memory();
        let q = MockSplitQueue::new(&mem, 16);
        header(&mem, 0x10_0000, VIRTIO_BLK_T_IN, 7);
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, 16, 0),
                desc(0x20_0000, 1024, W),
                desc(0x30_0000, 1, W),
            ])
            .expect("chain");
        let r = Request::parse(chain, &mem).expect("valid");
        assert_eq!(r.kind, RequestType::In);
        assert_eq!(r.sector, 7);
        assert_eq!(r.data, vec![(GuestAddress(0x20_0000), 1024)]);
        assert_eq!(r.status_gpa, GuestAddress(0x30_0000));
    }

    #[test]
    fn rejects_bad_shapes() {
        let mem = guest_memory();
        let q = MockSplitQueue::new(&mem, 16);
        header(&mem, 0x10_0000, VIRTIO_BLK_T_OUT, 0);
        let cases: Vec<(Vec<RawDescriptor>, RequestError)> = vec![
            (vec![desc(0x10_0000, 16, 0)], RequestError::TooShort(1)),
            (
                vec![desc(0x10_0000, 8, 0), desc(0x30_0000, 1, W)],
                RequestError::BadHeader,
            ),
            (
                vec![desc(0x10_0000, 16, 0), desc(0x30_0000, 1, 0)],
                RequestError::BadStatus,
            ),
            (
                vec![
                    desc(0x10_0000, 16, 0),
                    desc(0x20_0000, 512, W),
                    desc(0x30_0000, 1, W),
                ],
                RequestError::DataDirection(RequestType::Out),
            ),
            (
                vec![desc(0xffff_0000_0000, 16, 0), desc(0x30_0000, 1, W)],
                RequestError::HeaderMemory(0xffff_0000_0000),
            ),
        ];
        for (descs, want) in cases {
            let chain = q.build_desc_chain(&descs).expect("chain");
            assert_eq!(Request::parse(chain, &mem), Err(want));
        }
    }
}
