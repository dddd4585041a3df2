//! The families' chat templates rendered by hearth (minijinja) equal Python jinja2's renderings, computed once by
//! `scripts/chat_fixtures.py` and committed as `tests/fixtures/chat/expected.json`; and the encoding built on
//! them keeps message content out of special tokens and masks each assistant turn's content and end-of-turn
//! token.

use hearth::model::tokenizer::{PreTokenizer, tiny_vocab};
use hearth::model::{ChatFamily, ChatMessage, ChatTemplate, Role, Tokenizer, encode_chat};
use serde_json::Value;

fn fixtures() -> (Value, Value) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/{f}")).unwrap()).unwrap()
    };
    (read("cases.json"), read("expected.json"))
}

fn family(name: &str) -> ChatFamily {
    *ChatFamily::ALL
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("no family {name}"))
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "system" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                r => panic!("role {r}"),
            };
            ChatMessage::new(role, m["content"].as_str().unwrap())
        })
        .collect()
}

/// Every (family, conversation, generation prompt) case: the same text as jinja2, or an error where jinja2's
/// `raise_exception` fired (Mistral and Gemma refuse what their templates refuse).
#[test]
fn renderings_equal_python_jinja2() {
    let (cases, expected) = fixtures();
    let date = cases["date_string"].as_str().unwrap();
    let mut checked = 0;
    for fam in cases["families"].as_array().unwrap() {
        let name = fam["name"].as_str().unwrap();
        let tpl = ChatTemplate::new(family(name).template())
            .unwrap()
            .with_date(date);
        let (bos, eos) = (fam["bos"].as_str().unwrap(), fam["eos"].as_str().unwrap());
        for (conv, msgs) in cases["conversations"].as_object().unwrap() {
            let msgs = messages(msgs);
            for add_gen in [true, false] {
                let key = format!("{name}/{conv}/{}", if add_gen { "gen" } else { "nogen" });
                let got = tpl.render(&msgs, add_gen, bos, eos);
                match &expected[&key] {
                    Value::String(want) => assert_eq!(&got.unwrap(), want, "{key}"),
                    Value::Object(e) => {
                        let err = got.expect_err(&key).to_string();
                        let want = e["error"].as_str().unwrap();
                        assert!(err.contains(want), "{key}: {err} vs {want}");
                    }
                    other => panic!("{key}: {other:?}"),
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 42);
}

/// The tiny vocabulary plus one family's special tokens, with that family's template.
fn family_tokenizer(name: &str, specials: &[&str], bos: &str, eos: &str) -> Tokenizer {
    let (mut tokens, merges, types) = tiny_vocab();
    let mut types: Vec<i64> = types.into_iter().map(i64::from).collect();
    for s in specials.iter().chain([&bos, &eos]) {
        if !tokens.iter().any(|t| t == s) {
            tokens.push(s.to_string());
            types.push(3);
        }
    }
    let merges: Vec<&str> = merges.iter().map(String::as_str).collect();
    let mut tok =
        Tokenizer::new(tokens.clone(), &merges, Some(&types), PreTokenizer::Gpt2).unwrap();
    let id = |s: &str| tokens.iter().position(|t| t == s).unwrap() as u32;
    tok.bos_id = Some(id(bos));
    tok.eos_id = Some(id(eos));
    tok.set_chat_template(
        ChatTemplate::new(family(name).template())
            .unwrap()
            .with_date("26 Jul 2024"),
    );
    tok
}

#[test]
fn every_family_masks_assistant_content_and_end_of_turn() {
    let (cases, _) = fixtures();
    // (family, its turn tokens, the token that ends an assistant turn, whether it trims content)
    let families: [(&str, &[&str], &str, bool); 7] = [
        (
            "chatml",
            &["<|im_start|>", "<|im_end|>"],
            "<|im_end|>",
            false,
        ),
        (
            "qwen2.5",
            &["<|im_start|>", "<|im_end|>"],
            "<|im_end|>",
            false,
        ),
        (
            "qwen3",
            &["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
            "<|im_end|>",
            false,
        ),
        (
            "llama3",
            &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
            "<|eot_id|>",
            true,
        ),
        (
            "gemma3",
            &["<start_of_turn>", "<end_of_turn>"],
            "<end_of_turn>",
            true,
        ),
        (
            "phi3",
            &["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"],
            "<|end|>",
            false,
        ),
        ("mistral", &["[INST]", "[/INST]"], "</s>", false),
    ];
    for (name, specials, end, trims) in families {
        let fam = cases["families"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap();
        let tok = family_tokenizer(
            name,
            specials,
            fam["bos"].as_str().unwrap(),
            fam["eos"].as_str().unwrap(),
        );
        for (conv, msgs) in cases["conversations"].as_object().unwrap() {
            let msgs = messages(msgs);
            for add_gen in [true, false] {
                let Ok(text) = hearth::model::render_chat(&tok, &msgs, add_gen) else {
                    continue;
                };
                let p = encode_chat(&tok, &msgs, add_gen).unwrap();
                assert_eq!(tok.decode(&p.ids, false), text, "{name}/{conv}");
                let want: Vec<String> = msgs
                    .iter()
                    .filter(|m| m.role == Role::Assistant)
                    .map(|m| {
                        let c = if trims { m.content.trim() } else { &m.content };
                        format!("{c}{end}")
                    })
                    .collect();
                let got: Vec<String> = p
                    .assistant_spans
                    .iter()
                    .map(|r| tok.decode(&p.ids[r.clone()], false))
                    .collect();
                assert_eq!(got, want, "{name}/{conv}/{add_gen}");
                // The user's literal `<|im_end|>` is text in every family.
                if let Some(im_end) = tok.token_id("<|im_end|>") {
                    let user_ids = tok.encode("<|im_end|>", true).unwrap();
                    assert_eq!(user_ids, [im_end]);
                    let n = p.ids.iter().filter(|&&i| i == im_end).count();
                    assert_eq!(
                        n,
                        text.matches("<|im_end|>").count()
                            - usize::from(conv == "system_multiturn"),
                        "{name}/{conv}"
                    );
                }
            }
        }
    }
}
