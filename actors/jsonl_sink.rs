//! `jsonl_sink`: appends every message it receives to a JSON Lines file, one message per line.
//!
//! Each line is written with a single `write` on an append-mode file, so workers sharing the file never
//! interleave within a line; the file is synced when the worker drains at shutdown.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams};
use crate::message::{Message, MessageType};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlSinkParams {
    /// The file to append to; relative paths are under the graph's data directory.
    pub path: String,
}

static INFO: KindInfo = KindInfo {
    name: "jsonl_sink",
    about: "appends the samples and/or curation decisions wired to it to a JSON Lines file",
    inputs: &[
        PortSpec::optional("in", MessageType::Sample),
        PortSpec::optional("decisions", MessageType::Decision),
    ],
    outputs: &[],
    source: false,
};

impl ActorFactory<Message> for JsonlSinkParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        let path = ctx.data_dir.join(&self.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| ActorError::build_from(path.display().to_string(), e))?;
        Ok(Box::new(JsonlSink { file, path }))
    }
}

impl KindParams<Message> for JsonlSinkParams {
    fn example() -> Self {
        JsonlSinkParams {
            path: "training_set.jsonl".to_owned(),
        }
    }
}

struct JsonlSink {
    file: File,
    path: PathBuf,
}

impl Actor<Message> for JsonlSink {
    fn handle(
        &mut self,
        _port: &str,
        message: &Message,
        _out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let mut line = serde_json::to_vec(message).context("encode")?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .context(self.path.display().to_string())
    }

    fn flush(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        self.file.sync_all()?;
        Ok(())
    }
}
