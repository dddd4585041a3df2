#!/usr/bin/env bash
# The builtin guard on its dev split (data/guard/dev_prompts.jsonl, written by
# scripts/gen_guard_dev.py) and on the hand-written held-out prompts
# (data/guard/heldout_prompts.jsonl, data/guard/heldout2_prompts.jsonl), side by side, plus the
# template held-out split. Prints the figures even when a floor fails.
# Tune on dev only; the held-out texts are never printed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(cargo test --test curate -- --nocapture --test-threads 1 \
  guard::builtin_on_dev_prompts guard::builtin_on_hand_written_held_out_prompts guard::builtin_on_second_held_out_prompts guard::builtin_on_personal_held_out_turns \
  guard::builtin_held_out_report 2>&1) || true
echo "$out" | grep -oE '(dev|held-out|held-out-2|held-out-personal) \(.*|overall unsafe-vs-safe.*|builtin guard, held-out n=.*|test result.*'
