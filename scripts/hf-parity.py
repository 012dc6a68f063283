#!/usr/bin/env python3
"""Parity of the engine with Hugging Face transformers (docs/models.md, "A worked parity check").

Needs torch and transformers (not part of CI):

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers
    /tmp/hf/bin/python scripts/hf-parity.py --nereus target/release/nereus [--checkpoint runs/x/checkpoints/step-N]

1. In: transformers writes small random models (LlamaForCausalLM with `llama3` RoPE scaling in
   bf16 shards, Qwen3ForCausalLM with QK-norm and tied embeddings, LlamaForSequenceClassification)
   with `save_pretrained`; `nereus logprobs` scores token sequences under them on one rank and
   under mpirun with TP and PP, and transformers scores the same sequences.
2. Out (with --checkpoint): every model directory of a nereus checkpoint loads strictly with
   `from_pretrained` (no missing, unexpected or mismatched tensors) and scores like `nereus
   logprobs` does.
3. Any directory (with --model DIR), e.g. SmolLM2 as `nereus model import-gguf` writes it: it
   loads strictly and scores alike on one rank and with TP 3.

Prints the largest absolute difference per model and layout; exits 1 above --tolerance.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, LlamaConfig,
                          LlamaForCausalLM, LlamaForSequenceClassification, Qwen3Config, Qwen3ForCausalLM)


def sequences(vocab, seed=5):
    g = torch.Generator().manual_seed(seed)
    lengths = [16, 9, 2, 13, 16]
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_scores(model, seqs, value):
    """Per-token log p(x_t | x_<t), t >= 1, or per-position values, one sequence at a time."""
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            if value:
                hidden = model.model(input_ids=ids).last_hidden_state
                out.append(model.score(hidden)[0, :, 0].double().tolist())
            else:
                logits = model(input_ids=ids).logits[0].double()
                logp = torch.log_softmax(logits, dim=-1)
                out.append([logp[t - 1, s[t]].item() for t in range(1, len(s))])
    return out


def nereus_scores(binary, model_dir, tokens_file, ranks, tp, pp):
    out = tempfile.mktemp(suffix=".json")
    cmd = [binary, "logprobs", model_dir, "--tokens", tokens_file, "--json", out, "--tp", str(tp), "--pp", str(pp)]
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-n", str(ranks)] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(out) as f:
        report = json.load(f)
    return report.get("logprobs", report.get("values"))


def max_diff(a, b):
    assert len(a) == len(b)
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v)) if a else 0.0


def compare(binary, name, model_dir, model, value, vocab, layouts, work):
    seqs = sequences(vocab)
    tokens = os.path.join(work, f"{name}-tokens.json")
    with open(tokens, "w") as f:
        json.dump(seqs, f)
    want = hf_scores(model.float().eval(), seqs, value)
    rows = []
    for ranks, tp, pp in layouts:
        got = nereus_scores(binary, model_dir, tokens, ranks, tp, pp)
        rows.append((name, f"{ranks} rank(s), tp {tp}, pp {pp}", max_diff(got, want)))
    return rows


def random_models(work):
    """(name, directory, value model, vocab, layouts) of models transformers wrote."""
    torch.manual_seed(0)
    common = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=128, max_position_embeddings=64, initializer_range=0.2)
    out = []
    llama = LlamaConfig(num_hidden_layers=3, rms_norm_eps=1e-5, rope_theta=500000.0,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=32), **common)
    model = LlamaForCausalLM(llama).to(torch.bfloat16)
    d = os.path.join(work, "hf-llama3")
    model.save_pretrained(d, max_shard_size="100KB")
    out.append(("LlamaForCausalLM (llama3 RoPE, bf16 shards)", d, False, 128,
                [(1, 1, 1), (2, 2, 1), (2, 1, 2), (4, 2, 2)]))
    qwen = Qwen3Config(num_hidden_layers=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       tie_word_embeddings=True, **common)
    d = os.path.join(work, "hf-qwen3")
    Qwen3ForCausalLM(qwen).save_pretrained(d)
    out.append(("Qwen3ForCausalLM (QK-norm, tied)", d, False, 128, [(1, 1, 1), (2, 2, 1)]))
    cls = LlamaConfig(num_hidden_layers=2, num_labels=1, pad_token_id=0, **common)
    d = os.path.join(work, "hf-llama-cls")
    LlamaForSequenceClassification(cls).save_pretrained(d)
    out.append(("LlamaForSequenceClassification", d, True, 128, [(1, 1, 1), (2, 1, 2)]))
    return out


def load(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    value = any(a.endswith("ForSequenceClassification") for a in config.architectures)
    cls = AutoModelForSequenceClassification if value else AutoModelForCausalLM
    model, info = cls.from_pretrained(model_dir, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"{model_dir}: not a strict load: {problems}")
    return model, value, config.vocab_size


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nereus", default="target/release/nereus")
    p.add_argument("--checkpoint", help="a nereus checkpoint step-N directory to load with from_pretrained")
    p.add_argument("--model", action="append", default=[],
                   help="a model directory to score both ways (e.g. one `nereus model import-gguf` wrote); repeatable")
    p.add_argument("--tolerance", type=float, default=1e-4)
    args = p.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    work = tempfile.mkdtemp(prefix="hf-parity-")
    rows = []
    for name, d, value, vocab, layouts in random_models(work):
        model, _, _ = load(d)
        rows += compare(args.nereus, name, d, model, value, vocab, layouts, work)
    if args.checkpoint:
        for entry in sorted(os.listdir(args.checkpoint)):
            d = os.path.join(args.checkpoint, entry)
            if os.path.isdir(d):
                model, value, vocab = load(d)
                rows += compare(args.nereus, f"checkpoint {entry} ({type(model).__name__})", d, model, value, vocab,
                                [(1, 1, 1), (2, 2, 1)], work)
    for d in args.model:
        model, value, vocab = load(d)
        rows += compare(args.nereus, f"{os.path.basename(d.rstrip('/'))} ({type(model).__name__})", d, model, value,
                        vocab, [(1, 1, 1), (3, 3, 1)], work)
    worst = 0.0
    for name, layout, diff in rows:
        print(f"{name:55} {layout:24} max |diff| {diff:.2e}")
        worst = max(worst, diff)
    print(f"largest difference {worst:.2e} (tolerance {args.tolerance:.0e})")
    sys.exit(0 if worst <= args.tolerance else 1)


if __name__ == "__main__":
    main()
