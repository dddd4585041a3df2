#!/usr/bin/env python3
"""Reference peer: zen/gym's aggregate() semantics in numpy (shared/specs/federation-wire.md), timed on the same
shape as benches/federate_aggregate.rs: N gym blobs (u64 LE header length + JSON header with "offsets" + raw bf16),
per-element byzantine_robust (drop min and max when N >= 4, mean in f32), result truncated to bf16, encoded back."""
import argparse, json, struct, time
import numpy as np


def encode(tensors):
    header, off, chunks = {}, 0, []
    for name, arr in tensors:
        b = (arr.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "offsets": [off, off + len(b)]}
        off += len(b)
        chunks.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(chunks)


def decode(blob):
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    data = memoryview(blob)[8 + n :]
    out = {}
    for name, e in header.items():
        s, t = e["offsets"]
        u = np.frombuffer(data[s:t], dtype="<u2").astype(np.uint32) << 16
        out[name] = u.view(np.float32).reshape(e["shape"])
    return out


def aggregate(blobs, method="byzantine_robust"):
    decoded = [decode(b) for b in blobs]
    result = []
    for name in decoded[0]:
        stack = np.stack([d[name] for d in decoded]).astype(np.float32)
        n = stack.shape[0]
        if method == "byzantine_robust" and n >= 4:
            agg = np.sort(stack, axis=0)[1:-1].mean(axis=0)
        elif method == "median":
            agg = np.median(stack, axis=0)
        else:
            agg = stack.mean(axis=0)
        result.append((name, agg.astype(np.float32)))
    return encode(result)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=10_000_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    per = a.params // 10
    blobs = []
    for w in range(a.workers):
        ts = []
        for t in range(10):
            n = a.params - per * 9 if t == 9 else per
            ts.append((f"base_model.model.model.layers.{t}.mlp.down_proj.lora_A.weight",
                       (rng.random(n, dtype=np.float32) - 0.5) * 0.02))
        blobs.append(encode(ts))
    # Check the golden aggregation semantics before timing.
    small = [encode([("x", np.array([v], dtype=np.float32))]) for v in (1.0, 2.0, 3.0, 100.0)]
    assert decode(aggregate(small))["x"][0] == 2.5
    assert decode(aggregate(small[:2] + small[3:]))["x"][0] == 34.25
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        aggregate(blobs)
        times.append(time.perf_counter() - t0)
    print(f"gym_aggregate.py: {a.workers} workers x {a.params} params, numpy {np.__version__}: "
          f"best {min(times):.3f} s over {a.reps} runs")
    print(f"PY_SECONDS={min(times):.6f}")


if __name__ == "__main__":
    main()
