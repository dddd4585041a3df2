#!/usr/bin/env python3
"""PEFT's own numbers for the LoRA scales and DoRA's forward, computed once outside CI and committed as
literals in tests/model/peft_scales.rs, so that CI pins hearth's formulas to PEFT's without PyTorch.

Run (the virtualenv of scripts/peft_venv.sh: torch CPU + peft from PyPI):

    . scripts/peft_venv.sh && "$py" scripts/peft_scales.py

Prints Rust source lines (constants) to paste into tests/model/peft_scales.rs:

  - SCALES: (r, alpha, PEFT's `scaling` for plain LoRA, PEFT's `scaling` with use_rslora), read from the
    LoRA layers PEFT builds around a Linear, not recomputed here.
  - PATTERN_SCALES: PEFT's per-module `scaling` for an rsLoRA config with a rank_pattern and an
    alpha_pattern over a two-layer tree named like a Llama (model.layers.N.self_attn.q_proj, ...).
  - DoRA cases (inputs printed too): a small integer weight W [out, in], integer A [r, in], B [out, r], magnitude m [out] and
    input x [n, in]; PEFT's forward output y = DoRA(x) (float64) and its merged weight
    (merge_and_unload), for a plain and an rsLoRA scale.
"""

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from peft import __version__ as peft_version  # noqa: E402

torch.set_default_dtype(torch.float64)

PAIRS = [(1, 1.0), (2, 3.0), (4, 8.0), (8, 16.0), (16, 32.0), (3, 5.0), (64, 16.0), (7, 0.5)]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class One(torch.nn.Module):
    def __init__(self, inp, out):
        super().__init__()
        self.q_proj = torch.nn.Linear(inp, out, bias=False)

    def forward(self, x):
        return self.q_proj(x)


def layer_scaling(r, alpha, rslora):
    model = get_peft_model(
        One(4, 4), LoraConfig(r=r, lora_alpha=alpha, target_modules=["q_proj"], use_rslora=rslora)
    )
    return float(model.base_model.model.q_proj.scaling["default"])


class Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for t in ["q_proj", "k_proj", "v_proj", "o_proj"]:
            setattr(self, t, torch.nn.Linear(8, 8, bias=False))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for t in ["gate_proj", "up_proj", "down_proj"]:
            setattr(self, t, torch.nn.Linear(8, 8, bias=False))


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = Attn()
        self.mlp = Mlp()


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(), Layer()])


class Llamaish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner()


def pattern_scales():
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=TARGETS,
        use_rslora=True,
        rank_pattern={"down_proj": 8},
        alpha_pattern={"layers.1.self_attn.v_proj": 2},
    )
    model = get_peft_model(Llamaish(), cfg)
    out = []
    for name, mod in model.named_modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and "default" in mod.scaling:
            path = name.split("base_model.model.", 1)[-1]
            layer = int(path.split(".")[2])
            target = path.rsplit(".", 1)[-1]
            out.append((layer, target, mod.r["default"], float(mod.scaling["default"])))
    return out


W = [[2.0, -1.0, 0.0, 3.0], [1.0, 1.0, -2.0, 0.0], [0.0, -3.0, 1.0, 1.0]]
A = [[1.0, 0.0, -1.0, 2.0], [0.0, 2.0, 1.0, -1.0]]
B = [[1.0, -1.0], [2.0, 0.0], [-1.0, 3.0]]
M = [3.0, 2.0, 5.0]
X = [[1.0, 2.0, -1.0, 0.0], [0.0, -1.0, 3.0, 2.0]]
DORA_ALPHA = 3.0


def dora(r_alpha_rslora):
    r, alpha, rslora = r_alpha_rslora
    assert r == len(A)
    m = One(4, 3)
    with torch.no_grad():
        m.q_proj.weight.copy_(torch.tensor(W))
    model = get_peft_model(
        m,
        LoraConfig(r=r, lora_alpha=alpha, target_modules=["q_proj"], use_dora=True, use_rslora=rslora),
    ).eval()
    layer = model.base_model.model.q_proj
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(torch.tensor(A))
        layer.lora_B["default"].weight.copy_(torch.tensor(B))
        layer.lora_magnitude_vector["default"].weight.copy_(torch.tensor(M))
    scale = float(layer.scaling["default"])
    with torch.no_grad():
        y = model(torch.tensor(X))
        merged = model.merge_and_unload().q_proj.weight.detach().clone()
    return scale, y.tolist(), merged.tolist()


def rust_f64(v):
    s = repr(float(v))
    return s if ("." in s or "e" in s or "inf" in s or "nan" in s) else s + ".0"


def rust_rows(rows):
    return "[" + ", ".join("[" + ", ".join(rust_f64(v) for v in row) + "]" for row in rows) + "]"


def main():
    print(f"// peft {peft_version}, torch {torch.__version__}")
    print("const SCALES: &[(usize, f64, f64, f64)] = &[")
    for r, alpha in PAIRS:
        plain, rs = layer_scaling(r, alpha, False), layer_scaling(r, alpha, True)
        print(f"    ({r}, {rust_f64(alpha)}, {rust_f64(plain)}, {rust_f64(rs)}),")
    print("];")
    print("const PATTERN_SCALES: &[(usize, &str, usize, f64)] = &[")
    for layer, target, r, s in pattern_scales():
        print(f'    ({layer}, "{target}", {r}, {rust_f64(s)}),')
    print("];")
    print(f"const DORA_ALPHA: f64 = {rust_f64(DORA_ALPHA)};")
    for name, rows in [("W", W), ("A", A), ("B", B), ("X", X)]:
        print(f"const DORA_{name}: [[f64; {len(rows[0])}]; {len(rows)}] = {rust_rows(rows)};")
    print(f"const DORA_M: [f64; {len(M)}] = [{', '.join(rust_f64(v) for v in M)}];")
    for name, case in [("DORA", (len(A), DORA_ALPHA, False)), ("DORA_RSLORA", (len(A), DORA_ALPHA, True))]:
        scale, y, merged = dora(case)
        print(f"const {name}_SCALE: f64 = {rust_f64(scale)};")
        print(f"const {name}_Y: [[f64; {len(y[0])}]; {len(y)}] = {rust_rows(y)};")
        print(f"const {name}_MERGED: [[f64; {len(merged[0])}]; {len(merged)}] = {rust_rows(merged)};")


if __name__ == "__main__":
    main()
