#!/usr/bin/env python3
"""Binary unsafe-vs-safe probes on the embeddings `examples/guard_probe.rs` caches.

Run the example first (it embeds the probe's training prompts, dev and both held-out sets with
the base and writes them to CACHE_DIR), then:

    python3 scripts/guard_probe_eval.py CACHE_DIR 8,16,24 HIDDEN

For each tapped layer, each pooling (mean, last token, both) and each inverse regularisation C,
a logistic regression (scikit-learn) on standardised features prints ROC AUC, recall and safe
flagged at p >= 0.5, and at the threshold that flags 2% of dev's safe prompts (chosen on dev
only, applied unchanged to the held-out sets). Held-out texts are never read here.
"""
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

cache, layers, hidden = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
key = "-".join(map(str, layers))
width = len(layers) * 2 * hidden
X = np.fromfile(f"{cache}/train3_L{key}.f32", dtype=np.float32).reshape(-1, width)
y = (np.fromfile(f"{cache}/train3_ys.f32", dtype=np.float32).reshape(-1, 9).max(1) > 0).astype(int)
sets = {}
for name in ["dev", "held-out", "held-out-2"]:
    e = np.fromfile(f"{cache}/{name}_L{key}.f32", dtype=np.float32).reshape(-1, width)
    sets[name] = (e, np.fromfile(f"{cache}/{name}_unsafe.u8", dtype=np.uint8))


def feats(a, k, part):
    a = a[:, k * 2 * hidden:(k + 1) * 2 * hidden]
    return {"mean": a[:, :hidden], "last": a[:, hidden:], "both": a}[part]


for k, layer in enumerate(layers):
    for part in ["mean", "last", "both"]:
        xf = feats(X, k, part)
        mu, sd = xf.mean(0), xf.std(0) + 1e-3
        for c in [0.001, 0.01, 0.1]:
            m = LogisticRegression(C=c, max_iter=300).fit((xf - mu) / sd, y)
            z = {n: m.decision_function((feats(e, k, part) - mu) / sd) for n, (e, u) in sets.items()}
            e, u = sets["dev"]
            t = np.quantile(z["dev"][u == 0], 0.98)
            cols = []
            for n, (e, u) in sets.items():
                s = z[n]
                cols.append(
                    f"{n} auc {roc_auc_score(u, s):.3f} "
                    f"p.5 {np.mean(s[u == 1] > 0):.3f}/{np.mean(s[u == 0] > 0):.3f} "
                    f"dev2% {np.mean(s[u == 1] > t):.3f}/{np.mean(s[u == 0] > t):.3f}"
                )
            print(f"L{layer} {part:<4} C={c:<5} " + " | ".join(cols), flush=True)
