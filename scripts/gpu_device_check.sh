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
# carried llama.cpp tree, llama-bench's CUDA build (-ngl 99) on the same files for the side-by-side figure.
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
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
