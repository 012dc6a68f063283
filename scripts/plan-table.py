#!/usr/bin/env python3
"""Prints docs/plans.md's tables: `nereus plan` for Llama-3.1-8B PPO on the H200 and A100
clusters, 8 to 1,024 GPUs, 1K to 8K response tokens. Run from the repository root after
`cargo build --release`."""
import json
import subprocess

GPUS = [8, 16, 32, 64, 128, 256, 1024]
LENS = [1024, 2048, 4096, 8192]


def plan(cluster, gpus, length):
    out = subprocess.run(
        ["target/release/nereus", "plan", "configs/llama3.1-8b-ppo.toml", "--cluster", f"configs/clusters/{cluster}.toml",
         "--gpus", str(gpus), "--seq-len", str(length), "--json"],
        capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def cell(p, stage):
    m = next(m for m in p["model_stages"] if m["model_stage"] == stage)
    r = {"none": "", "selective": " sel", "full": " full"}[m["recompute"]]
    return f"{m['tp']}/{m['pp']}/{m['dp']}{r} mb{m['micro_batch']}"


for cluster in ["h200", "a100"]:
    print(f"\n### {cluster.upper()} cluster\n")
    print("| GPUs | " + " | ".join(f"{l // 1024}K: actor/training tp/pp/dp | step s" for l in LENS) + " |")
    print("|---|" + "---|---|" * len(LENS))
    for g in GPUS:
        row = [str(g)]
        for l in LENS:
            p = plan(cluster, g, l)
            row += [cell(p, "actor/training"), f"{p['step_latency_s']:.1f}"] if p else ["no plan", "-"]
        print("| " + " | ".join(row) + " |")
