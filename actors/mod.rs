//! Every actor kind a graph file can name. Adding a kind is one file here plus one line in `actor_kinds!`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::actor::{ActorFactory, KindInfo, KindParams};

macro_rules! actor_kinds {
    ($($variant:ident($module:ident :: $params:ident)),* $(,)?) => {
        $(pub mod $module;)*

        /// An actor kind with its parameters, written in a graph file as an externally tagged RON variant,
        /// e.g. `Throttle(delay_us: 100)`.
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub enum ActorKind {
            $($variant($module::$params),)*
        }

        impl ActorKind {
            pub fn factory(&self) -> Arc<dyn ActorFactory> {
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
                vec![$(ActorKind::$variant(<$module::$params as KindParams>::example()),)*]
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
}

impl ActorKind {
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
