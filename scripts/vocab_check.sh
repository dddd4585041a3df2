#!/usr/bin/env bash
# hearth's tokenizer against llama.cpp's own tokenizer tests: the real vocabularies (Llama 2 and 3, Phi-3, Qwen2,
# GPT-2, and others hearth refuses) that the llama.cpp tree in the llama-cpp-python source package ships under
# models/, each with its test strings (.inp) and llama.cpp's ids for them (.out). Unpacks that package as
# scripts/llamacpp_build.sh does (and builds llama-bench there on first use, ~10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llamacpp_build.sh
models=$llamacpp_dir/src/vendor/llama.cpp/models
cargo build --release --example vocab_check
status=0
for f in "$models"/ggml-vocab-*.gguf; do
    [ -f "$f.inp" ] && [ -f "$f.out" ] || continue
    target/release/examples/vocab_check "$f" || status=1
done
exit $status
