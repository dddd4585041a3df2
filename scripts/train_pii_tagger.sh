#!/usr/bin/env bash
# Makes the tagger's training data with scripts/gen_pii_tagger.py and trains the shipped weights
# (src/curate/redact/data/tagger.safetensors) with examples/train_pii_tagger.rs; prints the
# tagger's own span figures on the train split and on the test split it never trains on.
# usage: [WEIGHTS=FILE] scripts/train_pii_tagger.sh [N_TRAIN [EXTRA ARGS...]]   (Faker in target/venv-faker or on python3)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-30000}
OUT=target/pii-tagger
mkdir -p "$OUT"
source scripts/faker_venv.sh
"$PY" scripts/gen_pii_tagger.py --split train --seed 11 --n "$N" --out "$OUT/train.jsonl"
"$PY" scripts/gen_pii_tagger.py --split test --seed 23 --n 3000 --out "$OUT/test.jsonl"
cargo run -j"${JOBS:-1}" --release --example train_pii_tagger -- \
  --train "$OUT/train.jsonl" --eval "$OUT/test.jsonl" --out "${WEIGHTS:-src/curate/redact/data/tagger.safetensors}" "${@:2}"
