//! Curation decisions over time, for the status page ([`crate::page`]).

use rusqlite::params;
use serde::Serialize;

use super::{Store, StoreError};

/// Curation decisions over time, for the status page: how many items were admitted, and dropped or
/// quarantined for each `node: reason`, in equal time buckets from the first decision to the last.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CurationTimeline {
    /// Start of the first bucket (Unix ms).
    pub start_unix_ms: u64,
    pub bucket_ms: u64,
    /// `(label, count per bucket)`: `admitted`, then `node: reason` for drops and quarantines, most
    /// frequent first.
    pub series: Vec<(String, Vec<u64>)>,
}

impl Store {
    /// Decisions (every curation row no longer pending) counted into at most `buckets` equal time buckets.
    /// Grouped in SQL, so a store of months of items returns a few hundred numbers.
    pub fn curation_timeline(&self, buckets: u64) -> Result<CurationTimeline, StoreError> {
        let span: (Option<i64>, Option<i64>) = self
            .conn
            .query_row(
                "SELECT MIN(updated_at_unix_ms), MAX(updated_at_unix_ms) FROM curation WHERE state != 'pending'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(self.sq())?;
        let (Some(start), Some(end)) = span else {
            return Ok(CurationTimeline::default());
        };
        let buckets = buckets.max(1);
        // At least a second per bucket, so a burst of decisions in the same instant is one column, not many.
        let bucket_ms = (((end - start).max(0) as u64) / buckets + 1).max(1000);
        let n = (((end - start).max(0) as u64) / bucket_ms + 1) as usize;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT (updated_at_unix_ms - ?1) / ?2,
                        CASE WHEN state = 'admitted' THEN 'admitted'
                             ELSE COALESCE(node, '') || ': ' || COALESCE(reason, '') END,
                        COUNT(*)
                 FROM curation WHERE state != 'pending' GROUP BY 1, 2",
            )
            .map_err(self.sq())?;
        let rows: Vec<(i64, String, i64)> = stmt
            .query_map(params![start, bucket_ms as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .map_err(self.sq())?
            .collect::<Result<_, _>>()
            .map_err(self.sq())?;
        let mut series: Vec<(String, Vec<u64>)> = Vec::new();
        for (bucket, label, count) in rows {
            let label = kind(&label);
            let i = match series.iter().position(|(l, _)| *l == label) {
                Some(i) => i,
                None => {
                    series.push((label, vec![0; n]));
                    series.len() - 1
                }
            };
            if let Some(slot) = series[i].1.get_mut(bucket.max(0) as usize) {
                *slot += count.max(0) as u64;
            }
        }
        let total = |v: &[u64]| v.iter().sum::<u64>();
        series.sort_by(|a, b| {
            (b.0 == "admitted")
                .cmp(&(a.0 == "admitted"))
                .then(total(&b.1).cmp(&total(&a.1)))
                .then(a.0.cmp(&b.0))
        });
        Ok(CurationTimeline {
            start_unix_ms: start.max(0) as u64,
            bucket_ms,
            series,
        })
    }
}

/// A decision's series: `node: reason` without a reason's own `node: ` prefix or its ` of #N` (which item it
/// duplicates), as the run report groups them.
fn kind(label: &str) -> String {
    let label = label.split(" of #").next().unwrap_or(label);
    match label.split_once(": ") {
        Some((node, reason)) if reason.starts_with(&format!("{node}: ")) => reason.to_owned(),
        _ => label.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn series_are_named_as_the_report_groups_them() {
        assert_eq!(super::kind("admitted"), "admitted");
        assert_eq!(
            super::kind("dedup: dedup: exact duplicate of #11"),
            "dedup: exact duplicate"
        );
        assert_eq!(super::kind("guard: unsafe"), "guard: unsafe");
    }
}
