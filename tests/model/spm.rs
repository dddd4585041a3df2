//! SentencePiece (`tokenizer.ggml.model = "llama"`) tokenization against Google's `sentencepiece`: a tiny BPE
//! vocabulary with byte fallback and the ids `sp.encode` gave for a varied list of strings, computed once by
//! `scripts/spm_fixtures.py` and committed as `tests/fixtures/spm/spm.json`.

use candle_core::quantized::gguf_file::Value as Gguf;
use hearth::model::Tokenizer;
use hearth::model::tokenizer::token_type;
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
