#!/usr/bin/env python3
"""Writes an F16 GGUF with random weights shaped like a real model, for scripts/bench_real_sizes.sh.

    real_sizes_gguf.py SHAPE TOKENIZER.gguf OUT.gguf

SHAPE is `qwen3-1.7b` or `llama-3.2-1b` (the published configurations: layers, widths, heads, RoPE base,
Llama 3.1 frequency scaling as `rope_freqs.weight`, tied embeddings). The tokenizer metadata (`tokenizer.*`:
vocabulary, merges, pre-tokenizer, special ids, chat template) is copied from TOKENIZER.gguf (the default
model, SmolLM2-135M-Instruct), so that llama.cpp and hearth both accept the file; its vocabulary is padded
with unused tokens to the real model's size, so the embedding and the (tied) output head have their real
shapes. Weights are N(0, 0.02) as the models are initialised, norms 1, so that activations and logits have a
realistic spread and the argmax is not degenerate. Written with llama.cpp's own writer (gguf-py, from the
same source package as the llama.cpp build), one tensor at a time.
"""

import math
import sys

import numpy as np
import gguf

SHAPES = {
    # Qwen/Qwen3-1.7B config.json
    "qwen3-1.7b": dict(
        arch="qwen3", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ff=6144,
        vocab=151936, theta=1_000_000.0, ctx=40960, eps=1e-6, qk_norm=True, rope_freqs=None,
    ),
    # meta-llama/Llama-3.2-1B config.json (rope_scaling: llama3, factor 32, low 1, high 4, original 8192)
    "llama-3.2-1b": dict(
        arch="llama", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ff=8192,
        vocab=128256, theta=500_000.0, ctx=131072, eps=1e-5, qk_norm=False,
        rope_freqs=dict(factor=32.0, low=1.0, high=4.0, original=8192),
    ),
}


def llama3_rope_factors(head_dim, theta, factor, low, high, original):
    # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors (rope_type llama3).
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def copy_field(w, field):
    key = field.name
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[1]
        vals = field.contents()
        w.add_key_value(key, vals, vtype, sub)
    else:
        w.add_key_value(key, field.contents(), vtype)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(SHAPES)}}} TOKENIZER.gguf OUT.gguf")
    name, tok_path, out = sys.argv[1:]
    s = SHAPES[name]
    reader = gguf.GGUFReader(tok_path)
    fields = {f.name: f for f in reader.fields.values()}
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    pad = s["vocab"] - len(tokens)
    if pad < 0:
        sys.exit(f"{tok_path} has {len(tokens)} tokens, more than {name}'s {s['vocab']}")
    tokens = tokens + [f"<|hearth_unused_{i}|>" for i in range(pad)]
    types = types + [int(gguf.TokenType.UNUSED)] * pad

    a = s["arch"]
    w = gguf.GGUFWriter(out, a)
    w.add_name(f"hearth random {name}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_uint32(f"{a}.block_count", s["layers"])
    w.add_uint32(f"{a}.context_length", s["ctx"])
    w.add_uint32(f"{a}.embedding_length", s["hidden"])
    w.add_uint32(f"{a}.feed_forward_length", s["ff"])
    w.add_uint32(f"{a}.attention.head_count", s["heads"])
    w.add_uint32(f"{a}.attention.head_count_kv", s["kv_heads"])
    w.add_uint32(f"{a}.attention.key_length", s["head_dim"])
    w.add_uint32(f"{a}.attention.value_length", s["head_dim"])
    w.add_uint32(f"{a}.rope.dimension_count", s["head_dim"])
    w.add_float32(f"{a}.rope.freq_base", s["theta"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s["eps"])
    if a == "llama":
        w.add_uint32(f"{a}.vocab_size", s["vocab"])
    for key, field in fields.items():
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.ggml.tokens":
            w.add_array(key, tokens)
        elif key == "tokenizer.ggml.token_type":
            w.add_key_value(key, types, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
        else:
            copy_field(w, field)

    h, hd, ff, vocab = s["hidden"], s["head_dim"], s["ff"], s["vocab"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    mats = [("token_embd.weight", (vocab, h))]
    vecs = [("output_norm.weight", h)]
    if s["rope_freqs"]:
        vecs.append(("rope_freqs.weight", hd // 2))
    for l in range(s["layers"]):
        p = f"blk.{l}"
        mats += [
            (f"{p}.attn_q.weight", (q, h)),
            (f"{p}.attn_k.weight", (kv, h)),
            (f"{p}.attn_v.weight", (kv, h)),
            (f"{p}.attn_output.weight", (h, q)),
            (f"{p}.ffn_gate.weight", (ff, h)),
            (f"{p}.ffn_up.weight", (ff, h)),
            (f"{p}.ffn_down.weight", (h, ff)),
        ]
        vecs += [(f"{p}.attn_norm.weight", h), (f"{p}.ffn_norm.weight", h)]
        if s["qk_norm"]:
            vecs += [(f"{p}.attn_q_norm.weight", hd), (f"{p}.attn_k_norm.weight", hd)]
    for n, shape in mats:
        w.add_tensor_info(n, shape, np.dtype(np.float16), 2 * shape[0] * shape[1])
    for n, length in vecs:
        w.add_tensor_info(n, (length,), np.dtype(np.float32), 4 * length)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(35)
    for n, shape in mats:
        x = rng.standard_normal(shape, dtype=np.float32)
        x *= 0.02
        w.write_tensor_data(x.astype(np.float16))
    for n, length in vecs:
        if n == "rope_freqs.weight":
            f = s["rope_freqs"]
            w.write_tensor_data(llama3_rope_factors(hd, s["theta"], f["factor"], f["low"], f["high"], f["original"]))
        else:
            w.write_tensor_data(np.ones(length, dtype=np.float32))
    w.close()
    params = sum(r * c for _, (r, c) in mats)
    print(f"{out}: {name}, {params / 1e9:.2f}B parameters in matrices, vocabulary {len(tokens)} ({pad} unused added)")


if __name__ == "__main__":
    main()
