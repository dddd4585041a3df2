#!/usr/bin/env bash
# The collapse experiment (examples/collapse.rs): CYCLES training cycles in which the training set becomes
# more and more the model's own served answers, gate on and gate off, on the default model; both arms run
# side by side, then the table (collapse.md), the rows (on.csv, off.csv) and the plot (collapse.svg) are
# written to OUT. Takes about an hour on two cores.
#
#   scripts/collapse.sh [--out DIR] [--cycles N] [any other `collapse run` option, e.g. --model PATH]
#
#   --out     default docs/collapse
#   --cycles  default 20
# The default model is fetched once into SOAK_CACHE (default target/soak-cache), shared with scripts/soak.sh.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/docs/collapse
rest=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) rest+=("$1"); shift ;;
    esac
done
cache=${SOAK_CACHE:-$root/target/soak-cache}
mkdir -p "$out" "$cache"
(cd "$root" && cargo build --release --example collapse)
bin=$root/target/release/examples/collapse
# The first arm prepares the model and the replay cache; the second waits for them, then both run at once.
"$bin" run --arm on --out "$out" --cache "$cache" --cycles 0 "${rest[@]}" >/dev/null
pids=()
for arm in on off; do
    "$bin" run --arm "$arm" --out "$out" --cache "$cache" "${rest[@]}" 2>&1 | tee "$out/$arm.log" &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
((status == 0)) || { echo "an arm failed: see $out/on.log and $out/off.log" >&2; exit 1; }
"$bin" report --out "$out"
cat "$out/collapse.md"
