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
