#!/usr/bin/env python3
"""The soak's measurements (scripts/soak.sh).

  soak_report.py header
  soak_report.py sample --t SECS --pid PID --data DIR [--load load.json]   one CSV row to stdout
  soak_report.py report samples.csv --warmup SECS [--plot soak.png] [--json summary.json]

`sample` reads the process's resident set (VmRSS) and the data directory's disk use (allocated blocks, as
`du` counts them; symbolic links are not followed, so a linked model cache is not counted), split into the
SQLite files, the deltas, the dead letters and the rest, plus the store's row counts. `report` fits a least-
squares line to RSS and to the data directory's size over the samples after the warm-up, prints the slopes
(MiB per hour, with their standard errors) and draws both series with the fits (matplotlib).
"""

import argparse
import csv
import json
import math
import os
import sqlite3
import sys

COLUMNS = [
    "t_s", "rss_bytes", "data_bytes", "db_bytes", "deltas_bytes", "dead_letter_bytes",
    "training_rows", "interactions", "deltas", "chats_ok", "feedback_ok",
]
MIB = 1024 * 1024


def disk_use(path):
    """Allocated bytes under `path`, not following symbolic links."""
    total = 0
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    total += st.st_blocks * 512
    if os.path.isdir(path) and not os.path.islink(path):
        for entry in os.scandir(path):
            total += disk_use(entry.path)
    return total


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def store_counts(data):
    db = os.path.join(data, "hearth.sqlite")
    if not os.path.exists(db):
        return 0, 0, 0
    try:
        # Read-only, and a short busy timeout: the run is writing.
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)
        one = lambda sql: conn.execute(sql).fetchone()[0]
        counts = (one("SELECT COUNT(*) FROM training_set"), one("SELECT COUNT(*) FROM interactions"),
                  one("SELECT COUNT(*) FROM deltas"))
        conn.close()
        return counts
    except sqlite3.Error:
        return -1, -1, -1


def sample(args):
    data = args.data
    db = sum(disk_use(os.path.join(data, f"hearth.sqlite{s}")) for s in ("", "-wal", "-shm"))
    dead = sum(disk_use(os.path.join(data, n)) for n in os.listdir(data) if n.startswith("dead_letters.jsonl"))
    load = {}
    if args.load and os.path.exists(args.load):
        try:
            with open(args.load) as f:
                load = json.load(f)
        except (OSError, ValueError):
            pass
    training, interactions, deltas = store_counts(data)
    row = [args.t, rss_bytes(args.pid), disk_use(data), db, disk_use(os.path.join(data, "deltas")), dead,
           training, interactions, deltas, load.get("ok", 0), load.get("feedback_ok", 0)]
    print(",".join(str(v) for v in row))


def fit(ts, ys):
    """Least-squares slope and intercept, and the slope's standard error."""
    n = len(ts)
    mt, my = sum(ts) / n, sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if n < 3 or sxx == 0:
        return 0.0, my, float("nan")
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / sxx
    intercept = my - slope * mt
    resid = sum((y - (intercept + slope * t)) ** 2 for t, y in zip(ts, ys))
    return slope, intercept, math.sqrt(resid / (n - 2) / sxx)


def report(args):
    with open(args.csv) as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not rows:
        sys.exit("no samples")
    after = [r for r in rows if r["t_s"] >= args.warmup]
    summary = {"samples": len(rows), "samples_after_warmup": len(after), "warmup_s": args.warmup,
               "duration_s": rows[-1]["t_s"], "last": rows[-1], "fits": {}}
    for col in ("rss_bytes", "data_bytes", "db_bytes", "deltas_bytes", "dead_letter_bytes"):
        if len(after) < 3:
            break
        ts = [r["t_s"] for r in after]
        ys = [r[col] for r in after]
        slope, intercept, se = fit(ts, ys)
        mean = sum(ys) / len(ys)
        summary["fits"][col] = {
            "slope_bytes_per_s": slope,
            "slope_mib_per_hour": slope * 3600 / MIB,
            "stderr_mib_per_hour": se * 3600 / MIB,
            "intercept_bytes": intercept,
            "mean_mib": mean / MIB,
            "min_mib": min(ys) / MIB,
            "max_mib": max(ys) / MIB,
            "growth_per_hour_pct_of_mean": 100 * slope * 3600 / mean if mean else 0.0,
        }
    print(f"samples: {len(rows)} ({len(after)} after a warm-up of {args.warmup:.0f} s), "
          f"duration {rows[-1]['t_s']:.0f} s; chats answered {rows[-1]['chats_ok']:.0f}, "
          f"feedback {rows[-1]['feedback_ok']:.0f}; deltas in store {rows[-1]['deltas']:.0f}, "
          f"training rows {rows[-1]['training_rows']:.0f}")
    for col, f in summary["fits"].items():
        print(f"{col:>18}: slope {f['slope_mib_per_hour']:+.3f} ± {f['stderr_mib_per_hour']:.3f} MiB/h "
              f"({f['growth_per_hour_pct_of_mean']:+.2f} %/h of its mean {f['mean_mib']:.1f} MiB; "
              f"range {f['min_mib']:.1f}..{f['max_mib']:.1f} MiB)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(summary, out, indent=2)
    if args.plot:
        plot(rows, summary, args)


def plot(rows, summary, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for ax, col, title in ((axes[0], "rss_bytes", "RSS of hearth run"),
                           (axes[1], "data_bytes", "data directory (du)")):
        ax.plot(minutes, [r[col] / MIB for r in rows], marker=".", label=title)
        if col == "data_bytes":
            for part, label in (("db_bytes", "SQLite files"), ("deltas_bytes", "deltas"),
                                ("dead_letter_bytes", "dead letters")):
                ax.plot(minutes, [r[part] / MIB for r in rows], linewidth=1, label=label)
        f = summary["fits"].get(col)
        if f:
            ends = (args.warmup, rows[-1]["t_s"])
            line = [(f["intercept_bytes"] + f["slope_bytes_per_s"] * t) / MIB for t in ends]
            ax.plot([t / 60 for t in ends], line, "k--",
                    label=f"fit after warm-up: {f['slope_mib_per_hour']:+.3f} MiB/h")
        ax.axvline(args.warmup / 60, color="grey", linestyle=":", label="end of warm-up")
        ax.set_ylabel("MiB")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"plot: {args.plot}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("header")
    s = sub.add_parser("sample")
    s.add_argument("--t", type=float, required=True)
    s.add_argument("--pid", type=int, required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--load")
    r = sub.add_parser("report")
    r.add_argument("csv")
    r.add_argument("--warmup", type=float, required=True)
    r.add_argument("--plot")
    r.add_argument("--json")
    args = ap.parse_args()
    if args.cmd == "header":
        print(",".join(COLUMNS))
    elif args.cmd == "sample":
        sample(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
