#!/usr/bin/env python3
"""The ids llama.cpp gives each TEXT (special tokens parsed, no BOS) with the vocabulary of GGUF, as JSON.

Uses the llama.cpp that scripts/llamacpp_build.sh builds (libllama.so) through the `llama_cpp` package of the
same llama-cpp-python source archive, so that no second build is needed:

  source scripts/llamacpp_build.sh   # once: builds into ~/.cache/hearth-llamacpp
  python3 -m venv /tmp/lt && /tmp/lt/bin/pip install numpy typing_extensions diskcache jinja2
  PYTHONPATH=~/.cache/hearth-llamacpp/src LLAMA_CPP_LIB_PATH=~/.cache/hearth-llamacpp/build/bin \\
      /tmp/lt/bin/python scripts/llamacpp_tokenize.py GGUF TEXT...

TEXT takes Python escapes (\\n, \\t).
"""
import json
import sys

import llama_cpp


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    model = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
    out = []
    for arg in sys.argv[2:]:
        text = arg.encode().decode("unicode_escape")
        out.append({"text": text, "ids": model.tokenize(text.encode(), add_bos=False, special=True)})
    print(json.dumps({"general.name": model.metadata.get("general.name"), "cases": out}, ensure_ascii=False))


if __name__ == "__main__":
    main()
