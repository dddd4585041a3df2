//! What the experiment puts into a variant's graph: a source that replays the stream, and a wrapper around
//! every node that times its handler and, at the sink, keeps what arrives.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use indicatif::ProgressBar;

use crate::actors::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Produce};
use crate::message::{Decision, Message, MessageType, Sample};

static REPLAY: KindInfo = KindInfo {
    name: "replay",
    about: "replays an experiment's recorded stream, once, in a fixed order",
    inputs: &[],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: true,
};

/// Builds the replay source; one worker, since a second would send the stream twice.
pub struct ReplayFactory {
    pub samples: Arc<Vec<Arc<Sample>>>,
}

impl ActorFactory<Message> for ReplayFactory {
    fn info(&self) -> &'static KindInfo {
        &REPLAY
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        if ctx.worker > 0 {
            return Err(ActorError::build("the replay source runs one worker"));
        }
        Ok(Box::new(Replay {
            samples: self.samples.clone(),
            next: 0,
        }))
    }
}

struct Replay {
    samples: Arc<Vec<Arc<Sample>>>,
    next: usize,
}

impl Actor<Message> for Replay {
    fn handle(&mut self, port: &str, message: &Message, _: &mut Outbox) -> Result<(), ActorError> {
        Err(ActorError::Unexpected {
            port: port.to_owned(),
            got: message.message_type().to_string(),
        })
    }

    fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
        let Some(sample) = self.samples.get(self.next) else {
            return Ok(Produce::Exhausted);
        };
        self.next += 1;
        out.send("out", Message::Sample(sample.clone()))?;
        Ok(Produce::Produced)
    }
}

/// What reached the sink during one run.
#[derive(Default)]
pub struct Collected {
    pub admitted: Vec<Arc<Sample>>,
    pub decisions: Vec<Arc<Decision>>,
}

/// Per-node handler times in nanoseconds, one entry per handled message.
pub type Timings = Arc<Mutex<Vec<u64>>>;

/// Wraps a node's factory so each instance it builds is timed (and, at the sink, collected).
pub struct TapFactory {
    pub inner: Arc<dyn ActorFactory<Message>>,
    pub timings: Timings,
    pub collect: Option<Arc<Mutex<Collected>>>,
    pub progress: Option<ProgressBar>,
}

impl ActorFactory<Message> for TapFactory {
    fn info(&self) -> &'static KindInfo {
        self.inner.info()
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        Ok(Box::new(Tap {
            inner: self.inner.build(ctx)?,
            timings: self.timings.clone(),
            collect: self.collect.clone(),
            progress: self.progress.clone(),
        }))
    }

    fn planted(&self) -> Vec<String> {
        self.inner.planted()
    }
}

struct Tap {
    inner: BoxedActor,
    timings: Timings,
    collect: Option<Arc<Mutex<Collected>>>,
    progress: Option<ProgressBar>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a handler panicked while another held it; the data is still whole.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Actor<Message> for Tap {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let started = Instant::now();
        let result = self.inner.handle(port, message, out);
        let nanos = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        lock(&self.timings).push(nanos);
        if let (Some(collect), Ok(())) = (&self.collect, &result) {
            let mut c = lock(collect);
            match message {
                Message::Sample(s) => c.admitted.push(s.clone()),
                Message::Decision(d) => c.decisions.push(d.clone()),
                _ => {}
            }
            if let Some(p) = &self.progress {
                p.inc(1);
            }
        }
        result
    }

    fn on_start(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.inner.on_start(out)
    }

    fn on_restart(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.inner.on_restart(out)
    }

    fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
        self.inner.produce(out)
    }

    fn tick(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.inner.tick(out)
    }

    fn flush(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.inner.flush(out)
    }
}
