"""An independent reference for a Llama GGUF file: per-token log-probabilities computed in
float64 with numpy from the tensors as llama.cpp stores them, dequantized by llama.cpp's own
Python package (`gguf`), with llama.cpp's rotary convention (adjacent pairs of each head's
dimensions, the rows as its converter permuted them). Nothing here shares code or conventions
with Nereus's importer or engine.

    python gguf_llama_reference.py MODEL.gguf < tokens.json   # [[id, ...], ...]
prints {"logprobs": [[log p(x_t | x_<t) for t >= 1], ...]}.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key):
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    return value.tobytes().decode() if f.types[0].name == "STRING" else value[0].item()


def tensors(reader):
    out = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float64)
        out[t.name] = w.reshape([int(d) for d in reversed(t.shape.tolist())])
    return out


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_adjacent_pairs(x, base):
    """x: [T, heads, head_dim]; rotates (x[2i], x[2i+1]) by pos * base^(-2i/d)."""
    t, _, d = x.shape
    inv = base ** (-np.arange(0, d, 2) / d)
    angle = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def logprobs(w, cfg, ids):
    heads, kv, eps, base = cfg
    x = w["token_embd.weight"][ids]
    t = len(ids)
    layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("blk."))
    for layer in range(layers):
        p = f"blk.{layer}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(t, heads, -1)
        k = (h @ w[p + "attn_k.weight"].T).reshape(t, kv, -1)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, kv, -1)
        q, k = rope_adjacent_pairs(q, base), rope_adjacent_pairs(k, base)
        d = q.shape[-1]
        group = heads // kv
        out = np.empty_like(q)
        mask = np.triu(np.full((t, t), -np.inf), 1)
        for head in range(heads):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(d) + mask
            scores = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[:, head] = (scores / scores.sum(axis=1, keepdims=True)) @ v[:, head // group]
        x = x + out.reshape(t, -1) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], eps)
    logits = x @ w.get("output.weight", w["token_embd.weight"]).T
    logits = logits - logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return [float(logp[i - 1, ids[i]]) for i in range(1, t)]


def main():
    reader = GGUFReader(sys.argv[1])
    cfg = (field(reader, "llama.attention.head_count"), field(reader, "llama.attention.head_count_kv"),
           field(reader, "llama.attention.layer_norm_rms_epsilon"), field(reader, "llama.rope.freq_base"))
    w = tensors(reader)
    print(json.dumps({"logprobs": [logprobs(w, cfg, ids) for ids in json.load(sys.stdin)]}))


main()
