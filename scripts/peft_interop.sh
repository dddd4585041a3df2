#!/usr/bin/env bash
# PEFT interop, outside CI: hearth's adapters load in Hugging Face PEFT and give hearth's logits,
# and adapters PEFT saved load in hearth and give PEFT's logits.
#
#  1. hearth (examples/peft_interop.rs) writes its tiny Llama with F32 matrices as base.gguf, a
#     rank-4 LoRA on all seven projections (random A and B) with LoraSet::save_peft, the same A and
#     B as a DoRA adapter (magnitudes: row norms of W + scale*B*A times 1 + 0.1*N(0, 1)), and the
#     logits of both.
#     All steps run twice: for Llama (q/k rows permuted between GGUF and HF) and for Qwen3 (not).
#  2. transformers loads base.gguf as fp32; its base logits must match hearth's (this validates the
#     GGUF -> HF conversion, q/k un-permutation included), then PEFT loads hearth's adapter and
#     DoRA adapter and its logits must match hearth's.
#  3. PEFT creates and saves three adapters of its own: a plain one (r 4, alpha 8), an rsLoRA one
#     with a rank_pattern and an alpha_pattern, and a DoRA one with its magnitude vectors perturbed
#     away from the weight norms; hearth loads each with LoraSet::load_peft and its logits and
#     per-module scales must match PEFT's.
# Each check prints a PASS or FAIL line with the differences (tolerance: see scripts/peft_interop.py);
# the script exits 1 if any check failed.
#
# Environment:
#   HEARTH_BENCH_VENV  virtualenv with torch, transformers, peft and gguf (default
#                      ~/.cache/hearth-bench-venv, shared with scripts/bench_train_peft.sh); created
#                      and filled from PyPI when missing (~5.6 GB: the Linux torch wheel pulls CUDA libs)
#   HEARTH_INTEROP_DIR where to write the files (default: a temporary directory, removed at exit)
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/peft_venv.sh
. scripts/peft_venv.sh
"$py" -c 'from importlib.metadata import version as v
print("==", ", ".join(f"{p} {v(p)}" for p in ["torch", "transformers", "peft", "gguf"]))'

if [ -n "${HEARTH_INTEROP_DIR:-}" ]; then
    dir=$HEARTH_INTEROP_DIR
    mkdir -p "$dir"
else
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
fi

cargo build --release --example peft_interop
hearth() { cargo run --quiet --release --example peft_interop -- "$@"; }
failed=0
check() { "$py" scripts/peft_interop.py "$@" || failed=1; }

for arch in llama qwen3; do
    d=$dir/$arch
    echo "== $arch: hearth writes base, adapter and logits"
    hearth write "$d" "$arch"
    echo "== $arch: PEFT loads hearth's adapter"
    check check-hearth "$d"
    for name in peft_adapter peft_adapter_rslora peft_adapter_dora; do
        echo "== $arch: hearth loads $name"
        flag=
        [ "$name" = peft_adapter_rslora ] && flag=--rslora
        [ "$name" = peft_adapter_dora ] && flag=--dora
        check write-peft "$d" "$name" $flag
        if hearth logits "$d" "$d/$name" "$d/hearth_on_$name.json"; then
            check compare "$d" "$name"
        else
            echo "FAIL $arch $name: hearth could not load it"
            failed=1
        fi
    done
done

echo
if [ "$failed" = 0 ]; then
    echo "PASS peft interop: all checks passed"
else
    echo "FAIL peft interop: see the FAIL lines above"
fi
exit "$failed"
