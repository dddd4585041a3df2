//! `serve`: the model behind an OpenAI-compatible HTTP API, emitting every completed interaction and every
//! piece of feedback into the graph.
//!
//! Thin over [`crate::serve`]. Requests come from HTTP, not from edges, so this is a source: `produce`
//! forwards what the generation threads completed (the outbox is per worker and not `Sync`, hence the
//! channel). A `Delta` on `deltas` (the trainer/eval feedback edge) loads that adapter and makes it the
//! default: a hot swap that requests already running do not notice. A user's own delta (its provenance names
//! the user) is routed to that user's requests alone.
//!
//! The store's served state is the source of truth: `hearth deltas promote|rollback` change it while the
//! process runs, and the serve actor follows within a second. It serves a delta only if that delta adapts
//! the exact base it loaded (SHA-256 of the GGUF).
//!
//! The server outlives a worker restart (a restart must not drop the port or the requests in flight), so it
//! is kept per node and data directory, and stopped by `flush` at shutdown.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams, Produce};
use crate::message::{Message, MessageType};
use crate::model::{Base, BaseCache};
use crate::serve::follow::ServedFollower;
use crate::serve::settings::{running_or_start, take_running};
use crate::serve::{ServeEvent, Server};

/// The node's parameters: the server's settings.
pub use crate::serve::settings::ServeSettings as ServeParams;
pub use crate::serve::settings::addr_file;

static INFO: KindInfo = KindInfo {
    name: "serve",
    about: "serves the model (base + hot-swappable LoRA adapters) over an OpenAI-compatible API; emits interactions and feedback",
    inputs: &[PortSpec::optional("deltas", MessageType::Delta)],
    outputs: &[
        PortSpec::new("interactions", MessageType::Interaction),
        PortSpec::new("feedback", MessageType::Feedback),
    ],
    source: true,
};

impl ActorFactory<Message> for ServeParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    /// Cheap on purpose: the model loads on first use, so `hearth check` and restarts never reload it.
    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        Ok(Box::new(Serve {
            params: self.clone(),
            key: format!("{}\u{0}{}", ctx.data_dir.display(), ctx.node_id),
            ctx: ctx.clone(),
            server: None,
            follower: ServedFollower::new(&ctx.data_dir),
            captured: false,
        }))
    }
}

impl ServeParams {
    /// The base the node serves: `model` held as `requantize` says, from the graph's shared cache, so that a
    /// trainer and a gate naming the same `model` and `requantize` use the very same weights.
    pub fn base(&self, data_dir: &Path, bases: &BaseCache) -> Result<Arc<Base>, ActorError> {
        let path = crate::serve::model_path(self.model.as_deref(), data_dir)
            .context("resolve the model")?;
        bases
            .get_with(&path, self.requantize)
            .context("load the model")
    }
}

impl KindParams<Message> for ServeParams {
    fn example() -> Self {
        ServeParams {
            model: Some("models/SmolLM2-135M-Instruct.Q8_0.gguf".to_owned()),
            listen: "127.0.0.1:8080".to_owned(),
            ..ServeParams::default()
        }
    }
}

struct Serve {
    params: ServeParams,
    key: String,
    ctx: BuildContext,
    server: Option<Arc<Server>>,
    follower: ServedFollower,
    /// Whether `interactions` leads anywhere: then an answer waits until the item is stored.
    captured: bool,
}

/// How long an answer waits for its interaction to be stored before it is withheld (503).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

impl Serve {
    fn server(&mut self) -> Result<Arc<Server>, ActorError> {
        if let Some(s) = &self.server {
            return Ok(s.clone());
        }
        let (p, ctx) = (&self.params, &self.ctx);
        let commit_timeout = self.captured.then_some(COMMIT_TIMEOUT);
        let server = running_or_start(&self.key, || {
            p.api_key(&ctx.data_dir)
                .context("check who may reach the API")?;
            let base = p.base(&ctx.data_dir, &ctx.resources.get::<BaseCache>())?;
            let (server, addr) = p
                .start(&base, &ctx.data_dir, &ctx.node_id, commit_timeout)
                .context("start serving")?;
            tracing::info!(%addr, model = %base.path.display(), "serving the OpenAI-compatible API");
            Ok::<_, ActorError>(server)
        })?;
        self.server = Some(server.clone());
        Ok(server)
    }

    fn forward(server: &Server, out: &mut Outbox) -> Result<usize, ActorError> {
        let mut n = 0;
        while let Ok(event) = server.events().try_recv() {
            n += 1;
            match event {
                ServeEvent::Interaction(i) => {
                    out.send("interactions", Message::Interaction(Arc::new(i)))
                }
                ServeEvent::Feedback(f) => out.send("feedback", Message::Feedback(Arc::new(f))),
            }?;
        }
        Ok(n)
    }

    fn follow_store(&mut self) -> Result<(), ActorError> {
        let server = self.server()?;
        self.follower
            .poll(&server, &self.ctx.node_id)
            .context("follow the store's served state")
    }
}

impl Actor<Message> for Serve {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        _out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let delta = crate::message::expect_delta(port, message)?;
        let user = crate::train::artifact::delta_user(std::path::Path::new(&delta.path))
            .with_context(|| format!("read whose delta `{}` is", delta.id))?;
        let server = self.server()?;
        match user {
            Some(user) => server.swap_user(&user, Some(delta)),
            None => server.swap_to(Some(delta)),
        }
        .with_context(|| format!("swap to delta `{}`", delta.id))
    }

    fn on_start(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.captured = out.is_connected("interactions");
        self.server()?;
        self.follow_store()
    }

    fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
        let server = self.server()?;
        self.follow_store()?;
        Ok(if Self::forward(&server, out)? > 0 {
            Produce::Produced
        } else {
            Produce::Idle(Duration::from_millis(10))
        })
    }

    /// Stops the API, lets admitted requests finish, and forwards what they produced: while it stops, since
    /// their answers wait until what they produced is stored.
    fn flush(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        let server = take_running(&self.key);
        let Some(server) = server.or_else(|| self.server.take()) else {
            return Ok(());
        };
        self.server = None;
        let stopping = server.clone();
        let stopped = std::thread::spawn(move || stopping.shutdown());
        while !stopped.is_finished() {
            if Self::forward(&server, out)? == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = stopped.join();
        Self::forward(&server, out)?;
        Ok(())
    }
}
