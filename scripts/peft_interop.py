#!/usr/bin/env python3
"""PEFT interop check, the Python half (scripts/peft_interop.sh runs both halves in order).

hearth's half is `cargo run --release --example peft_interop` (examples/peft_interop.rs), which
writes DIR/base.gguf (hearth's tiny Llama or Qwen3, F32 matrices), DIR/hearth_adapter/ (rank-4
LoRA on all seven projections, saved with LoraSet::save_peft), DIR/hearth_dora_adapter/ (the same A
and B as DoRA, with magnitudes away from the row norms of W + scale*B*A) and DIR/hearth_logits.json
(hearth's logits for a fixed token sequence: base alone, base + adapter, base + DoRA adapter).

Subcommands:
    check-hearth DIR
        Loads DIR/base.gguf into transformers as fp32 (transformers undoes llama.cpp's q/k row
        permutation itself), checks its logits against hearth's base logits (validates the
        conversion), then loads DIR/hearth_adapter with PeftModel.from_pretrained, checks that every
        tensor in the file landed in the model, and compares the adapted logits with hearth's.
        A control then permutes the q/k lora_B rows the other way and must be caught.
        Then the same for DIR/hearth_dora_adapter on a fresh base (every tensor, magnitude
        vectors included, must land in the model), plus a check that its magnitudes move the
        logits away from the plain adapter's (same A and B), and a control that permutes the q/k
        magnitude rows.
    write-peft DIR NAME [--rslora | --dora]
        Creates a fresh PEFT LoRA (rank 4, alpha 8, all seven projections, init_lora_weights=False
        so that B is random too), saves it with save_pretrained to DIR/NAME and writes its logits
        (and each module's scaling) to DIR/NAME_logits.json. With --rslora: use_rslora=True plus a
        rank_pattern (down_proj r 8) and an alpha_pattern (layer 1 v_proj alpha 2). With --dora:
        use_dora=True, each magnitude vector (initialised by PEFT to the row norms of
        W + scale*B*A, where DoRA equals plain LoRA) multiplied by 1 + 0.1*N(0, 1) before saving.
    compare DIR NAME
        Compares DIR/hearth_on_NAME.json (hearth's logits with DIR/NAME loaded by
        LoraSet::load_peft) with DIR/NAME_logits.json, and hearth's per-module ranks, scales and
        DoRA flags with PEFT's.

Every check prints one PASS or FAIL line; the exit status is 1 if any failed.

Tolerance: the two sides run the same fp32 math in different kernels (candle vs PyTorch), so
logits differ only by rounding, ~1e-6 of their magnitude for this 2-layer model. A check passes
when max|hearth - peft| <= 1e-4 * max|peft| ("rel" below). Any real mismatch (unpermuted q/k rows,
a transposed A or B, alpha/r vs alpha/sqrt(r), a module not loaded, a DoRA magnitude ignored or in
the wrong row order) moves logits by >= 1e-2 of their magnitude: each adapter is required to change
the logits by at least 100x the tolerance, so that a pass cannot come from an adapter too small to
matter.
"""

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF conversion progress bar
# Deprecation notices from transformers, and PEFT's note that the base directory has no
# config.json (the config is in the GGUF): noise here.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message="Could not find a config file")

import torch  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
REL_TOL = 1e-4
MIN_EFFECT = 100 * REL_TOL

failures = []
prefix = ""  # "llama: " / "qwen3: ", from DIR/hearth_logits.json


def report(ok, label, detail):
    label = prefix + label
    print(f"{'PASS' if ok else 'FAIL'} {label}: {detail}", flush=True)
    if not ok:
        failures.append(label)


def diff(got, want):
    """(max abs diff, max abs diff / max |want|, max elementwise rel where |want| >= 1% of max)."""
    got = torch.as_tensor(got, dtype=torch.float64)
    want = torch.as_tensor(want, dtype=torch.float64)
    if got.shape != want.shape:
        raise SystemExit(f"shape mismatch: {tuple(got.shape)} vs {tuple(want.shape)}")
    d = (got - want).abs()
    scale = want.abs().max().item()
    big = want.abs() >= 0.01 * scale
    elem = (d[big] / want.abs()[big]).max().item()
    return d.max().item(), d.max().item() / scale, elem


def check_logits(label, got, want):
    mx, rel, elem = diff(got, want)
    report(
        rel <= REL_TOL,
        label,
        f"max abs {mx:.3e}, rel {rel:.3e} (tol {REL_TOL:g}), "
        f"max elementwise rel {elem:.3e} (|ref| >= 1% of max)",
    )


def check_effect(label, adapted, base):
    _, rel, _ = diff(adapted, base)
    report(
        rel >= MIN_EFFECT,
        label,
        f"adapter moves logits by rel {rel:.3e} (needs >= {MIN_EFFECT:g} to make the check meaningful)",
    )


def load_base(dir_):
    model = AutoModelForCausalLM.from_pretrained(
        str(dir_), gguf_file="base.gguf", dtype=torch.float32
    )
    return model.eval()


@torch.no_grad()
def logits(model, tokens):
    return model(torch.tensor([tokens])).logits[0].float()


def scalings(model):
    """{'model.layers.0.self_attn.q_proj': {'rank': r, 'scale': s, 'dora': bool}} for the 'default'
    adapter."""
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and "default" in mod.scaling:
            key = name.split("base_model.model.", 1)[-1]
            out[key] = {
                "rank": mod.r["default"],
                "scale": float(mod.scaling["default"]),
                "dora": bool(mod.use_dora.get("default", False)),
            }
    return out


def param_name(key):
    """The model parameter that the adapter file's `key` loads into (adapter 'default')."""
    key = key.replace(".lora_A.weight", ".lora_A.default.weight").replace(
        ".lora_B.weight", ".lora_B.default.weight"
    )
    if key.endswith(".lora_magnitude_vector"):
        key += ".default.weight"
    return key


def check_all_loaded(model, adapter_dir, label):
    """Every tensor in the adapter file must have landed, unchanged, in a LoRA module of `model`."""
    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    lora_params = {k for k in params if ".lora_" in k}
    loaded, mismatched = 0, []
    for key, t in saved.items():
        p = params.get(param_name(key))
        if p is not None and p.shape == t.shape and torch.equal(p.detach(), t.float()):
            loaded += 1
        else:
            mismatched.append(key)
    magnitudes = sum(".lora_magnitude_vector" in k for k in saved)
    report(
        loaded == len(saved) == len(lora_params) and not mismatched,
        f"{label}: every tensor loaded by PEFT",
        f"{loaded}/{len(saved)} file tensors ({magnitudes} DoRA magnitude vectors) equal to the "
        f"model's ({len(lora_params)} LoRA parameters in the model)"
        f"{'; mismatched: ' + ', '.join(mismatched[:4]) if mismatched else ''}",
    )


def permute_qk(model, head_dim, part):
    """Permutes the rows of the q/k `part` parameters (lora_B or lora_magnitude_vector) from one
    per-head order to the other, in place."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f".{part}." in name and (".q_proj." in name or ".k_proj." in name):
                out, rest = p.shape[0], p.shape[1:]
                rows = p.reshape(out // head_dim, 2, head_dim // 2, *rest).transpose(1, 2)
                p.copy_(rows.reshape(p.shape))


def check_hearth(dir_):
    dir_ = Path(dir_)
    ref = json.loads((dir_ / "hearth_logits.json").read_text())
    tokens = ref["tokens"]
    base = load_base(dir_)
    print(
        f"transformers config: {type(base).__name__}, hidden {base.config.hidden_size}, "
        f"layers {base.config.num_hidden_layers}, heads {base.config.num_attention_heads}/"
        f"{base.config.num_key_value_heads}, head_dim {getattr(base.config, 'head_dim', None)}, "
        f"vocab {base.config.vocab_size}, tied {base.config.tie_word_embeddings}",
        flush=True,
    )
    base_logits = logits(base, tokens)
    check_logits("base: transformers(GGUF) vs hearth", base_logits, ref["base"])

    adapter_dir = dir_ / "hearth_adapter"
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    check_all_loaded(model, adapter_dir, "hearth adapter")
    sc = scalings(model)
    scales = sorted({v["scale"] for v in sc.values()})
    print(f"PEFT scaling of hearth adapter: {scales} over {len(sc)} modules", flush=True)
    adapted = logits(model, tokens)
    check_effect("hearth adapter: effect", adapted, base_logits)
    check_logits("hearth adapter: PEFT vs hearth", adapted, ref["adapted"])

    # Control: the q/k lora_B row order matters. For Llama, hearth's in-memory rows are in GGUF
    # (interleaved-RoPE) order and save_peft converts them to Hugging Face order; for Qwen3 both
    # orders agree and nothing may be permuted. Either way, the other choice must fail by far more
    # than the tolerance.
    arch = ref.get("arch", "llama")
    head_dim = base.config.head_dim
    permute_qk(model, head_dim, "lora_B")
    _, rel, _ = diff(logits(model, tokens), ref["adapted"])
    what = "left in GGUF row order" if arch == "llama" else "permuted as for Llama"
    report(
        rel >= MIN_EFFECT,
        f"control: q/k lora_B {what} is caught",
        f"rel {rel:.3e} from hearth's logits (tol {REL_TOL:g})",
    )

    # DoRA: the same A and B with magnitudes (save_peft writes them in Hugging Face row order too),
    # on a fresh base since PeftModel.from_pretrained wrapped the first one.
    dora_dir = dir_ / "hearth_dora_adapter"
    model = PeftModel.from_pretrained(load_base(dir_), str(dora_dir)).eval()
    check_all_loaded(model, dora_dir, "hearth DoRA adapter")
    sc = scalings(model)
    print(
        f"PEFT scaling of hearth DoRA adapter: {sorted({v['scale'] for v in sc.values()})} over "
        f"{len(sc)} modules, {sum(v['dora'] for v in sc.values())} with use_dora",
        flush=True,
    )
    dora = logits(model, tokens)
    check_effect("hearth DoRA adapter: effect", dora, base_logits)
    _, rel, _ = diff(dora, adapted)
    report(
        rel >= MIN_EFFECT,
        "hearth DoRA adapter: effect of the magnitudes",
        f"moves logits by rel {rel:.3e} from the plain adapter with the same A and B "
        f"(needs >= {MIN_EFFECT:g})",
    )
    check_logits("hearth DoRA adapter: PEFT vs hearth", dora, ref["adapted_dora"])
    # Control: the magnitude rows follow lora_B's order, so the other q/k order must be caught too.
    permute_qk(model, head_dim, "lora_magnitude_vector")
    _, rel, _ = diff(logits(model, tokens), ref["adapted_dora"])
    report(
        rel >= MIN_EFFECT,
        f"control: q/k lora_magnitude_vector {what} is caught",
        f"rel {rel:.3e} from hearth's logits (tol {REL_TOL:g})",
    )


def write_peft(dir_, name, rslora, dora):
    dir_ = Path(dir_)
    tokens = json.loads((dir_ / "hearth_logits.json").read_text())["tokens"]
    base = load_base(dir_)
    base_logits = logits(base, tokens)
    extra = {}
    if rslora:
        extra = dict(
            use_rslora=True,
            rank_pattern={"down_proj": 8},
            alpha_pattern={"layers.1.self_attn.v_proj": 2},
        )
    if dora:
        extra = dict(use_dora=True)
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=TARGETS,
        init_lora_weights=False,  # B random as well as A (nn.Linear's kaiming-uniform)
        task_type="CAUSAL_LM",
        **extra,
    )
    torch.manual_seed(2 if dora else 1 if rslora else 0)
    model = get_peft_model(base, cfg).eval()
    if dora:
        # PEFT starts each magnitude at the row norms of W + scale*B*A, where DoRA equals plain
        # LoRA: move them away so that hearth must apply them (and in the right row order).
        lora_logits = logits(model, tokens)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if ".lora_magnitude_vector." in pname:
                    p.mul_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(str(dir_ / name))
    adapted = logits(model, tokens)
    check_effect(f"{name}: effect", adapted, base_logits)
    if dora:
        _, rel, _ = diff(adapted, lora_logits)
        report(
            rel >= MIN_EFFECT,
            f"{name}: effect of the magnitudes",
            f"moves logits by rel {rel:.3e} from the same A and B at PEFT's initial magnitudes "
            f"(needs >= {MIN_EFFECT:g})",
        )
    sc = scalings(model)
    (dir_ / f"{name}_logits.json").write_text(
        json.dumps(
            {
                "tokens": tokens,
                "base": base_logits.tolist(),
                "adapted": adapted.tolist(),
                "modules": sc,
            }
        )
    )
    files = sorted(p.name for p in (dir_ / name).iterdir())
    print(
        f"PEFT: saved {dir_ / name} ({', '.join(files)}), {len(sc)} LoRA modules, "
        f"scales {sorted({v['scale'] for v in sc.values()})}, "
        f"{sum(v['dora'] for v in sc.values())} with use_dora",
        flush=True,
    )


def compare(dir_, name):
    dir_ = Path(dir_)
    peft = json.loads((dir_ / f"{name}_logits.json").read_text())
    hearth = json.loads((dir_ / f"hearth_on_{name}.json").read_text())
    if peft["tokens"] != hearth["tokens"]:
        raise SystemExit(f"token sequences differ: {peft['tokens']} vs {hearth['tokens']}")
    check_logits(f"{name}: hearth base vs transformers base", hearth["base"], peft["base"])
    # hearth's per-module rank, scale and DoRA flag, as load_peft derived them from the adapter.
    hm, pm = hearth["adapter"]["modules"], peft["modules"]
    bad = [
        f"{k}: hearth {hm.get(k)} peft {pm.get(k)}"
        for k in sorted(set(hm) | set(pm))
        if k not in hm
        or k not in pm
        or hm[k]["rank"] != pm[k]["rank"]
        or abs(hm[k]["scale"] - pm[k]["scale"]) > 1e-9 * abs(pm[k]["scale"])
        or hm[k]["dora"] != pm[k]["dora"]
    ]
    report(
        not bad,
        f"{name}: hearth load_peft ranks, scales and DoRA flags vs PEFT's",
        f"{len(hm)} modules in hearth, {len(pm)} in PEFT"
        + (f"; differ: {'; '.join(bad[:4])}" if bad else ", all equal"),
    )
    check_logits(f"{name}: hearth(load_peft) vs PEFT", hearth["adapted"], peft["adapted"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("check-hearth")
    a.add_argument("dir")
    a = sub.add_parser("write-peft")
    a.add_argument("dir")
    a.add_argument("name")
    flavour = a.add_mutually_exclusive_group()
    flavour.add_argument("--rslora", action="store_true")
    flavour.add_argument("--dora", action="store_true")
    a = sub.add_parser("compare")
    a.add_argument("dir")
    a.add_argument("name")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("HEARTH_INTEROP_THREADS", "2")))
    global prefix
    prefix = json.loads((Path(args.dir) / "hearth_logits.json").read_text())["arch"] + ": "
    if args.cmd == "check-hearth":
        check_hearth(args.dir)
    elif args.cmd == "write-peft":
        write_peft(args.dir, args.name, args.rslora, args.dora)
    else:
        compare(args.dir, args.name)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
