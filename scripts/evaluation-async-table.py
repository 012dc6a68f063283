#!/usr/bin/env python3
"""Prints docs/evaluation.md's "Asynchronous training" table from the JSON files
scripts/evaluation-async.sh writes: per cluster and trace, the mean step (step, transition and
restart seconds per step) of sync nereus, sync static, async static (no adapting at weight sync)
and async nereus (adapting at weight sync) over five machines, and seed-by-seed ratios.
Run from the repository root:

    python3 scripts/evaluation-async-table.py [DIR]
"""
import json
import os
import statistics
import sys

DIR = sys.argv[1] if len(sys.argv) > 1 else "docs/evaluation/async"
TRACES = ["growth-1000", "both-1000", "spot-1000"]
CLUSTERS = ["a100", "lumi-g", "h200"]


def runs(path):
    """(policy, seed) -> run summary (Nereus at the job's γ: simulate ran one γ here)."""
    with open(path) as f:
        return {(r["policy"], r["seed"]): r for r in json.load(f)["runs"]}


def spread(xs, digits=1):
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.{digits}f} ± {sd:.{digits}f}"


def main():
    print("| cluster | trace | sync nereus s/step | sync static | async static (no adapting) | "
          "async nereus (adapting) | async static / sync nereus | async nereus / sync nereus | "
          "async nereus / async static | async nereus transitions |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cluster in CLUSTERS:
        for trace in TRACES:
            base = f"{DIR}/{cluster}-{trace}-1024"
            if not (os.path.exists(base + "-sync.json") and os.path.exists(base + "-async.json")):
                continue
            sync, asyn = runs(base + "-sync.json"), runs(base + "-async.json")
            seeds = sorted(s for (p, s) in sync if p == "nereus")
            mean = lambda table, policy: [table[(policy, s)]["mean_step_s"] for s in seeds]
            sn, ss, an, ast = mean(sync, "nereus"), mean(sync, "static"), mean(asyn, "nereus"), mean(asyn, "static")
            ratio = lambda a, b: spread([x / y for x, y in zip(a, b)], 3)
            trans = [asyn[("nereus", s)]["transitions"] for s in seeds]
            print(f"| {cluster} | {trace} | {spread(sn)} | {spread(ss)} | {spread(ast)} | {spread(an)} | "
                  f"{ratio(ast, sn)} | {ratio(an, sn)} | {ratio(an, ast)} | {spread(trans)} |")


if __name__ == "__main__":
    main()
