#!/usr/bin/env bash
# The one script for a lent GPU (no cargo there, no network). Two steps:
#
#   scripts/gpu_device_check.sh prepare   # here, on the CPU machine: builds the gpu test executable with the
#                                         # `cuda` and `rocm` features and the gpu_decode example (release,
#                                         # `cuda`), stripped, into target/gpu-carry/
#   run(command="scripts/gpu_device_check.sh run", carry=["target/gpu-carry"])   # on the lent GPU
#
# `run` writes under $OUT (default ./gpu-results): every kernel and the decode step against their CPU
# references (tests/gpu), the decode-step throughput of the kernels at SmolLM2-135M and SmolLM2-1.7B shapes,
# nvidia-smi; then, per shape, a random-weight Q8_0 GGUF written there (examples/gpu_decode.rs) and the model's
# GPU decode and prefill beside its CPU path on it, logits compared; and, when HEARTH_LLAMACPP_SRC names a
# carried llama.cpp tree, llama-bench's CUDA build (-ngl 99) on the same files for the side-by-side figure;
# then LoRA training on the device per shape (`gpu_decode train`: rank 8 on all seven projections, as the
# trainer's device path runs it) beside PyTorch + PEFT on the device's own torch (scripts/bench_train_peft.py
# --shape, fp32 and bf16), from the transformers/peft wheels `prepare` downloads (pinned as in
# scripts/peft_venv.sh, without torch and what the device's torch already brings).
set -uo pipefail
cd "$(dirname "$0")/.."
carry=target/gpu-carry
case "${1:-}" in
prepare)
    set -e
    exe=$(cargo test --features cuda,rocm --test gpu --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])' | tail -1)
    [ -n "$exe" ] || { echo "could not build the gpu test executable" >&2; exit 1; }
    mkdir -p "$carry"
    strip -o "$carry/gpu" "$exe"
    cargo build --release --features cuda --example gpu_decode
    strip -o "$carry/gpu_decode" target/release/examples/gpu_decode
    # The PEFT peer's wheels for the device's Python 3.12: resolved here (with torch, for the pins), then
    # downloaded without torch, its CUDA libraries and its own dependencies, which the device's torch brings.
    wheels=$carry/wheels
    mkdir -p "$wheels"
    venv=target/gpu-venv
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    plat=(--python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    "$venv/bin/pip" install --quiet --dry-run --ignore-installed --report "$carry/peer.json" "${plat[@]}" \
        --target "$carry/unused" transformers==5.24.0 peft==0.21.2
    python3 - "$carry/peer.json" > "$carry/peer.txt" <<'PY'
import json, re, sys
skip = re.compile(r"^(torch|triton|nvidia-.*|sympy|networkx|mpmath|jinja2|markupsafe|numpy|setuptools)$", re.I)
for p in json.load(open(sys.argv[1]))["install"]:
    name, version = p["metadata"]["name"], p["metadata"]["version"]
    if not skip.match(name):
        print(f"{name}=={version}")
PY
    "$venv/bin/pip" download --quiet --no-deps "${plat[@]}" -d "$wheels" -r "$carry/peer.txt"
    cp scripts/bench_train_peft.py "$carry/"
    du -sh "$carry" "$wheels"
    ls -la "$carry"
    ;;
run)
    out=${OUT:-$PWD/gpu-results}
    mkdir -p "$out"
    exec > >(tee "$out/log.txt") 2>&1
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi"
    # NVRTC and the driver from the machine's CUDA install (13.0 for driver 580).
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    exe=$carry/gpu
    [ -x "$exe" ] || { echo "$exe missing: run 'prepare' here and carry $carry" >&2; exit 1; }
    echo "== kernels against the CPU reference"
    timeout 120 "$exe" --test-threads 1 --nocapture > "$out/kernels.txt" 2>&1
    echo "kernel tests exit $?"; tail -30 "$out/kernels.txt"
    for shape in smollm2-135m smollm2-1.7b; do
        echo "== decode step, $shape"
        HEARTH_GPU_SHAPE=$shape HEARTH_GPU_STEPS=${HEARTH_GPU_STEPS:-200} timeout 120 "$exe" \
            --ignored --nocapture --exact throughput::decode_step_throughput 2>&1 \
            | tee -a "$out/decode.txt" | grep -E '^\{|panicked|skipped' || true
    done
    models=$out/../gpu-models
    mkdir -p "$models"
    build=$out/../llamacpp-build
    if [ -n "${HEARTH_LLAMACPP_SRC:-}" ]; then
        echo "== llama.cpp CUDA build from $HEARTH_LLAMACPP_SRC"
        timeout 400 cmake -S "$HEARTH_LLAMACPP_SRC" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON > "$out/llamacpp-cmake.txt" 2>&1 \
            && timeout 400 cmake --build "$build" --target llama-bench -j "$(nproc)" >> "$out/llamacpp-cmake.txt" 2>&1
        echo "llama.cpp build exit $?"
    else
        echo "== llama.cpp skipped: set HEARTH_LLAMACPP_SRC (carried source)"
    fi
    for shape in smollm2-135m smollm2-1.7b; do
        gguf=$models/$shape-q8_0.gguf
        echo "== model decode, $shape"
        timeout 120 "$carry/gpu_decode" write "$gguf" "$shape" || { echo "write $shape failed"; continue; }
        timeout 300 "$carry/gpu_decode" run "$gguf" cuda:0 128 128 2>&1 | tee -a "$out/model_decode.txt"
        if [ -x "$build/bin/llama-bench" ]; then
            "$build/bin/llama-bench" -m "$gguf" -ngl 99 -p 128 -n 128 -r 3 -o json \
                > "$out/llamacpp-bench-$shape.json" 2>> "$out/llamacpp-cmake.txt"
            echo "llama-bench exit $?"
            grep -E '"(n_prompt|n_gen|avg_ts)"' "$out/llamacpp-bench-$shape.json" 2>/dev/null
        fi
    done
    peer=$out/../peft-venv
    echo "== PEFT peer from the carried wheels, over the device's torch"
    python3 -m venv --system-site-packages "$peer" \
        && "$peer/bin/pip" install --quiet --no-index --find-links "$carry/wheels" -r "$carry/peer.txt" \
        > "$out/peft-install.txt" 2>&1
    echo "peer install exit $?"
    for shape in smollm2-135m smollm2-1.7b; do
        gguf=$models/$shape-q8_0.gguf
        echo "== LoRA training, $shape (sequence 256, batch 4, rank 8)"
        timeout 240 "$carry/gpu_decode" train "$gguf" cuda:0 256 4 ${HEARTH_GPU_TRAIN_STEPS:-8} 8 1 2>&1 \
            | tee -a "$out/train.txt"
        for dtype in float32 bfloat16; do
            timeout 240 "$peer/bin/python" "$carry/bench_train_peft.py" --shape "$shape" --device cuda \
                --dtype "$dtype" --seq 256 --batch 4 --rank 8 --steps ${HEARTH_GPU_TRAIN_STEPS:-8} 2>&1 \
                | tee -a "$out/train.txt" | grep -E '^peft|Error' || true
        done
    done
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
