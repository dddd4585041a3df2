#!/usr/bin/env python3
"""Builds the labelled stream for experiments/curation_order.ron, reproducibly (seeded, standard library only).

Mixes three sources into one JSONL file of `hearth experiment` records:
  - chat records from ../shared/data/pii/pii_10k.jsonl with their gold PII spans (API_KEY spans become gold
    secrets) and its PII-free negatives;
  - guard templates from data/guard (both splits, prompt and response side), slots filled from fillers.json,
    labelled unsafe by their categories (PII values generated into a template are gold PII spans too);
  - near and exact duplicates of a share of the above, each group sharing a `dup_group`.

Usage: scripts/build_curation_stream.py [--pii N] [--guard N] [--dups N] [--seed S] [--out FILE]
"""

import argparse
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PII = ROOT.parent / "shared" / "data" / "pii" / "pii_10k.jsonl"
GUARD = ROOT / "data" / "guard"

ANSWERS = [
    "Sure, here is a short answer.",
    "Here is what I would suggest.",
    "Done. Let me know if you want changes.",
    "Happy to help with that.",
]


def pii_records(n, rng):
    out = []
    with open(PII) as f:
        for line in f:
            if len(out) >= n:
                break
            r = json.loads(line)
            pii, secrets = [], []
            for s in r["spans"]:
                if s["type"] == "API_KEY":
                    secrets.append({"value": s["value"]})
                else:
                    pii.append({"type": s["type"], "value": s["value"], "start": s["start"], "end": s["end"]})
            out.append({
                "id": f"pii-{r['id']}",
                "user": f"u{r['id'] % 7}",
                "prompt": r["text"],
                "response": rng.choice(ANSWERS),
                "pii": pii,
                "secrets": secrets,
            })
    return out


def digits(rng, k):
    return "".join(rng.choice("0123456789") for _ in range(k))


def fill(text, split, fillers, rng):
    """Fills every slot; returns (text, gold PII spans) or None for a slot this script does not generate."""
    key = "train" if split == "train" else "test"
    spans = []

    def pick(name):
        v = fillers[name]
        if isinstance(v, dict):
            v = v.get(key) or v.get("train") or next(iter(v.values()))
        return rng.choice(v)

    def value(name):
        if name in fillers:
            return pick(name)
        if name == "person":
            v = f"{pick('first')} {pick('last')}"
            spans.append({"type": "PERSON", "value": v})
            return v
        if name == "email":
            v = f"{pick('first').lower()}.{pick('last').lower()}@{pick('domain')}"
            spans.append({"type": "EMAIL", "value": v})
            return v
        if name == "phone":
            v = f"({digits(rng, 3)}) {digits(rng, 3)}-{digits(rng, 4)}"
            spans.append({"type": "PHONE", "value": v})
            return v
        if name == "ssn":
            v = f"{rng.randint(100, 665)}-{digits(rng, 2)}-{digits(rng, 4)}"
            spans.append({"type": "SSN", "value": v})
            return v
        simple = {
            "money": lambda: f"${rng.randint(2, 90)},{digits(rng, 3)}",
            "price": lambda: f"${rng.randint(3, 400)}",
            "digits4": lambda: digits(rng, 4),
            "clock": lambda: f"{rng.randint(1, 12)}:{rng.choice(['00', '15', '30', '45'])}",
            "bignum": lambda: str(rng.randint(10**6, 10**9)),
            "lineno": lambda: str(rng.randint(2, 400)),
            "port": lambda: str(rng.choice([8080, 5432, 3000, 6379])),
            "math": lambda: f"{rng.randint(2, 99)} * {rng.randint(2, 99)}",
        }
        if name in simple:
            return simple[name]()
        raise KeyError(name)

    try:
        return re.sub(r"\{(\w+)\}", lambda m: value(m.group(1)), text), spans
    except KeyError:
        return None


def guard_records(n, rng):
    fillers = json.loads((GUARD / "fillers.json").read_text())
    templates = [json.loads(line) for line in open(GUARD / "templates.jsonl")]
    rng.shuffle(templates)
    out = []
    for i, t in enumerate(templates):
        if len(out) >= n:
            break
        filled = fill(t["text"], t["split"], fillers, rng)
        if filled is None:
            continue
        text, spans = filled
        rec = {"id": f"guard-{i}", "user": f"u{i % 7}", "pii": spans, "unsafe": t["labels"]}
        if t["side"] == "prompt":
            rec["prompt"], rec["response"] = text, rng.choice(ANSWERS)
        else:
            rec["prompt"], rec["response"] = "Can you help me with something?", text
        out.append(rec)
    return out


def near_copy(text, rng):
    """A near duplicate: one small edit a user makes when asking again."""
    edits = [
        lambda s: "Please " + s[0].lower() + s[1:] if s else s,
        lambda s: s.rstrip(".?!") + "?",
        lambda s: s + " Thanks!",
        lambda s: s.replace(" the ", " this ", 1),
        lambda s: "Hi, " + s,
        lambda s: s,  # an exact resend
    ]
    return rng.choice(edits)(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pii", type=int, default=3000)
    ap.add_argument("--guard", type=int, default=600)
    ap.add_argument("--dups", type=int, default=800, help="records copied into duplicate groups")
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "data" / "curation_stream.jsonl"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    records = pii_records(args.pii, rng) + guard_records(args.guard, rng)
    copies = []
    for k, orig in enumerate(rng.sample(records, min(args.dups, len(records)))):
        group = f"g{k}"
        orig["dup_group"] = group
        for j in range(rng.choice([1, 1, 2])):
            c = dict(orig)
            c["id"] = f"{orig['id']}-dup{j}"
            c["prompt"] = near_copy(orig["prompt"], rng)
            # Gold values the edit left intact are still gold in the copy.
            c["pii"] = [s for s in orig.get("pii", []) if s["value"] in c["prompt"] + c["response"]]
            c["pii"] = [{k2: v for k2, v in s.items() if k2 in ("type", "value")} for s in c["pii"]]
            copies.append(c)
    records += copies
    rng.shuffle(records)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{out}: {len(records)} records ({len(copies)} duplicates)")


if __name__ == "__main__":
    main()
