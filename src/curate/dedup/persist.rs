//! Saving and loading deduper state, so a restart does not readmit what was already seen.
//!
//! Format (little-endian): magic `HRTHDDP2`, u32 length + JSON of the config it was built with,
//! u64 next sequence number, u64 entry count and per entry (seq, sample key, exact hash, cluster,
//! signature),
//! u64 cluster count and per cluster (id, u32 n, n × (seq, u32 weight)), then a u64 checksum of
//! everything before it. Binary because a JSON store of 10^5–10^6 signatures would be several
//! times larger and slower; LSH buckets are rebuilt on load rather than stored.

use std::collections::VecDeque;
use std::fs;
use std::path::Path;

use super::minhash::hash_bytes;
use super::{DedupConfig, DedupError, Deduper, Entry};

const MAGIC: &[u8; 8] = b"HRTHDDP2";
/// The first format, without sample keys: still read (keys become 0, "unknown").
const MAGIC_V1: &[u8; 8] = b"HRTHDDP1";
const CHECK_SEED: u64 = 0xc0ff_ee00_dd5e_ed01;

impl Deduper {
    /// Writes the state atomically: a temporary file in the same directory is written, fsynced
    /// and renamed over `path` (then the directory is fsynced), so a crash leaves either the old or
    /// the new state, never a torn one.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), DedupError> {
        let path = path.as_ref();
        let io = |source| DedupError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut buf = Vec::with_capacity(64 + self.entries.len() * (32 + 4 * self.config.num_perm));
        buf.extend_from_slice(MAGIC);
        let cfg = serde_json::to_vec(&self.config).map_err(|e| DedupError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("config does not serialise: {e}"),
        })?;
        put_u32(&mut buf, cfg.len() as u32);
        buf.extend_from_slice(&cfg);
        put_u64(&mut buf, self.next_seq);
        put_u64(&mut buf, self.entries.len() as u64);
        for e in &self.entries {
            put_u64(&mut buf, e.seq);
            put_u64(&mut buf, e.key);
            put_u64(&mut buf, e.exact);
            put_u64(&mut buf, e.cluster);
            for &v in e.sig.iter() {
                put_u32(&mut buf, v);
            }
        }
        let mut clusters: Vec<_> = self.clusters.iter().collect();
        clusters.sort_unstable_by_key(|(id, _)| **id);
        put_u64(&mut buf, clusters.len() as u64);
        for (id, log) in clusters {
            put_u64(&mut buf, *id);
            put_u32(&mut buf, log.len() as u32);
            for &(s, w) in log {
                put_u64(&mut buf, s);
                put_u32(&mut buf, w);
            }
        }
        let sum = hash_bytes(&buf, CHECK_SEED);
        put_u64(&mut buf, sum);

        crate::files::atomic_write(path, &buf).map_err(io)
    }

    /// Loads state saved by [`Deduper::save`]. The signature-defining fields of `config` (shingle,
    /// shingle_size, num_perm, bands, rows, seed) must equal the saved ones, else
    /// [`DedupError::ConfigMismatch`] names the first that differs; the other fields are taken from
    /// `config` (a smaller `capacity` evicts the oldest entries at once).
    pub fn load(path: impl AsRef<Path>, config: DedupConfig) -> Result<Self, DedupError> {
        let path = path.as_ref();
        config.validate()?;
        let bytes = fs::read(path).map_err(|source| DedupError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let corrupt = |reason: &str| DedupError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        if bytes.len() < MAGIC.len() + 8 || (&bytes[..8] != MAGIC && &bytes[..8] != MAGIC_V1) {
            return Err(corrupt("not a hearth dedup state (bad magic)"));
        }
        let keyed = &bytes[..8] == MAGIC;
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let mut sum = [0u8; 8];
        sum.copy_from_slice(tail);
        if u64::from_le_bytes(sum) != hash_bytes(body, CHECK_SEED) {
            return Err(corrupt("checksum mismatch (truncated or modified)"));
        }
        let mut r = Reader {
            buf: body,
            pos: MAGIC.len(),
        };
        let short = || corrupt("unexpected end of data");
        let cfg_len = r.u32().ok_or_else(short)? as usize;
        let saved: DedupConfig = serde_json::from_slice(r.bytes(cfg_len).ok_or_else(short)?)
            .map_err(|e| corrupt(&format!("saved config: {e}")))?;
        for ((field, s), (_, g)) in saved
            .signature_fields()
            .into_iter()
            .zip(config.signature_fields())
        {
            if s != g {
                return Err(DedupError::ConfigMismatch {
                    path: path.to_path_buf(),
                    field,
                    saved: s,
                    given: g,
                });
            }
        }
        let mut d = Deduper::new(config)?;
        d.next_seq = r.u64().ok_or_else(short)?;
        let n = r.u64().ok_or_else(short)?;
        let per = if keyed { 32 } else { 24 } + 4 * d.config.num_perm;
        if n.saturating_mul(per as u64) > (body.len() - r.pos) as u64 {
            return Err(short());
        }
        let mut last = None;
        for _ in 0..n {
            let seq = r.u64().ok_or_else(short)?;
            let key = if keyed { r.u64().ok_or_else(short)? } else { 0 };
            let exact = r.u64().ok_or_else(short)?;
            let cluster = r.u64().ok_or_else(short)?;
            let mut sig = vec![0u32; d.config.num_perm];
            for v in sig.iter_mut() {
                *v = r.u32().ok_or_else(short)?;
            }
            if last.is_some_and(|l| seq <= l) || seq >= d.next_seq {
                return Err(corrupt("entries out of sequence order"));
            }
            last = Some(seq);
            d.remember(Entry {
                seq,
                key,
                exact,
                cluster,
                sig: sig.into_boxed_slice(),
            });
        }
        let nc = r.u64().ok_or_else(short)?;
        for _ in 0..nc {
            let id = r.u64().ok_or_else(short)?;
            let len = r.u32().ok_or_else(short)? as usize;
            if len.saturating_mul(12) > body.len() - r.pos {
                return Err(short());
            }
            let mut log = VecDeque::with_capacity(len);
            for _ in 0..len {
                log.push_back((r.u64().ok_or_else(short)?, r.u32().ok_or_else(short)?));
            }
            d.clusters.insert(id, log);
        }
        if r.pos != body.len() {
            return Err(corrupt("trailing data"));
        }
        while d.entries.len() > d.config.capacity {
            d.evict_oldest();
        }
        Ok(d)
    }
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
}
