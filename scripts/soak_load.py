#!/usr/bin/env python3
"""API traffic for the soak (scripts/soak.sh): a heavy user's day, sped up.

A heavy user, as defined here: 200 chat requests and 50 pieces of feedback a day (feedback on one answer in
four: thumbs up or down, an edit, an accepted answer). `--scale 10` sends ten times that: 2000 chats and 500
feedback a day, one chat every 43 s on average. Arrivals are Poisson (exponential gaps), so bursts happen.
Prompts are drawn from templates and a vocabulary, so curation's dedup admits most of them, as it would a
person's varied questions; now and then one carries an email address or a key for the curators to catch.

Counts go to --stats (JSON, rewritten after every request): sent, ok, failed, feedback_ok, by status.
Standard library only. Stops on SIGTERM/SIGINT or after --duration seconds.
"""

import argparse
import json
import os
import random
import signal
import sys
import time
import urllib.error
import urllib.request

CHATS_PER_DAY = 200
FEEDBACK_PER_DAY = 50

TOPICS = [
    "sourdough", "the garden", "my bike", "tax forms", "a birthday", "rust lifetimes", "sqlite", "the cat",
    "knee pain", "a job interview", "the budget", "a trip to Porto", "tomatoes", "the heating", "a poem",
    "git rebase", "a cover letter", "sleep", "running shoes", "the landlord", "a recipe for dal", "chess",
]
ASKS = [
    "How do I {v} {t}?", "Can you explain {t} in two sentences?", "What should I know about {t} before {g}?",
    "Give me three tips on {t}.", "Why does {t} {p}?", "Write a short note about {t} for {w}.",
    "Is it a good idea to {v} {t} on {d}?", "Summarise what we said about {t}.",
]
VERBS = ["fix", "start", "plan", "clean", "improve", "learn", "compare", "schedule"]
GOALS = ["the weekend", "winter", "the meeting", "my holiday", "next month", "tomorrow morning"]
PROBLEMS = ["keep failing", "take so long", "cost so much", "confuse me", "break in the cold"]
WHO = ["my sister", "the team", "a neighbour", "my doctor", "the school"]
DAYS = ["Monday", "a rainy day", "a weekday", "Sunday night"]


def prompt(rng):
    text = rng.choice(ASKS).format(
        v=rng.choice(VERBS), t=rng.choice(TOPICS), g=rng.choice(GOALS), p=rng.choice(PROBLEMS),
        w=rng.choice(WHO), d=rng.choice(DAYS),
    )
    roll = rng.random()
    if roll < 0.03:
        text += f" You can reach me at user{rng.randrange(1000)}@example.com."
    elif roll < 0.04:
        text += " My token is ghp_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(36))
    return f"{text} (#{rng.randrange(10**6)})"


def post(addr, path, body, key, timeout=120):
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--addr", required=True, help="host:port of the serve node")
    ap.add_argument("--scale", type=float, default=10.0, help="times a heavy user's rate (default 10)")
    ap.add_argument("--duration", type=float, default=float("inf"), help="seconds to run (default: until signalled)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats", default=None, help="JSON file of counts, rewritten after every request")
    args = ap.parse_args()
    key = os.environ.get("HEARTH_API_KEY")
    rng = random.Random(args.seed)
    chats_per_sec = CHATS_PER_DAY * args.scale / 86400.0
    feedback_share = FEEDBACK_PER_DAY / CHATS_PER_DAY
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    stats = {"sent": 0, "ok": 0, "failed": 0, "feedback_sent": 0, "feedback_ok": 0, "status": {},
             "chats_per_day": CHATS_PER_DAY * args.scale, "feedback_per_day": FEEDBACK_PER_DAY * args.scale}
    end = time.monotonic() + args.duration
    # Open-loop arrivals: the next arrival is scheduled from the last one, not from when an answer came.
    next_at = time.monotonic()
    while not stop and time.monotonic() < end:
        next_at += rng.expovariate(chats_per_sec)
        while not stop and time.monotonic() < min(next_at, end):
            time.sleep(min(0.5, max(0.0, next_at - time.monotonic())))
        if stop or time.monotonic() >= end:
            break
        user = "me"
        body = {"messages": [{"role": "user", "content": prompt(rng)}], "user": user,
                "max_tokens": args.max_tokens, "temperature": 0.7}
        code, answer = post(args.addr, "/v1/chat/completions", body, key)
        stats["sent"] += 1
        stats["status"][str(code)] = stats["status"].get(str(code), 0) + 1
        if code == 200:
            stats["ok"] += 1
        else:
            stats["failed"] += 1
        if code == 200 and answer.get("id") and rng.random() < feedback_share:
            kind = rng.choice(["thumbs_up", "thumbs_down", "edit", "accepted"])
            fb = {"response_id": answer["id"], "user": user, "kind": kind}
            if kind == "edit":
                fb["text"] = f"A shorter answer, the way I like it ({rng.randrange(10**6)})."
            fcode, _ = post(args.addr, "/v1/feedback", fb, key)
            stats["feedback_sent"] += 1
            stats["feedback_ok"] += fcode == 200
        if args.stats:
            tmp = args.stats + ".tmp"
            with open(tmp, "w") as f:
                json.dump(stats, f)
            os.replace(tmp, args.stats)
    print(json.dumps(stats), file=sys.stderr)


if __name__ == "__main__":
    main()
