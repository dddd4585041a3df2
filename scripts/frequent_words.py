#!/usr/bin/env python3
"""Writes src/curate/redact/data/frequent_words.txt: the most frequent words of 42 languages, from the `wordfreq`
package on PyPI. The redactor reads them on a sign-off line only, so that two capitalised everyday words there
(`Met vriendelijke groet,` / `Wakker Begin`) are not taken for a person's name in languages its own word lists do not
cover (the lists hold names too, so they cannot count as ordinary words everywhere). The file is sorted: the redactor
searches it by bisection. Run once outside CI when the list changes:

    python3 -m venv target/wordfreq-venv && target/wordfreq-venv/bin/pip install wordfreq==3.1.1
    target/wordfreq-venv/bin/python scripts/frequent_words.py [N]

wordfreq's data is CC BY-SA 4.0 (Robyn Speer, Luminoso); the written file carries that notice.
"""
import os
import sys

import wordfreq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000

words = set()
langs = sorted(wordfreq.available_languages("best"))
for lang in langs:
    for w in wordfreq.top_n_list(lang, N):
        # words only (no numbers, no clitics), of at least three letters
        if w.isalpha() and len(w) >= 3:
            words.add(w.lower())

out = os.path.join(ROOT, "src/curate/redact/data/frequent_words.txt")
with open(out, "w", encoding="utf-8") as f:
    f.write(f"# The {N} most frequent words of each of {len(langs)} languages ({' '.join(langs)}), three letters or more.\n")
    f.write("# From wordfreq 3.1.1 (https://pypi.org/project/wordfreq/), by Robyn Speer; data CC BY-SA 4.0, and so is\n")
    f.write("# this list. Written by scripts/frequent_words.py.\n")
    ws = sorted(words)
    for i in range(0, len(ws), 16):
        f.write(" ".join(ws[i:i + 16]) + "\n")
print(f"{len(words)} words -> {out}")
