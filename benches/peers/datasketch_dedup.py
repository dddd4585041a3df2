#!/usr/bin/env python3
"""datasketch MinHash LSH on the records benches/curate_dedup.rs writes (same stream, same truth).

Peer configuration: 128 permutations, word 5-grams, LSH threshold 0.8. Text gets the same
normalisation as hearth (lowercase, punctuation as separator) so formatting is not held against it.
A record is flagged when the LSH query returns any earlier record; only unflagged records are
inserted, as in hearth. Prints docs/s, recall and precision against the constructed truth, plus
recall on pairs whose exact word-5-gram Jaccard is >= 0.8 (the peer's own notion of recall).
"""
import json
import re
import sys
import time

from datasketch import MinHash, MinHashLSH

TOKEN = re.compile(r"[^\W_]+", re.UNICODE)


def shingles(text, n=5):
    words = TOKEN.findall(text.lower())
    if len(words) <= n:
        return {" ".join(words).encode()}
    return {" ".join(words[i:i + n]).encode() for i in range(len(words) - n + 1)}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    # --update-each: one MinHash.update() per shingle (the common usage) instead of update_batch.
    each = "--update-each" in sys.argv
    path = args[0] if args else "target/curate_dedup_corpus.jsonl"
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    flagged = []
    t = time.perf_counter()
    for r in recs:
        m = MinHash(num_perm=128)
        if each:
            for s in shingles(r["text"]):
                m.update(s)
        else:
            m.update_batch(list(shingles(r["text"])))
        hit = bool(lsh.query(m))
        if not hit:
            lsh.insert(r["id"], m)
        flagged.append(hit)
    secs = time.perf_counter() - t
    tp = fp = fn = 0
    jpos = jhit = 0
    sets = {}
    for r, hit in zip(recs, flagged):
        dup = r["kind"] == "FormatVariant" or (
            isinstance(r["kind"], dict) and "NearDuplicate" in r["kind"])
        tp += dup and hit
        fp += (not dup) and hit
        fn += dup and not hit
        if dup:
            a = sets.setdefault(r["id"], shingles(r["text"]))
            src = recs[r["source"]]
            b = sets.setdefault(src["id"], shingles(src["text"]))
            if len(a & b) / len(a | b) >= 0.8:
                jpos += 1
                jhit += hit
    print("DATASKETCH mode=%s docs_per_s=%.0f recall=%.4f precision=%.4f recall_own_j08=%.4f n=%d secs=%.2f"
          % ("update_each" if each else "update_batch", len(recs) / secs, tp / max(tp + fn, 1), tp / max(tp + fp, 1), jhit / max(jpos, 1),
             len(recs), secs))


if __name__ == "__main__":
    main()
