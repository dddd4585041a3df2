#!/usr/bin/env bash
# Scores the curate redactor and secret filter with the shared scorers.
# usage: scripts/score_curate.sh [OUTDIR]   (needs ../shared or $SHARED pointing at shared/)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
[ -d "$SHARED" ] || SHARED=/work/shared
OUT=${1:-target/curate-score}
mkdir -p "$OUT"
cargo build -j"${JOBS:-1}" --release --bin hearth --example secrets_scan_tree
BIN=target/release/hearth
for set in pii_10k presidio_synth_1500; do
  "$BIN" redact --jsonl "$SHARED/data/pii/$set.jsonl" --spans-out "$OUT/$set.pred.jsonl"
  echo "== PII: $set"
  python3 "$SHARED/tools/score_pii.py" "$SHARED/data/pii/$set.jsonl" "$OUT/$set.pred.jsonl" --json "$OUT/$set.score.json"
done
"$BIN" secrets --jsonl "$SHARED/data/pii/pii_10k.jsonl" --findings-out "$OUT/pii_10k.secrets.jsonl"
echo "== secrets: pii_10k"
python3 "$SHARED/tools/score_secrets.py" "$SHARED/data/pii/pii_10k.jsonl" "$OUT/pii_10k.secrets.jsonl" "$OUT/secrets.score.json"
echo "== secrets on real source code (false positives)"
DIRS=(src tests benches examples)
REG="${CARGO_HOME:-$HOME/.cargo}/registry/src"
[ -d "$REG" ] && DIRS+=("$REG")
target/release/examples/secrets_scan_tree "${DIRS[@]}" > "$OUT/source_fp.tsv"
cut -f2 "$OUT/source_fp.tsv" | sort | uniq -c | sort -rn | head -20
