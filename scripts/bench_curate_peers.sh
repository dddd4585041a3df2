#!/usr/bin/env bash
# Side-by-side speed of hearth's secret filter / redactor and the Python peers on the same
# corpus: detect-secrets 1.5 (PyPI) on the pii_10k records written one file each by
# ../shared/tools/prep_secrets.py, and Presidio (presidio-analyzer + a spaCy small model) when
# that model can be installed from PyPI. Speeds are CPU seconds (user+sys) of the whole run.
# The Rust peer hanzo-guard is measured in the criterion bench (benches/curate_throughput.rs).
#
# usage: scripts/bench_curate_peers.sh [OUTDIR]   env: N (records, default 2000), SHARED, JOBS
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
[ -d "$SHARED" ] || SHARED=/work/shared
OUT=${1:-target/curate-peers}
N=${N:-2000}
mkdir -p "$OUT"
GOLD="$SHARED/data/pii/pii_10k.jsonl"
head -n "$N" "$GOLD" > "$OUT/corpus.jsonl"

# cpu_secs CMD...: runs CMD (stdout to /dev/null) and prints its user+sys CPU seconds
cpu_secs() {
  python3 - "$@" <<'EOF'
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime + r.ru_stime:.3f}")
EOF
}

# ---- hearth (release build; the CLI in the main crate, the example in scratch crates).
# hearth_cmd secrets|redact IN: the command line that scans IN
if [ -f src/main.rs ]; then
  cargo build -q -j"${JOBS:-1}" --release --bin hearth
  hearth_cmd() {
    if [ "$1" = secrets ]; then echo target/release/hearth secrets --jsonl "$2" --findings-out "$OUT/hearth.out.jsonl"
    else echo target/release/hearth redact --jsonl "$2" --spans-out "$OUT/hearth.out.jsonl"; fi
  }
else
  cargo build -q -j"${JOBS:-1}" --release --example curate_predict
  hearth_cmd() {
    if [ "$1" = secrets ]; then echo target/release/examples/curate_predict secrets "$2" "$OUT/hearth.out.jsonl"
    else echo target/release/examples/curate_predict pii "$2" "$OUT/hearth.out.jsonl"; fi
  }
fi

# ---- the same records as files, for the file-based scanner
rm -rf "$OUT/files_corpus"
python3 "$SHARED/tools/prep_secrets.py" "$OUT/corpus.jsonl" "$OUT/files_corpus" > /dev/null
BYTES=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['text'].encode())+1 for l in open(sys.argv[1])))" "$OUT/corpus.jsonl")
echo "corpus: $N pii_10k records, $BYTES bytes of text (hearth: all 10,000 records, start-up subtracted)"

# hearth is fast enough that a run on N records is mostly start-up (building the lexicon and
# regexes): time it on all of pii_10k, best of 3, minus the start-up measured on one record.
best() { sort -n | head -1; }
head -n 1 "$GOLD" > "$OUT/one.jsonl"
HBYTES=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['text'].encode())+1 for l in open(sys.argv[1])))" "$GOLD")
h_secs() { # mode -> CPU seconds on all of pii_10k, start-up subtracted
  local full one
  # shellcheck disable=SC2046
  full=$(for _ in 1 2 3; do cpu_secs $(hearth_cmd "$1" "$GOLD"); done | best)
  # shellcheck disable=SC2046
  one=$(for _ in 1 2 3; do cpu_secs $(hearth_cmd "$1" "$OUT/one.jsonl"); done | best)
  python3 -c "import sys; print(max(float(sys.argv[1]) - float(sys.argv[2]), 1e-3))" "$full" "$one"
}
H_SEC=$(h_secs secrets)
H_RED=$(h_secs redact)

# ---- detect-secrets from PyPI in a private venv
VENV="$OUT/venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "detect-secrets==1.5.0"
DS=$(cpu_secs "$VENV/bin/detect-secrets" scan --all-files "$OUT/files_corpus/files")

# ---- Presidio: presidio-analyzer is on PyPI; the spaCy model en_core_web_sm is published on
# GitHub releases, not on PyPI, so `pip install en_core_web_sm` normally fails (we do not use
# third-party re-uploads of the model). Without it the shared README's figure is printed.
PRESIDIO="unavailable"
if "$VENV/bin/pip" install -q --disable-pip-version-check presidio-analyzer > "$OUT/presidio_pip.log" 2>&1 &&
   "$VENV/bin/pip" install -q --disable-pip-version-check en_core_web_sm >> "$OUT/presidio_pip.log" 2>&1 &&
   "$VENV/bin/python" -c "import en_core_web_sm" 2>/dev/null; then
  cat > "$OUT/presidio_run.py" <<'EOF'
import json, sys
from presidio_analyzer import AnalyzerEngine
from presidio_analyzer.nlp_engine import NlpEngineProvider
nlp = NlpEngineProvider(nlp_configuration={"nlp_engine_name": "spacy",
      "models": [{"lang_code": "en", "model_name": "en_core_web_sm"}]}).create_engine()
eng = AnalyzerEngine(nlp_engine=nlp)
for l in open(sys.argv[1]):
    eng.analyze(text=json.loads(l)["text"], language="en")
EOF
  PRESIDIO=$(cpu_secs "$VENV/bin/python" "$OUT/presidio_run.py" "$OUT/corpus.jsonl")
fi

# rate SECS KB|MB [BYTES]
rate() { python3 -c "import sys; b,s,u=float(sys.argv[1]),float(sys.argv[2]),sys.argv[3]; d={'KB':1e3,'MB':1e6}[u]; print(f'{b/s/d:10.1f} {u}/s  ({s:.2f} s CPU)')" "${3:-$BYTES}" "$1" "$2"; }
echo
echo "== secret scanning (same records)"
printf '%-44s %s\n' "hearth secret filter (CLI, JSONL, all 10k)" "$(rate "$H_SEC" MB "$HBYTES")"
printf '%-44s %s\n' "detect-secrets 1.5.0 (one file per record)" "$(rate "$DS" KB)"
python3 -c "import sys; h=float(sys.argv[3])/float(sys.argv[1]); d=float(sys.argv[4])/float(sys.argv[2]); print(f'ratio hearth / detect-secrets: {h/d:.0f}x')" "$H_SEC" "$DS" "$HBYTES" "$BYTES"
echo
echo "== PII redaction (same records)"
printf '%-44s %s\n' "hearth redactor (CLI, JSONL, all 10k)" "$(rate "$H_RED" MB "$HBYTES")"
if [ "$PRESIDIO" = unavailable ]; then
  echo "Presidio: not measured: presidio-analyzer installs from PyPI but no official spaCy small"
  echo "  model (en_core_web_sm) is obtainable there (see $OUT/presidio_pip.log)."
  echo "  Reference figure from ../shared/README.md (Presidio 2.2 + spaCy small, pii_10k, this"
  echo "  machine): 4.5 KB/s  [README reference, not measured in this run]"
else
  printf '%-44s %s\n' "Presidio analyzer + en_core_web_sm" "$(rate "$PRESIDIO" KB)"
fi
