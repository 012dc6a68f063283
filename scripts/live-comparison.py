#!/usr/bin/env python3
"""Summarises scripts/live-comparison.sh's runs (DIR/<policy>-<seed>/metrics.jsonl and .log):

- whole-run tokens/s per policy (the run summary's "tokens/s over the run"), mean ± sd;
- for Nereus, per op class, the median of predicted over measured seconds per step (all stages
  summed, steps from STEADY on, after the calibration has steps to fit), for classes above 5% of
  the steady steps' measured time;
- every Nereus transition's predicted and measured seconds.

    python3 scripts/live-comparison.py DIR
"""
import glob
import json
import os
import re
import statistics
import sys

DIR = sys.argv[1] if len(sys.argv) > 1 else "runs/live-comparison"
POLICIES = ["nereus", "static", "greedy", "every-k"]
# Steps before this one are the calibration's warm-up (it fits over the last 40 steps).
STEADY = 10


def records(run):
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in r and "event" not in r:
            out.append(r)
    return out


def whole_run_tokens_per_s(log):
    m = re.search(r"tokens/s over the run\s+([0-9.]+)", open(log).read())
    return float(m.group(1)) if m else None


def per_class(rows):
    """Per op class: the median of predicted over measured seconds over the steady steps that ran
    it, and its share of the steady steps' measured time (a class run on a few steps only, as a
    trial's plan, weighs by those steps, not by its share while it ran)."""
    ratios, seconds, total = {}, {}, 0.0
    for r in rows:
        if r["step"] < STEADY or "op_seconds" not in r:
            continue
        total += r["step_seconds"]
        measured, predicted = {}, {}
        for side, into in (("measured", measured), ("predicted", predicted)):
            for stage in r["op_seconds"][side].values():
                for op, s in stage.items():
                    into[op] = into.get(op, 0.0) + s
        for op, m in measured.items():
            if m > 0 and op in predicted:
                ratios.setdefault(op, []).append(predicted[op] / m)
                seconds[op] = seconds.get(op, 0.0) + m
    return {op: (statistics.median(v), seconds[op] / total, len(v)) for op, v in ratios.items()}


def main():
    print("| policy | runs | whole-run tokens/s, mean ± sd | per seed |")
    print("|---|---|---|---|")
    for policy in POLICIES:
        logs = sorted(glob.glob(os.path.join(DIR, f"{policy}-*.log")))
        values = [whole_run_tokens_per_s(log) for log in logs]
        done = [v for v in values if v is not None]
        cell = f"{statistics.mean(done):,.0f} ± {statistics.stdev(done):,.0f}" if len(done) > 1 else "-"
        seeds = ", ".join("stopped" if v is None else f"{v:,.0f}" for v in values)
        print(f"| {policy} | {len(logs)} | {cell} | {seeds} |")
    print("\n| Nereus run | op class | share of step | steps run | median predicted/measured | in [0.67, 1.5] |")
    print("|---|---|---|---|---|---|")
    transitions = []
    for run in sorted(glob.glob(os.path.join(DIR, "nereus-*[0-9]"))):
        rows = records(run)
        for op, (ratio, share, steps) in sorted(per_class(rows).items(), key=lambda kv: -kv[1][1]):
            if share > 0.05:
                ok = "yes" if 0.67 <= ratio <= 1.5 else "**no**"
                print(f"| {os.path.basename(run)} | {op} | {share:.1%} | {steps} | {ratio:.2f} | {ok} |")
        for r in rows:
            t = r.get("transition")
            if t:
                transitions.append((os.path.basename(run), r["step"], t["kind"], t["predicted_seconds"], t["seconds"]))
    print("\n| Nereus run | after step | kind | predicted s | measured s | predicted/measured |")
    print("|---|---|---|---|---|---|")
    for run, step, kind, p, m in transitions:
        print(f"| {run} | {step} | {kind} | {p:.4f} | {m:.4f} | {p / m:.2f} |")


main()
