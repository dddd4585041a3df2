#!/usr/bin/env python3
"""Writes src/curate/redact/data/countries.txt: the names of countries and territories in 50 languages, from
the Unicode CLDR as the `babel` package ships it. The redactor reads them as places, so that `Nova Zelândia`
or `Ηνωμένο Βασίλειο` is not taken for a person's name. Run once outside CI when the language list changes:

    python3 -m venv target/babel-venv && target/babel-venv/bin/pip install babel
    target/babel-venv/bin/python scripts/cldr_countries.py
"""
import os

import babel
from babel import Locale

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LANGS = (
    "en de fr es pt it nl sv da nb fi is pl cs sk sl hr sr sr_Latn bs mk bg ru uk be el tr hu ro lt lv et hy ka "
    "az kk uz sq ca gl eu ar fa he hi th vi id ms ja ko zh zh_Hant"
).split()

names = set()
for lang in LANGS:
    for code, name in Locale.parse(lang).territories.items():
        # countries and territories (two letters), not regions (`001`) or pseudo-codes
        if len(code) == 2 and code.isalpha() and code not in ("ZZ", "XA", "XB", "UN", "EU", "EZ", "QO"):
            names.add(name.strip())
out = os.path.join(ROOT, "src/curate/redact/data/countries.txt")
with open(out, "w", encoding="utf-8") as f:
    f.write("# Country and territory names in %d languages, CLDR via babel %s (scripts/cldr_countries.py).\n"
            % (len(LANGS), babel.__version__))
    for n in sorted(names):
        f.write(n + "\n")
print(len(names), "names ->", out)
