#!/usr/bin/env bash
# Runs the Rust aggregation bench and the numpy reference (gym semantics) on the same shape, prints the ratio.
# Needs python3 with numpy (pip install numpy). Usage: scripts/bench_federate.sh [--params N] [--workers K]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rust_out=$(cargo bench -j2 --bench federate_aggregate -- "$@" 2>/dev/null)
echo "$rust_out"
py_out=$("$PY" benches/peers/gym_aggregate.py "$@")
echo "$py_out"
rs=$(echo "$rust_out" | sed -n 's/^RUST_SECONDS=//p')
py=$(echo "$py_out" | sed -n 's/^PY_SECONDS=//p')
awk -v r="$rs" -v p="$py" 'BEGIN {
  printf "byzantine_robust 8x10M: rust %.4f s, numpy peer (this run) %.3f s -> %.1fx\n", r, p, p / r
  printf "vs the spec figure for zen/gym aggregate() on this machine (5.68 s): %.0fx (goal >= 50x, <= 0.11 s)\n", 5.68 / r
}'
