#!/usr/bin/env bash
# Decode and prefill tokens/s of hearth's serve engine and of llama.cpp's llama-bench on the same GGUF (the
# default model, SmolLM2-135M-Instruct at Q8_0, unless HEARTH_GGUF names another), 1 and 2 threads, in one run;
# prints the ratios and hearth's fraction of the measured read-bandwidth bound. llama-bench is built from the
# llama-cpp-python source package on first use (scripts/llamacpp_build.sh, ~10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llamacpp_build.sh
data=${HEARTH_DATA_DIR:-$PWD/target/hearth-bench-data}
gguf=${HEARTH_GGUF:-$data/models/SmolLM2-135M-Instruct.Q8_0.gguf}
# This machine's speed drifts by a third within minutes, so llama-bench runs both before and after hearth's
# bench (before only once the model exists: hearth's bench prepares it on first run: fetch from PyPI,
# requantize to Q8_0), and each side's figure is its best repetition, as hearth's bench reports its best.
llama_run() {
    "$llama_bench" -m "$gguf" -p "$prompt_tokens" -n 64 -t 1,2 -r 3 -o json 2>/dev/null
}
# Decode after hearth's long prompt (llama-bench fills its cache to that depth first, f16 as by default).
llama_long_run() {
    "$llama_bench" -m "$gguf" -p 0 -n 64 -d "$long_tokens" -t 1,2 -r 2 -o json 2>/dev/null
}
# The prompt length hearth's bench prompt has on the default model; corrected (and the first run dropped) when
# hearth's output says otherwise.
prompt_tokens=121
llama_before='[]'
if [ -f "$gguf" ]; then llama_before=$(llama_run); fi
hearth_out=$(HEARTH_DATA_DIR=$data cargo bench -q --bench serve_decode 2>/dev/null)
echo "$hearth_out"
hearth_prompt_tokens=$(echo "$hearth_out" | sed -n 's/.*prefill \([0-9]*\) tokens.*/\1/p' | head -1)
if [ "$hearth_prompt_tokens" != "$prompt_tokens" ]; then
    prompt_tokens=$hearth_prompt_tokens
    llama_before='[]'
fi
llama_after=$(llama_run)
long_tokens=$(echo "$hearth_out" | sed -n 's/.*long context (prompt \([0-9]*\) tokens.*/\1/p' | head -1)
llama_long='[]'
if [ -n "$long_tokens" ]; then llama_long=$(llama_long_run); fi
HEARTH_OUT=$hearth_out LLAMA_JSON="[$llama_before, $llama_after]" LLAMA_LONG_JSON="$llama_long" python3 - <<'PY'
import json, os, re
runs = json.loads(os.environ["LLAMA_JSON"])
rows = [r for run in runs for r in run]
long_rows = json.loads(os.environ["LLAMA_LONG_JSON"])
llama = {}
for r in rows:
    kind = "prefill" if r["n_prompt"] > 0 else "decode"
    key = (kind, r["n_threads"])
    llama[key] = max(llama.get(key, 0.0), max(r["samples_ts"]))
reps = sum(len(r["samples_ts"]) for r in rows if r["n_threads"] == 1 and r["n_prompt"] == 0)
print(f"llama.cpp {rows[0].get('build_commit', '?')} ({rows[0].get('cpu_info', '?')}), best of {reps} repetitions:")
for (kind, t), ts in sorted(llama.items()):
    print(f"  {kind:7} threads {t}: {ts:7.1f} tok/s")
ours, small_pages, gguf_layout = {}, {}, {}
# hearth's last two children rerun 1 thread with its weights on small pages, and with Q8_0 weights in the GGUF
# layout: kept apart, printed as ratios. Each child's first line says it loaded; a rerun's next says what it
# leaves out.
child = "main"
for line in os.environ["HEARTH_OUT"].splitlines():
    if " loaded in " in line:
        child = "main"
    elif "on small pages" in line:
        child = "small"
    elif "GGUF layout" in line:
        child = "gguf"
    m = re.search(r"threads +(\d+) \| resident adapters 0 .*prefill \d+ tokens: +([\d.]+) tok/s \| decode \d+ tokens: +([\d.]+) tok/s \((\d+)% of", line)
    if m:
        t = int(m.group(1))
        if child != "main":
            (small_pages if child == "small" else gguf_layout)[t] = float(m.group(3))
            continue
        ours[("prefill", t)] = float(m.group(2))
        ours[("decode", t)] = float(m.group(3))
        ours[("bound", t)] = int(m.group(4))
for what, rerun in (("weights on huge / small pages", small_pages), ("Q8_0 in panels / GGUF layout", gguf_layout)):
    for t, ts in sorted(rerun.items()):
        if ("decode", t) in ours:
            print(f"hearth decode threads {t}, {what}: {ours[('decode', t)]:.1f} / {ts:.1f} = {ours[('decode', t)] / ts:.2f}x")
for t in (1, 2):
    for kind in ("decode", "prefill"):
        if (kind, t) in ours and (kind, t) in llama:
            print(f"hearth / llama.cpp {kind:7} threads {t}: {ours[(kind, t)]:7.1f} / {llama[(kind, t)]:7.1f} = {ours[(kind, t)] / llama[(kind, t)]:.2f}x")
    if ("bound", t) in ours:
        print(f"hearth decode threads {t}: {ours[('bound', t)]}% of the read-bandwidth bound")
for line in os.environ["HEARTH_OUT"].splitlines():
    if "on small pages" in line:
        break
    m = re.search(r"threads +(\d+) \| long context \(prompt (\d+) tokens.*f32 cache +([\d.]+) tok/s, f16 cache +([\d.]+)", line)
    if not m:
        continue
    t, depth, f32, f16 = int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
    peer = max((max(r["samples_ts"]) for r in long_rows if r["n_threads"] == t), default=None)
    if peer:
        print(f"hearth (f32 / f16 cache) / llama.cpp (f16 cache) decode threads {t} after {depth} tokens: {f32:.1f} / {f16:.1f} / {peer:.1f} = {f32 / peer:.2}x / {f16 / peer:.2}x")
PY
