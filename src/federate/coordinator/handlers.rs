//! The HTTP endpoints: signed pushes of updates, long-polls for aggregates, loss reports, topology and
//! metrics.

use std::collections::VecDeque;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

use super::finalize::{arm_timer, tracing_log, try_finalize, validate_update};
use super::settings::aggregation_name;
use super::state::{RoundSummary, blob_path, persist_state};
use super::{Shared, now_ms};
use crate::federate::hmac_auth::{
    self, AuthError, HEADER_NONCE, HEADER_SIG, HEADER_TS, HEADER_WORKER, SignedRequest,
};
use crate::files::atomic_write;

fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn unauthorized(e: &AuthError) -> Box<HttpResponse> {
    metrics::counter!("hearth_federate_auth_failures_total", "reason" => e.reason()).increment(1);
    Box::new(
        HttpResponse::Unauthorized()
            .insert_header(("X-Hearth-Auth-Error", e.reason()))
            .finish(),
    )
}

/// Verifies the signature, then the replay cache; returns the authenticated worker.
/// The error side is boxed: an `HttpResponse` is large and this is the cold path.
fn authenticate(sh: &Shared, req: &HttpRequest, body: &[u8]) -> Result<String, Box<HttpResponse>> {
    let worker = header(req, HEADER_WORKER)
        .ok_or_else(|| unauthorized(&AuthError::Header(HEADER_WORKER)))?;
    let secret = sh
        .cfg
        .secrets
        .get(worker)
        .filter(|_| sh.cfg.workers.iter().any(|w| w == worker))
        .ok_or_else(|| unauthorized(&AuthError::UnknownWorker))?;
    let sreq = SignedRequest {
        method: req.method().as_str(),
        path: req.path(),
        ts: header(req, HEADER_TS).ok_or_else(|| unauthorized(&AuthError::Header(HEADER_TS)))?,
        sig: header(req, HEADER_SIG).ok_or_else(|| unauthorized(&AuthError::Header(HEADER_SIG)))?,
        nonce: header(req, HEADER_NONCE),
        body,
    };
    let now = hmac_auth::unix_now();
    let sig =
        hmac_auth::verify(secret, &sreq, now, sh.cfg.skew_secs).map_err(|e| unauthorized(&e))?;
    let ts: i64 = sreq.ts.trim().parse().unwrap_or(now);
    sh.replay
        .check_and_insert(sig, ts + sh.cfg.skew_secs, now)
        .map_err(|e| unauthorized(&e))?;
    Ok(worker.to_owned())
}

fn json_err(status: StatusCode, msg: &str, extra: serde_json::Value) -> HttpResponse {
    metrics::counter!("hearth_federate_rejected_total", "status" => status.as_u16().to_string())
        .increment(1);
    let mut v = serde_json::json!({"ok": false, "error": msg});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    HttpResponse::build(status).json(v)
}

pub(super) async fn put_update(
    sh: web::Data<Arc<Shared>>,
    req: HttpRequest,
    path: web::Path<(u64, String)>,
    body: web::Bytes,
) -> HttpResponse {
    let (round, name) = path.into_inner();
    let worker = match authenticate(&sh, &req, &body) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    if worker != name {
        metrics::counter!("hearth_federate_auth_failures_total", "reason" => "impersonation")
            .increment(1);
        return HttpResponse::Forbidden().finish();
    }
    let layout = match validate_update(sh.cfg.mode, sh.cfg.exact_lora, &body) {
        Ok(l) => l,
        Err(e) => {
            return json_err(
                StatusCode::UNPROCESSABLE_ENTITY,
                &e.to_string(),
                serde_json::json!({}),
            );
        }
    };
    let arm = {
        let mut st = sh.lock();
        let cur = st.current_round;
        let closed = st
            .rounds
            .get(&round)
            .is_some_and(|r| r.aggregate.is_some() || r.finalizing || r.failed.is_some());
        if round < cur || closed || round > cur + 1 {
            return json_err(
                StatusCode::CONFLICT,
                "round not open",
                serde_json::json!({"current_round": cur}),
            );
        }
        let r = st.rounds.entry(round).or_default();
        if let Some(l) = &r.layout
            && *l != layout
        {
            return json_err(
                StatusCode::UNPROCESSABLE_ENTITY,
                "tensor layout differs from this round's",
                serde_json::json!({}),
            );
        }
        let first = r.arrivals.is_empty();
        if first {
            r.opened_at_ms = now_ms();
            r.layout = Some(layout);
        }
        if let Some(dir) = &sh.cfg.state_dir
            && let Err(e) = atomic_write(&blob_path(dir, round, &worker), &body)
        {
            tracing_log(&format!("persist update: {e}"));
            return json_err(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot persist",
                serde_json::json!({}),
            );
        }
        r.arrivals.insert(worker.clone(), body.clone());
        let deadline = sh.deadline_ms(r);
        if let Err(e) = persist_state(&sh, &st) {
            tracing_log(&e.to_string());
        }
        first.then_some(deadline)
    };
    metrics::counter!("hearth_federate_updates_total").increment(1);
    metrics::counter!("hearth_federate_update_bytes_total").increment(body.len() as u64);
    if let Some(d) = arm {
        arm_timer(&sh, round, d);
    }
    try_finalize(sh.get_ref().clone(), round).await;
    HttpResponse::Ok().json(serde_json::json!({"ok": true}))
}

pub(super) async fn get_aggregate(
    sh: web::Data<Arc<Shared>>,
    req: HttpRequest,
    path: web::Path<u64>,
) -> HttpResponse {
    let round = path.into_inner();
    if let Err(r) = authenticate(&sh, &req, b"") {
        return *r;
    }
    let hold_until = std::time::Instant::now() + sh.cfg.long_poll;
    loop {
        let seen = sh.signal.current();
        let overdue = {
            let st = sh.lock();
            match st.rounds.get(&round) {
                Some(r) if r.aggregate.is_some() => {
                    let b = r.aggregate.clone().unwrap_or_default();
                    return HttpResponse::Ok()
                        .content_type("application/octet-stream")
                        .body(b);
                }
                Some(r) if r.failed.is_some() => {
                    let msg = r.failed.clone().unwrap_or_default();
                    return json_err(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &msg,
                        serde_json::json!({}),
                    );
                }
                Some(r) => !r.finalizing && !r.arrivals.is_empty() && now_ms() >= sh.deadline_ms(r),
                None if round < st.current_round => {
                    return json_err(StatusCode::GONE, "round expired", serde_json::json!({}));
                }
                None => false,
            }
        };
        if overdue {
            try_finalize(sh.get_ref().clone(), round).await;
            if sh.signal.current() != seen {
                continue;
            }
        }
        let left = hold_until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", "0"))
                .json(serde_json::json!({"ok": false, "error": "not ready"}));
        }
        let _ = actix_web::rt::time::timeout(left, sh.signal.changed(seen)).await;
    }
}

#[derive(serde::Deserialize)]
struct EndBody {
    loss: f64,
    step: u64,
}

pub(super) async fn post_end(
    sh: web::Data<Arc<Shared>>,
    req: HttpRequest,
    path: web::Path<u64>,
    body: web::Bytes,
) -> HttpResponse {
    let round = path.into_inner();
    let worker = match authenticate(&sh, &req, &body) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    let Ok(end) = serde_json::from_slice::<EndBody>(&body) else {
        return json_err(
            StatusCode::BAD_REQUEST,
            "expected {\"loss\": float, \"step\": int}",
            serde_json::json!({}),
        );
    };
    let mut st = sh.lock();
    if let Some(r) = st.rounds.get_mut(&round) {
        r.summary.losses.insert(worker, (end.loss, end.step));
    }
    metrics::gauge!("hearth_federate_last_loss").set(end.loss);
    HttpResponse::Ok().json(serde_json::json!({"ok": true}))
}

pub(super) async fn topology(sh: web::Data<Arc<Shared>>) -> HttpResponse {
    let c = &sh.cfg;
    let weights: serde_json::Value = match &c.data_weights {
        Some(w) => serde_json::to_value(w).unwrap_or_default(),
        None => {
            let n = c.workers.len() as f64;
            c.workers
                .iter()
                .map(|w| (w.clone(), serde_json::json!(1.0 / n)))
                .collect()
        }
    };
    HttpResponse::Ok().json(serde_json::json!({
        "workers": c.workers,
        "data_weights": weights,
        "expert_pins": c.expert_pins,
        "aggregation": aggregation_name(c.aggregation),
        "sync_interval_steps": c.sync_interval_steps,
    }))
}

pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"ok": true}))
}

pub(super) async fn recent(sh: web::Data<Arc<Shared>>) -> HttpResponse {
    let st = sh.lock();
    let rounds: VecDeque<&RoundSummary> = st
        .rounds
        .values()
        .filter(|r| r.aggregate.is_some())
        .map(|r| &r.summary)
        .collect();
    HttpResponse::Ok()
        .json(serde_json::json!({"current_round": st.current_round, "rounds": rounds}))
}
