//! Drawing a graph as Graphviz dot or Mermaid, with ports, capacities and policies on the edges.

use super::Payload;
use super::schema::WhenFull;
use super::validate::Graph;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DrawFormat {
    Dot,
    Mermaid,
}

fn policy(w: WhenFull) -> &'static str {
    match w {
        WhenFull::Block => "block",
        WhenFull::DropNewest => "drop newest",
        WhenFull::DropOldest => "drop oldest",
    }
}

fn edge_label<M: Payload>(graph: &Graph<M>, e: &super::validate::ResolvedEdge) -> String {
    let from = &graph.plan.nodes[e.from_node];
    let ty = from
        .factory
        .info()
        .output(e.from_port)
        .map(|p| p.message_type.to_string())
        .unwrap_or_default();
    format!(
        "{} -> {} [{ty}; cap {}; {}{}]",
        e.from_port,
        e.to_port,
        e.spec.capacity,
        policy(e.spec.when_full),
        if e.spec.feedback { "; feedback" } else { "" }
    )
}

pub fn draw<M: Payload>(graph: &Graph<M>, format: DrawFormat) -> String {
    let mut out = String::new();
    match format {
        DrawFormat::Dot => {
            out.push_str(&format!(
                "digraph \"{}\" {{\n  rankdir=LR;\n",
                graph.plan.name
            ));
            for n in &graph.plan.nodes {
                out.push_str(&format!(
                    "  \"{}\" [shape=box, label=\"{}\\n{} x{}\"];\n",
                    n.id,
                    n.id,
                    n.factory.info().name,
                    n.workers
                ));
            }
            for e in &graph.edges {
                let style = if e.spec.feedback {
                    ", style=dashed"
                } else {
                    ""
                };
                out.push_str(&format!(
                    "  \"{}\" -> \"{}\" [label=\"{}\"{style}];\n",
                    graph.plan.nodes[e.from_node].id,
                    graph.plan.nodes[e.to_node].id,
                    edge_label(graph, e)
                ));
            }
            out.push_str("}\n");
        }
        DrawFormat::Mermaid => {
            out.push_str("flowchart LR\n");
            for n in &graph.plan.nodes {
                out.push_str(&format!(
                    "  {}[\"{}<br/>{} x{}\"]\n",
                    n.id,
                    n.id,
                    n.factory.info().name,
                    n.workers
                ));
            }
            for e in &graph.edges {
                let arrow = if e.spec.feedback { "-.->" } else { "-->" };
                out.push_str(&format!(
                    "  {} {arrow}|\"{}\"| {}\n",
                    graph.plan.nodes[e.from_node].id,
                    edge_label(graph, e),
                    graph.plan.nodes[e.to_node].id
                ));
            }
        }
    }
    out
}
