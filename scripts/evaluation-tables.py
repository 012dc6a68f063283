#!/usr/bin/env python3
"""Prints docs/evaluation.md's result tables from docs/evaluation/<cluster>-<trace>.json (written
by scripts/evaluation.sh). Run from the repository root: python3 scripts/evaluation-tables.py [DIR]"""
import json
import sys

DIR = sys.argv[1] if len(sys.argv) > 1 else "docs/evaluation"
CLUSTERS = ["a100", "h200", "lumi-g"]
TRACES = [
    ("growth-1000", "growth (1,000 steps, 500→8,000 tokens, 1,024 GPUs)"),
    ("spot-1000", "spot (1,000 steps, 2,048 tokens, 512–1,024 GPUs)"),
    ("both-1000", "growth + spot (1,000 steps, 512–1,024 GPUs)"),
    ("paper-26", "the paper's 26 steps (1,147→3,722 tokens, 8–32 GPUs)"),
]
GAMMA = 0.5


def runs(cluster, trace):
    with open(f"{DIR}/{cluster}-{trace}.json") as f:
        return json.load(f)["runs"]


def at_gamma(rs):
    """One run per policy: Nereus at γ = 0.5 (the others ignore γ)."""
    return [r for r in rs if r["policy"] != "nereus" or r["gamma"] == GAMMA]


def main():
    for trace, title in TRACES:
        print(f"### {title}\n")
        print("| cluster | policy | γ | mean step s | compute s/step | total h | transitions (urgent/opp.) | transition s | share % | stops |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for c in CLUSTERS:
            for r in at_gamma(runs(c, trace)):
                print(f"| {c} | {r['policy']} | {r['gamma']:g} | {r['mean_step_s']:.1f} | {r['mean_compute_step_s']:.1f} "
                      f"| {r['total_s'] / 3600:.2f} | {r['transitions']} ({r['urgent']}/{r['opportunistic']}) "
                      f"| {r['transition_s']:.1f} | {100 * r['transition_share']:.3f} | {r['restarts']} |")
        print()
    sweep = {c: [r for r in runs(c, "paper-26") if r["policy"] == "nereus"] for c in CLUSTERS}
    gammas = [r["gamma"] for r in sweep[CLUSTERS[0]]]
    print("### γ on the 26-step trace (nereus)\n")
    print("| cluster | " + " | ".join(f"γ={g:g}" for g in gammas) + " |")
    print("|---|" + "---|" * len(gammas))
    for c in CLUSTERS:
        print(f"| {c} | " + " | ".join(f"{r['mean_step_s']:.1f}" for r in sweep[c]) + " |")
    print("\n### Relative to Nereus (mean step seconds, transitions and stops included)\n")
    print("| cluster | trace | static | greedy | every-k |")
    print("|---|---|---|---|---|")
    for c in CLUSTERS:
        for trace, _ in TRACES:
            by = {r["policy"]: r["mean_step_s"] for r in at_gamma(runs(c, trace))}
            rel = lambda p: f"{100 * (1 - by['nereus'] / by[p]):+.1f}%"
            print(f"| {c} | {trace} | {rel('static')} | {rel('greedy')} | {rel('every-k')} |")


main()
