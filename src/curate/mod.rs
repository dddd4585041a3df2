//! Curation: everything a captured datum passes before it may train. Nothing personal leaves this stage.

/// A 256-entry table of `$class` for every byte value, built at compile time: the byte
/// scanners of redaction and the secret filter read one entry per byte instead of a chain of
/// range tests (`byte_table!(|b| b.is_ascii_digit())`). Defined before the submodules below,
/// so it is in scope in all of them.
macro_rules! byte_table {
    (|$b:ident| $class:expr) => {{
        let mut table = [{
            let $b = 0u8;
            $class
        }; 256];
        let mut i = 1;
        while i < 256 {
            let $b = i as u8;
            table[i] = $class;
            i += 1;
        }
        table
    }};
}

pub mod dedup;
pub mod guard;
pub mod redact;
pub mod secrets;

/// Text with spans replaced by sentinels, remembering where each sentinel came from, so that finds in the
/// replaced text map back to the original: both the redactor and the secret filter scan their own output
/// again to stay idempotent.
pub(crate) struct Spliced {
    pub text: String,
    /// Per sentinel: (start, end) in `text`, (start, end) in the original.
    map: Vec<(usize, usize, usize, usize)>,
}

impl Spliced {
    /// Replaces each sorted, non-overlapping byte span of `text` with its sentinel. Sentinels
    /// are never empty (`<EMAIL>`, `<SECRET:rule>`): [`Self::original`] relies on it.
    pub fn new<S: AsRef<str>>(
        text: &str,
        spans: impl IntoIterator<Item = (usize, usize, S)>,
    ) -> Self {
        let mut out = String::with_capacity(text.len());
        let mut map = Vec::new();
        let mut pos = 0;
        for (start, end, sentinel) in spans {
            out.push_str(&text[pos..start]);
            let rs = out.len();
            out.push_str(sentinel.as_ref());
            map.push((rs, out.len(), start, end));
            pos = end;
        }
        out.push_str(&text[pos..]);
        Spliced { text: out, map }
    }

    /// Per sentinel, in order: (start, end) in `text`, (start, end) in the original.
    pub fn sentinels(&self) -> &[(usize, usize, usize, usize)] {
        &self.map
    }

    /// The original offset of `r` (an offset in `text`); an offset inside a sentinel maps to that span's
    /// start (`is_end` false) or end (`is_end` true).
    ///
    /// Binary search, not a walk over every sentinel: a re-scan that finds something new asks
    /// twice per find, and a long text with many sentinels and many new finds makes the walk
    /// quadratic.
    pub fn original(&self, r: usize, is_end: bool) -> usize {
        // Sentinels are non-empty and in order, so their starts increase: those that `r` is at
        // or past (an end offset equal to a sentinel's start counts as past it) form a prefix.
        let past = self
            .map
            .partition_point(|&(rs, ..)| rs < r || (rs == r && is_end));
        // Only the last two of them can hold `r`: any earlier one ends before the next starts,
        // which is at most `r`, and strictly before `r` unless two sentinels touch at `r`.
        for &(_, re, os, oe) in &self.map[past.saturating_sub(2)..past] {
            if r < re || (r == re && is_end) {
                return if is_end { oe } else { os };
            }
        }
        // After a sentinel the offsets differ by its original end minus its end here.
        match past.checked_sub(1).map(|k| self.map[k]) {
            Some((_, re, _, oe)) => (r as isize + oe as isize - re as isize) as usize,
            None => r,
        }
    }
}

/// One record of the shared gold-format JSONL (`../shared/data/pii`): the fields the scorers' inputs need.
#[derive(serde::Deserialize)]
pub(crate) struct TextRecord {
    pub id: serde_json::Value,
    pub text: String,
}

/// Calls `each` on every record of `input`. A line that is not such a record goes to `bad` with its 1-based line
/// number and the reason, and the rest of the file is still read; only I/O errors stop it.
pub(crate) fn for_each_text_record(
    input: impl std::io::BufRead,
    mut each: impl FnMut(TextRecord) -> std::io::Result<()>,
    mut bad: impl FnMut(usize, String),
) -> std::io::Result<()> {
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<TextRecord>(&line) {
            Ok(record) => each(record)?,
            Err(e) => bad(n + 1, e.to_string()),
        }
    }
    Ok(())
}

/// A fixed set of byte spans, possibly overlapping, that answers "does any of them overlap
/// `s..e`?" in O(log n): sorted by start, with the furthest end reached so far. Asking a
/// plain list once per token made detection quadratic in the length of a text.
pub(crate) struct SpanIndex {
    starts: Vec<usize>,
    /// `furthest_end[i]`: the largest end among the first `i + 1` spans by start.
    furthest_end: Vec<usize>,
}

impl SpanIndex {
    pub(crate) fn new(mut spans: Vec<(usize, usize)>) -> Self {
        spans.sort_unstable();
        let mut furthest = 0;
        let furthest_end = spans
            .iter()
            .map(|&(_, e)| {
                furthest = furthest.max(e);
                furthest
            })
            .collect();
        Self {
            starts: spans.into_iter().map(|(s, _)| s).collect(),
            furthest_end,
        }
    }

    /// Some span `(a, b)` has `a <= s && e <= b`.
    pub(crate) fn contains(&self, s: usize, e: usize) -> bool {
        let from_s = self.starts.partition_point(|&a| a <= s);
        from_s > 0 && self.furthest_end[from_s - 1] >= e
    }

    /// Some span `(a, b)` has `a < e && s < b`.
    pub(crate) fn overlaps(&self, s: usize, e: usize) -> bool {
        // spans starting before `e` form a prefix; one of them overlaps iff its furthest end
        // passes `s`
        let before_end = self.starts.partition_point(|&a| a < e);
        before_end > 0 && self.furthest_end[before_end - 1] > s
    }
}

/// Spans kept so far by an overlap resolution, pairwise non-overlapping (`a.start < b.end &&
/// b.start < a.end` holds for no two), asked for the first one a new span overlaps. A few are
/// scanned; from [`KeptSpans::INDEX_FROM`] on they are indexed, since scanning all of them per
/// candidate is quadratic in the findings of a text. Non-empty ones have distinct starts and
/// ends in the same order, so the first one overlapping is found next to the new span's start;
/// empty ones (an empty capture) overlap what strictly contains their position and are apart.
#[derive(Default)]
pub(crate) struct KeptSpans {
    /// All of them while fewer than `INDEX_FROM` (the first `few_len`; inline, so a short
    /// record's resolution allocates nothing more); then none.
    few: [(usize, usize); KeptSpans::INDEX_FROM - 1],
    few_len: usize,
    /// Non-empty ones, start -> end (once indexed).
    spans: std::collections::BTreeMap<usize, usize>,
    /// Positions of empty ones (once indexed).
    empty: std::collections::BTreeSet<usize>,
}

impl KeptSpans {
    /// Below this many a scan is faster than any index.
    const INDEX_FROM: usize = 16;

    pub(crate) fn insert(&mut self, start: usize, end: usize) {
        if self.spans.is_empty() && self.empty.is_empty() && self.few_len < self.few.len() {
            self.few[self.few_len] = (start, end);
            self.few_len += 1;
            return;
        }
        let few = std::mem::take(&mut self.few_len);
        for &(s, e) in self.few[..few].iter().chain([&(start, end)]) {
            if s < e {
                self.spans.insert(s, e);
            } else {
                self.empty.insert(s);
            }
        }
    }

    /// The smallest start among kept spans `k` with `k.start < end && start < k.end`.
    pub(crate) fn first_overlap(&self, start: usize, end: usize) -> Option<usize> {
        if self.few_len > 0 {
            return self.few[..self.few_len]
                .iter()
                .filter(|&&(s, e)| s < end && start < e)
                .map(|&(s, _)| s)
                .min();
        }
        // The non-empty span with the smallest end past `start` is the last one starting at or
        // before `start`, if it reaches past `start`, else the first one after it.
        let non_empty = match self.spans.range(..=start).next_back() {
            Some((&s, &e)) if e > start => Some(s),
            _ => self
                .spans
                .range((std::ops::Bound::Excluded(start), std::ops::Bound::Unbounded))
                .next()
                .map(|(&s, _)| s),
        }
        .filter(|&s| s < end);
        let empty = if start + 1 < end {
            self.empty.range(start + 1..end).next().copied()
        } else {
            None
        };
        non_empty.into_iter().chain(empty).min()
    }
}

/// Merges what a re-scan of redacted text found (sorted by start, and mapped back to the
/// original text, which keeps that order) into `found`, as replacing, one new span at a time in
/// order, everything it overlaps would: a found span stays unless some new one overlaps it, and
/// a new one stays unless a later new one overlaps it. The result is sorted by start (stable:
/// earlier finds first on ties). Both questions go to an index, so a long text whose re-scan
/// finds much costs O(n log n), not a comparison of every pair.
pub(crate) fn merge_rescan<T>(
    found: &mut Vec<T>,
    new: Vec<T>,
    span: impl Fn(&T) -> (usize, usize),
) {
    debug_assert!(new.windows(2).all(|w| span(&w[0]).0 <= span(&w[1]).0));
    let index = SpanIndex::new(new.iter().map(&span).collect());
    found.retain(|f| {
        let (s, e) = span(f);
        !index.overlaps(s, e)
    });
    // Later new spans, start -> furthest end. Walking backwards, every one of them starts at
    // or after the current span's start `s`: one starting inside `s + 1..e` overlaps it, and
    // one starting at `s` does when it ends past `s`. An empty span overlaps none of them.
    let mut later: std::collections::BTreeMap<usize, usize> = std::collections::BTreeMap::new();
    let mut keep = vec![true; new.len()];
    for (i, n) in new.iter().enumerate().rev() {
        let (s, e) = span(n);
        if s < e {
            let mut starting_before_e = later.range(s..e);
            keep[i] = match starting_before_e.next() {
                None => true,
                Some((&a, &b)) => a == s && b <= s && starting_before_e.next().is_none(),
            };
        }
        let furthest = later.entry(s).or_insert(e);
        *furthest = (*furthest).max(e);
    }
    found.extend(
        new.into_iter()
            .zip(keep)
            .filter_map(|(n, k)| k.then_some(n)),
    );
    found.sort_by_key(|f| span(f).0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// [`merge_rescan`] as first written: each new span in turn replaces what it overlaps.
    fn merge_one_by_one(found: &mut Vec<(usize, usize, u8)>, new: Vec<(usize, usize, u8)>) {
        for n in new {
            found.retain(|f| !(f.0 < n.1 && n.0 < f.1));
            found.push(n);
        }
        found.sort_by_key(|f| f.0);
    }

    fn spans(tag: u8) -> impl Strategy<Value = Vec<(usize, usize, u8)>> {
        prop::collection::vec((0usize..80, 0usize..10), 0..40)
            .prop_map(move |v| v.into_iter().map(|(s, l)| (s, s + l, tag)).collect())
    }

    /// [`Spliced::original`] as first written: a walk over every sentinel.
    fn original_by_walk(sp: &Spliced, r: usize, is_end: bool) -> usize {
        let mut delta: isize = 0;
        for &(rs, re, os, oe) in &sp.map {
            if r < rs || (r == rs && !is_end) {
                break;
            }
            if r < re || (r == re && is_end) {
                return if is_end { oe } else { os };
            }
            delta += (oe - os) as isize - (re - rs) as isize;
        }
        (r as isize + delta) as usize
    }

    proptest! {
        /// Spans touching, empty, at the text's ends, sentinels longer and shorter than spans.
        #[test]
        fn original_equals_the_walk_over_every_sentinel(
            cuts in prop::collection::vec((0usize..4, 0usize..6, 1usize..5), 0..12),
        ) {
            let text = "abcdefghij".repeat(8);
            let (mut spans, mut pos) = (Vec::new(), 0);
            for (gap, len, sentinel) in cuts {
                let start = pos + gap;
                let end = start + len;
                if end > text.len() {
                    break;
                }
                spans.push((start, end, "#".repeat(sentinel)));
                pos = end;
            }
            let sp = Spliced::new(&text, spans);
            for r in 0..=sp.text.len() {
                for is_end in [false, true] {
                    prop_assert_eq!(sp.original(r, is_end), original_by_walk(&sp, r, is_end), "r {} end {}", r, is_end);
                }
            }
        }

        #[test]
        fn merge_rescan_equals_replacing_one_new_span_at_a_time(
            found in spans(0),
            mut new in spans(1),
        ) {
            // a re-scan's finds come sorted by start
            new.sort_by_key(|n| n.0);
            let mut fast = found.clone();
            merge_rescan(&mut fast, new.clone(), |f| (f.0, f.1));
            let mut slow = found;
            merge_one_by_one(&mut slow, new);
            prop_assert_eq!(fast, slow);
        }

        /// Spans offered in random order, kept when they overlap nothing kept: past
        /// `INDEX_FROM` of them too, empty ones included.
        #[test]
        fn kept_spans_answer_as_a_scan_does(
            offered in prop::collection::vec((0usize..600, 0usize..8), 0..200),
        ) {
            let mut kept = KeptSpans::default();
            let mut scan: Vec<(usize, usize)> = Vec::new();
            for (s, l) in offered {
                let e = s + l;
                let want = scan.iter().filter(|&&(a, b)| a < e && s < b).map(|&(a, _)| a).min();
                prop_assert_eq!(kept.first_overlap(s, e), want, "{}..{}", s, e);
                if want.is_none() {
                    kept.insert(s, e);
                    scan.push((s, e));
                }
            }
        }

        #[test]
        fn span_index_answers_as_a_scan_does(
            spans in prop::collection::vec((0usize..50, 0usize..10), 0..30),
            queries in prop::collection::vec((0usize..60, 0usize..10), 1..30),
        ) {
            let spans: Vec<(usize, usize)> = spans.into_iter().map(|(s, l)| (s, s + l)).collect();
            let index = SpanIndex::new(spans.clone());
            for (s, l) in queries {
                let e = s + l;
                let scan = spans.iter().any(|&(a, b)| a < e && s < b);
                prop_assert_eq!(index.overlaps(s, e), scan, "overlaps {}..{}", s, e);
                let scan = spans.iter().any(|&(a, b)| a <= s && e <= b);
                prop_assert_eq!(index.contains(s, e), scan, "contains {}..{}", s, e);
            }
        }
    }
}
