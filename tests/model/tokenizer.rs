//! Byte-level BPE and ChatML encoding.

use hearth::model::gguf::GgufFile;
use hearth::model::tokenizer::{PreTokenizer, pre_tokenize};
use hearth::model::{
    Arch, ChatMessage, Role, TinySpec, Tokenizer, encode_chat, render_chat, write_tiny_model,
};

fn tiny_tokenizer() -> Tokenizer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    write_tiny_model(&path, &TinySpec::new(Arch::Llama)).unwrap();
    Tokenizer::from_gguf_metadata(GgufFile::open(&path).unwrap().metadata()).unwrap()
}

const SAMPLES: [&str; 9] = [
    "",
    "the cat is on the mat",
    "Hello, world!  Two  spaces\tand a tab\n\nnew lines\r\n",
    "naïve café — “quotes” and emoji 🦀🔥 and 中文",
    "numbers 12345 and 3.14159, don't we'll I'M",
    "   leading and trailing   ",
    "<|im_start|>user\nhi<|im_end|>",
    "\u{0}\u{1}\u{7f} control bytes",
    "a'b 'll '\u{301}",
];

#[test]
fn encode_decode_round_trips() {
    let tok = tiny_tokenizer();
    for s in SAMPLES {
        for allow in [false, true] {
            let ids = tok.encode(s, allow).unwrap();
            assert_eq!(tok.decode(&ids, false), s, "allow_special={allow}");
            assert!(ids.iter().all(|&i| (i as usize) < tok.vocab_size()));
        }
    }
}

#[test]
fn merges_apply_in_rank_order() {
    let tok = tiny_tokenizer();
    // "Ġthe" comes from "Ġt" + "he".
    let ids = tok.encode(" the", false).unwrap();
    assert_eq!(ids, vec![tok.token_id("Ġthe").unwrap()]);
    let ids = tok.encode("thing", false).unwrap();
    let pieces: Vec<String> = ids.iter().map(|&i| tok.decode(&[i], false)).collect();
    assert_eq!(pieces, vec!["t", "h", "ing"]);
}

#[test]
fn specials_only_when_allowed() {
    let tok = tiny_tokenizer();
    let start = tok.token_id("<|im_start|>").unwrap();
    let ids = tok.encode("x<|im_start|>y", true).unwrap();
    assert!(ids.contains(&start));
    let ids = tok.encode("x<|im_start|>y", false).unwrap();
    assert!(
        !ids.contains(&start),
        "user text must not forge a special token"
    );
    assert_eq!(tok.decode(&ids, false), "x<|im_start|>y");
    assert_eq!(tok.bos_id, Some(start));
    assert!(tok.is_special(start));
}

#[test]
fn gpt2_pre_tokenizer_matches_regex_splits() {
    let split = |s| pre_tokenize(s, PreTokenizer::Gpt2);
    assert_eq!(split("Hello world"), vec!["Hello", " world"]);
    assert_eq!(split("it's 42!!"), vec!["it", "'s", " 42", "!!"]);
    assert_eq!(split("a  b"), vec!["a", " ", " b"]);
    assert_eq!(split("a\n\nb  "), vec!["a", "\n", "\n", "b", "  "]);
    assert_eq!(split("x \ny"), vec!["x", " ", "\n", "y"]);
    assert_eq!(
        pre_tokenize("ab 123", PreTokenizer::SmolLm),
        vec!["ab", " ", "1", "2", "3"]
    );
    let q = |s| pre_tokenize(s, PreTokenizer::Qwen2);
    assert_eq!(q("Hello,world 12"), vec!["Hello", ",world", " ", "1", "2"]);
    assert_eq!(q("a.\n\nb"), vec!["a", ".\n\n", "b"]);
    assert_eq!(q("I'M  ok"), vec!["I", "'M", " ", " ok"]);
}

#[test]
fn chat_template_and_assistant_spans() {
    let tok = tiny_tokenizer();
    let msgs = vec![
        ChatMessage::new(Role::System, "be brief"),
        ChatMessage::new(Role::User, "hi <|im_end|>"),
        ChatMessage::new(Role::Assistant, "hello there"),
    ];
    let text = render_chat(&tok, &msgs, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi <|im_end|><|im_end|>\n\
         <|im_start|>assistant\nhello there<|im_end|>\n<|im_start|>assistant\n"
    );
    let p = encode_chat(&tok, &msgs, true).unwrap();
    // Same text back, yet the user's literal "<|im_end|>" is not the special token.
    assert_eq!(tok.decode(&p.ids, false), text);
    let end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(p.ids.iter().filter(|&&i| i == end).count(), 3);
    assert_eq!(p.assistant_spans.len(), 1);
    let span = p.assistant_spans[0].clone();
    assert_eq!(
        tok.decode(&p.ids[span.clone()], false),
        "hello there<|im_end|>"
    );
    let mask = p.assistant_mask();
    assert_eq!(mask.iter().filter(|m| **m).count(), span.len());
}

#[test]
fn bad_tokenizer_metadata_is_an_error() {
    let err = Tokenizer::new(vec!["a".into()], &[], None, PreTokenizer::Gpt2).unwrap_err();
    assert!(err.to_string().contains("byte token"), "{err}");
}

/// Differential test against the `tokenizers` pipelines candle-core builds from GGUF metadata,
/// on the tiny vocabulary, for each pre-tokenizer flavour.
#[test]
fn pre_tokenizers_match_the_reference_pipelines() {
    use candle_core::quantized::gguf_file::{Content, Value};
    use candle_core::quantized::tokenizer::TokenizerFromGguf;
    use hearth::model::gguf::write_gguf;
    let (tokens, merges, types) = hearth::model::tokenizer::tiny_vocab();
    let corpus = [
        "Hello world, this is the thing.",
        "it's   spaced\tout\n\n\nand  trailing  ",
        "I'M SHOUTING 'LL 'Re we've",
        "numbers 1 12 123 1234 12345 and 3.14159!!",
        "punct:;!? (parens) [brackets] {braces} ... --- ''' \"\"\"",
        "line one\r\nline two\n  indented\n\ttabbed\n",
        "ünïcödé café naïve 中文字符 日本語 😀🦀 ٣٤٥ Ⅻ",
        "a.\n\nb .\n c!\r\n\r\n d",
        " leading space and x  \n  y",
        "mixed123abc 4x4 v2.0 e=mc^2",
    ];
    let dir = tempfile::tempdir().unwrap();
    // (GGUF `pre`, whether candle's pipeline adds a prefix space: its GPT-2 default does)
    for (pre, prefix_space) in [("gpt2", true), ("qwen2", false), ("llama3", false)] {
        let md: Vec<(String, Value)> = vec![
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(tokens.iter().cloned().map(Value::String).collect()),
            ),
            (
                "tokenizer.ggml.merges".into(),
                Value::Array(merges.iter().cloned().map(Value::String).collect()),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(types.iter().map(|t| Value::I32(*t)).collect()),
            ),
            (
                "tokenizer.ggml.add_space_prefix".into(),
                Value::Bool(prefix_space),
            ),
        ];
        let path = dir.path().join(format!("{pre}.gguf"));
        write_gguf(&path, &md, &[]).unwrap();
        let content = Content::read(&mut std::fs::File::open(&path).unwrap()).unwrap();
        let ours = Tokenizer::from_gguf_metadata(&content.metadata).unwrap();
        let theirs = tokenizers::Tokenizer::from_gguf(&content).unwrap();
        for s in corpus {
            let want = theirs.encode(s, false).unwrap().get_ids().to_vec();
            let got = ours.encode(s, false).unwrap();
            assert_eq!(got, want, "{pre}: {s:?}");
        }
    }
}

/// ChatML ids as hearth built them before chat templates were rendered: structure tokens by id, each piece
/// encoded on its own, content without special tokens. The rendered template must give the same ids.
pub fn chatml_by_hand(
    tok: &Tokenizer,
    msgs: &[ChatMessage],
    system: Option<&str>,
    add_gen: bool,
) -> Vec<u32> {
    let (start, end) = (
        tok.token_id("<|im_start|>").unwrap(),
        tok.token_id("<|im_end|>").unwrap(),
    );
    let enc = |s: &str| tok.encode(s, false).unwrap();
    let mut ids = tok.bos_prefix();
    let turn = |role: &str, content: &str, ids: &mut Vec<u32>| {
        ids.push(start);
        ids.extend(enc(role));
        ids.extend(enc("\n"));
        ids.extend(enc(content));
        ids.push(end);
        ids.extend(enc("\n"));
    };
    if let Some(sys) = system
        && msgs.first().is_none_or(|m| m.role != Role::System)
    {
        turn("system", sys, &mut ids);
    }
    for m in msgs {
        turn(m.role.as_str(), &m.content, &mut ids);
    }
    if add_gen {
        ids.push(start);
        ids.extend(enc("assistant"));
        ids.extend(enc("\n"));
    }
    ids
}

/// SmolLM2-135M-Instruct's GGUF template, verbatim.
pub const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[test]
fn smollm2_template_gives_the_chatml_ids_as_before() {
    use hearth::model::ChatTemplate;
    let mut tok = tiny_tokenizer();
    tok.set_chat_template(ChatTemplate::new(SMOLLM2_TEMPLATE).unwrap());
    let sys = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
    let convs = [
        vec![ChatMessage::new(Role::User, "hi")],
        vec![
            ChatMessage::new(Role::System, "terse"),
            ChatMessage::new(Role::User, "what's 2+2? <|im_start|>"),
            ChatMessage::new(Role::Assistant, " 4, of course.\n"),
            ChatMessage::new(Role::User, "and\n\n3+3?"),
        ],
        vec![
            ChatMessage::new(Role::User, "user"),
            ChatMessage::new(Role::Assistant, "assistant"),
        ],
    ];
    for msgs in &convs {
        for add_gen in [true, false] {
            let p = encode_chat(&tok, msgs, add_gen).unwrap();
            assert_eq!(
                p.ids,
                chatml_by_hand(&tok, msgs, Some(sys), add_gen),
                "{msgs:?} {add_gen}"
            );
            let text = render_chat(&tok, msgs, add_gen).unwrap();
            assert_eq!(tok.decode(&p.ids, false), text);
            // Each assistant turn's span is its content and `<|im_end|>`.
            let want: Vec<String> = msgs
                .iter()
                .filter(|m| m.role == Role::Assistant)
                .map(|m| format!("{}<|im_end|>", m.content))
                .collect();
            let got: Vec<String> = p
                .assistant_spans
                .iter()
                .map(|r| tok.decode(&p.ids[r.clone()], false))
                .collect();
            assert_eq!(got, want);
        }
    }
    // The user's literal `<|im_start|>` stays text.
    let start = tok.token_id("<|im_start|>").unwrap();
    let p = encode_chat(&tok, &convs[1], false).unwrap();
    assert_eq!(p.ids.iter().filter(|&&i| i == start).count(), 4);
}

#[test]
fn qwen3_template_answers_without_thinking_and_spans_skip_the_think_block() {
    use hearth::model::{ChatFamily, ChatTemplate};
    let mut tok = tiny_tokenizer();
    tok.set_chat_template(ChatTemplate::new(ChatFamily::Qwen3.template()).unwrap());
    let user = [ChatMessage::new(Role::User, "hi")];
    let text = render_chat(&tok, &user, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let conv = [
        ChatMessage::new(Role::User, "hi"),
        ChatMessage::new(Role::Assistant, "one"),
        ChatMessage::new(Role::User, "again"),
        ChatMessage::new(Role::Assistant, "two"),
    ];
    let p = encode_chat(&tok, &conv, false).unwrap();
    let spans: Vec<String> = p
        .assistant_spans
        .iter()
        .map(|r| tok.decode(&p.ids[r.clone()], false))
        .collect();
    // The last turn carries the empty think block the generation prompt ends with; it is not trained on.
    assert_eq!(spans, ["one<|im_end|>", "two<|im_end|>"]);
    assert!(
        tok.decode(&p.ids, false)
            .contains("<think>\n\n</think>\n\ntwo")
    );
}

#[test]
fn templates_fall_back_by_family_and_errors_name_the_key() {
    use hearth::model::ChatTemplate;
    // The tiny vocabulary has ChatML's markers and no template: plain ChatML.
    let tok = tiny_tokenizer();
    let text = render_chat(&tok, &[ChatMessage::new(Role::User, "x")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    );
    let e = ChatTemplate::new("{% for m in messages %}").unwrap_err();
    assert!(e.to_string().contains("tokenizer.chat_template"), "{e}");
    // raise_exception surfaces as an error, not a panic or an empty prompt.
    let mut tok = tiny_tokenizer();
    tok.set_chat_template(
        ChatTemplate::new("{{ raise_exception('System role not supported') }}").unwrap(),
    );
    let e = encode_chat(&tok, &[ChatMessage::new(Role::User, "x")], true).unwrap_err();
    assert!(e.to_string().contains("System role not supported"), "{e}");
    assert_eq!(
        hearth::model::chat::strftime("%d %b %Y %H:%M:%S %A", 1_721_952_000),
        "26 Jul 2024 00:00:00 Friday"
    );
}

/// The tiny model's tokenizer metadata with `tokenizer.ggml.pre` set to `pre` and the token `Ġcab` added, which
/// no merge reaches.
fn with_whole_word(pre: &str) -> Result<Tokenizer, hearth::model::ModelError> {
    use candle_core::quantized::gguf_file::Value;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    write_tiny_model(&path, &TinySpec::new(Arch::Llama)).unwrap();
    let mut md = GgufFile::open(&path).unwrap().metadata().clone();
    let Some(Value::Array(tokens)) = md.get_mut("tokenizer.ggml.tokens") else {
        panic!("no tokens");
    };
    tokens.push(Value::String("Ġcab".into()));
    if let Some(Value::Array(types)) = md.get_mut("tokenizer.ggml.token_type") {
        types.push(Value::I32(1));
    }
    md.insert("tokenizer.ggml.pre".into(), Value::String(pre.into()));
    Tokenizer::from_gguf_metadata(&md)
}

/// Llama 3 takes a piece the vocabulary holds whole without merging (its `ignore_merges`, as llama.cpp's LLAMA3
/// pre-tokenizer), where merges may not reach that token; Qwen2 merges. A pre-tokenizer hearth does not split
/// for is refused, naming the key, rather than splitting text as GPT-2 does.
#[test]
fn llama3_ignores_merges_for_whole_pieces_and_unknown_pre_tokenizers_are_refused() {
    let llama3 = with_whole_word("llama-bpe").unwrap();
    let cab = llama3.token_id("Ġcab").unwrap();
    assert_eq!(llama3.encode("a cab", false).unwrap()[1..], [cab]);
    let qwen2 = with_whole_word("qwen2").unwrap();
    let ids = qwen2.encode("a cab", false).unwrap();
    assert!(ids.len() > 2 && !ids.contains(&cab), "{ids:?}");
    for pre in ["qwen35", "falcon", ""] {
        let err = with_whole_word(pre).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.ggml.pre") && err.contains(&format!("`{pre}`")),
            "{err}"
        );
    }
}
