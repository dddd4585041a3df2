#!/usr/bin/env python3
"""Computes tests/fixtures/chat/expected.json: each family's chat template (src/model/chat_templates/, as its
publisher ships it) rendered by Python's jinja2 the way Hugging Face's `apply_chat_template` sets it up, for
the conversations in tests/fixtures/chat/cases.json. Run once outside CI when a template or case changes:

    python3 -m venv target/jinja-venv && target/jinja-venv/bin/pip install jinja2
    target/jinja-venv/bin/python scripts/chat_fixtures.py

tests/model/chat_templates.rs renders the same cases with hearth's minijinja setup and compares.
"""
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # As transformers' chat template environment defines it.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def main():
    with open(os.path.join(ROOT, "tests/fixtures/chat/cases.json")) as f:
        cases = json.load(f)
    env = environment()
    out = {}
    for fam in cases["families"]:
        path = os.path.join(ROOT, "src/model/chat_templates", fam["name"] + ".jinja")
        with open(path) as f:
            template = env.from_string(f.read())
        for conv_name, messages in cases["conversations"].items():
            for gen in (True, False):
                key = f"{fam['name']}/{conv_name}/{'gen' if gen else 'nogen'}"
                try:
                    out[key] = template.render(
                        messages=messages,
                        add_generation_prompt=gen,
                        bos_token=fam["bos"],
                        eos_token=fam["eos"],
                        enable_thinking=False,
                        date_string=cases["date_string"],
                    )
                except jinja2.exceptions.TemplateError as e:
                    out[key] = {"error": str(e)}
    with open(os.path.join(ROOT, "tests/fixtures/chat/expected.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")
    print(f"{len(out)} renderings, jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
