#!/usr/bin/env bash
# Side-by-side dedup throughput: hearth (Rust) vs datasketch (Python) on the same 100k records.
# Usage: scripts/bench_dedup.sh   (HEARTH_BENCH_QUICK=0 also runs the criterion benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet datasketch
corpus="${HEARTH_DEDUP_CORPUS:-target/curate_dedup_corpus.jsonl}"
export HEARTH_DEDUP_CORPUS="$corpus" HEARTH_BENCH_QUICK="${HEARTH_BENCH_QUICK-1}"
hearth=$(cargo bench -j1 --bench curate_dedup 2>/dev/null | tee /dev/stderr | grep '^HEARTH_DEDUP')
peer=$(python3 benches/peers/datasketch_dedup.py "$corpus" | tee /dev/stderr | grep '^DATASKETCH')
peer_each=$(python3 benches/peers/datasketch_dedup.py --update-each "$corpus" | tee /dev/stderr | grep '^DATASKETCH')
field() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1"; }
h=$(field "$hearth" docs_per_s); p=$(field "$peer" docs_per_s)
echo
printf '%-10s %12s %8s %9s\n' tool docs/s recall precision
printf '%-10s %12s %8s %9s\n' hearth "$h" "$(field "$hearth" recall)" "$(field "$hearth" precision)"
pe=$(field "$peer_each" docs_per_s)
printf '%-10s %12s %8s %9s  (update_batch)\n' datasketch "$p" "$(field "$peer" recall)" "$(field "$peer" precision)"
printf '%-10s %12s %8s %9s  (update per shingle)\n' datasketch "$pe" "$(field "$peer_each" recall)" "$(field "$peer_each" precision)"
python3 -c "print('speed ratio hearth/datasketch: %.1fx vs update_batch, %.1fx vs per-shingle update' % ($h / $p, $h / $pe))"
