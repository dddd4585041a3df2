#!/usr/bin/env python3
"""llama.cpp's logits beside hearth's on the same GGUF and tokens, for scripts/bench_real_sizes.sh.

    real_sizes_logits.py GGUF HEARTH_PREFIX

HEARTH_PREFIX.tokens.json holds the token ids, HEARTH_PREFIX.f32 hearth's logits and HEARTH_PREFIX.ref.f32 an f32
reference's (every product in f32 over the file's weights dequantized), one row of the vocabulary per position,
little-endian f32, all written by `real_sizes logits`. The same ids go through llama.cpp in one batch (the
`llama_cpp` package from the llama-cpp-python source package, over the libllama.so built beside llama-bench:
LLAMA_CPP_LIB_PATH), every position's logits kept. Prints one line per pair (hearth / llama.cpp, and each
against the reference): top-1 agreement, and the relative error per position, max_v |a - b| / max_v |b|, as its
maximum and median over positions.
"""

import json
import sys

import numpy as np
import llama_cpp


def compare(a, b):
    agree = float(np.mean(a.argmax(1) == b.argmax(1)))
    rel = np.abs(a - b).max(1) / np.abs(b).max(1)
    return f"top-1 agreement {agree * 100:5.1f}% | relative error max {rel.max():.4f}, median {np.median(rel):.4f}"


def main():
    gguf, prefix = sys.argv[1:]
    tokens = json.load(open(prefix + ".tokens.json"))
    n = len(tokens)
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=max(512, n), n_batch=max(512, n), n_ubatch=max(512, n),
                          n_threads=2, logits_all=True, verbose=False)
    llm.eval(tokens)
    theirs = np.asarray(llm.scores[:n], dtype=np.float32)
    ours = np.fromfile(prefix + ".f32", dtype="<f4").reshape(n, -1)
    ref = np.fromfile(prefix + ".ref.f32", dtype="<f4").reshape(n, -1)
    if ours.shape != theirs.shape:
        sys.exit(f"hearth's logits are {ours.shape}, llama.cpp's {theirs.shape}")
    # How far apart the two best logits are: disagreements sit where this is small.
    top2 = np.sort(ref, axis=1)[:, -2:]
    print(f"logits over {n} positions (spread: std {ref.std():.3f}, median top-1 margin {np.median(top2[:, 1] - top2[:, 0]):.3f})")
    print(f"  hearth / llama.cpp:    {compare(ours, theirs)}")
    print(f"  hearth / f32 ref:      {compare(ours, ref)}")
    print(f"  llama.cpp / f32 ref:   {compare(theirs, ref)}")


if __name__ == "__main__":
    main()
