#!/usr/bin/env bash
# Compiles every GPU kernel on a machine without a GPU: NVRTC from PyPI (pinned to CUDA 13.0, the lent
# machine's driver 580) into a venv under target/, clang-19 for gfx1100/gfx1151 when installed
# (apt-get install clang-19), then runs tests/gpu with the `cuda` and `rocm` features. Kernel tests against
# the CPU reference skip with a notice where no GPU opens. About 1 minute after the test target is built.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/gpu-venv
nvrtc_version=${HEARTH_NVRTC_VERSION:-13.0.88}
if [ ! -x "$venv/bin/pip" ]; then python3 -m venv "$venv" || echo "python3 -m venv failed" >&2; fi
"$venv/bin/pip" install --quiet "nvidia-cuda-nvrtc==$nvrtc_version" \
    || echo "pip install nvidia-cuda-nvrtc failed: the NVRTC compile check will skip" >&2
lib=$(ls -d "$PWD/$venv"/lib/python3*/site-packages/nvidia/cu*/lib 2>/dev/null | head -1 || true)
command -v clang-19 >/dev/null || echo "clang-19 not installed: the RDNA compile check will skip" >&2
LD_LIBRARY_PATH="${lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --features cuda,rocm --test gpu -- --nocapture "$@"
