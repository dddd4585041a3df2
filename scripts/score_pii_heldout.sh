#!/usr/bin/env bash
# Generates the dev and held-out splits of scripts/gen_pii_heldout.py and prints the redactor's
# scores on both side by side. Tune on dev only; the held-out split is for reporting.
# usage: scripts/score_pii_heldout.sh [N]   (needs ../shared; Faker in target/venv-faker or on python3)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
[ -d "$SHARED" ] || SHARED=/work/shared
N=${1:-5000}
OUT=target/pii-heldout
mkdir -p "$OUT"
source scripts/faker_venv.sh
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build -j"${JOBS:-1}" --release --bin hearth
"$PY" scripts/gen_pii_heldout.py --split dev --seed 7 --n "$N" --out "$OUT/dev.jsonl"
"$PY" scripts/gen_pii_heldout.py --split heldout --seed 90210 --n "$N" --out "$OUT/heldout.jsonl"
for s in dev heldout; do
  target/release/hearth redact --jsonl "$OUT/$s.jsonl" --spans-out "$OUT/$s.pred.jsonl"
  python3 "$SHARED/tools/score_pii.py" "$OUT/$s.jsonl" "$OUT/$s.pred.jsonl" --json "$OUT/$s.score.json" > "$OUT/$s.score.txt"
done
python3 - "$OUT/dev.score.json" "$OUT/heldout.score.json" <<'PY'
import json, sys
d, h = (json.load(open(p)) for p in sys.argv[1:3])
rows = lambda s: {r["type"]: r for r in s["rows"]}
dr, hr = rows(d), rows(h)
f = lambda x: "  -  " if x is None else "%.3f" % x
print("%-12s | %6s %8s %8s | %6s %8s %8s | %6s" % ("type", "gold", "redact", "P_typed", "gold", "redact", "P_typed", "gap"))
print("%-12s | %24s | %24s |" % ("", "dev", "held-out"))
for t in sorted(set(dr) | set(hr)):
    a, b = dr.get(t, {}), hr.get(t, {})
    ra, rb = a.get("redacted@0.90"), b.get("redacted@0.90")
    gap = "%+.3f" % (rb - ra) if ra is not None and rb is not None else "  -"
    print("%-12s | %6s %8s %8s | %6s %8s %8s | %6s" % (t, a.get("gold", 0), f(ra), f(a.get("precision_typed")),
          b.get("gold", 0), f(rb), f(b.get("precision_typed")), gap))
for name, s in (("dev", d), ("held-out", h)):
    m = s["summary"]
    neg, hit = m["negative_records"], m["negative_records_with_any_pred"]
    print("%-8s PII-free records touched %d/%d = %.2f%%; micro redacted %.3f, typed precision %.3f" % (
        name, hit, neg, 100.0 * hit / max(1, neg), m["micro_redacted"], m["micro_precision_typed"]))
PY
