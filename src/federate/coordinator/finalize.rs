//! Closing a round: each update checked as it arrives, the aggregate computed once every worker has pushed or
//! the deadline has passed with a quorum, and the timer that wakes a round at its deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web;

use super::state::{blob_path, persist_state, round_dir};
use super::{CoordinatorConfig, ExactLora, Shared, now_ms};
use crate::federate::aggregate;
use crate::federate::lora::{self, ExactOptions};
use crate::federate::wire::{self, Delta, Rounding, WireMode};
use crate::files::atomic_write;

/// Decodes and checks an update; returns its layout. With exact LoRA aggregation every pair must have the
/// configured rank, so a hostile worker cannot make the re-factoring SVD arbitrarily large.
pub(super) fn validate_update(
    mode: WireMode,
    exact: Option<ExactLora>,
    body: &[u8],
) -> Result<Vec<(String, Vec<usize>)>, wire::WireError> {
    let d: Delta = wire::decode(mode, body)?;
    if let Some(x) = exact {
        for p in lora::find_lora_pairs(&d) {
            let (a, b) = (&d[p.a], &d[p.b]);
            let ok = a.shape.len() == 2
                && b.shape.len() == 2
                && a.shape[0] == x.rank
                && b.shape[1] == x.rank;
            if !ok {
                return Err(wire::WireError::BadTensor {
                    name: p.module,
                    reason: format!(
                        "LoRA shapes {:?} {:?} do not have rank {}",
                        a.shape, b.shape, x.rank
                    ),
                });
            }
        }
    }
    if mode == WireMode::Gym && wire::decode_gym_view(body)?.flat.is_none() {
        return Err(wire::WireError::BadTensor {
            name: "*".into(),
            reason: "tensors not back to back".into(),
        });
    }
    Ok(d.into_iter().map(|t| (t.name, t.shape)).collect())
}

fn compute_aggregate(
    cfg: &CoordinatorConfig,
    names: &[String],
    blobs: &[web::Bytes],
) -> Result<(Vec<u8>, Option<f64>), String> {
    let weights: Option<Vec<f32>> = cfg.data_weights.as_ref().map(|dw| {
        let n = names.len() as f64;
        names
            .iter()
            .map(|w| dw.get(w).copied().unwrap_or(1.0 / n) as f32)
            .collect()
    });
    match cfg.mode {
        WireMode::Gym => {
            let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_ref()).collect();
            aggregate::aggregate_gym_blobs(
                &refs,
                weights.as_deref(),
                cfg.aggregation,
                Rounding::Truncate,
                cfg.threads,
            )
            .map(|b| (b, None))
            .map_err(|e| e.to_string())
        }
        WireMode::Native => {
            let deltas = blobs
                .iter()
                .map(|b| wire::decode_safetensors(b))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let (agg, residual) = match cfg.exact_lora {
                Some(x) => {
                    let (d, reps) = lora::aggregate_exact(
                        &deltas,
                        weights.as_deref(),
                        ExactOptions {
                            scale: x.scale,
                            rank: x.rank,
                            method: cfg.aggregation,
                            seed: 0x5eed,
                            threads: cfg.threads,
                        },
                    )
                    .map_err(|e| e.to_string())?;
                    let worst = reps.iter().map(|r| r.rel_residual).fold(0.0, f64::max);
                    (d, Some(worst))
                }
                None => (
                    aggregate::aggregate_deltas(
                        &deltas,
                        weights.as_deref(),
                        cfg.aggregation,
                        cfg.threads,
                    )
                    .map_err(|e| e.to_string())?,
                    None,
                ),
            };
            let meta = residual.map(|r| {
                HashMap::from([("hearth.lora_max_residual".to_owned(), format!("{r:.6e}"))])
            });
            wire::encode_safetensors(&agg, Rounding::NearestEven, meta)
                .map(|b| (b, residual))
                .map_err(|e| e.to_string())
        }
    }
}

/// Closes `round` if every expected worker arrived, or the deadline passed with a quorum.
pub(super) async fn try_finalize(sh: Arc<Shared>, round: u64) {
    let job = {
        let mut st = sh.lock();
        let deadline = st.rounds.get(&round).map(|r| sh.deadline_ms(r));
        let Some(r) = st.rounds.get_mut(&round) else {
            return;
        };
        if r.aggregate.is_some() || r.finalizing || r.failed.is_some() || r.arrivals.is_empty() {
            return;
        }
        let all = sh.cfg.workers.iter().all(|w| r.arrivals.contains_key(w));
        let due = now_ms() >= deadline.unwrap_or(i64::MAX);
        if !(all || (due && r.arrivals.len() >= sh.cfg.quorum)) {
            return;
        }
        r.finalizing = true;
        let names: Vec<String> = r.arrivals.keys().cloned().collect();
        let blobs: Vec<web::Bytes> = r.arrivals.values().cloned().collect();
        (names, blobs, !all)
    };
    let (names, blobs, timed_out) = job;
    let sh2 = sh.clone();
    let names2 = names.clone();
    let t0 = std::time::Instant::now();
    let res = web::block(move || compute_aggregate(&sh2.cfg, &names2, &blobs)).await;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    {
        let mut st = sh.lock();
        let Some(r) = st.rounds.get_mut(&round) else {
            return;
        };
        r.finalizing = false;
        match res {
            Ok(Ok((blob, residual))) => {
                if let Some(dir) = &sh.cfg.state_dir
                    && let Err(e) =
                        atomic_write(&round_dir(dir, round).join("aggregate.blob"), &blob)
                {
                    tracing_log(&format!("round {round}: cannot persist aggregate: {e}"));
                }
                r.summary.round = round;
                r.summary.included = names.clone();
                r.summary.missing = sh
                    .cfg
                    .workers
                    .iter()
                    .filter(|w| !names.contains(w))
                    .cloned()
                    .collect();
                r.summary.aggregate_ms = ms;
                r.summary.bytes = blob.len();
                r.summary.timed_out = timed_out;
                r.summary.lora_max_residual = residual;
                r.aggregate = Some(web::Bytes::from(blob));
                r.arrivals.clear();
                metrics::counter!("hearth_federate_rounds_total").increment(1);
                metrics::gauge!("hearth_federate_round_participants").set(names.len() as f64);
                metrics::histogram!("hearth_federate_aggregate_seconds").record(ms / 1e3);
                if timed_out {
                    metrics::counter!("hearth_federate_rounds_timed_out_total").increment(1);
                }
                if let Some(res) = residual {
                    metrics::gauge!("hearth_federate_lora_residual").set(res);
                }
                st.current_round = st.current_round.max(round + 1);
                let keep = sh.cfg.keep_rounds.max(1) as u64;
                let cur = st.current_round;
                let old: Vec<u64> = st
                    .rounds
                    .keys()
                    .copied()
                    .filter(|&id| id + keep < cur)
                    .collect();
                for id in old {
                    st.rounds.remove(&id);
                    if let Some(dir) = &sh.cfg.state_dir {
                        let _ = std::fs::remove_dir_all(round_dir(dir, id));
                    }
                }
                if let Some(dir) = &sh.cfg.state_dir {
                    // Blobs of a closed round are no longer needed.
                    for w in &names {
                        let _ = std::fs::remove_file(blob_path(dir, round, w));
                    }
                }
                if let Err(e) = persist_state(&sh, &st) {
                    tracing_log(&format!("round {round}: {e}"));
                }
            }
            Ok(Err(e)) => {
                tracing_log(&format!("round {round}: aggregation failed: {e}"));
                r.failed = Some(e);
                st.current_round = st.current_round.max(round + 1);
            }
            Err(e) => {
                tracing_log(&format!("round {round}: aggregation task failed: {e}"));
                r.failed = Some(e.to_string());
                st.current_round = st.current_round.max(round + 1);
            }
        }
    }
    sh.signal.notify_all();
}

pub(super) fn tracing_log(msg: &str) {
    metrics::counter!("hearth_federate_errors_total").increment(1);
    eprintln!("hearth::federate: {msg}");
}

/// Arms the deadline timer of a round (no polling: one sleep per round).
pub(super) fn arm_timer(sh: &Arc<Shared>, round: u64, deadline_ms: i64) {
    let sh = sh.clone();
    let wait = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64 + 5);
    actix_web::rt::spawn(async move {
        actix_web::rt::time::sleep(wait).await;
        try_finalize(sh, round).await;
    });
}
