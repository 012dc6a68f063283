#!/usr/bin/env python3
"""Prints docs/engine.md's asynchronous-training table from the runs scripts/async-comparison.sh
writes (OUT/<mode>-<seed>/metrics.jsonl, mode sync, async-1, async-2): per mode, mean ± sd
[min, max] over the seeds of the step seconds (the sum of the step lines' step_seconds: the
warm-up and the evaluations are not step lines), whole-run tokens/s (generated tokens over those
seconds), the step seconds up to the first evaluation at or above 0.80 and 0.85 accuracy, the
accuracy at step 10 and at the last step, the weight syncs, then the mean staleness.

    python3 scripts/async-comparison.py [OUT]
"""
import glob
import json
import os
import re
import statistics
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else "runs/async-comparison"
MODES = [("sync", "sync"), ("async-1", "async, k = 1"), ("async-2", "async, k = 2")]
TARGETS = [0.80, 0.85]


def run(path):
    """One run's numbers; the seconds to a target are None when no evaluation reached it."""
    steps, evals = [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "eval":
                evals.append(r)
            elif "event" not in r and "step_seconds" in r:
                steps.append(r)
    seconds = [s["step_seconds"] for s in steps]
    # An evaluation after `n` steps follows step lines 0..n-1: its time is their sum.
    to = {x: next((sum(seconds[: e["step"]]) for e in evals if e["accuracy"] >= x), None) for x in TARGETS}
    acc = {e["step"]: e["accuracy"] for e in evals}
    asyncs = [s.get("async") or {} for s in steps]
    return {
        "steps": len(steps),
        "seconds": sum(seconds),
        "tokens_per_s": sum(s["tokens_per_second"] * s["step_seconds"] for s in steps) / sum(seconds),
        "to": to,
        "acc10": acc.get(10),
        "acc_last": acc.get(len(steps)),
        # Sync mode has no async record: its weights are shared within the step, every step.
        "syncs": sum(isinstance(a.get("weight_sync"), dict) for a in asyncs),
        "staleness": statistics.mean(a.get("staleness", 0) for a in asyncs),
    }


def spread(xs, digits=1, bounds=True):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    text = f"{statistics.mean(xs):.{digits}f} ± {sd:.{digits}f}"
    return text + (f" [{min(xs):.{digits}f}, {max(xs):.{digits}f}]" if bounds else "")


def main():
    rows, notes, steps = [], [], None
    for mode, label in MODES:
        runs = {}
        for path in sorted(glob.glob(f"{OUT}/{mode}-*/metrics.jsonl")):
            seed = path.split("/")[-2].rsplit("-", 1)[1]
            log = os.path.dirname(path) + ".log"
            failed = os.path.exists(log) and re.search(r"^exit \d+", open(log).read(), re.M)
            if failed:
                notes.append(f"{mode} seed {seed}: {failed.group(0)} (left out)")
                continue
            runs[seed] = run(path)
        if not runs:
            continue
        rs = list(runs.values())
        steps = rs[0]["steps"]
        if any(r["steps"] != steps for r in rs):
            notes.append(f"{mode}: step counts differ: {[r['steps'] for r in rs]}")
        to = []
        for x in TARGETS:
            reached = [r["to"][x] for r in rs]
            missed = sum(t is None for t in reached)
            to.append(spread(reached) + (f" ({len(rs) - missed}/{len(rs)} seeds reached it)" if missed else ""))
        syncs = sorted({r["syncs"] for r in rs})
        syncs = str(syncs[0]) if len(syncs) == 1 else spread([r["syncs"] for r in rs], 1, False)
        if mode == "sync":
            syncs = f"{rs[0]['steps']} (in the step)"
        rows.append(f"| {label} | {spread([r['seconds'] for r in rs])} | "
                    f"{spread([r['tokens_per_s'] for r in rs], 0, False)} | {to[0]} | {to[1]} | "
                    f"{spread([r['acc10'] for r in rs], 2, False)} | {spread([r['acc_last'] for r in rs], 2, False)} | "
                    f"{syncs} |")
        notes.append(f"{label}: {len(rs)} seeds ({', '.join(runs)}), mean staleness "
                     f"{statistics.mean(r['staleness'] for r in rs):.2f}")
    print(f"| mode | step s ({steps} steps) | tokens/s | s to accuracy 0.80 | s to 0.85 | "
          f"accuracy at step 10 | at step {steps} | weight syncs |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
