#!/usr/bin/env python3
"""Computes tests/fixtures/spm/spm.json: a tiny SentencePiece BPE vocabulary (byte fallback, Llama's settings) and
the ids Google's `sentencepiece` gives for a varied list of strings, for tests/model/spm.rs to match. Run once
outside CI when the strings or settings change:

    python3 -m venv target/spm-venv && target/spm-venv/bin/pip install sentencepiece protobuf jinja2
    target/spm-venv/bin/python scripts/spm_fixtures.py

The model is trained on the repository's README and docs at a pinned commit (English prose: CJK and emoji are left to byte
fallback) as Llama's and Mistral's tokenizer.model were set up: BPE, identity normalisation, extra whitespace
kept, digits split, a dummy prefix. Each string is encoded twice, with `add_dummy_prefix` on (Llama 2, Mistral,
Phi-3: `tokenizer.ggml.add_space_prefix` true or absent) and off (Gemma's `add_space_prefix = false`).

`sp.encode` matches user-defined pieces in text and never control ones. llama.cpp, with special tokens parsed,
splits text at control, user-defined and unknown (`<unk>`) tokens and encodes each text fragment on its own, each with the space
prefix (every fragment starts the text or follows a special token): `special` is that, built from `sp.encode`
of each fragment. `chat` is each family template (src/model/chat_templates/, rendered by jinja2 as
scripts/chat_fixtures.py does) tokenized that way after the BOS the tokenizer adds: what llama.cpp's server
feeds the model for that conversation.
"""
import io
import json
import os
import subprocess
import sys

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from chat_fixtures import environment  # noqa: E402

CONTROL = ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|endoftext|>", "<start_of_turn>",
           "<end_of_turn>", "[INST]", "[/INST]"]
USER_DEFINED = ["<|tool|>"]

STRINGS = [
    "",
    "Hello world",
    "the model serves the adapters",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "two  spaces and   three",
    " ",
    "   ",
    "line one\nline two\n\nafter a blank line\n",
    "\n starts with a newline",
    "tabs\tand\r\ncarriage returns",
    "numbers 12345 and 3.14159, 2026-12-06",
    "ALL CAPS and MixedCase and snake_case_words",
    "punctuation: (parens) [brackets] {braces} ... --- \"quotes\" 'single'",
    "café naïve résumé",
    "中文字符 and 日本語",
    "emoji 🦀🔥 in text",
    "👍",
    "a<0x41>b <s> </s> <unk>",
    "the <|user|> marker is text here",
    "<|user|>\nhi<|end|>\n<|assistant|>\n",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "[INST] what is 2+2? [/INST] 4</s>",
    "call <|tool|> now",
    "<|tool|><|tool|>x",
]

CONVERSATION = [
    {"role": "user", "content": "What is a tokenizer?"},
    {"role": "assistant", "content": "It splits text into pieces."},
    {"role": "user", "content": "the model: 3 examples, with emoji 🦀."},
]

# (family template, add_space_prefix, add_bos, bos, eos) as each family's GGUFs set them.
FAMILIES = [
    {"name": "phi3", "add_space_prefix": True, "add_bos": False, "bos": "<s>", "eos": "<|endoftext|>"},
    {"name": "gemma3", "add_space_prefix": False, "add_bos": True, "bos": "<s>", "eos": "</s>"},
    {"name": "mistral", "add_space_prefix": True, "add_bos": True, "bos": "<s>", "eos": "</s>"},
]


# The corpus is the README and docs as of this commit, so that later edits to them do not change the vocabulary.
CORPUS_COMMIT = "5f96020"


def corpus():
    names = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", CORPUS_COMMIT, "docs/"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in ["README.md"] + sorted(n for n in names if n.endswith(".md")):
        text = subprocess.run(["git", "-C", ROOT, "show", f"{CORPUS_COMMIT}:{name}"], check=True,
                              capture_output=True, text=True).stdout
        for line in text.split("\n"):
            if line.strip():
                yield line


def train():
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=corpus(),
        model_writer=model,
        model_type="bpe",
        vocab_size=1000,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        character_coverage=0.995,
        control_symbols=CONTROL,
        user_defined_symbols=USER_DEFINED,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def processor(proto_bytes, prefix):
    proto = pb.ModelProto()
    proto.ParseFromString(proto_bytes)
    proto.normalizer_spec.add_dummy_prefix = prefix
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(proto.SerializeToString())
    return sp


def specials(sp):
    return sorted(
        [(sp.id_to_piece(i), i) for i in range(sp.get_piece_size()) if sp.is_control(i)
         or sp.is_unknown(i) or sp.id_to_piece(i) in USER_DEFINED],
        key=lambda s: -len(s[0]),
    )


def split_encode(sp, text, specials):
    """llama.cpp with special tokens parsed: the earliest special (the longest where several start there) is its
    id; each text fragment between is encoded on its own (and so gets the dummy prefix)."""
    out = []
    rest = text
    while rest:
        best = None
        for s, i in specials:
            p = rest.find(s)
            if p >= 0 and (best is None or p < best[0] or (p == best[0] and len(s) > best[1])):
                best = (p, len(s), i)
        if best is None:
            out += sp.encode(rest)
            break
        if best[0] > 0:
            out += sp.encode(rest[:best[0]])
        out.append(best[2])
        rest = rest[best[0] + best[1]:]
    return out


def main():
    proto_bytes = train()
    with_prefix = processor(proto_bytes, True)
    without = processor(proto_bytes, False)
    sp = with_prefix
    n = sp.get_piece_size()
    types = []
    for i in range(n):
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.id_to_piece(i) in USER_DEFINED:
            types.append(4)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)
    sps = specials(sp)
    cases = []
    for s in STRINGS:
        case = {"text": s}
        for key, proc in (("prefix", with_prefix), ("no_prefix", without)):
            ids = proc.encode(s)
            case[key] = {
                "sp": ids,
                "decoded": proc.decode(ids),
                "special": split_encode(proc, s, sps),
            }
        cases.append(case)
    env = environment()
    chats = []
    for fam in FAMILIES:
        with open(os.path.join(ROOT, "src/model/chat_templates", fam["name"] + ".jinja")) as f:
            template = env.from_string(f.read())
        proc = with_prefix if fam["add_space_prefix"] else without
        text = template.render(messages=CONVERSATION, add_generation_prompt=True, bos_token=fam["bos"],
                               eos_token=fam["eos"], enable_thinking=False)
        ids = []
        body = text
        if fam["add_bos"]:
            ids.append(sp.piece_to_id(fam["bos"]))
            # llama.cpp's server would add a second BOS; hearth drops the one the template wrote.
            if body.startswith(fam["bos"]):
                body = body[len(fam["bos"]):]
        ids += split_encode(proc, body, sps)
        chats.append(dict(fam, text=text, ids=ids))
    out = {
        "sentencepiece": spm.__version__,
        "pieces": [sp.id_to_piece(i) for i in range(n)],
        "scores": [sp.get_score(i) for i in range(n)],
        "types": types,
        "conversation": CONVERSATION,
        "cases": cases,
        "chats": chats,
    }
    os.makedirs(os.path.join(ROOT, "tests/fixtures/spm"), exist_ok=True)
    with open(os.path.join(ROOT, "tests/fixtures/spm/spm.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    byte_hits = sum(1 for c in cases for i in c["prefix"]["sp"] if types[i] == 6)
    print(f"{n} pieces, {len(cases)} strings ({byte_hits} byte-fallback ids), {len(chats)} chats, "
          f"sentencepiece {spm.__version__}")


if __name__ == "__main__":
    main()
