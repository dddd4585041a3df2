//! Quantized weights moved onto 2 MiB pages after loading, where the OS allows it.
//!
//! A decode step streams every weight once. On 4 KiB pages that is tens of thousands of pages per token, far
//! more than the TLB holds, so each page costs a table walk and the hardware prefetchers stop at every page
//! edge; on 2 MiB pages the kernel streams the weights close to the machine's plain read bandwidth.
//!
//! Weights are loaded by candle into ordinary heap buffers, so this asks Linux to collapse the 2 MiB chunks
//! they fill into huge pages in place (`MADV_COLLAPSE`, Linux 6.1+; it works whatever the system's THP
//! policy says, except `never`). Contents never change; where the kernel refuses, nothing happens and the
//! weights stay on small pages. Only chunks at least half covered by weights are collapsed, so a tiny model
//! costs nothing and memory around the weights grows by at most the uncovered half of its edge chunks.

/// Size and alignment of an x86-64 / AArch64 (4 KiB granule) transparent huge page.
pub const HUGE_PAGE: usize = 2 << 20;

/// What [`collapse_into_huge_pages`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HugePageReport {
    /// Chunks the kernel moved (or had already moved) onto a huge page.
    pub collapsed_chunks: usize,
    /// Chunks it refused (no such support, no free huge page, a chunk crossing a mapping's edge).
    pub refused_chunks: usize,
}

impl HugePageReport {
    /// Bytes now on huge pages.
    pub fn collapsed_bytes(&self) -> usize {
        self.collapsed_chunks * HUGE_PAGE
    }
}

/// Start addresses of the `HUGE_PAGE`-aligned chunks that `ranges` (`(address, length)`) cover by at least
/// `min_covered` bytes, ascending. Overlapping ranges count once.
pub fn chunks_to_collapse(ranges: &[(usize, usize)], min_covered: usize) -> Vec<usize> {
    let mut spans: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|(_, len)| *len > 0)
        .map(|&(start, len)| (start, start.saturating_add(len)))
        .collect();
    spans.sort_unstable();
    // Merge overlaps first, so that coverage is never counted twice.
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let mut covered: Vec<(usize, usize)> = Vec::new();
    for (s, e) in merged {
        let mut chunk = s - s % HUGE_PAGE;
        while chunk < e {
            let next = chunk.saturating_add(HUGE_PAGE);
            let bytes = e.min(next) - s.max(chunk);
            match covered.last_mut() {
                Some(last) if last.0 == chunk => last.1 += bytes,
                _ => covered.push((chunk, bytes)),
            }
            chunk = next;
        }
    }
    covered
        .into_iter()
        .filter(|&(_, bytes)| bytes >= min_covered)
        .map(|(chunk, _)| chunk)
        .collect()
}

/// Asks the kernel to put the chunks that `buffers` at least half fill onto huge pages (see the module doc).
pub fn collapse_into_huge_pages(buffers: &[&[u8]]) -> HugePageReport {
    let ranges: Vec<(usize, usize)> = buffers
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    let mut report = HugePageReport::default();
    for chunk in chunks_to_collapse(&ranges, HUGE_PAGE / 2) {
        if collapse(chunk) {
            report.collapsed_chunks += 1;
        } else {
            report.refused_chunks += 1;
        }
    }
    report
}

#[cfg(target_os = "linux")]
fn collapse(chunk: usize) -> bool {
    // SAFETY: MADV_COLLAPSE only changes which physical pages back the range, never its contents or its
    // mapping; a range that is not (wholly) mapped anonymous memory is refused with an error, not touched.
    unsafe { libc::madvise(chunk as *mut libc::c_void, HUGE_PAGE, libc::MADV_COLLAPSE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn collapse(_chunk: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn chunks_are_those_at_least_half_covered() {
        let base = 64 * HUGE_PAGE;
        // Half of chunk 0 and all of chunk 1 and 2.5 MiB further; a 1 KiB sliver of chunk 3.
        let ranges = [
            (base + MIB, MIB + HUGE_PAGE + MIB / 2),
            (base + 3 * HUGE_PAGE, 1024),
        ];
        assert_eq!(
            chunks_to_collapse(&ranges, HUGE_PAGE / 2),
            vec![base, base + HUGE_PAGE]
        );
        // Chunk 2 holds only MiB / 2 of the first range; with a lower bar it and the sliver qualify.
        assert_eq!(
            chunks_to_collapse(&ranges, 1024),
            vec![
                base,
                base + HUGE_PAGE,
                base + 2 * HUGE_PAGE,
                base + 3 * HUGE_PAGE
            ]
        );
    }

    #[test]
    fn neighbouring_buffers_add_up_and_overlaps_count_once() {
        let base = 8 * HUGE_PAGE;
        // Three 400 KiB buffers back to back fill 1.2 MiB of one chunk: enough together, not alone.
        let three: Vec<(usize, usize)> = (0..3)
            .map(|i| (base + i * 400 * 1024, 400 * 1024))
            .collect();
        assert_eq!(chunks_to_collapse(&three, HUGE_PAGE / 2), vec![base]);
        assert!(chunks_to_collapse(&three[..1], HUGE_PAGE / 2).is_empty());
        // The same 600 KiB buffer listed twice (a tied embedding and head) is still 600 KiB.
        let twice = [(base, 600 * 1024), (base, 600 * 1024)];
        assert!(chunks_to_collapse(&twice, HUGE_PAGE / 2).is_empty());
        assert!(chunks_to_collapse(&[], 1).is_empty());
        assert!(chunks_to_collapse(&[(base, 0)], 0).is_empty());
    }

    /// Whether or not this kernel agrees to collapse, the bytes read back unchanged.
    #[test]
    fn collapsing_keeps_every_byte() {
        let data: Vec<u8> = (0..5 * HUGE_PAGE).map(|i| (i * 31 % 251) as u8).collect();
        let report = collapse_into_huge_pages(&[&data, &data[..HUGE_PAGE]]);
        assert!(
            report.collapsed_chunks + report.refused_chunks >= 4,
            "{report:?}"
        );
        assert!(
            data.iter()
                .enumerate()
                .all(|(i, &b)| b == (i * 31 % 251) as u8)
        );
    }
}
