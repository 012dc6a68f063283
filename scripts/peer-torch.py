#!/usr/bin/env python3
"""The peer `bench engine --device cuda` is compared with: PyTorch eager on the same shape.

Llama-3.2-1B's architecture (random weights, built from its config: no download), one sequence of
4,096 tokens, as a user would train it (f32 master weights, bf16 autocast, SDPA attention, fused
AdamW), and Hugging Face `generate` on 64 sequences of 128 prompt + 128 new tokens (bf16, greedy).
Prints one JSON object: step and forward seconds (median of --reps after two warm-ups), MFU
against --peak-tflops, peak memory, decode tokens/s.

    python3 scripts/peer-torch.py [--reps 5] [--peak-tflops 989] [--json OUT]

Needs torch and transformers (the H200 node has both); exits 3 with a message when they are absent.
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json")
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"peer-torch: PyTorch or transformers is not installed ({e}); no peer row", file=sys.stderr)
        sys.exit(3)
    if not torch.cuda.is_available():
        print("peer-torch: torch sees no CUDA device; no peer row", file=sys.stderr)
        sys.exit(3)
    torch.manual_seed(1)
    config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=8192,
                         rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, config.vocab_size, (1, args.tokens), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(input_ids=ids)

    def timed(f):
        for _ in range(2):
            f()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            f()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return sorted(times)[len(times) // 2], min(times), max(times)

    torch.cuda.reset_peak_memory_stats()
    step_s = timed(step)
    peak = torch.cuda.max_memory_allocated()
    forward_s = timed(forward)
    flops = 6.0 * params * args.tokens
    out = {"peer": "torch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "parameters": params,
           "tokens": args.tokens, "step_s": step_s[0], "step_s_min_max": step_s[1:], "forward_s": forward_s[0],
           "mfu": flops / step_s[0] / (args.peak_tflops * 1e12), "peak_memory_bytes": peak}
    if not args.skip_decode:
        del opt
        model = model.to(torch.bfloat16).eval()
        model.generation_config.pad_token_id = 0
        prompts = torch.randint(1, config.vocab_size, (64, 128), device="cuda")
        gen = lambda: model.generate(prompts, max_new_tokens=128, min_new_tokens=128, do_sample=False)  # noqa: E731
        decode = timed(gen)
        out["decode_tokens_per_s"] = 64 * 128 / decode[0]
    text = json.dumps(out)
    print(text)
    if args.json:
        open(args.json, "w").write(text + "\n")


if __name__ == "__main__":
    main()
