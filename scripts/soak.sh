#!/usr/bin/env bash
# Soak: graphs/personal.ron under API traffic for a long time (default two hours), sampling the process's RSS
# and the data directory's size at a fixed interval; at the end, the slopes after warm-up and a plot.
# Not a CI test: it takes hours and a real model.
#
#   scripts/soak.sh [--duration SECS] [--sample-every SECS] [--warmup SECS] [--scale X]
#                   [--bounds soak|personal] [--out DIR]
#
#   --duration      seconds of traffic after serve is up (default 7200)
#   --sample-every  seconds between samples (default 60)
#   --warmup        samples before this are left out of the fits (default: a third of --duration, 40 min of
#                   two hours: with --bounds soak the training window's age (30 min) and the delta retention
#                   (5 min between cycles, 3 served + 2 rejected kept) are reached by then)
#   --scale         times a heavy user's rate; a heavy user is 200 chats and 50 feedback a day (default 10:
#                   2000 chats and 500 feedback a day; see scripts/soak_load.py)
#   --bounds        soak (default): personal.ron with its time bounds shortened so each one is reached within
#                   the run (below); personal: the graph's own bounds, which a two-hour run never reaches (raw
#                   text is kept a week), so the data directory keeps growing by design
#   --out           where samples.csv, summary.json, soak.png, hearth.log, graph.ron and data/ go
#                   (default target/soak/<date>)
#
# The release binary is built (cargo build --release) unless HEARTH_BIN names one. The default model is fetched
# once into SOAK_CACHE (default target/soak-cache) and linked into the data directory, so it is not counted in
# the data directory's size. HEARTH_API_KEY, if set, is sent as a bearer token. matplotlib comes from the
# system python or is installed once into SOAK_CACHE/venv.
#
# --bounds soak changes these parameters of graphs/personal.ron (each is a bound the run should reach):
#   Capture retention_secs 604800 -> 600, record_retention_secs 7776000 -> 1200;
#   Trainer window (2000 samples, 90 days) -> (200 samples, 1800 s),
#   min_interval_secs 3600 -> 300, idle_load dropped (the load generator shares the machine); Eval retention
#   (keep_rejected 8, keep_served 16) -> (2, 3); dead letters (8 MiB, 3 files) -> (64 KiB, 2 files).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
duration=7200
every=60
warmup=""
scale=10
bounds=soak
out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --duration) duration=$2; shift 2 ;;
        --sample-every) every=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --scale) scale=$2; shift 2 ;;
        --bounds) bounds=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ -n $warmup ]] || warmup=$((duration / 3))
[[ $bounds == soak || $bounds == personal ]] || { echo "--bounds is soak or personal" >&2; exit 2; }
out=${out:-$root/target/soak/$(date +%Y%m%d-%H%M%S)}
cache=${SOAK_CACHE:-$root/target/soak-cache}
mkdir -p "$out" "$cache/models"
out=$(cd "$out" && pwd)
data=$out/data
mkdir -p "$data"
ln -sfn "$cache/models" "$data/models"

if [[ -z ${HEARTH_BIN:-} ]]; then
    (cd "$root" && cargo build --release --bin hearth)
    HEARTH_BIN=$root/target/release/hearth
fi

# The graph: ephemeral port, no control server (another run may hold 9090), bounds as chosen.
graph=$out/graph.ron
cp "$root/graphs/personal.ron" "$graph"
edit() { # from to: replaces a literal text that must be present
    python3 - "$graph" "$1" "$2" <<'EOF'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if old not in text:
    sys.exit(f"graphs/personal.ron no longer contains {old!r}: update scripts/soak.sh")
open(path, "w").write(text.replace(old, new))
EOF
}
edit 'listen: "127.0.0.1:8080"' 'listen: "127.0.0.1:0"'
edit ', control: "127.0.0.1:9090"' ''
if [[ $bounds == soak ]]; then
    edit 'retention_secs: 604800' 'retention_secs: 600'
    edit 'record_retention_secs: 7776000' 'record_retention_secs: 1200'
    edit 'window: (max_samples: 2000, max_age_secs: 7776000)' 'window: (max_samples: 200, max_age_secs: 1800)'
    edit 'min_interval_secs: 3600' 'min_interval_secs: 300'
    edit ' idle_load: 0.5,' ''
    edit 'retention: (keep_rejected: 8, keep_served: 16)' 'retention: (keep_rejected: 2, keep_served: 3)'
    edit 'dead_letters: (max_bytes: 8388608, keep: 3)' 'dead_letters: (max_bytes: 65536, keep: 2)'
fi
"$HEARTH_BIN" check "$graph" >/dev/null

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

echo "soak: $duration s at ${scale}x a heavy user, a sample every $every s, warm-up $warmup s, bounds $bounds"
echo "soak: output in $out"
"$HEARTH_BIN" run "$graph" --data-dir "$data" >"$out/hearth.log" 2>&1 &
hearth=$!
pids+=("$hearth")
# Serve writes its address once the model is loaded (the first run fetches it: allow a while).
for _ in $(seq 1 1800); do
    [[ -s $data/serve.addr ]] && break
    kill -0 "$hearth" 2>/dev/null || { tail -30 "$out/hearth.log"; echo "hearth exited" >&2; exit 1; }
    sleep 1
done
[[ -s $data/serve.addr ]] || { echo "serve did not start in 30 min" >&2; exit 1; }
addr=$(cat "$data/serve.addr")
echo "soak: serving on $addr (pid $hearth)"

python3 "$root/scripts/soak_load.py" --addr "$addr" --scale "$scale" --duration "$duration" \
    --stats "$out/load.json" 2>"$out/load.log" &
load=$!
pids+=("$load")

csv=$out/samples.csv
python3 "$root/scripts/soak_report.py" header >"$csv"
start=$(date +%s)
next=0
while :; do
    now=$(date +%s)
    t=$((now - start))
    if ((t >= next)); then
        kill -0 "$hearth" 2>/dev/null || { tail -30 "$out/hearth.log"; echo "hearth exited during the soak" >&2; exit 1; }
        python3 "$root/scripts/soak_report.py" sample --t "$t" --pid "$hearth" --data "$data" \
            --load "$out/load.json" >>"$csv"
        tail -1 "$csv"
        next=$((next + every))
    fi
    ((t >= duration)) && break
    sleep 1
done

kill -TERM "$load" 2>/dev/null || true
wait "$load" 2>/dev/null || true
kill -TERM "$hearth"
status=0
for _ in $(seq 1 300); do kill -0 "$hearth" 2>/dev/null || break; sleep 1; done
if kill -0 "$hearth" 2>/dev/null; then
    echo "hearth did not drain in 300 s; killing it" >&2
    kill -KILL "$hearth" || true
    status=1
fi
wait "$hearth" || status=$?
trap - EXIT
echo "soak: hearth exited with $status"

py=python3
if ! python3 -c 'import matplotlib' 2>/dev/null; then
    if [[ ! -x $cache/venv/bin/python ]]; then
        python3 -m venv "$cache/venv"
        "$cache/venv/bin/pip" install --quiet matplotlib
    fi
    py=$cache/venv/bin/python
fi
"$py" "$root/scripts/soak_report.py" report "$csv" --warmup "$warmup" --plot "$out/soak.png" \
    --json "$out/summary.json" | tee "$out/summary.txt"
exit "$status"
