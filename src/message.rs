//! The closed set of messages that travel on hearth's graph edges.
//!
//! Every port declares one [`MessageType`], so that `hearth check` can prove, before anything runs, that each
//! edge connects an output and an input of the same type; the engine checks this without knowing the types. Provenance travels inside each sample: every actor that
//! changes or judges a sample appends a step, so a training example can always be traced back to the captured
//! interaction it came from and to every decision taken on the way.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

use crate::engine::ActorError;

/// The type carried on a port; edges must connect ports of equal type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MessageType {
    /// A completed request/response exchange, as served.
    Interaction,
    /// The user's reaction to an earlier response (thumbs, edit, accepted completion, score).
    Feedback,
    /// A training candidate moving through curation.
    Sample,
    /// A curation decision to keep a sample out of training (drop or quarantine), with its reason.
    Decision,
    /// A trained LoRA delta (adapter files on disk plus provenance).
    Delta,
    /// The eval gate's verdict on a delta.
    EvalReport,
}

impl fmt::Display for MessageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Who wrote a chat turn. The API accepts exactly these, so a stored turn never holds another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    /// The role a chat API names `name`, if it is one of ours.
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
        }
    }
}

/// A completed exchange between a user and the served model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interaction {
    pub id: String,
    pub user: String,
    /// The adapter that answered, `None` for the bare base.
    pub adapter: Option<String>,
    pub prompt: Vec<ChatMessage>,
    pub response: String,
    /// Sampling settings as JSON, kept verbatim so a trainer can reproduce the policy that answered.
    pub sampling: serde_json::Value,
    pub created_at_unix_ms: u64,
    pub latency_ms: u64,
    /// Resolved once the interaction is durable (see [`Commit`]); not part of its data.
    #[serde(skip)]
    pub commit: Commit,
}

/// What the user said about a response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FeedbackKind {
    Thumbs {
        up: bool,
    },
    /// The user rewrote the answer; the edit is preferred over the original.
    Edit {
        text: String,
    },
    /// A completion the user accepted as is.
    Accepted,
    Score {
        value: f64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Feedback {
    pub id: String,
    pub response_id: String,
    pub user: String,
    pub kind: FeedbackKind,
    pub created_at_unix_ms: u64,
    /// Resolved once the feedback is durable (see [`Commit`]); not part of its data.
    #[serde(skip)]
    pub commit: Commit,
}

/// How the node that makes an item durable tells whoever acknowledges it (the API's 200) that it may: an
/// answer waits on [`CommitWait`] until [`Commit::done`] is called after the transaction commits. Every copy
/// of the item shares one signal; when the last copy is dropped undone (dropped on a full edge,
/// dead-lettered, or the graph stopped), the waiter learns that at once. An item made without a waiter
/// carries an inert signal.
#[derive(Clone, Default)]
pub struct Commit(Option<crossbeam_channel::Sender<()>>);

/// The waiting side of a [`Commit`].
pub struct CommitWait(crossbeam_channel::Receiver<()>);

/// Why an acknowledged item was not committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotCommitted {
    #[error("the item was dropped before it was stored")]
    Dropped,
    #[error("the item was not stored within {0:?}")]
    Timeout(std::time::Duration),
}

impl Commit {
    /// A signal and its waiter.
    pub fn pair() -> (Commit, CommitWait) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        (Commit(Some(tx)), CommitWait(rx))
    }

    /// The item is durable; releases the waiter (a no-op for an inert signal or a second call).
    pub fn done(&self) {
        if let Some(tx) = &self.0 {
            let _ = tx.try_send(());
        }
    }
}

impl CommitWait {
    pub fn wait(&self, timeout: std::time::Duration) -> Result<(), NotCommitted> {
        match self.0.recv_timeout(timeout) {
            Ok(()) => Ok(()),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(NotCommitted::Dropped),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                Err(NotCommitted::Timeout(timeout))
            }
        }
    }
}

impl fmt::Debug for Commit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Commit(awaited)"
        } else {
            "Commit"
        })
    }
}

/// Two items are equal by their data: who waits on them is not part of it.
impl PartialEq for Commit {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Whether a sample is grounded in what a person wrote or generated by the model itself; the collapse guard
/// and dedup's diversity floor weigh self-generated data below grounded data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Origin {
    Grounded,
    SelfGenerated,
}

/// The training signal a sample carries; one variant per objective family of the trainer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SampleContent {
    /// Supervised fine-tuning: imitate `response`.
    Sft {
        prompt: Vec<ChatMessage>,
        response: String,
    },
    /// A preference pair (DPO): `chosen` over `rejected` for the same prompt.
    Preference {
        prompt: Vec<ChatMessage>,
        chosen: String,
        rejected: String,
    },
    /// An unpaired judgement (KTO): thumbs up or down on one answer.
    Unpaired {
        prompt: Vec<ChatMessage>,
        response: String,
        desirable: bool,
    },
    /// A scored answer (GRPO rewards).
    Scored {
        prompt: Vec<ChatMessage>,
        response: String,
        score: f64,
    },
}

impl SampleContent {
    /// Every free-text field, for curation actors that must inspect or rewrite all of them.
    pub fn texts_mut(&mut self) -> Vec<&mut String> {
        fn prompt_texts(p: &mut [ChatMessage]) -> impl Iterator<Item = &mut String> {
            p.iter_mut().map(|m| &mut m.content)
        }
        match self {
            SampleContent::Sft { prompt, response }
            | SampleContent::Unpaired {
                prompt, response, ..
            }
            | SampleContent::Scored {
                prompt, response, ..
            } => prompt_texts(prompt)
                .chain(std::iter::once(response))
                .collect(),
            SampleContent::Preference {
                prompt,
                chosen,
                rejected,
            } => prompt_texts(prompt).chain([chosen, rejected]).collect(),
        }
    }

    /// Every free-text field, read-only.
    pub fn texts(&self) -> Vec<&str> {
        match self {
            SampleContent::Sft { prompt, response }
            | SampleContent::Unpaired {
                prompt, response, ..
            }
            | SampleContent::Scored {
                prompt, response, ..
            } => prompt
                .iter()
                .map(|m| m.content.as_str())
                .chain(std::iter::once(response.as_str()))
                .collect(),
            SampleContent::Preference {
                prompt,
                chosen,
                rejected,
            } => prompt
                .iter()
                .map(|m| m.content.as_str())
                .chain([chosen.as_str(), rejected.as_str()])
                .collect(),
        }
    }
}

/// One step of a sample's history: which node did what. Details never hold the removed values themselves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProvenanceStep {
    pub node: String,
    pub action: String,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Provenance {
    /// Ids of the captured interactions and feedback events this sample was built from.
    pub sources: Vec<String>,
    pub steps: Vec<ProvenanceStep>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub id: String,
    pub user: String,
    pub origin: Origin,
    pub content: SampleContent,
    pub provenance: Provenance,
    pub created_at_unix_ms: u64,
}

impl Sample {
    /// Appends a provenance step; actors call this for every change or judgement they make.
    pub fn record(&mut self, node: &str, action: &str, details: serde_json::Value) {
        self.provenance.steps.push(ProvenanceStep {
            node: node.to_owned(),
            action: action.to_owned(),
            details,
        });
    }
}

/// Where a sample kept out of training went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Dropped,
    /// Held with its verdict for a person to review.
    Quarantined,
}

/// A curation decision to keep a sample out of training: nothing disappears silently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub sample: Sample,
    pub node: String,
    pub outcome: Outcome,
    pub reason: String,
}

/// A trained LoRA delta: the adapter directory and the provenance that binds it to its base, recipe and data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub id: String,
    pub path: String,
    pub base_sha256: String,
    pub recipe_sha256: String,
    pub data_digest: String,
    pub parent: Option<String>,
}

/// The eval gate's verdict on one delta.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub delta: Delta,
    pub promoted: bool,
    /// Per probe leg: name, base score, candidate score, tolerance, passed.
    pub legs: serde_json::Value,
}

/// A message on an edge. Every variant corresponds to exactly one [`MessageType`].
///
/// Payloads are shared (`Arc`): fan-out and pass-through cost a reference count, and the engine can keep the
/// message for the dead-letter store while an actor handles it. An actor that changes a payload clones it
/// (`Arc::make_mut` or `(*arc).clone()`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Message {
    Interaction(Arc<Interaction>),
    Feedback(Arc<Feedback>),
    Sample(Arc<Sample>),
    Decision(Arc<Decision>),
    Delta(Arc<Delta>),
    EvalReport(Arc<EvalReport>),
}

impl Message {
    pub fn message_type(&self) -> MessageType {
        match self {
            Message::Interaction(_) => MessageType::Interaction,
            Message::Feedback(_) => MessageType::Feedback,
            Message::Sample(_) => MessageType::Sample,
            Message::Decision(_) => MessageType::Decision,
            Message::Delta(_) => MessageType::Delta,
            Message::EvalReport(_) => MessageType::EvalReport,
        }
    }

    /// A short id for logs and dead letters.
    pub fn id(&self) -> &str {
        match self {
            Message::Interaction(m) => &m.id,
            Message::Feedback(m) => &m.id,
            Message::Sample(m) => &m.id,
            Message::Decision(m) => &m.sample.id,
            Message::Delta(m) => &m.id,
            Message::EvalReport(m) => &m.delta.id,
        }
    }
}

impl crate::engine::Payload for Message {
    type Type = MessageType;

    fn message_type(&self) -> MessageType {
        Message::message_type(self)
    }

    fn id(&self) -> &str {
        Message::id(self)
    }
}

/// The sample in `message`, or the error an actor that only takes samples returns for anything else.
pub fn expect_sample<'a>(port: &str, message: &'a Message) -> Result<&'a Arc<Sample>, ActorError> {
    match message {
        Message::Sample(sample) => Ok(sample),
        other => Err(unexpected(port, other)),
    }
}

/// The delta a [`Message::Delta`] carries, or the error an actor returns for any other message on `port`.
pub fn expect_delta<'a>(port: &str, message: &'a Message) -> Result<&'a Arc<Delta>, ActorError> {
    match message {
        Message::Delta(delta) => Ok(delta),
        other => Err(unexpected(port, other)),
    }
}

/// The error for a message of a type the actor does not handle on `port`.
pub fn unexpected(port: &str, message: &Message) -> ActorError {
    ActorError::Unexpected {
        port: port.to_owned(),
        got: message.message_type().to_string(),
    }
}
