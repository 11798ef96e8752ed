//! The sparse guest-memory image stored in a `memory` section.
//!
//! Layout (little-endian), before the section's zstd compression:
//!
//! ```text
//! u32 page_size_bytes      power of two, 512 ..= 1 MiB
//! u64 guest_len_bytes      the guest memory size the image describes
//! u32 run_count
//! run_count x { u64 first_page, u64 page_count }   sorted, disjoint, non-adjacent
//! page data: the pages of every run, in order
//! ```
//!
//! Pages that are entirely zero are not written: a guest that touched 1 % of
//! its RAM costs 1 % on disk, and restoring into freshly mapped (zeroed)
//! memory writes only the pages that hold data. The decoder streams: it
//! never holds the whole image, and it writes each page straight into the
//! destination slice.
//!
//! Everything here is read from an untrusted file: counts and lengths are
//! checked against the destination before anything is allocated or copied.

use std::io::{self, Read, Write};

/// The page granularity of the images this crate writes.
pub const PAGE_SIZE_BYTES: u32 = 4096;
/// Fixed part before the runs.
const PREFIX_LEN: usize = 4 + 8 + 4;
/// One run record.
const RUN_LEN: usize = 16;

/// A maximal range of non-zero pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Index of the first page (byte offset / page size).
    pub first_page: u64,
    /// Number of pages, at least 1.
    pub page_count: u64,
}

/// What a decoded image held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// The guest memory size recorded in the image.
    pub guest_len_bytes: u64,
    /// Bytes of page data written into the destination.
    pub data_bytes: u64,
    /// Number of runs of non-zero pages.
    pub runs: u64,
}

/// Why an image could not be decoded (wrapped by the container's errors).
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The image's bytes ended early or could not be read.
    #[error("memory image ends early or cannot be read")]
    Read(#[source] io::Error),
    /// A field is out of range or the runs are inconsistent.
    #[error("memory image is malformed: {0}")]
    Malformed(String),
    /// The image describes a guest of another size.
    #[error(
        "memory image is for {image_bytes} bytes of guest memory, the destination has {dest_bytes}"
    )]
    SizeMismatch {
        /// Size recorded in the image.
        image_bytes: u64,
        /// Size of the destination.
        dest_bytes: u64,
    },
}

fn is_zero(page: &[u8]) -> bool {
    // Word-wise: the slice is usually page-aligned, and this is the hot loop
    // of a snapshot.
    let (head, words, tail) = {
        // SAFETY: reinterpreting initialized bytes as u64 words is valid for
        // any bit pattern; align_to only yields correctly aligned middles.
        unsafe { page.align_to::<u64>() }
    };
    head.iter().all(|b| *b == 0) && words.iter().all(|w| *w == 0) && tail.iter().all(|b| *b == 0)
}

/// The runs of non-zero pages of `guest` (a final partial page counts as a
/// page).
pub fn nonzero_runs(guest: &[u8], page_size: usize) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    push_runs(&mut runs, guest, None, page_size, 0);
    runs
}

/// Appends the non-zero page runs of `part`, whose first page has index
/// `first_page`, merging with the last run when they touch.
fn push_runs(
    runs: &mut Vec<Run>,
    part: &[u8],
    mask: Option<&[bool]>,
    page_size: usize,
    first_page: u64,
) {
    for (i, page) in part.chunks(page_size).enumerate() {
        // A page the mask rules out is not read at all: reading a hole of
        // a memfd or file mapping would allocate it.
        if mask.is_some_and(|m| !m.get(i).copied().unwrap_or(true)) || is_zero(page) {
            continue;
        }
        let i = first_page + i as u64;
        match runs.last_mut() {
            Some(r) if r.first_page + r.page_count == i => r.page_count += 1,
            _ => runs.push(Run {
                first_page: i,
                page_count: 1,
            }),
        }
    }
}

/// Write the sparse image of `guest` to `w`; returns the bytes written.
pub fn encode_into<W: Write>(guest: &[u8], w: &mut W) -> io::Result<u64> {
    encode_parts_into(&[guest], w)
}

/// Write the sparse image of the concatenation of `parts` (guest RAM split
/// over several host mappings, in guest order) to `w`; returns the bytes
/// written. Every part but the last is a whole number of pages.
pub fn encode_parts_into<W: Write>(parts: &[&[u8]], w: &mut W) -> io::Result<u64> {
    encode_masked_parts_into(parts, &[], w)
}

/// [`encode_parts_into`] where `masks[i]` (when present) has one entry per
/// page of part `i`: `false` says the page is known to be zero (a hole of
/// the file behind it, never faulted in), so it is skipped unread. Pages
/// past a mask's end are read.
pub fn encode_masked_parts_into<W: Write>(
    parts: &[&[u8]],
    masks: &[Option<Vec<bool>>],
    w: &mut W,
) -> io::Result<u64> {
    DataPages::scan(parts, masks)?.encode_into(w)
}

/// The non-zero pages of guest memory held in several host mappings (in
/// guest order), found by one scan and then written as many times as
/// needed: into a snapshot's memory section ([`DataPages::encode_into`]) and
/// into its restore image (`crate::image::write_image`), without scanning
/// guest RAM twice.
pub struct DataPages<'a> {
    parts: &'a [&'a [u8]],
    /// Page index where each part starts.
    starts: Vec<u64>,
    runs: Vec<Run>,
    guest_len: u64,
}

impl<'a> DataPages<'a> {
    /// Scans `parts` (every part but the last a whole number of pages) for
    /// non-zero pages; `masks[i]`, when present, rules pages of part `i` out
    /// unread (see [`encode_masked_parts_into`]).
    pub fn scan(parts: &'a [&'a [u8]], masks: &[Option<Vec<bool>>]) -> io::Result<DataPages<'a>> {
        let page = PAGE_SIZE_BYTES as usize;
        let (last, whole) = parts.split_last().unwrap_or((&(&[] as &[u8]), &[]));
        if let Some(p) = whole.iter().find(|p| p.len() % page != 0) {
            return Err(io::Error::other(format!(
                "a memory part of {} bytes is not a whole number of {page}-byte pages",
                p.len()
            )));
        }
        let mut starts = Vec::with_capacity(parts.len());
        let mut runs = Vec::new();
        let mut first = 0u64;
        for (i, p) in whole.iter().chain(std::iter::once(last)).enumerate() {
            starts.push(first);
            let mask = masks.get(i).and_then(|m| m.as_deref());
            push_runs(&mut runs, p, mask, page, first);
            first += (p.len() as u64).div_ceil(page as u64);
        }
        Ok(DataPages {
            parts,
            starts,
            runs,
            guest_len: parts.iter().map(|p| p.len() as u64).sum(),
        })
    }

    /// The guest memory length in bytes (all parts).
    pub fn guest_len_bytes(&self) -> u64 {
        self.guest_len
    }

    /// The runs of non-zero pages, in increasing order.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// The data of the runs as contiguous host slices with the guest byte
    /// offset each starts at: a run that spans two parts is two slices.
    pub fn slices(&self) -> impl Iterator<Item = (u64, &'a [u8])> + '_ {
        let page = u64::from(PAGE_SIZE_BYTES);
        self.runs.iter().flat_map(move |r| {
            let end_pg = r.first_page + r.page_count;
            let mut pg = r.first_page;
            std::iter::from_fn(move || {
                if pg >= end_pg {
                    return None;
                }
                let part = self.starts.partition_point(|s| *s <= pg) - 1;
                let part_end = self.starts.get(part + 1).copied().unwrap_or(u64::MAX);
                let stop = end_pg.min(part_end);
                let bytes = self.parts[part];
                let from = usize::try_from((pg - self.starts[part]) * page).expect("within part");
                let to = usize::try_from((stop - self.starts[part]) * page)
                    .expect("within part")
                    .min(bytes.len());
                let at = pg * page;
                pg = stop;
                Some((at, &bytes[from..to]))
            })
        })
    }

    /// Writes the sparse image (the section layout above) to `w`; returns
    /// the bytes written.
    pub fn encode_into<W: Write>(&self, w: &mut W) -> io::Result<u64> {
        let mut n = 0u64;
        let mut put = |w: &mut W, b: &[u8]| -> io::Result<()> {
            n += b.len() as u64;
            w.write_all(b)
        };
        put(w, &PAGE_SIZE_BYTES.to_le_bytes())?;
        put(w, &self.guest_len.to_le_bytes())?;
        let count = u32::try_from(self.runs.len())
            .map_err(|_| io::Error::other("more than 2^32 runs of non-zero pages"))?;
        put(w, &count.to_le_bytes())?;
        for r in &self.runs {
            put(w, &r.first_page.to_le_bytes())?;
            put(w, &r.page_count.to_le_bytes())?;
        }
        for (_, bytes) in self.slices() {
            put(w, bytes)?;
        }
        Ok(n)
    }
}

/// [`encode_into`] a fresh vector.
pub fn encode(guest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(guest, &mut out).expect("writing to a Vec cannot fail");
    out
}

fn read_u32<R: Read>(r: &mut R) -> Result<u32, MemoryError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).map_err(MemoryError::Read)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64<R: Read>(r: &mut R) -> Result<u64, MemoryError> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).map_err(MemoryError::Read)?;
    Ok(u64::from_le_bytes(b))
}

/// Decode an image from `r` into `dest`, which must be exactly the guest
/// size the image records and must already be zero where the image has no
/// pages (fresh anonymous or memfd memory is). Only non-zero pages are
/// written. `r` must end exactly where the image ends.
pub fn decode_into<R: Read>(r: &mut R, dest: &mut [u8]) -> Result<MemoryStats, MemoryError> {
    let page_size = read_u32(r)?;
    if !page_size.is_power_of_two() || !(512..=1 << 20).contains(&page_size) {
        return Err(MemoryError::Malformed(format!(
            "page size {page_size} is not a power of two between 512 and 1 MiB"
        )));
    }
    let page = u64::from(page_size);
    let guest_len = read_u64(r)?;
    if guest_len != dest.len() as u64 {
        return Err(MemoryError::SizeMismatch {
            image_bytes: guest_len,
            dest_bytes: dest.len() as u64,
        });
    }
    let total_pages = guest_len.div_ceil(page);
    let run_count = read_u32(r)?;
    if u64::from(run_count) > total_pages {
        return Err(MemoryError::Malformed(format!(
            "{run_count} runs for a guest of {total_pages} pages"
        )));
    }
    // Bounded by total_pages, which is bounded by the destination's size.
    let mut runs = Vec::with_capacity(run_count as usize);
    let mut next_free = 0u64;
    for i in 0..run_count {
        let first_page = read_u64(r)?;
        let page_count = read_u64(r)?;
        let end = first_page.checked_add(page_count);
        let ok = page_count > 0
            && first_page >= next_free
            && (i == 0 || first_page > next_free)
            && end.is_some_and(|e| e <= total_pages);
        if !ok {
            return Err(MemoryError::Malformed(format!(
                "run {i} (pages {first_page}+{page_count}) is empty, out of order, adjacent to \
                 the previous run, or past the guest's {total_pages} pages"
            )));
        }
        next_free = end.expect("checked above");
        runs.push(Run {
            first_page,
            page_count,
        });
    }
    let mut data_bytes = 0u64;
    for run in &runs {
        // All within dest (checked above), so the conversions hold.
        let start = usize::try_from(run.first_page * page).expect("within dest");
        let end = usize::try_from(((run.first_page + run.page_count) * page).min(guest_len))
            .expect("within dest");
        r.read_exact(&mut dest[start..end])
            .map_err(MemoryError::Read)?;
        data_bytes += (end - start) as u64;
    }
    let mut probe = [0u8; 1];
    match r.read(&mut probe) {
        Ok(0) => {}
        Ok(_) => {
            return Err(MemoryError::Malformed(
                "bytes after the last page of the image".into(),
            ))
        }
        Err(e) => return Err(MemoryError::Read(e)),
    }
    Ok(MemoryStats {
        guest_len_bytes: guest_len,
        data_bytes,
        runs: runs.len() as u64,
    })
}

/// The raw (uncompressed) length of the image of a guest: for callers that
/// size buffers.
pub fn encoded_len(runs: &[Run], guest_len: u64) -> u64 {
    let page = u64::from(PAGE_SIZE_BYTES);
    let data: u64 = runs
        .iter()
        .map(|r| ((r.first_page + r.page_count) * page).min(guest_len) - r.first_page * page)
        .sum();
    (PREFIX_LEN + RUN_LEN * runs.len()) as u64 + data
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn guest_with(len: usize, touched: &[(usize, u8)]) -> Vec<u8> {
        let mut g = vec![0u8; len];
        for &(off, v) in touched {
            g[off] = v;
        }
        g
    }

    #[test]
    fn zero_pages_are_not_written() {
        let g = guest_with(64 * 4096, &[(5, 1), (4096 * 7 + 3, 2), (4096 * 8, 3)]);
        let runs = nonzero_runs(&g, 4096);
        assert_eq!(
            runs,
            vec![
                Run {
                    first_page: 0,
                    page_count: 1
                },
                Run {
                    first_page: 7,
                    page_count: 2
                }
            ]
        );
        let img = encode(&g);
        assert_eq!(img.len() as u64, encoded_len(&runs, g.len() as u64));
        assert_eq!(img.len(), PREFIX_LEN + 2 * RUN_LEN + 3 * 4096);
        let mut back = vec![0u8; g.len()];
        let stats = decode_into(&mut img.as_slice(), &mut back).unwrap();
        assert_eq!(back, g);
        assert_eq!(stats.data_bytes, 3 * 4096);
        assert_eq!(stats.runs, 2);
    }

    #[test]
    fn parts_encode_like_their_concatenation() {
        let g = guest_with(
            16 * 4096 + 10,
            &[(5, 1), (4096 * 3 + 3, 2), (4096 * 4, 3), (16 * 4096 + 9, 4)],
        );
        let (a, b) = g.split_at(4 * 4096);
        assert_eq!(encode(&g), {
            let mut v = Vec::new();
            encode_parts_into(&[a, b], &mut v).unwrap();
            v
        });
        // A mask skips pages unread: the masked-out page's data is left out.
        let mut mask = vec![true; 4];
        mask[3] = false;
        let mut v = Vec::new();
        encode_masked_parts_into(&[a, b], &[Some(mask), None], &mut v).unwrap();
        let mut back = vec![0u8; g.len()];
        decode_into(&mut v.as_slice(), &mut back).unwrap();
        assert_eq!(back[4096 * 3 + 3], 0, "masked page skipped");
        assert_eq!(&back[4096 * 4..], &g[4096 * 4..]);
        let e = encode_parts_into(&[&g[..100], &g[100..]], &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("not a whole number"), "{e}");
    }

    #[test]
    fn an_all_zero_guest_is_only_a_header() {
        let g = vec![0u8; 1 << 20];
        assert_eq!(encode(&g).len(), PREFIX_LEN);
    }

    #[test]
    fn partial_last_page_round_trips() {
        let g = guest_with(4096 + 100, &[(4096 + 99, 9)]);
        let img = encode(&g);
        let mut back = vec![0u8; g.len()];
        decode_into(&mut img.as_slice(), &mut back).unwrap();
        assert_eq!(back, g);
    }

    #[test]
    fn size_mismatch_is_named() {
        let img = encode(&vec![1u8; 8192]);
        let mut back = vec![0u8; 4096];
        let e = decode_into(&mut img.as_slice(), &mut back).unwrap_err();
        assert_eq!(
            e.to_string(),
            "memory image is for 8192 bytes of guest memory, the destination has 4096"
        );
    }

    #[test]
    fn overlapping_runs_and_trailing_bytes_are_refused() {
        let mut img = Vec::new();
        img.extend_from_slice(&4096u32.to_le_bytes());
        img.extend_from_slice(&(4u64 * 4096).to_le_bytes());
        img.extend_from_slice(&2u32.to_le_bytes());
        for (a, b) in [(0u64, 2u64), (1, 1)] {
            img.extend_from_slice(&a.to_le_bytes());
            img.extend_from_slice(&b.to_le_bytes());
        }
        let mut back = vec![0u8; 4 * 4096];
        let e = decode_into(&mut img.as_slice(), &mut back).unwrap_err();
        assert!(e.to_string().contains("run 1"), "{e}");

        let mut good = encode(&guest_with(8192, &[(1, 1)]));
        good.push(0);
        let mut back = vec![0u8; 8192];
        let e = decode_into(&mut good.as_slice(), &mut back).unwrap_err();
        assert!(e.to_string().contains("bytes after"), "{e}");
    }

    proptest! {
        #[test]
        fn round_trip(pages in proptest::collection::vec(any::<(bool, u8)>(), 0..64)) {
            let mut g = Vec::new();
            for (touched, v) in pages {
                let mut p = vec![0u8; 4096];
                if touched {
                    p[usize::from(v) * 13 % 4096] = v | 1;
                }
                g.extend_from_slice(&p);
            }
            let img = encode(&g);
            let mut back = vec![0u8; g.len()];
            decode_into(&mut img.as_slice(), &mut back).unwrap();
            prop_assert_eq!(back, g);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), len in 0usize..20000) {
            let mut dest = vec![0u8; len];
            let _ = decode_into(&mut bytes.as_slice(), &mut dest);
        }
    }
}
