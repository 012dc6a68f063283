"""The RL formulas as published, in float64 numpy: the independent side of the parity test of
Nereus's advantage estimators, policy losses and loss aggregations
(tests/rl_parity.rs).

Written from the papers and from verl's `verl/trainer/ppo/core_algos.py` (the functions named
beside each formula below), over response-aligned `[S, R]` arrays with a response mask, as verl
computes them. Where Nereus keeps a convention of its own, the formula here says so and follows
it (the parity is about the formulas, not about epsilon conventions):

- whitening (`masked_whiten`): verl divides by `sqrt(unbiased var + 1e-8)`; Nereus by
  `population std + 1e-8` (its PPO always has);
- GRPO's group standard deviation: verl and TRL use `torch.std` (Bessel's correction); Nereus the
  population standard deviation (its GRPO always has);
- PPO's clipped surrogate: verl adds a dual clip (`clip_ratio_c`, Ye et al. 2020) and clamps the
  log-ratio to +-20; Nereus has neither (the surrogate of Schulman et al. 2017, with DAPO's
  decoupled `clip_low`/`clip_high`);
- entropy: verl computes each token's entropy from the logits; Nereus's objective sees only the
  sampled token's log-probability, so it uses the sampled estimate `-log p` and the score-function
  gradient `-log p * grad log p`, which this reference computes the same way.

Gradients of everything else are central finite differences of the loss written here, so they do
not share Nereus's hand-written derivatives.

stdin: one JSON object (see rl_parity.rs); stdout: {"advantages": [...], "returns": [...],
"losses": [{"loss": x, "grad": [...]}]}.
"""

import json
import sys

import numpy as np


def response_view(flat, batch):
    """A rollout-layout array `[S*T]` as the response-aligned `[S, R]` (row P-1+t is token t)."""
    p, t = batch["prompt_len"], batch["seq_len"]
    a = np.asarray(flat, dtype=np.float64).reshape(-1, t)
    return a[:, p - 1 : t - 1]


def rollout_layout(resp, batch):
    """The inverse of `response_view`: `[S, R]` back to `[S*T]` with zeros off the responses."""
    p, t = batch["prompt_len"], batch["seq_len"]
    out = np.zeros((resp.shape[0], t))
    out[:, p - 1 : t - 1] = resp
    return out.reshape(-1)


def kl_estimate(logp, ref, kind):
    """verl `kl_penalty_forward` (from Schulman, "Approximating KL divergence", 2020)."""
    x = logp - ref
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x * x
    if kind == "k3":  # unclamped, as Schulman and GRPO write it
        return np.exp(-x) + x - 1.0
    if kind == "low-var-kl":  # verl's low_var_kl: clamps before exp and after
        d = np.clip(-x, -20.0, 20.0)
        return np.clip(np.exp(d) - d - 1.0, -10.0, 10.0)
    raise ValueError(kind)


def masked_whiten(values, mask):
    """verl `masked_whiten`, with Nereus's population std + 1e-8 (see the module doc)."""
    sel = values[mask > 0]
    if sel.size == 0:
        return values * 0.0
    mean = sel.mean()
    std = np.sqrt(((sel - mean) ** 2).mean())
    return (values - mean) / (std + 1e-8) * mask


def token_level_rewards(batch, mask, kl_kind):
    """verl `apply_kl_penalty`: the score on the last response token, minus beta * KL(old, ref)
    on every response token when the KL is in the reward."""
    s, r = mask.shape
    scores = np.zeros((s, r))
    for i, n in enumerate(batch["lengths"]):
        if n > 0:
            scores[i, n - 1] = batch["scores"][i]
    if kl_kind is None:
        return scores
    old, ref = response_view(batch["old_logp"], batch), response_view(batch["ref_logp"], batch)
    return scores - batch["kl_coef"] * kl_estimate(old, ref, kl_kind) * mask


def outcome_scores(batch, rewards, mask):
    """A sequence's score: its token rewards summed (verl's `token_level_rewards.sum(dim=-1)`);
    an all-masked sequence keeps its score."""
    total = (rewards * mask).sum(axis=-1)
    empty = mask.sum(axis=-1) == 0
    total[empty] = np.asarray(batch["scores"])[empty]
    return total


def group_ids(batch):
    return np.arange(len(batch["lengths"])) // batch["group"]


def gae(batch, rewards, mask):
    """verl `compute_gae_advantage_return` (Schulman et al. 2016)."""
    values = response_view(batch["values"], batch)
    gamma, lam = batch["gamma"], batch["lam"]
    s, r = rewards.shape
    adv, next_value, last = np.zeros((s, r)), np.zeros(s), np.zeros(s)
    for t in reversed(range(r)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * last
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last = step * mask[:, t] + (1 - mask[:, t]) * last
        adv[:, t] = last
    returns = adv + values
    return masked_whiten(adv, mask), returns * mask


def grpo(batch, rewards, mask, std):
    """verl `compute_grpo_outcome_advantage` (Shao et al. 2024); `std=False` is Dr. GRPO
    (`norm_adv_by_std_in_grpo=False`, Liu et al. 2025, arXiv:2503.20783)."""
    scores, ids = outcome_scores(batch, rewards, mask), group_ids(batch)
    out = np.zeros_like(scores)
    for g in np.unique(ids):
        k = ids == g
        mean, sd = scores[k].mean(), scores[k].std()  # population std: see the module doc
        out[k] = (scores[k] - mean) / (sd + 1e-6) if std else scores[k] - mean
    return out[:, None] * mask


def rloo(batch, rewards, mask):
    """verl `compute_rloo_outcome_advantage` (Ahmadian et al. 2024, arXiv:2402.14740):
    `s * n/(n-1) - mean * n/(n-1)`, the score minus the mean of the others."""
    scores, ids = outcome_scores(batch, rewards, mask), group_ids(batch)
    out = scores.copy()
    for g in np.unique(ids):
        k = ids == g
        n = k.sum()
        if n > 1:
            out[k] = scores[k] * n / (n - 1) - scores[k].mean() * n / (n - 1)
    return out[:, None] * mask


def reinforce_pp(batch, rewards, mask):
    """verl `compute_reinforce_plus_plus_outcome_advantage` (Hu 2025, arXiv:2501.03262)."""
    s, r = rewards.shape
    returns, running = np.zeros((s, r)), np.zeros(s)
    for t in reversed(range(r)):
        running = rewards[:, t] + batch["gamma"] * running
        returns[:, t] = running
        running = running * mask[:, t]
    return masked_whiten(returns, mask)


def reinforce_pp_baseline(batch, rewards, mask):
    """verl `compute_reinforce_plus_plus_baseline_outcome_advantage` (Hu 2025)."""
    scores, ids = outcome_scores(batch, rewards, mask), group_ids(batch)
    for g in np.unique(ids):
        k = ids == g
        scores[k] = scores[k] - scores[k].mean()
    return masked_whiten(scores[:, None] * mask, mask)


def remax(batch, rewards, mask):
    """verl `compute_remax_outcome_advantage` (Li et al. 2023): reward-to-go minus the greedy
    response's score."""
    to_go = np.flip(np.cumsum(np.flip(rewards * mask, -1), -1), -1)
    return (to_go - np.asarray(batch["greedy"])[:, None]) * mask


def advantages(batch, case):
    mask = response_view(batch["mask"], batch)
    rewards = token_level_rewards(batch, mask, case["reward_kl"])
    est = case["estimator"]
    returns = None
    if est == "gae":
        adv, returns = gae(batch, rewards, mask)
    elif est in ("group", "group-no-std"):
        adv = grpo(batch, rewards, mask, est == "group")
    elif est == "rloo":
        adv = rloo(batch, rewards, mask)
    elif est == "reinforce++":
        adv = reinforce_pp(batch, rewards, mask)
    elif est == "reinforce++-baseline":
        adv = reinforce_pp_baseline(batch, rewards, mask)
    elif est == "remax":
        adv = remax(batch, rewards, mask)
    else:
        raise ValueError(est)
    return adv, returns


def agg_loss(loss_mat, mask, mode, horizon):
    """verl `agg_loss` with the global batch's counts; fully masked sequences excluded."""
    tokens = mask.sum(axis=-1)
    seqs = (tokens > 0).sum()
    if mode == "token-mean":
        return (loss_mat * mask).sum() / max(mask.sum(), 1.0)
    seq_sum = (loss_mat * mask).sum(axis=-1)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum / np.maximum(tokens, 1.0)).sum() / seqs
    if mode == "seq-mean-token-sum-norm":  # Dr. GRPO: a constant horizon, not |y|
        return seq_sum.sum() / seqs / horizon
    raise ValueError(mode)


def pg_losses(logp, old, adv, mask, case):
    """verl `compute_policy_loss_vanilla` (no dual clip; see the module doc) and
    `compute_policy_loss_gspo` (Zheng et al. 2025, arXiv:2507.18071): per-token losses."""
    low, high = case["clip_low"], case["clip_high"]
    if case["ratio"] == "token":
        ratio = np.exp(logp - old)
    else:
        n = np.maximum(mask.sum(axis=-1), 1.0)
        seq = ((logp - old) * mask).sum(axis=-1) / n
        ratio = np.exp(np.minimum(seq, 10.0))[:, None] * np.ones_like(logp)
    return np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - low, 1 + high))


def policy_loss(logp, batch, case, mask, horizon):
    """pg loss + kl_coef * KL loss (verl's `kl_loss`), both aggregated by `agg`; the entropy
    term apart (see `entropy_terms`)."""
    old = response_view(batch["old_logp"], batch)
    ref = response_view(batch["ref_logp"], batch)
    adv = response_view(batch["advantages"], batch)
    loss = agg_loss(pg_losses(logp, old, adv, mask, case), mask, case["agg"], horizon)
    if case["kl_coef"] > 0:
        loss += case["kl_coef"] * agg_loss(kl_estimate(logp, ref, case["kl_estimator"]), mask, case["agg"], horizon)
    return loss


def entropy_terms(logp, mask, case, horizon):
    """`-entropy_coef * agg(H)` with `H = -log p`, and its score-function gradient
    `entropy_coef * agg-weight * log p` per token."""
    c = case["entropy_coef"]
    value = -c * agg_loss(-logp, mask, case["agg"], horizon)
    weight = np.zeros_like(logp)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[i, t] > 0:
                unit = np.zeros_like(logp)
                unit[i, t] = 1.0
                weight[i, t] = agg_loss(unit, mask, case["agg"], horizon)
    return value, c * weight * logp


def loss_case(batch, case):
    members = batch["members"]
    p, t = batch["prompt_len"], batch["seq_len"]
    # The mini-batch's sequences, in its order.
    sub = dict(batch)
    if case["ratio"] == "sequence":  # GSPO's advantages are the sequence's (rl_parity.rs)
        sub["advantages"] = batch["seq_advantages"]
    for key in ("old_logp", "ref_logp", "advantages", "mask"):
        a = np.asarray(sub[key]).reshape(-1, t)
        sub[key] = a[members].reshape(-1)
    mask = response_view(sub["mask"], sub)
    logp = response_view(batch["outputs"], batch).copy()
    horizon = t - p
    h = 1e-6
    grad = np.zeros_like(logp)
    for i in range(logp.shape[0]):
        for j in range(logp.shape[1]):
            up, down = logp.copy(), logp.copy()
            up[i, j] += h
            down[i, j] -= h
            grad[i, j] = (policy_loss(up, sub, case, mask, horizon) - policy_loss(down, sub, case, mask, horizon)) / (2 * h)
    loss = policy_loss(logp, sub, case, mask, horizon)
    if case["entropy_coef"] > 0:
        value, g = entropy_terms(logp, mask, case, horizon)
        loss, grad = loss + value, grad + g
    return {"loss": float(loss), "grad": rollout_layout(grad * mask, batch).tolist()}


def main():
    batch = json.load(sys.stdin)
    t = batch["seq_len"]
    p = batch["prompt_len"]
    mask = np.zeros((len(batch["lengths"]), t))
    for i, n in enumerate(batch["lengths"]):
        mask[i, p - 1 : p - 1 + n] = 1.0
    batch["mask"] = mask.reshape(-1).tolist()
    out = {"advantages": [], "returns": [], "losses": []}
    for case in batch["advantage_cases"]:
        adv, returns = advantages(batch, case)
        out["advantages"].append(rollout_layout(adv, batch).tolist())
        out["returns"].append(None if returns is None else rollout_layout(returns, batch).tolist())
    for case in batch["loss_cases"]:
        out["losses"].append(loss_case(batch, case))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
