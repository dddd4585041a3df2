#!/usr/bin/env python3
"""PyTorch + PEFT peer for hearth's training-throughput bench (benches/train_throughput.rs).

Measures tokens/s of full LoRA SFT steps -- forward, causal-LM loss, backward, gradient-norm
clipping at 1.0 and AdamW over the LoRA parameters -- on CPU in fp32, with the same shapes as
hearth's bench: sequence 128, batch 4, LoRA rank 8 and 16 (alpha = 2 x rank, dropout 0) on all
seven linear projections (q, k, v, o, gate, up, down). Inputs are random token ids with
labels = input ids; tokens per step = batch x seq. Warm-up steps are run first and not timed.

Models: --shape smollm2-135m|smollm2-1.7b builds a random-weight Llama of that model's layers, widths and heads
with the tiny model's 307-token vocabulary, as `examples/gpu_decode.rs write` does for hearth's GPU figures;
--tiny builds hearth's tiny Llama test model (`TinySpec::new(Arch::Llama)` in
src/model/gguf.rs: hidden 64, 2 layers, 4 heads / 2 kv heads of dim 16, intermediate 128,
307-token vocabulary, tied embeddings) with random weights; --gguf PATH loads a llama-architecture
GGUF (e.g. SmolLM2-135M-Instruct) through transformers, dequantized to fp32, without network.

Prints one line per rank, e.g.
    peft tiny rank 8: 1234.5 tokens/s (2048 tokens in 1.66 s, 4 steps)

Dependencies (from PyPI; the Linux torch wheel pulls its CUDA libraries, ~5.6 GB in all):
    python3 -m venv venv && venv/bin/pip install torch transformers peft gguf numpy safetensors
scripts/bench_train_peft.sh does that and prints hearth's figures beside these.
"""

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_model():
    """hearth's tiny Llama test model, randomly initialised."""
    config = LlamaConfig(
        vocab_size=307,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


# Layers, widths and heads of `gpu_decode write`'s shapes (head dim 64, tied embeddings, vocabulary 307).
SHAPES = {
    "smollm2-135m": (576, 1536, 30, 9, 3),
    "smollm2-1.7b": (2048, 8192, 24, 32, 32),
}


def shaped_model(shape):
    """A random-weight Llama shaped like `shape` with the tiny vocabulary."""
    hidden, ffn, layers, heads, kv_heads = SHAPES[shape]
    config = LlamaConfig(
        vocab_size=307,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=2048,
        rope_theta=10_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def gguf_model(path):
    """A GGUF checkpoint, dequantized to fp32 by transformers."""
    path = Path(path)
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )


def measure(base, rank, args):
    """Wraps `base` with LoRA of `rank`, times the steps; returns (peft model, tokens, seconds)."""
    lora = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=TARGETS,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    vocab = base.config.vocab_size
    batches = torch.randint(vocab, (args.warmup + args.steps, args.batch, args.seq), generator=gen)
    batches = batches.to(args.device)

    def step(ids):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    for ids in batches[: args.warmup]:
        step(ids)
    sync()
    start = time.perf_counter()
    for ids in batches[args.warmup :]:
        step(ids)
    sync()
    seconds = time.perf_counter() - start
    return model, args.steps * args.batch * args.seq, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--tiny", action="store_true", help="hearth's tiny Llama, random weights")
    which.add_argument("--gguf", metavar="PATH", help="llama GGUF to load (e.g. SmolLM2-135M)")
    which.add_argument("--shape", choices=sorted(SHAPES), help="random weights of a model's shape")
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    ap.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations"
    )
    ap.add_argument("--rank", type=int, nargs="+", default=[8, 16], help="LoRA rank(s)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per rank")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.tiny:
        base, name = tiny_model(), "tiny"
    elif args.shape:
        base, name = shaped_model(args.shape), args.shape
    else:
        base, name = gguf_model(args.gguf), Path(args.gguf).stem
    base = base.to(device=args.device, dtype=getattr(torch, args.dtype))
    for rank in args.rank:
        model, tokens, seconds = measure(base, rank, args)
        print(
            f"peft {name} rank {rank}: {tokens / seconds:.1f} tokens/s "
            f"({tokens} tokens in {seconds:.2f} s, {args.steps} steps, {args.device}, {args.dtype})",
            flush=True,
        )
        base = model.unload()


if __name__ == "__main__":
    main()
