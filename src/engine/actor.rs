//! What an actor is to the engine: a kind with declared ports, a factory that builds one instance per worker,
//! and the outbox through which an instance sends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::Payload;
use super::edge::EdgeSender;
use super::resources::Resources;

/// A port an actor kind declares, with the one message type `T` it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec<T: 'static> {
    pub name: &'static str,
    pub message_type: T,
    /// An input that must be fed by some edge; `hearth check` rejects a graph that leaves it dangling.
    pub required: bool,
}

impl<T> PortSpec<T> {
    /// A port that must be connected (inputs) or that carries the actor's main output.
    pub const fn new(name: &'static str, message_type: T) -> Self {
        PortSpec {
            name,
            message_type,
            required: true,
        }
    }

    /// An input the actor can run without (e.g. serve's delta feedback when no trainer is wired).
    pub const fn optional(name: &'static str, message_type: T) -> Self {
        PortSpec {
            name,
            message_type,
            required: false,
        }
    }
}

/// Static facts about an actor kind, used by validation, `hearth actors` and the runtime.
#[derive(Debug)]
pub struct KindInfo<T: 'static> {
    /// The snake_case name used in metrics, docs and the `actors/` file name.
    pub name: &'static str,
    pub about: &'static str,
    pub inputs: &'static [PortSpec<T>],
    pub outputs: &'static [PortSpec<T>],
    /// A source produces messages without input (it may still take feedback input); shutdown stops sources first.
    pub source: bool,
}

impl<T> KindInfo<T> {
    pub fn input(&self, name: &str) -> Option<&PortSpec<T>> {
        self.inputs.iter().find(|p| p.name == name)
    }
    pub fn output(&self, name: &str) -> Option<&PortSpec<T>> {
        self.outputs.iter().find(|p| p.name == name)
    }
}

/// Why a call into an actor failed. The engine restarts the worker (dead-lettering the message being handled,
/// unless the failure is [`ActorError::Background`]) and counts the failure against the node's restart policy.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// The library the actor is glue over failed; the cause is kept whole.
    #[error("{context}")]
    Failed {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A failure with nothing underneath (a panic, a broken invariant the actor noticed itself).
    #[error("{0}")]
    Message(String),
    #[error("message type {got} on port `{port}` is not handled by this actor")]
    Unexpected { port: String, got: String },
    /// The node's parameters cannot build an actor; `source` is the library's error, when there is one.
    #[error("cannot build actor: {context}")]
    Build {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Work the actor runs off its thread or on a schedule (a training cycle) failed. Returned from any call
    /// (often [`Actor::tick`]); the message being handled, if any, is not at fault and is not dead-lettered.
    #[error("{context}")]
    Background {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Send(#[from] SendError),
}

impl ActorError {
    /// Wraps a library error with what the actor was doing, keeping it as the source.
    pub fn failed(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ActorError::Failed {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A failure of the actor's background or periodic work, with what it was doing (see
    /// [`ActorError::Background`]).
    pub fn background(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ActorError::Background {
            context: context.into(),
            source: source.into(),
        }
    }

    /// Whether this is a failure of background work rather than of the call that returned it.
    pub fn is_background(&self) -> bool {
        matches!(self, ActorError::Background { .. })
    }

    /// A build failure of the node's own making (its parameters), with nothing underneath.
    pub fn build(context: impl Into<String>) -> Self {
        ActorError::Build {
            context: context.into(),
            source: None,
        }
    }

    /// A build failure caused by a library error, kept as the source.
    pub fn build_from(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ActorError::Build {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// The error and every cause under it, joined by `: `, for logs and dead letters.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            // Many errors print their cause in their own message too; say each thing once.
            let line = c.to_string();
            if !text.contains(&line) {
                text.push_str(": ");
                text.push_str(&line);
            }
            cause = c.source();
        }
        text
    }
}

/// Attaches what an actor was doing to a library error: `store.served().context("read the served state")?`.
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T, ActorError>;

    /// As [`Context::context`], with the text made only on failure.
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, ActorError>;
}

impl<T, E: Into<Box<dyn std::error::Error + Send + Sync>>> Context<T> for Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T, ActorError> {
        self.map_err(|e| ActorError::failed(what, e))
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, ActorError> {
        self.map_err(|e| ActorError::failed(what(), e))
    }
}

/// What a source did on one call of [`Actor::produce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Produce {
    /// Sent something (or made progress); call again at once.
    Produced,
    /// Nothing to do now; the engine waits up to this long (waking early for input) before calling again.
    Idle(Duration),
    /// The source has nothing more, ever.
    Exhausted,
}

/// One running instance of an actor kind. Each worker of a node owns one; it is rebuilt after a failure.
pub trait Actor<M>: Send {
    /// Handles one message arriving on `port`. Taking it by reference lets the engine keep the message for the
    /// dead-letter store if this call fails or panics.
    fn handle(&mut self, port: &str, message: &M, out: &mut Outbox<M>) -> Result<(), ActorError>;

    /// Called once per worker after its first successful build, before any input: an actor that owns durable
    /// state re-emits the work a previous run left unfinished here. Not called again after a restart, when
    /// that work is already in flight.
    fn on_start(&mut self, _out: &mut Outbox<M>) -> Result<(), ActorError> {
        Ok(())
    }

    /// Called after a worker is rebuilt following a failure, before any further input. An actor whose state is
    /// kept in a durable store reloads it here, so the rebuilt instance retries the work that failed rather
    /// than waiting for new input to start it again; [`Actor::on_start`]'s re-emitting is not repeated.
    fn on_restart(&mut self, _out: &mut Outbox<M>) -> Result<(), ActorError> {
        Ok(())
    }

    /// Sources only: produce the next messages.
    fn produce(&mut self, _out: &mut Outbox<M>) -> Result<Produce, ActorError> {
        Ok(Produce::Exhausted)
    }

    /// Non-sources: called when the mailbox has stayed empty for a short while (tens of milliseconds), so
    /// an actor whose work runs off its thread (a training cycle) can send the result when it is ready
    /// rather than with the next message. A failure of that work is returned as [`ActorError::Background`]:
    /// it restarts the worker and counts against the restart policy like a handler's.
    fn tick(&mut self, _out: &mut Outbox<M>) -> Result<(), ActorError> {
        Ok(())
    }

    /// Called once when the worker's inputs are drained at shutdown; buffered work must be sent or persisted here.
    fn flush(&mut self, _out: &mut Outbox<M>) -> Result<(), ActorError> {
        Ok(())
    }
}

/// What a factory gets to build an instance.
#[derive(Debug, Clone)]
pub struct BuildContext {
    pub node_id: String,
    pub worker: usize,
    pub data_dir: PathBuf,
    /// Shared by every node of the running graph: what several nodes use is loaded once (a base model).
    pub resources: Arc<Resources>,
}

impl BuildContext {
    /// A context for building one actor outside a running graph (tests, tools), with resources of its own.
    pub fn new(node_id: &str, worker: usize, data_dir: impl Into<PathBuf>) -> Self {
        BuildContext {
            node_id: node_id.to_owned(),
            worker,
            data_dir: data_dir.into(),
            resources: Arc::new(Resources::default()),
        }
    }
}

/// Builds actor instances of one configured kind. Graph files reach this through their [`super::NodeKind`];
/// tests and benches may implement it directly.
pub trait ActorFactory<M: Payload>: Send + Sync {
    fn info(&self) -> &'static KindInfo<M::Type>;
    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Actor<M>>, ActorError>;

    /// Values this node plants in the data on purpose (a demo user's personal data, an eval canary): the run
    /// report checks that none of them reached the training set.
    fn planted(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The sending side of a worker: each output port fans out to every edge connected to it.
pub struct Outbox<M> {
    node_id: Arc<str>,
    ports: Vec<(&'static str, Vec<EdgeSender<M>>)>,
}

/// A send that could not complete.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("node `{node}` has no output port `{port}`")]
    UnknownPort { node: String, port: String },
}

impl<M: Clone> Outbox<M> {
    pub(crate) fn new(node_id: Arc<str>, ports: Vec<(&'static str, Vec<EdgeSender<M>>)>) -> Self {
        Outbox { node_id, ports }
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Sends on `port` to every connected edge, applying each edge's `when_full` policy. A port with no edge
    /// discards silently by design: the graph chose not to consume it (validation lists such ports).
    pub fn send(&mut self, port: &str, message: M) -> Result<(), SendError> {
        let Some((_, edges)) = self.ports.iter().find(|(p, _)| *p == port) else {
            return Err(SendError::UnknownPort {
                node: self.node_id.to_string(),
                port: port.to_owned(),
            });
        };
        if let Some((last, rest)) = edges.split_last() {
            for edge in rest {
                edge.send(message.clone());
            }
            last.send(message);
        }
        Ok(())
    }

    /// Publishes locally batched send counts; the worker calls this before it blocks or exits.
    pub(crate) fn publish_counts(&self) {
        for (_, edges) in &self.ports {
            for edge in edges {
                edge.publish();
            }
        }
    }

    /// Adds an edge to `port` (a reload connecting a running node to a new one).
    pub(crate) fn add_edge(&mut self, port: &'static str, edge: EdgeSender<M>) {
        match self.ports.iter_mut().find(|(p, _)| *p == port) {
            Some((_, edges)) => edges.push(edge),
            None => self.ports.push((port, vec![edge])),
        }
    }

    /// Drops the sender of the edge with these counters; its receiver drains what is queued, then closes.
    pub(crate) fn remove_edge(&mut self, edge: &Arc<super::edge::EdgeStats>) {
        for (_, edges) in &mut self.ports {
            edges.retain(|e| !Arc::ptr_eq(e.stats(), edge));
        }
    }

    /// Every port with its edges, leaving this outbox without any (a retiring worker hands them on).
    pub(crate) fn take_ports(&mut self) -> Vec<(&'static str, Vec<EdgeSender<M>>)> {
        std::mem::take(&mut self.ports)
    }

    /// Whether any edge is connected to `port`, so an actor can skip building a message nobody reads.
    pub fn is_connected(&self, port: &str) -> bool {
        self.ports
            .iter()
            .any(|(p, edges)| *p == port && !edges.is_empty())
    }
}

/// The parameters of one actor kind as written in a graph file; they build the kind's instances.
pub trait KindParams<M: Payload>: ActorFactory<M> + Clone + 'static {
    /// A valid configuration, shown by `hearth actors` and checked by tests to build and validate.
    fn example() -> Self;
}
