//! Every actor kind a graph file can name. Adding a kind is one file here, its `mod` line, and one line in
//! `actor_kinds!`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::{self, ActorFactory, KindParams, NodeKind};
use crate::message::{Message, MessageType};

pub mod blackhole;
pub mod capture;
pub mod dedup;
pub mod eval;
pub mod fault_inject;
pub mod federate;
pub mod generate;
pub mod guard;
pub mod jsonl_sink;
pub mod reconcile;
pub mod redact;
pub mod secret_filter;
pub mod serve;
pub mod simulate;
pub mod store;
pub mod throttle;
pub mod trainer;

/// The engine's types as hearth's actors use them, over hearth's [`Message`].
pub type KindInfo = engine::KindInfo<MessageType>;
pub type PortSpec = engine::PortSpec<MessageType>;
pub type Outbox = engine::Outbox<Message>;
pub type Graph = engine::Graph<Message>;
pub type Plan = engine::Plan<Message>;
pub type BoxedActor = Box<dyn engine::Actor<Message>>;

macro_rules! actor_kinds {
    ($($variant:ident($module:ident :: $params:ident)),* $(,)?) => {
        /// An actor kind with its parameters, written in a graph file as an externally tagged RON variant,
        /// e.g. `Throttle(delay_us: 100)`.
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub enum ActorKind {
            $($variant($module::$params),)*
        }

        impl ActorKind {
            pub fn factory(&self) -> Arc<dyn ActorFactory<Message>> {
                match self {
                    $(ActorKind::$variant(p) => Arc::new(p.clone()),)*
                }
            }

            pub fn info(&self) -> &'static KindInfo {
                match self {
                    $(ActorKind::$variant(p) => p.info(),)*
                }
            }

            /// One valid example per kind, in registration order.
            pub fn examples() -> Vec<ActorKind> {
                vec![$(ActorKind::$variant(<$module::$params as KindParams<Message>>::example()),)*]
            }
        }
    };
}

actor_kinds! {
    Generate(generate::GenerateParams),
    Throttle(throttle::ThrottleParams),
    FaultInject(fault_inject::FaultInjectParams),
    JsonlSink(jsonl_sink::JsonlSinkParams),
    Blackhole(blackhole::BlackholeParams),
    Redact(redact::RedactConfig),
    SecretFilter(secret_filter::SecretConfig),
    Guard(guard::GuardParams),
    Dedup(dedup::DedupConfig),
    Simulate(simulate::SimulateParams),
    Capture(capture::CaptureParams),
    Store(store::StoreParams),
    Serve(serve::ServeParams),
    Trainer(trainer::TrainerParams),
    Eval(eval::EvalParams),
    Federate(federate::FederateParams),
    Reconcile(reconcile::ReconcileParams),
}

impl NodeKind for ActorKind {
    type Message = Message;

    fn factory(&self) -> Arc<dyn ActorFactory<Message>> {
        ActorKind::factory(self)
    }
}

impl ActorKind {
    /// Parses and validates graph text whose nodes are hearth's actor kinds, with hearth's own checks across
    /// nodes ([`base_forms`]).
    pub fn graph(src: &str) -> Result<Graph, Vec<engine::GraphError>> {
        let graph = Graph::from_ron::<ActorKind>(src);
        let forms = match engine::schema::GraphFile::<ActorKind>::parse(src) {
            Ok((file, _)) => base_forms(&file.nodes),
            // Already reported by `from_ron`.
            Err(_) => Vec::new(),
        };
        match graph {
            Ok(g) if forms.is_empty() => Ok(g),
            Ok(_) => Err(forms),
            Err(mut errors) => {
                errors.extend(forms);
                Err(errors)
            }
        }
    }

    /// The kind as a graph file would write it, on one line.
    pub fn to_ron(&self) -> String {
        let config = ron::ser::PrettyConfig::new()
            .compact_arrays(true)
            .compact_structs(true)
            .extensions(
                ron::extensions::Extensions::UNWRAP_VARIANT_NEWTYPES
                    | ron::extensions::Extensions::IMPLICIT_SOME,
            )
            .struct_names(false);
        match ron::ser::to_string_pretty(self, config) {
            // The pretty printer announces the extensions it used; graph files get them from hearth's parser.
            Ok(text) => match text.rfind(")]") {
                Some(i) if text.starts_with("#![") => text[i + 2..].trim().to_owned(),
                _ => text,
            },
            Err(e) => format!("<unprintable: {e}>"),
        }
    }
}

/// Nodes that load the same `model` (serve, trainer, eval, reconcile) must hold it in the same form (`requantize`):
/// otherwise serving, training and the gate would each use other weights, and the graph would hold two
/// copies. `model` is compared as written (absent: the default model).
fn base_forms(
    nodes: &[engine::schema::Located<engine::schema::NodeSpec<ActorKind>>],
) -> Vec<engine::GraphError> {
    let mut first: std::collections::HashMap<Option<&str>, (&str, crate::model::Requantize)> =
        std::collections::HashMap::new();
    let mut errors = Vec::new();
    for node in nodes {
        let (model, requantize) = match &node.value.kind {
            ActorKind::Serve(p) => (p.model.as_deref(), p.requantize),
            ActorKind::Trainer(p) => (p.model.as_deref(), p.requantize),
            ActorKind::Eval(p) => (p.model.as_deref(), p.requantize),
            ActorKind::Reconcile(p) => (p.model.as_deref(), p.requantize),
            _ => continue,
        };
        match first.get(&model) {
            Some(&(id, held)) if held != requantize => errors.push(engine::GraphError::at(
                node.at,
                format!(
                    "node `{}`: requantize: {requantize:?} differs from node `{id}`'s {held:?} for {}: every node \
                     that loads a base holds it in the same form, so that what is trained and judged is what is served",
                    node.value.id,
                    model.map_or("the default model".to_owned(), |m| format!("model `{m}`")),
                ),
            )),
            Some(_) => {}
            None => {
                first.insert(model, (&node.value.id, requantize));
            }
        }
    }
    errors
}
