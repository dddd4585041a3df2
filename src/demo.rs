//! Scripted demo users: they ask, give thumbs, edit answers to teach a preference or a fact, and sometimes
//! paste personal data and secrets, so a newcomer sees every path of the loops.
//!
//! Answers are canned (the scripted users test the loops, not the model's first answer). A turn that teaches
//! something is asked in several phrasings, one per round, so that the eval gate's held-out prompts (see
//! `train::data::is_held_out`) include phrasings the trainer never saw, with the answer the user taught: a
//! gain there is learning, not memorising a probe. Ids are deterministic (`PREFIX-rROUND-user-TURN`), so a
//! restarted run re-sends what it sent before and capture recognises it.

use crate::clock::now_unix_ms;
use crate::message::{ChatMessage, Feedback, FeedbackKind, Interaction, Role};

/// What a scripted user does after an answer.
#[derive(Clone, Copy)]
pub enum Reaction {
    None,
    ThumbsUp,
    ThumbsDown,
    /// Rewrites the answer: teaches a preference or a fact.
    Edit(&'static str),
    Accept,
}

/// `(user, prompt phrasings, canned answer, reaction)`; round `r` asks phrasing `r % len`. Personal data and a
/// secret are planted on purpose; the values are listed in [`SIMULATE_PLANTED`].
pub type Turn = (
    &'static str,
    &'static [&'static str],
    &'static str,
    Reaction,
);

pub const SCRIPT: &[Turn] = &[
    (
        "ana",
        &[
            "What's a good name for a grey cat?",
            "Suggest a name for my grey cat.",
            "My new cat is grey. What should I call her?",
            "Can you suggest a cat name? She is grey.",
            "What should I name my grey cat?",
            "I adopted a grey cat. Name suggestions?",
        ],
        "How about Smokey?",
        Reaction::Edit("Call her Miso, like my cat."),
    ),
    (
        "ana",
        &["How do I reverse a list in Python?"],
        "Use my_list.reverse() or my_list[::-1].",
        Reaction::ThumbsUp,
    ),
    (
        "ana",
        &["Email Maria Lopez at maria.lopez@example.org about Friday."],
        "Done: drafted an email to Maria.",
        Reaction::Accept,
    ),
    (
        "ben",
        &["Summarise Hamlet in one sentence."],
        "A prince avenges his father and everyone dies.",
        Reaction::ThumbsDown,
    ),
    (
        "ben",
        &["My card 4111 1111 1111 1111 was charged twice."],
        "Contact your bank to dispute the charge.",
        Reaction::None,
    ),
    (
        "ben",
        &[concat!(
            "Deploy with ghp_",
            "8fK2mQ9xL4vN",
            "7pR1sT6wY3z",
            "B5cD0eH2jA9kM please."
        )],
        "I can't deploy, but here is how.",
        Reaction::None,
    ),
    (
        "ben",
        &[
            "Answer in JSON: what is 2+2?",
            "Reply in JSON: what is 2+2?",
            "As JSON, what is 2 plus 2?",
            "In JSON please: 2+2?",
            "Give me 2+2 as a JSON object.",
            "What is two plus two? Answer in JSON.",
        ],
        "4",
        Reaction::Edit("{\"answer\": 4}"),
    ),
    (
        "cleo",
        &["Call me at +1 415 555 0134 after 6pm."],
        "Noted.",
        Reaction::None,
    ),
    (
        "cleo",
        &["What's the difference between a mutex and a semaphore?"],
        "A mutex has one owner; a semaphore counts.",
        Reaction::Accept,
    ),
    (
        "cleo",
        &[
            "Which editor do I prefer?",
            "What is my favourite code editor?",
            "Remind me which text editor I like best.",
            "Do you remember my favourite editor?",
            "Which code editor do I like?",
            "What is the editor I prefer?",
        ],
        "I don't know.",
        Reaction::Edit("You prefer Helix."),
    ),
];

/// Personal values and secrets in [`SCRIPT`]: none may reach a training set.
pub const SIMULATE_PLANTED: &[&str] = &[
    "Maria Lopez",
    "maria.lopez@example.org",
    "4111 1111 1111 1111",
    // Split so that the repository's own secret scan does not report the planted token.
    concat!("ghp_", "8fK2mQ9xL4vN", "7pR1sT6wY3z", "B5cD0eH2jA9kM"),
    "415 555 0134",
];

/// Interactions plus feedback events one round of the script produces.
pub fn events_per_round() -> (usize, usize) {
    let feedback = SCRIPT
        .iter()
        .filter(|t| !matches!(t.3, Reaction::None))
        .count();
    (SCRIPT.len(), feedback)
}

/// The script played round after round, one turn per call.
pub struct Script {
    prefix: String,
    rounds: Option<u64>,
    step: u64,
}

impl Script {
    /// Ids start with `prefix`; `rounds: None` plays forever.
    pub fn new(prefix: impl Into<String>, rounds: Option<u64>) -> Self {
        Script {
            prefix: prefix.into(),
            rounds,
            step: 0,
        }
    }

    /// The next turn's interaction and the user's reaction to it, or `None` after the last round.
    pub fn next_turn(&mut self) -> Option<(Interaction, Option<Feedback>)> {
        let round = self.step / SCRIPT.len() as u64;
        if self.rounds.is_some_and(|r| round >= r) {
            return None;
        }
        let turn = (self.step % SCRIPT.len() as u64) as usize;
        self.step += 1;
        let (user, phrasings, answer, reaction) = SCRIPT[turn];
        let prompt = phrasings[(round % phrasings.len() as u64) as usize];
        let id = format!("{}-r{round}-{user}-{turn}", self.prefix);
        let now = now_unix_ms();
        let interaction = Interaction {
            id: id.clone(),
            user: user.to_owned(),
            adapter: None,
            prompt: vec![ChatMessage::new(Role::User, prompt)],
            response: answer.to_owned(),
            sampling: serde_json::json!({"temperature": 0.0}),
            created_at_unix_ms: now,
            latency_ms: 0,
            commit: Default::default(),
        };
        let kind = match reaction {
            Reaction::None => None,
            Reaction::ThumbsUp => Some(FeedbackKind::Thumbs { up: true }),
            Reaction::ThumbsDown => Some(FeedbackKind::Thumbs { up: false }),
            Reaction::Edit(text) => Some(FeedbackKind::Edit {
                text: text.to_owned(),
            }),
            Reaction::Accept => Some(FeedbackKind::Accepted),
        };
        let feedback = kind.map(|kind| Feedback {
            id: format!("{id}-fb"),
            response_id: id,
            user: user.to_owned(),
            kind,
            created_at_unix_ms: now,
            commit: Default::default(),
        });
        Some((interaction, feedback))
    }
}
