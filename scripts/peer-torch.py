#!/usr/bin/env python3
"""The peer `bench engine --device cuda --peer torch` is compared with: PyTorch eager on the same shape.

The shape is one of `bench engine`'s (`--shape`, random weights built from its config, no download):
`llama1b`, Llama-3.2-1B's architecture, one sequence of 4,096 tokens, decode 64 sequences of 128 + 128
tokens; `tiny`, two blocks 128 wide, 2 x 64 tokens, decode 4 x (8 + 8). Trained as a user would
(f32 master weights, bf16 autocast, SDPA attention, fused AdamW); decoded with Hugging Face
`generate` (bf16, greedy), timed as the engine's decode row is: generating every new token less
generating one, per token step. Prints one JSON object: step and forward seconds (median of --reps
after two warm-ups), MFU against --peak-tflops, peak memory, the decode token step and tokens/s.

    python3 scripts/peer-torch.py [--shape llama1b] [--reps 5] [--peak-tflops 989] [--json OUT]

Needs torch and transformers (the H200 node has both) and a CUDA device; exits 3 with a message
when any is absent (`bench engine --peer torch` then says so and adds no peer row).
"""
import argparse
import json
import sys
import time


# bench engine's shapes (crates/bench/src/bench/engine/device.rs, `EngineShape::sizes`): the model,
# the training batch (sequences, tokens) and the decode (sequences, prompt, new tokens).
SHAPES = {
    "llama1b": (dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True),
                (1, 4096), (64, 128, 128)),
    "tiny": (dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=512, tie_word_embeddings=False),
             (2, 64), (4, 8, 8)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama1b")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json")
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"peer-torch: PyTorch or transformers is not installed ({e})", file=sys.stderr)
        sys.exit(3)
    if not torch.cuda.is_available():
        print("peer-torch: torch sees no CUDA device", file=sys.stderr)
        sys.exit(3)
    torch.manual_seed(1)
    model_args, (batch, tokens), (sequences, prompt, new) = SHAPES[args.shape]
    config = LlamaConfig(max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, **model_args)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, config.vocab_size, (batch, tokens), device="cuda")

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
    flops = 6.0 * params * batch * tokens
    out = {"peer": "torch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "parameters": params,
           "shape": args.shape, "tokens": batch * tokens, "step_s": step_s[0], "step_s_min_max": step_s[1:], "forward_s": forward_s[0],
           "mfu": flops / step_s[0] / (args.peak_tflops * 1e12), "peak_memory_bytes": peak}
    if not args.skip_decode:
        del opt
        model = model.to(torch.bfloat16).eval()
        model.generation_config.pad_token_id = 0
        prompts = torch.randint(1, config.vocab_size, (sequences, prompt), device="cuda")

        def generate(n):
            return lambda: model.generate(prompts, max_new_tokens=n, min_new_tokens=n, do_sample=False)

        full, first = timed(generate(new))[0], timed(generate(1))[0]
        out["decode_step_s"] = max(full - first, 0.0) / (max(new, 2) - 1)
        out["decode_tokens_per_s"] = sequences / out["decode_step_s"] if out["decode_step_s"] > 0 else None
        out["generate_tokens_per_s"] = sequences * new / full
    text = json.dumps(out)
    print(text)
    if args.json:
        open(args.json, "w").write(text + "\n")


if __name__ == "__main__":
    main()
