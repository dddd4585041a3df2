//! Curation: everything a captured datum passes before it may train. Nothing personal leaves this stage.

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
    /// Replaces each sorted, non-overlapping byte span of `text` with its sentinel.
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

    /// The original offset of `r` (an offset in `text`); an offset inside a sentinel maps to that span's
    /// start (`is_end` false) or end (`is_end` true).
    pub fn original(&self, r: usize, is_end: bool) -> usize {
        let mut delta: isize = 0;
        for &(rs, re, os, oe) in &self.map {
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

/// Merges what a re-scan of redacted text found (already mapped back to the original text)
/// into `found`, as replacing, one new span at a time in order, everything it overlaps would:
/// a found span stays unless some new one overlaps it, and a new one stays unless a later new
/// one overlaps it. The result is sorted by start (stable: earlier finds first on ties). Asking
/// an index keeps this linear in `found`; new spans are few and are compared among themselves.
pub(crate) fn merge_rescan<T>(
    found: &mut Vec<T>,
    new: Vec<T>,
    span: impl Fn(&T) -> (usize, usize),
) {
    let index = SpanIndex::new(new.iter().map(&span).collect());
    found.retain(|f| {
        let (s, e) = span(f);
        !index.overlaps(s, e)
    });
    let mut kept_new: Vec<T> = Vec::with_capacity(new.len());
    for n in new {
        let (s, e) = span(&n);
        kept_new.retain(|k| {
            let (ks, ke) = span(k);
            !(ks < e && s < ke)
        });
        kept_new.push(n);
    }
    found.extend(kept_new);
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

    proptest! {
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
