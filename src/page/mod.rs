//! The status page the control port serves at `GET /`: the live graph, curation decisions over time, each
//! training cycle's loss curve, the gate's history with a rollback button, what is served and the privacy
//! check. Rendered on the server as HTML with inline SVG, from assets compiled into the binary, so viewing it
//! fetches nothing from anywhere but this server.
//!
//! The graph is drawn here (boxes and edges need a layout, not a plot); the charts are drawn by `plotters`'
//! SVG backend.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use plotters::prelude::*;

use crate::engine::edge::EdgeSnapshot;
use crate::engine::runtime::{NodeSnapshot, NodeState, StatusSnapshot};
use crate::report::Report;
use crate::store::{CurationTimeline, DeltaRecord, DeltaStatus, ServedState, Store, StoreError};

const TEMPLATE: &str = include_str!("page.html");
const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// Where the page reads what the store knows: the run's data directory, and the planted values the privacy
/// check looks for in the training set (as in the run report).
#[derive(Debug, Clone)]
pub struct PageSource {
    pub data_dir: PathBuf,
    pub planted: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("drawing a chart: {0}")]
    Plot(String),
}

fn plot_err<E: std::fmt::Display>(e: E) -> PageError {
    PageError::Plot(e.to_string())
}

/// Escapes text for HTML element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The whole page. `view` is the data ([`render_view`]); `None` when a key is set: the page then carries no
/// data and asks for the key, keeps it in the tab's `sessionStorage`, and fetches the view with it.
pub fn render_page(view: Option<&str>) -> String {
    TEMPLATE
        .replace("{{STYLE}}", STYLE)
        .replace("{{SCRIPT}}", SCRIPT)
        .replace("{{KEYED}}", if view.is_some() { "false" } else { "true" })
        .replace(
            "{{LOGIN_HIDDEN}}",
            if view.is_some() { " hidden" } else { "" },
        )
        .replace("{{VIEW}}", view.unwrap_or(""))
}

/// The data part of the page (also served alone at `GET /page/view`, which the page's script refreshes).
pub fn render_view(
    status: &StatusSnapshot,
    source: Option<&PageSource>,
) -> Result<String, PageError> {
    let mut out = String::new();
    let store = match source {
        Some(s) if s.data_dir.join(Store::FILE_NAME).exists() => {
            Some((Store::open(&s.data_dir)?, s))
        }
        _ => None,
    };
    let served = store.as_ref().map(|(st, _)| st.served()).transpose()?;
    let _ = write!(
        out,
        "<header><h1>hearth · {}</h1><p>up {} · serving <b id=\"served\">{}</b></p></header>",
        esc(&status.graph),
        duration(status.uptime_seconds),
        esc(&served_name(served.as_ref()))
    );
    out.push_str("<section><h2>Graph</h2>");
    out.push_str(&graph_svg(status));
    out.push_str(
        "<p class=\"note\">Box: node and state (green running, amber restarting or erroring, red failed, grey \
         finished). Edge: queue fill (depth / capacity) and drops.</p></section>",
    );
    let Some((store, source)) = store else {
        out.push_str(
            "<section><p class=\"note\">No store in this run's data directory yet: curation, training and the \
             gate appear once the graph has written one.</p></section>",
        );
        return Ok(out);
    };
    let report = Report::build(&store, &source.planted)?;
    let timeline = store.curation_timeline(60)?;
    out.push_str("<section><h2>Curation decisions over time</h2>");
    let c = &report.curation;
    let _ = write!(
        out,
        "<p>{} interactions, {} feedback · admitted {} · dropped {} · quarantined {} · pending {} · training set {}</p>",
        c.interactions,
        c.feedback,
        c.admitted,
        c.dropped,
        c.quarantined,
        c.pending,
        report.training_set
    );
    if timeline.series.is_empty() {
        out.push_str("<p class=\"note\">No decisions yet.</p>");
    } else {
        out.push_str("<figure class=\"chart curation\">");
        out.push_str(&timeline_svg(&timeline)?);
        out.push_str("</figure>");
    }
    out.push_str("</section>");
    let deltas = store.deltas()?;
    out.push_str(&cycles_html(&deltas)?);
    out.push_str(&gate_html(&deltas, served.as_ref()));
    out.push_str(&users_html(&report));
    out.push_str(&privacy_html(&report));
    Ok(out)
}

fn served_name(served: Option<&ServedState>) -> String {
    match served.and_then(|s| s.delta_id.as_deref()) {
        Some(id) => format!("delta {id}"),
        None => "the base alone".to_owned(),
    }
}

fn duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s / 60 % 60),
    }
}

/// `YYYY-MM-DD HH:MM:SS` UTC of Unix milliseconds.
fn utc(ms: u64) -> String {
    crate::clock::utc_datetime(ms)
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(46, 125, 50),
    RGBColor(198, 40, 40),
    RGBColor(239, 108, 0),
    RGBColor(21, 101, 192),
    RGBColor(106, 27, 154),
    RGBColor(0, 131, 143),
    RGBColor(121, 85, 72),
    RGBColor(97, 97, 97),
];

/// A line chart: one line per `(label, points)`, a legend when there is more than one.
fn line_chart(
    size: (u32, u32),
    lines: &[(String, Vec<(f64, f64)>)],
    x_desc: &str,
    y_desc: &str,
    from_zero: bool,
) -> Result<String, PageError> {
    let points = lines.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.08).max(1e-3);
    let (y0, y1) = if from_zero {
        (0.0, y1.max(1.0) * 1.1)
    } else {
        (y0 - pad, y1 + pad)
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(48)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(6)
            .y_labels(5)
            .label_style(("sans-serif", 11))
            .light_line_style(RGBColor(245, 245, 245))
            .draw()
            .map_err(plot_err)?;
        for (i, (label, pts)) in lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
                });
            // A line of one or two points hardly shows: mark them.
            if pts.len() <= 2 {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                    .map_err(plot_err)?;
            }
        }
        if lines.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font(("sans-serif", 11))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .draw()
                .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Decisions per time bucket: `admitted`, then the most frequent `node: reason` series (the rest summed as
/// `other`, so the legend stays readable).
fn timeline_svg(t: &CurationTimeline) -> Result<String, PageError> {
    const SHOWN: usize = 6;
    let minutes = |i: usize| (i as f64 * t.bucket_ms as f64) / 60_000.0;
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut other: Option<Vec<u64>> = None;
    for (i, (label, counts)) in t.series.iter().enumerate() {
        if i < SHOWN {
            let pts = counts
                .iter()
                .enumerate()
                .map(|(j, &c)| (minutes(j), c as f64))
                .collect();
            lines.push((label.clone(), pts));
        } else {
            let sum = other.get_or_insert_with(|| vec![0; counts.len()]);
            for (s, c) in sum.iter_mut().zip(counts) {
                *s += c;
            }
        }
    }
    if let Some(sum) = other {
        let pts = sum
            .iter()
            .enumerate()
            .map(|(j, &c)| (minutes(j), c as f64))
            .collect();
        lines.push(("other".to_owned(), pts));
    }
    line_chart(
        (760, 260),
        &lines,
        &format!(
            "minutes since {} UTC ({} s per point)",
            utc(t.start_unix_ms),
            t.bucket_ms / 1000
        ),
        "items",
        true,
    )
}

/// The per-step training losses a delta's provenance carries (the trainer's cycle report).
pub fn losses(d: &DeltaRecord) -> Vec<(f64, f64)> {
    d.provenance["metrics"]["losses"]
        .as_array()
        .map(|a| {
            a.iter()
                .enumerate()
                .filter_map(|(i, l)| {
                    l.as_f64()
                        .filter(|l| l.is_finite())
                        .map(|l| ((i + 1) as f64, l))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One loss curve per training cycle, newest first (at most 8).
fn cycles_html(deltas: &[DeltaRecord]) -> Result<String, PageError> {
    let mut out = String::from("<section><h2>Training cycles</h2>");
    let trained: Vec<&DeltaRecord> = deltas
        .iter()
        .rev()
        .filter(|d| !losses(d).is_empty())
        .take(8)
        .collect();
    if trained.is_empty() {
        out.push_str("<p class=\"note\">No training cycle has finished yet.</p>");
    }
    out.push_str("<div class=\"cycles\">");
    for d in trained {
        let pts = losses(d);
        let m = &d.provenance["metrics"];
        let _ = write!(
            out,
            "<figure class=\"chart loss\" data-delta=\"{}\"><figcaption><b>{}</b> · {} · {} samples · {} steps \
             · loss {:.3} → {:.3}</figcaption>",
            esc(&d.id),
            esc(short(&d.id)),
            utc(d.created_at_unix_ms),
            d.provenance["num_samples"].as_u64().unwrap_or(0),
            m["steps"].as_u64().unwrap_or(pts.len() as u64),
            pts.first().map_or(f64::NAN, |p| p.1),
            pts.last().map_or(f64::NAN, |p| p.1),
        );
        out.push_str(&line_chart(
            (380, 190),
            &[("loss".to_owned(), pts)],
            "step",
            "loss",
            false,
        )?);
        out.push_str("</figure>");
    }
    out.push_str("</div></section>");
    Ok(out)
}

fn status_class(s: DeltaStatus) -> &'static str {
    match s {
        DeltaStatus::Promoted => "ok",
        DeltaStatus::Rejected => "bad",
        DeltaStatus::RolledBack => "warn",
        DeltaStatus::Candidate => "idle",
    }
}

/// Every delta, newest first, with its legs and verdict; the rollback button.
fn gate_html(deltas: &[DeltaRecord], served: Option<&ServedState>) -> String {
    let mut out = String::from("<section><h2>The gate</h2>");
    let _ = write!(
        out,
        "<p>Serving <b>{}</b>. <button type=\"button\" id=\"rollback\" data-action=\"rollback\"{}>Roll back</button> \
         restores the state served before this one, as <code>hearth deltas rollback</code> does; the serve node \
         follows within a second.</p>",
        esc(&served_name(served)),
        if served.is_some_and(|s| s.seq.is_some()) {
            ""
        } else {
            " disabled"
        }
    );
    if deltas.is_empty() {
        out.push_str("<p class=\"note\">No delta yet.</p></section>");
        return out;
    }
    out.push_str(
        "<table class=\"gate\"><thead><tr><th>delta</th><th>trained</th><th>status</th><th>samples</th>\
         <th>gain</th><th>legs (served → candidate)</th><th>verdict</th></tr></thead><tbody>",
    );
    let served_id = served.and_then(|s| s.delta_id.as_deref());
    for d in deltas.iter().rev() {
        let verdict = d.verdict.as_ref();
        let gain = verdict.and_then(|v| v["personal_gain"].as_f64());
        let reason = verdict.and_then(|v| v["reason"].as_str()).unwrap_or("");
        let _ = write!(
            out,
            "<tr data-delta=\"{}\" data-status=\"{}\"><td><code title=\"{}\">{}</code>{}</td><td>{}</td>\
             <td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>",
            esc(&d.id),
            d.status.as_str(),
            esc(&d.id),
            esc(short(&d.id)),
            if served_id == Some(d.id.as_str()) {
                " <b class=\"ok\">served</b>"
            } else {
                ""
            },
            utc(d.created_at_unix_ms),
            status_class(d.status),
            d.status.as_str(),
            d.provenance["num_samples"].as_u64().unwrap_or(0),
            gain.map_or("–".to_owned(), |g| format!("{g:+.4}")),
        );
        for l in &d.legs {
            let _ = write!(
                out,
                "<span class=\"leg {}\" title=\"tolerance {}\">{} {} {:.4} → {:.4}</span> ",
                if l.passed { "ok" } else { "bad" },
                l.tolerance,
                if l.passed { "✓" } else { "✗" },
                esc(&l.leg),
                l.baseline,
                l.candidate
            );
        }
        if d.legs.is_empty() {
            out.push_str("<span class=\"note\">awaiting the gate</span>");
        }
        let _ = write!(out, "</td><td>{}</td></tr>", esc(reason));
    }
    out.push_str("</tbody></table></section>");
    out
}

/// Each user with deltas of their own: what they are served, with a rollback button for their chain; then the
/// newest route-or-merge decision.
fn users_html(r: &Report) -> String {
    if r.users.is_empty() && r.reconciliation.is_none() {
        return String::new();
    }
    let mut out = String::from(
        "<section><h2>Per-user deltas</h2><table class=\"users\"><thead><tr><th>user</th><th>served</th>\
         <th>gain</th><th>own deltas (promoted, rejected)</th><th>samples</th><th></th></tr></thead><tbody>",
    );
    for u in &r.users {
        let _ = write!(
            out,
            "<tr data-user=\"{}\"><td>{}</td><td>{}{}</td><td>{}</td><td>{} ({}, {})</td><td>{}</td><td>\
             <button type=\"button\" data-action=\"rollback\" data-user=\"{}\"{}>Roll back</button></td></tr>",
            esc(&u.user),
            esc(&u.user),
            u.served.as_deref().map_or(
                "<span class=\"note\">the common state</span>".to_owned(),
                |d| { format!("<code title=\"{}\">{}</code>", esc(d), esc(short(d))) }
            ),
            if u.merged_with.is_empty() {
                String::new()
            } else {
                format!(" merged: {}", esc(&u.merged_with.join(", ")))
            },
            u.personal_gain
                .map_or("–".to_owned(), |g| format!("{g:+.4}")),
            u.deltas,
            u.promoted,
            u.rejected,
            u.training_samples,
            esc(&u.user),
            if u.served.is_some() { "" } else { " disabled" },
        );
    }
    out.push_str("</tbody></table>");
    if let Some(rec) = &r.reconciliation {
        out.push_str("<h3>Route or merge</h3><ul class=\"reconcile\">");
        for l in crate::report::reconciliation_lines(rec) {
            let _ = write!(out, "<li>{}</li>", esc(&l));
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
    out
}

fn privacy_html(r: &Report) -> String {
    let clean = r.planted_in_training_set == 0 && r.promoted_canary_leaks == 0;
    let mut out = format!(
        "<section><h2>Privacy check</h2><p class=\"{}\" id=\"privacy\">{}</p><ul>",
        if clean { "ok" } else { "bad" },
        if clean {
            "✓ clean"
        } else {
            "✗ a planted value or canary got through"
        }
    );
    let _ = write!(
        out,
        "<li>planted personal values and secrets found in the training set: {} of {} checked{}</li>",
        r.planted_in_training_set,
        r.planted_checked,
        if r.planted_found_prefixes.is_empty() {
            String::new()
        } else {
            format!(" ({})", esc(&r.planted_found_prefixes.join(", ")))
        }
    );
    let _ = write!(
        out,
        "<li>largest canary exposure of a promoted delta: {}</li><li>canary leaks in promoted deltas' \
         completions: {}</li></ul></section>",
        r.max_promoted_canary_exposure_bits
            .map_or("–".to_owned(), |b| format!("{b:.2} bits")),
        r.promoted_canary_leaks
    );
    out
}

// ---- the graph ----

const BOX_W: f64 = 150.0;
const BOX_H: f64 = 62.0;
const COL: f64 = 250.0;
const ROW: f64 = 96.0;
const MARGIN: f64 = 24.0;

/// `from.port->to.port` as the engine names edges: the two node ids.
fn edge_ends(name: &str) -> Option<(&str, &str)> {
    let (from, to) = name.split_once("->")?;
    Some((
        from.rsplit_once('.')?.0.trim(),
        to.rsplit_once('.')?.0.trim(),
    ))
}

/// Columns by longest path from the sources (Kahn's order; a cycle, such as the feedback edge, is broken at
/// the waiting node that has the fewest inputs left), rows in the graph file's order.
fn layout(nodes: &[NodeSnapshot], edges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let n = nodes.len();
    let mut indeg = vec![0usize; n];
    for &(_, t) in edges {
        indeg[t] += 1;
    }
    let mut col = vec![0usize; n];
    let mut placed = vec![false; n];
    for _ in 0..n {
        let next = (0..n)
            .filter(|&v| !placed[v])
            .min_by_key(|&v| (indeg[v], v))
            .unwrap_or(0);
        placed[next] = true;
        col[next] = edges
            .iter()
            .filter(|&&(f, t)| t == next && placed[f] && f != next)
            .map(|&(f, _)| col[f] + 1)
            .max()
            .unwrap_or(0);
        for &(f, t) in edges {
            if f == next && !placed[t] {
                indeg[t] = indeg[t].saturating_sub(1);
            }
        }
    }
    let mut rows: HashMap<usize, usize> = HashMap::new();
    col.iter()
        .map(|&c| {
            let r = rows.entry(c).or_insert(0);
            *r += 1;
            (c, *r - 1)
        })
        .collect()
}

fn node_colours(n: &NodeSnapshot) -> (&'static str, &'static str) {
    match n.state {
        NodeState::Failed => ("#c62828", "#ffebee"),
        NodeState::Restarting => ("#ef6c00", "#fff3e0"),
        NodeState::Running if n.erroring => ("#ef6c00", "#fff3e0"),
        NodeState::Running => ("#2e7d32", "#e8f5e9"),
        NodeState::Finished => ("#616161", "#f5f5f5"),
    }
}

fn fill_colour(fill: f64) -> &'static str {
    if fill >= 0.9 {
        "#c62828"
    } else if fill >= 0.5 {
        "#ef6c00"
    } else {
        "#2e7d32"
    }
}

/// How an edge is drawn (see [`graph_svg`]); a lane's number counts away from the boxes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    Direct,
    Over(usize),
    Under(usize),
}

const LANE: f64 = 24.0;

/// From `(x1, y1)` straight to the lane at `y`, along it, and to `(x2, y2)`, with rounded corners.
fn lane_path(x1: f64, y1: f64, x2: f64, y2: f64, y: f64) -> String {
    let dx = if x2 >= x1 { 6.0 } else { -6.0 };
    let dy1 = if y < y1 { 6.0 } else { -6.0 };
    let dy2 = if y < y2 { 6.0 } else { -6.0 };
    format!(
        "M{x1},{y1} L{x1},{} Q{x1},{y} {},{y} L{},{y} Q{x2},{y} {x2},{} L{x2},{y2}",
        y + dy1,
        x1 + dx,
        x2 - dx,
        y + dy2
    )
}

/// The live graph as SVG: a box per node coloured by state, an arrow per edge with its queue fill and drops.
pub fn graph_svg(status: &StatusSnapshot) -> String {
    let index: HashMap<&str, usize> = status
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    let resolved: Vec<(usize, usize, &EdgeSnapshot)> = status
        .edges
        .iter()
        .filter_map(|e| {
            let (f, t) = edge_ends(&e.name)?;
            Some((*index.get(f)?, *index.get(t)?, e))
        })
        .collect();
    let pairs: Vec<(usize, usize)> = resolved.iter().map(|&(f, t, _)| (f, t)).collect();
    let pos = layout(&status.nodes, &pairs);
    let cols = pos.iter().map(|p| p.0).max().map_or(0, |c| c + 1);
    let rows = pos.iter().map(|p| p.1).max().map_or(0, |r| r + 1);
    // Routes: an edge to the next column in the same row is a short curve between the boxes; a feedback edge
    // (to the same or an earlier column) runs under the boxes, dashed; any other (skipping columns, changing
    // rows, or a second edge between the same two nodes) runs over them. Each of those gets its own lane.
    let mut seen: Vec<(usize, usize)> = Vec::new();
    let (mut over, mut under) = (0usize, 0usize);
    let routes: Vec<Route> = pairs
        .iter()
        .map(|&(f, t)| {
            let route = if pos[t].0 <= pos[f].0 {
                under += 1;
                Route::Under(under - 1)
            } else if pos[t].0 == pos[f].0 + 1 && pos[t].1 == pos[f].1 && !seen.contains(&(f, t)) {
                Route::Direct
            } else {
                over += 1;
                Route::Over(over - 1)
            };
            seen.push((f, t));
            route
        })
        .collect();
    let top = MARGIN + 14.0 + over as f64 * LANE;
    let xy = |i: usize| (MARGIN + pos[i].0 as f64 * COL, top + pos[i].1 as f64 * ROW);
    let under_lane =
        |k: usize| top + (rows.max(1) - 1) as f64 * ROW + BOX_H + 22.0 + k as f64 * LANE;
    let over_lane = |k: usize| top - 10.0 - k as f64 * LANE;
    let width = 2.0 * MARGIN + (cols.max(1) - 1) as f64 * COL + BOX_W;
    let height = under_lane(under) - LANE + 14.0 + MARGIN;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg id=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} {height}\" width=\"{width}\" \
         height=\"{height}\" role=\"img\" aria-label=\"the running graph\" font-family=\"sans-serif\">\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" \
         orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#555\"/></marker></defs>"
    );
    for (&(f, t, e), route) in resolved.iter().zip(&routes) {
        let (fx, fy) = xy(f);
        let (tx, ty) = xy(t);
        // The engine counts sends and receives in batches, so the depth it derives from them can run past the
        // capacity for a moment; a bounded queue never holds more.
        let depth = if e.capacity == 0 {
            e.depth
        } else {
            e.depth.min(e.capacity)
        };
        let fill = if e.capacity == 0 {
            0.0
        } else {
            depth as f64 / e.capacity as f64
        };
        let (path, lx, ly) = match *route {
            Route::Direct => {
                let (x1, y1, x2, y2) = (fx + BOX_W, fy + BOX_H / 2.0, tx - 2.0, ty + BOX_H / 2.0);
                let mid = (x1 + x2) / 2.0;
                (
                    format!("M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"),
                    mid,
                    (y1 + y2) / 2.0 - 8.0,
                )
            }
            Route::Over(k) => {
                let (x1, x2, y) = (
                    fx + BOX_W / 2.0 + 12.0,
                    tx + BOX_W / 2.0 - 12.0,
                    over_lane(k),
                );
                (lane_path(x1, fy, x2, ty - 2.0, y), (x1 + x2) / 2.0, y)
            }
            Route::Under(k) => {
                let (x1, x2, y) = (
                    fx + BOX_W / 2.0 - 12.0,
                    tx + BOX_W / 2.0 + 12.0,
                    under_lane(k),
                );
                (
                    lane_path(x1, fy + BOX_H, x2, ty + BOX_H + 2.0, y),
                    (x1 + x2) / 2.0,
                    y,
                )
            }
        };
        let dropped = if e.dropped > 0 {
            format!("{} dropped", e.dropped)
        } else {
            String::new()
        };
        // Between boxes: the count over the fill bar, drops under the line. On a lane: the count and drops on
        // the line's top, the bar under it.
        let (count_y, bar_y, drops) = match route {
            Route::Direct => (
                ly - 6.0,
                ly - 3.0,
                format!(
                    "<text x=\"{lx}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\" fill=\"#c62828\">{dropped}</text>",
                    ly + 24.0
                ),
            ),
            _ => (ly - 4.0, ly + 3.0, String::new()),
        };
        let inline_drops = if *route != Route::Direct && e.dropped > 0 {
            format!("<tspan fill=\"#c62828\"> · {dropped}</tspan>")
        } else {
            String::new()
        };
        let _ = write!(
            s,
            "<g class=\"edge\" data-edge=\"{}\" data-depth=\"{}\" data-capacity=\"{}\" data-dropped=\"{}\"><title>{} \
             · {}/{} queued · {} passed · {} dropped</title><path d=\"{path}\" fill=\"none\" stroke=\"#555\" \
             stroke-width=\"1.5\"{} marker-end=\"url(#arrow)\"/>\
             <rect x=\"{}\" y=\"{bar_y}\" width=\"36\" height=\"6\" fill=\"#ddd\" rx=\"2\"/>\
             <rect class=\"fill\" x=\"{}\" y=\"{bar_y}\" width=\"{:.1}\" height=\"6\" fill=\"{}\" rx=\"2\"/>\
             <text x=\"{lx}\" y=\"{count_y}\" font-size=\"10\" text-anchor=\"middle\" fill=\"#333\">{}/{}{inline_drops}</text>\
             {drops}</g>",
            esc(&e.name),
            depth,
            e.capacity,
            e.dropped,
            esc(&e.name),
            depth,
            e.capacity,
            e.popped,
            e.dropped,
            if matches!(route, Route::Under(_)) {
                " stroke-dasharray=\"5 3\""
            } else {
                ""
            },
            lx - 18.0,
            lx - 18.0,
            36.0 * fill,
            fill_colour(fill),
            depth,
            e.capacity,
        );
    }
    for (i, n) in status.nodes.iter().enumerate() {
        let (x, y) = xy(i);
        let (stroke, bg) = node_colours(n);
        let state = match n.state {
            NodeState::Running if n.erroring => "Erroring".to_owned(),
            other => format!("{other:?}"),
        };
        let errors = if n.errors > 0 {
            format!(" · {} errors", n.errors)
        } else {
            String::new()
        };
        let _ = write!(
            s,
            "<g class=\"node\" data-node=\"{}\" data-state=\"{state}\"><title>{} ({}) {state}{}</title>\
             <rect x=\"{x}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"6\" fill=\"{bg}\" stroke=\"{stroke}\" \
             stroke-width=\"2\"/><text x=\"{}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\" fill=\"#222\">{}</text>\
             <text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#555\">{} · {state}</text>\
             <text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"{}\">{} done · {} queued{}</text></g>",
            esc(&n.id),
            esc(&n.id),
            n.kind,
            n.last_error
                .as_ref()
                .map(|e| format!(": {}", esc(&e.error)))
                .unwrap_or_default(),
            x + 8.0,
            y + 18.0,
            esc(&n.id),
            x + 8.0,
            y + 35.0,
            n.kind,
            x + 8.0,
            y + 52.0,
            if n.errors > 0 { "#c62828" } else { "#333" },
            n.processed,
            n.queue_depth,
            errors
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn edge_names_give_their_nodes() {
        assert_eq!(edge_ends("gen.out->sink.in"), Some(("gen", "sink")));
        assert_eq!(
            edge_ends("eval.promoted->serve.deltas"),
            Some(("eval", "serve"))
        );
        assert_eq!(edge_ends("nonsense"), None);
    }

    #[test]
    fn a_feedback_cycle_is_laid_out_left_to_right() {
        let node = |id: &str| NodeSnapshot {
            id: id.to_owned(),
            kind: "x",
            state: NodeState::Running,
            workers: 1,
            queue_depth: 0,
            processed: 0,
            errors: 0,
            restarts: 0,
            restarts_in_window: 0,
            erroring: false,
            last_error: None,
        };
        let nodes: Vec<NodeSnapshot> = ["serve", "capture", "trainer", "eval"]
            .into_iter()
            .map(node)
            .collect();
        // serve -> capture -> trainer -> eval -> serve (the feedback edge).
        let pos = layout(&nodes, &[(0, 1), (1, 2), (2, 3), (3, 0)]);
        let cols: Vec<usize> = pos.iter().map(|p| p.0).collect();
        assert_eq!(cols, [0, 1, 2, 3]);
    }

    #[test]
    fn timestamps_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_709_210_096_000), "2024-02-29 12:34:56");
    }
}
