#!/usr/bin/env python3
"""Prints docs/evaluation.md's result tables from the JSON files scripts/evaluation.sh writes
(`nereus simulate --json`: per policy the mean and spread over five machines, and each policy
against Nereus seed by seed). Run from the repository root:

    python3 scripts/evaluation-tables.py [DIR]
"""
import glob
import json
import os
import sys

DIR = sys.argv[1] if len(sys.argv) > 1 else "docs/evaluation"
GAMMA = 0.5
OTHERS = ["static", "greedy", "every-k"]
# A comparison's verdict against the floor: Nereus's mean step at most 1.01x each other's.
FLOOR = 1.01


def load(path):
    with open(path) as f:
        return json.load(f)


def at_gamma(policies):
    """One entry per policy: Nereus at the job's γ (the others ignore γ)."""
    return {p["policy"]: p for p in policies if p["policy"] != "nereus" or p["gamma"] == GAMMA}


def spread(s, digits=1):
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f}"


def main():
    files = sorted(glob.glob(f"{DIR}/*.json"))
    print("### Every comparison (five machines each; mean ± sd)\n")
    print("| comparison | nereus s/step | static | greedy | every-k | nereus transitions (opp.) | worst ratio | ≤ 1.01× all |")
    print("|---|---|---|---|---|---|---|---|")
    sweeps = []
    for path in files:
        doc = load(path)
        if "policies" not in doc:
            continue
        name = os.path.basename(path)[: -len(".json")]
        by = at_gamma(doc["policies"])
        n = by["nereus"]
        cells = []
        worst = 0.0
        for p in OTHERS:
            # over_nereus: the other's mean step over Nereus's, seed by seed (above 1: Nereus faster).
            ratio = by[p]["over_nereus"]
            worst = max(worst, 1.0 / ratio["mean"])
            cells.append(f"{spread(by[p]['mean_step_s'])} ({ratio['mean']:.3f} ± {ratio['sd']:.3f})")
        ok = "yes" if worst <= FLOOR else "**no**"
        print(f"| {name} | {spread(n['mean_step_s'])} | " + " | ".join(cells)
              + f" | {n['transitions']['mean']:.1f} ({n['opportunistic']['mean']:.1f}) | {worst:.3f} | {ok} |")
        gammas = [p for p in doc["policies"] if p["policy"] == "nereus"]
        if len(gammas) > 1:
            sweeps.append((name, gammas))
    for name, gammas in sweeps:
        print(f"\n### γ on {name} (nereus, mean step s over five machines)\n")
        print("| γ | " + " | ".join(f"{g['gamma']:g}" for g in gammas) + " |")
        print("|---|" + "---|" * len(gammas))
        print("| mean ± sd | " + " | ".join(spread(g["mean_step_s"]) for g in gammas) + " |")
        print("| transitions | " + " | ".join(f"{g['transitions']['mean']:.1f}" for g in gammas) + " |")


main()
