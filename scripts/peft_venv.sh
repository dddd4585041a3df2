# Sourced by the scripts that run PyTorch + PEFT beside hearth: sets `py` to the Python of a virtualenv
# ($HEARTH_BENCH_VENV, default ~/.cache/hearth-bench-venv) holding the pinned peer, installing it from PyPI
# when missing (~5.6 GB: the Linux torch wheel pulls CUDA libraries; it runs on the CPU all the same).
venv=${HEARTH_BENCH_VENV:-$HOME/.cache/hearth-bench-venv}
py=$venv/bin/python
if ! "$py" -c 'import torch, transformers, peft, gguf' 2>/dev/null; then
    echo "== installing the PEFT peer into $venv" >&2
    python3 -m venv "$venv"
    "$py" -m pip install --upgrade pip
    "$py" -m pip install torch==2.15.0 transformers==5.24.0 peft==0.21.2 gguf==0.19.0 \
        numpy==2.4.6 safetensors==0.8.0
fi
