//! Round state, and its persistence: `state.json` plus one blob per arrival and per aggregate, so that a
//! restarted coordinator resumes mid-round.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use actix_web::web;

use super::finalize::validate_update;
use super::{CoordinatorConfig, CoordinatorError, Shared};
use crate::federate::hmac_auth;
use crate::files::atomic_write;

/// One round's summary, kept for `/v1/metrics` and persisted.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RoundSummary {
    pub round: u64,
    pub included: Vec<String>,
    pub missing: Vec<String>,
    pub aggregate_ms: f64,
    pub bytes: usize,
    pub timed_out: bool,
    pub lora_max_residual: Option<f64>,
    pub losses: BTreeMap<String, (f64, u64)>,
}

#[derive(Default)]
pub(super) struct Round {
    pub(super) opened_at_ms: i64,
    pub(super) arrivals: BTreeMap<String, web::Bytes>,
    pub(super) layout: Option<Vec<(String, Vec<usize>)>>,
    pub(super) finalizing: bool,
    /// Aggregation failed; the round is closed and its GETs answer 500 (no retry loop).
    pub(super) failed: Option<String>,
    pub(super) aggregate: Option<web::Bytes>,
    pub(super) summary: RoundSummary,
}

#[derive(Default)]
pub(super) struct State {
    /// Lowest round still accepting pushes.
    pub(super) current_round: u64,
    pub(super) rounds: BTreeMap<u64, Round>,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Persisted {
    current_round: u64,
    rounds: Vec<PersistedRound>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct PersistedRound {
    id: u64,
    opened_at_ms: i64,
    arrivals: Vec<String>,
    finalized: bool,
    summary: RoundSummary,
}

pub(super) fn round_dir(base: &Path, id: u64) -> PathBuf {
    base.join(format!("round-{id}"))
}

/// Worker names become file names hex-encoded, so no name can escape the directory.
pub(super) fn blob_path(base: &Path, id: u64, worker: &str) -> PathBuf {
    round_dir(base, id).join(format!("{}.blob", hmac_auth::to_hex(worker.as_bytes())))
}

pub(super) fn persist_state(sh: &Shared, st: &State) -> Result<(), CoordinatorError> {
    let Some(dir) = &sh.cfg.state_dir else {
        return Ok(());
    };
    let p = Persisted {
        current_round: st.current_round,
        rounds: st
            .rounds
            .iter()
            .map(|(&id, r)| PersistedRound {
                id,
                opened_at_ms: r.opened_at_ms,
                arrivals: r.arrivals.keys().cloned().collect(),
                finalized: r.aggregate.is_some(),
                summary: r.summary.clone(),
            })
            .collect(),
    };
    let bytes =
        serde_json::to_vec_pretty(&p).map_err(|e| CoordinatorError::State(e.to_string()))?;
    atomic_write(&dir.join("state.json"), &bytes)
        .map_err(|e| CoordinatorError::State(e.to_string()))
}

pub(super) fn load_state(cfg: &CoordinatorConfig) -> Result<State, CoordinatorError> {
    let Some(dir) = &cfg.state_dir else {
        return Ok(State::default());
    };
    let path = dir.join("state.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(e) => return Err(CoordinatorError::State(format!("{}: {e}", path.display()))),
    };
    let p: Persisted =
        serde_json::from_slice(&bytes).map_err(|e| CoordinatorError::State(e.to_string()))?;
    let mut st = State {
        current_round: p.current_round,
        rounds: BTreeMap::new(),
    };
    for pr in p.rounds {
        let mut r = Round {
            opened_at_ms: pr.opened_at_ms,
            summary: pr.summary,
            ..Round::default()
        };
        if pr.finalized {
            let b = std::fs::read(round_dir(dir, pr.id).join("aggregate.blob"))
                .map_err(|e| CoordinatorError::State(format!("round {} aggregate: {e}", pr.id)))?;
            r.aggregate = Some(web::Bytes::from(b));
        } else {
            for w in pr.arrivals {
                let b = std::fs::read(blob_path(dir, pr.id, &w)).map_err(|e| {
                    CoordinatorError::State(format!("round {} worker {w}: {e}", pr.id))
                })?;
                let layout = validate_update(cfg.mode, cfg.exact_lora, &b)
                    .map_err(|e| CoordinatorError::State(e.to_string()))?;
                r.layout.get_or_insert(layout);
                r.arrivals.insert(w, web::Bytes::from(b));
            }
        }
        st.rounds.insert(pr.id, r);
    }
    Ok(st)
}
