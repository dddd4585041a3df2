//! The recorded stream: JSONL records, each a prompt and response with optional gold labels.
//!
//! A record is `{"id", "prompt", "response"?, "user"?, "pii"?: [{"type", "value"}], "secrets"?: [{"value",
//! "rule"?}], "unsafe"?: [category], "dup_group"?}`. Gold spans are matched by value: a span leaks when its
//! value still appears verbatim in an admitted sample, whatever curation did to the text around it.

use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::ExperimentError;
use crate::message::{ChatMessage, Origin, Provenance, Role, Sample, SampleContent};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldSpan {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
    /// Offsets as the source data set gives them; kept for reference, matching is by value.
    #[serde(default)]
    pub start: Option<usize>,
    #[serde(default)]
    pub end: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldSecret {
    pub value: String,
    #[serde(default)]
    pub rule: Option<String>,
}

/// One line of the stream file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub id: String,
    #[serde(default = "default_user")]
    pub user: String,
    pub prompt: String,
    #[serde(default)]
    pub response: String,
    #[serde(default)]
    pub pii: Vec<GoldSpan>,
    #[serde(default)]
    pub secrets: Vec<GoldSecret>,
    #[serde(default, rename = "unsafe")]
    pub unsafe_labels: Vec<String>,
    #[serde(default)]
    pub dup_group: Option<String>,
}

fn default_user() -> String {
    "experiment".to_owned()
}

/// Fixed creation times, so nothing a variant sees depends on the clock of the run.
const EPOCH_MS: u64 = 1_767_225_600_000;

impl Record {
    /// The sample curation sees: a grounded SFT pair, as capture would emit it.
    pub fn sample(&self, index: usize) -> Arc<Sample> {
        Arc::new(Sample {
            id: self.id.clone(),
            user: self.user.clone(),
            origin: Origin::Grounded,
            content: SampleContent::Sft {
                prompt: vec![ChatMessage::new(Role::User, self.prompt.clone())],
                response: self.response.clone(),
            },
            provenance: Provenance {
                sources: vec![self.id.clone()],
                steps: Vec::new(),
            },
            created_at_unix_ms: EPOCH_MS + index as u64,
        })
    }
}

/// Reads every record, naming the line of the first that does not parse.
pub fn read(path: &Path, limit: Option<usize>) -> Result<Vec<Record>, ExperimentError> {
    let io = |source| ExperimentError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut records = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|n| records.len() >= n) {
            break;
        }
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let stream_err = |col: usize, message: String| ExperimentError::Stream {
            file: path.to_path_buf(),
            line: i + 1,
            col,
            message,
        };
        let record: Record =
            serde_json::from_str(&line).map_err(|e| stream_err(e.column(), e.to_string()))?;
        if !ids.insert(record.id.clone()) {
            return Err(stream_err(1, format!("id `{}` is used twice", record.id)));
        }
        records.push(record);
    }
    if records.is_empty() {
        return Err(ExperimentError::Stream {
            file: path.to_path_buf(),
            line: 1,
            col: 1,
            message: "the stream has no records".to_owned(),
        });
    }
    Ok(records)
}

/// The replay order for one repeat: file order, or a seeded shuffle (Fisher–Yates over SplitMix64, so the
/// order depends on the seed alone, not on a library's generator).
pub fn order(n: usize, shuffle: bool, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for i in (1..n).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            idx.swap(i, j);
        }
    }
    idx
}
