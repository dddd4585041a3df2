//! Sampling, stop conditions and streaming.

use candle_core::quantized::GgmlDType;
use hearth::model::gguf::GgufFile;
use hearth::model::{
    Arch, GenerateConfig, Sampler, StopReason, TinySpec, Tokenizer, Transformer, generate,
    write_tiny_model,
};

fn setup() -> (Transformer, Tokenizer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut spec = TinySpec::new(Arch::Qwen3);
    spec.dtype = GgmlDType::Q8_0;
    write_tiny_model(&path, &spec).unwrap();
    let tok = Tokenizer::from_gguf_metadata(GgufFile::open(&path).unwrap().metadata()).unwrap();
    (Transformer::from_gguf(&path).unwrap(), tok, dir)
}

#[test]
fn seeded_sampling_is_deterministic_and_streams_the_text() {
    let (m, tok, _d) = setup();
    let prompt = tok.encode("the cat", false).unwrap();
    let cfg = GenerateConfig {
        max_tokens: 16,
        temperature: 0.9,
        top_k: Some(40),
        top_p: Some(0.95),
        seed: 42,
        ..Default::default()
    };
    let mut streamed = String::new();
    let mut n = 0;
    let a = generate(&m, &tok, &prompt, None, &cfg, |e| {
        streamed.push_str(e.text);
        n += usize::from(e.token.is_some());
        true
    })
    .unwrap();
    let b = generate(&m, &tok, &prompt, None, &cfg, |_| true).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.reason, StopReason::MaxTokens);
    assert_eq!(a.tokens.len(), 16);
    assert_eq!(n, 16);
    assert_eq!(streamed, a.text);
    let c = generate(
        &m,
        &tok,
        &prompt,
        None,
        &GenerateConfig { seed: 43, ..cfg },
        |_| true,
    )
    .unwrap();
    assert_ne!(
        a.tokens, c.tokens,
        "different seeds should differ on a random model"
    );
}

#[test]
fn stop_strings_cut_text_and_are_never_streamed() {
    let (m, tok, _d) = setup();
    let prompt = tok.encode("the cat", false).unwrap();
    let free = generate(
        &m,
        &tok,
        &prompt,
        None,
        &GenerateConfig {
            max_tokens: 24,
            ..Default::default()
        },
        |_| true,
    )
    .unwrap();
    // Pick a stop string from the middle of the free-running text.
    let chars: Vec<char> = free.text.chars().collect();
    assert!(chars.len() >= 8, "{:?}", free.text);
    let stop: String = chars[4..6].iter().collect();
    let cfg = GenerateConfig {
        max_tokens: 24,
        stop_strings: vec![stop.clone()],
        ..Default::default()
    };
    let mut streamed = String::new();
    let out = generate(&m, &tok, &prompt, None, &cfg, |e| {
        streamed.push_str(e.text);
        true
    })
    .unwrap();
    assert_eq!(out.reason, StopReason::StopString(stop.clone()));
    let cut = free.text.find(&stop).unwrap();
    assert_eq!(out.text, free.text[..cut]);
    assert_eq!(streamed, out.text);
}

#[test]
fn stop_tokens_cancel_and_limits() {
    let (m, tok, _d) = setup();
    let prompt = tok.encode("hello", false).unwrap();
    let free = generate(
        &m,
        &tok,
        &prompt,
        None,
        &GenerateConfig {
            max_tokens: 6,
            ..Default::default()
        },
        |_| true,
    )
    .unwrap();
    let cfg = GenerateConfig {
        max_tokens: 6,
        stop_tokens: vec![free.tokens[2]],
        ..Default::default()
    };
    let out = generate(&m, &tok, &prompt, None, &cfg, |_| true).unwrap();
    assert_eq!(out.reason, StopReason::StopToken(free.tokens[2]));
    assert_eq!(
        out.tokens,
        free.tokens[..free
            .tokens
            .iter()
            .position(|&t| t == free.tokens[2])
            .unwrap()]
    );
    let mut k = 0;
    let out = generate(
        &m,
        &tok,
        &prompt,
        None,
        &GenerateConfig {
            max_tokens: 6,
            ..Default::default()
        },
        |_| {
            k += 1;
            k < 3
        },
    )
    .unwrap();
    assert_eq!(out.reason, StopReason::Cancelled);
    assert_eq!(out.tokens.len(), 3);
    assert!(generate(&m, &tok, &[], None, &GenerateConfig::default(), |_| true).is_err());
    let long = vec![1u32; m.max_positions()];
    assert!(generate(&m, &tok, &long, None, &GenerateConfig::default(), |_| true).is_err());
    let out = generate(
        &m,
        &tok,
        &vec![1u32; m.max_positions() - 2],
        None,
        &GenerateConfig::default(),
        |_| true,
    )
    .unwrap();
    assert_eq!(out.reason, StopReason::ContextFull);
    // Positions 254 and 255 are fed back; the token sampled for position 256 is returned unfed.
    assert_eq!(out.tokens.len(), 3);
}

#[test]
fn sampler_respects_top_k_and_greedy() {
    let logits = [0.0f32, 5.0, 4.9, -1.0];
    let mut greedy = Sampler::new(&GenerateConfig::default());
    assert_eq!(greedy.sample(&logits).unwrap(), 1);
    let mut s = Sampler::new(&GenerateConfig {
        temperature: 1.0,
        top_k: Some(2),
        seed: 1,
        ..Default::default()
    });
    for _ in 0..200 {
        assert!(matches!(s.sample(&logits).unwrap(), 1 | 2));
    }
    let mut p = Sampler::new(&GenerateConfig {
        temperature: 1.0,
        top_p: Some(0.01),
        seed: 1,
        ..Default::default()
    });
    assert_eq!(p.sample(&logits).unwrap(), 1);
    assert!(greedy.sample(&[f32::NAN]).is_err());
}

/// Empirical frequencies of `draws` samples against the distribution the settings define (softmax at the
/// temperature over the `top_k` best, cut to the smallest best-first prefix reaching `top_p`).
fn check_distribution(logits: &[f32], temperature: f32, top_k: Option<usize>, top_p: Option<f32>) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k.unwrap_or(logits.len()));
    let w: Vec<f64> = order
        .iter()
        .map(|&i| (((logits[i] - logits[order[0]]) / temperature) as f64).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut keep = order.len();
    if let Some(p) = top_p {
        let mut acc = 0.0;
        for (j, x) in w.iter().enumerate() {
            acc += x / total;
            if acc >= p as f64 {
                keep = j + 1;
                break;
            }
        }
    }
    let kept: f64 = w[..keep].iter().sum();
    let mut expected = vec![0f64; logits.len()];
    for (j, &i) in order[..keep].iter().enumerate() {
        expected[i] = w[j] / kept;
    }
    let draws = 10_000;
    let mut s = Sampler::new(&GenerateConfig {
        temperature,
        top_k,
        top_p,
        seed: 7,
        ..Default::default()
    });
    let mut seen = vec![0usize; logits.len()];
    for _ in 0..draws {
        seen[s.sample(logits).unwrap() as usize] += 1;
    }
    for (i, (&e, &c)) in expected.iter().zip(&seen).enumerate() {
        if e == 0.0 {
            assert_eq!(
                c, 0,
                "id {i} is outside the kept set but was drawn {c} times"
            );
        } else {
            // five standard deviations of a binomial count
            let sd = (draws as f64 * e * (1.0 - e)).sqrt();
            assert!(
                (c as f64 - draws as f64 * e).abs() <= 5.0 * sd + 2.0,
                "id {i}: drawn {c} times, expected {:.1}",
                draws as f64 * e
            );
        }
    }
}

#[test]
fn sampler_draws_from_the_distribution_its_settings_define() {
    // A vocabulary of 300 with a few strong ids, many ties and a long tail.
    let logits: Vec<f32> = (0..300u32)
        .map(|i| match i {
            17 => 6.0,
            250 => 5.5,
            3..=5 => 4.0,
            _ => ((i * 7919) % 97) as f32 / 40.0,
        })
        .collect();
    check_distribution(&logits, 1.0, None, None);
    check_distribution(&logits, 0.7, Some(5), None);
    check_distribution(&logits, 1.0, None, Some(0.5));
    check_distribution(&logits, 1.3, Some(200), Some(0.6));
    // A flat vocabulary: the nucleus holds 272 tied ids (the lowest ids first), more than the first prefix
    // the sampler orders.
    let flat = vec![0.25f32; 300];
    check_distribution(&flat, 1.0, None, Some(0.905));
}

#[test]
fn streamed_text_always_equals_final_text() {
    let (m, tok, _d) = setup();
    let prompt = tok.encode("hello", false).unwrap();
    for seed in 0..24u64 {
        // High temperature on a random model emits arbitrary bytes: split UTF-8 sequences and
        // partial stop strings at the end are common.
        let cfg = GenerateConfig {
            max_tokens: 12,
            temperature: 1.5,
            seed,
            stop_strings: vec!["e t".into(), "\u{FFFD}\u{FFFD}".into(), "ab".into()],
            stop_tokens: vec![tok.token_id("<|im_end|>").unwrap()],
            ..Default::default()
        };
        let mut streamed = String::new();
        let out = generate(&m, &tok, &prompt, None, &cfg, |e| {
            streamed.push_str(e.text);
            true
        })
        .unwrap();
        assert_eq!(streamed, out.text, "seed {seed}: {:?}", out.reason);
        for s in &cfg.stop_strings {
            assert!(!out.text.contains(s.as_str()), "seed {seed}");
        }
    }
}

/// Inside a pool of several threads, `generate` keeps the other threads spinning for each step's splits (see
/// `with_spinning_pool` and `model::spin_pool`): every call returns, and the tokens equal those of one thread and
/// of no pool at all. The model is wide enough that every projection splits across threads (q alone is 2^16
/// weights) and the prompt long enough that attention splits its positions too.
#[test]
fn generation_in_a_pool_of_any_size_gives_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.gguf");
    let mut spec = TinySpec::new(Arch::Qwen3);
    spec.dtype = GgmlDType::Q8_0;
    (spec.hidden_size, spec.intermediate_size, spec.head_dim) = (256, 512, 64);
    write_tiny_model(&path, &spec).unwrap();
    let tok = Tokenizer::from_gguf_metadata(GgufFile::open(&path).unwrap().metadata()).unwrap();
    let m = Transformer::from_gguf(&path).unwrap();
    let prompt = tok
        .encode(
            &"the cat sat on the mat and then the dog sat on it. ".repeat(3),
            false,
        )
        .unwrap();
    assert!(prompt.len() >= 64, "{} prompt tokens", prompt.len());
    let cfg = GenerateConfig {
        max_tokens: 24,
        temperature: 0.9,
        seed: 7,
        ..Default::default()
    };
    let in_pool = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| generate(&m, &tok, &prompt, None, &cfg, |_| true).unwrap())
    };
    let one = in_pool(1);
    assert_eq!(one.tokens.len(), 24);
    for threads in [2, 3, 4] {
        assert_eq!(in_pool(threads), one, "{threads} threads");
    }
    assert_eq!(
        generate(&m, &tok, &prompt, None, &cfg, |_| true).unwrap(),
        one
    );
}

/// BOS, EOS and EOT from the GGUF metadata: `add_bos_token` puts BOS before raw and chat prompts (absent, it
/// does not), and greedy decoding stops on `eot_token_id` as it does on EOS.
#[test]
fn bos_and_eot_come_from_the_metadata() {
    use hearth::model::{ChatMessage, Role, encode_chat};
    let dir = tempfile::tempdir().unwrap();
    let load = |spec: &TinySpec, name: &str| {
        let path = dir.path().join(name);
        write_tiny_model(&path, spec).unwrap();
        let tok = Tokenizer::from_gguf_metadata(GgufFile::open(&path).unwrap().metadata()).unwrap();
        (Transformer::from_gguf(&path).unwrap(), tok)
    };
    let plain_spec = TinySpec::new(Arch::Llama);
    let (m, plain) = load(&plain_spec, "plain.gguf");
    let messages = [ChatMessage::new(Role::User, "hi".to_string())];
    assert!(!plain.add_bos);
    assert_eq!(
        plain.encode_prompt("hello", false).unwrap(),
        plain.encode("hello", false).unwrap()
    );
    let prompt = plain.encode("hello", false).unwrap();
    let free = generate(
        &m,
        &plain,
        &prompt,
        None,
        &GenerateConfig::greedy(&plain, 8),
        |_| true,
    )
    .unwrap();
    assert_eq!(
        free.tokens.len(),
        8,
        "the tiny model stopped early: {:?}",
        free.reason
    );
    let eot = free.tokens[2];
    let first = free.tokens.iter().position(|&t| t == eot).unwrap();

    let mut spec = plain_spec.clone();
    spec.add_bos_token = Some(true);
    spec.eot_token_id = Some(eot);
    let (m, tok) = load(&spec, "bos-eot.gguf");
    let bos = tok.bos_id.unwrap();
    assert!(tok.add_bos);
    assert_eq!(tok.eot_id, Some(eot));
    assert_eq!(
        tok.encode_prompt("hello", false).unwrap(),
        [vec![bos], tok.encode("hello", false).unwrap()].concat()
    );
    let chat = encode_chat(&tok, &messages, true).unwrap();
    let plain_chat = encode_chat(&plain, &messages, true).unwrap();
    assert_eq!(chat.ids, [vec![bos], plain_chat.ids].concat());
    let cfg = GenerateConfig::greedy(&tok, 8);
    assert!(cfg.stop_tokens.contains(&eot) && cfg.stop_tokens.contains(&tok.eos_id.unwrap()));
    let out = generate(&m, &tok, &prompt, None, &cfg, |_| true).unwrap();
    assert_eq!(out.reason, StopReason::StopToken(eot));
    assert_eq!(out.tokens, free.tokens[..first]);
}
