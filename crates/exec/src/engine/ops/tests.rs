//! Finite-difference checks of every layer in f64: the loss `Σ out · R` for a fixed random `R`
//! is differentiated by the layer's backward pass and by central differences, input by input.

use super::*;
use nereus_core::config::RopeScaling;

/// Deterministic pseudo-random values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Compares `analytic[i]` with the central difference of `loss` in every element of every input.
fn check(layer: &str, inputs: &[Vec<f64>], analytic: &[Vec<f64>], loss: impl Fn(&[Vec<f64>]) -> f64) {
    let h = 1e-6;
    for (which, input) in inputs.iter().enumerate() {
        for e in 0..input.len() {
            let mut plus = inputs.to_vec();
            plus[which][e] += h;
            let mut minus = inputs.to_vec();
            minus[which][e] -= h;
            let numeric = (loss(&plus) - loss(&minus)) / (2.0 * h);
            let got = analytic[which][e];
            let tol = 1e-6 * numeric.abs().max(got.abs()) + 1e-8;
            assert!(
                (numeric - got).abs() <= tol,
                "{layer}: input {which} element {e}: backward {got} vs finite difference {numeric}"
            );
        }
    }
}

#[test]
fn linear_gradients_match_finite_differences() {
    let (n, inp, out) = (5, 4, 3);
    let r = values(n * out, 1);
    let loss = |v: &[Vec<f64>]| {
        let mut y = vec![0.0; n * out];
        linear_forward(&mut y, &v[0], &v[1], n, inp, out);
        dot(&y, &r)
    };
    let inputs = vec![values(n * inp, 2), values(out * inp, 3)];
    let (mut dx, mut dw) = (vec![0.0; n * inp], vec![0.0; out * inp]);
    linear_backward(Some(&mut dx), &mut dw, &r, &inputs[0], &inputs[1], n, inp, out);
    check("linear", &inputs, &[dx, dw], loss);
}

#[test]
fn rmsnorm_gradients_match_finite_differences_for_any_epsilon() {
    let (n, c) = (3, 6);
    let r = values(n * c, 4);
    // ε = 0.3 is as large as the mean square here, so a backward pass that ignored it (or
    // counted it twice) would fail.
    for eps in [1e-5, 1e-6, 0.3] {
        let loss = |v: &[Vec<f64>]| {
            let (mut y, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
            rmsnorm_forward(&mut y, &mut rstd, &v[0], &v[1], c, eps);
            dot(&y, &r)
        };
        let inputs = vec![values(n * c, 5), values(c, 6)];
        let (mut y, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
        rmsnorm_forward(&mut y, &mut rstd, &inputs[0], &inputs[1], c, eps);
        let (mut dx, mut dw) = (vec![0.0; n * c], vec![0.0; c]);
        rmsnorm_backward(&mut dx, &mut dw, &r, &inputs[0], &inputs[1], &rstd, c);
        check("rmsnorm", &inputs, &[dx, dw], loss);
    }
}

#[test]
fn rmsnorm_forward_uses_the_configured_epsilon() {
    // x = (3, 4): mean square 12.5; with ε = 3.5, rstd = 1/4 exactly.
    let (mut y, mut rstd) = (vec![0.0; 2], vec![0.0; 1]);
    rmsnorm_forward(&mut y, &mut rstd, &[3.0f64, 4.0], &[2.0, -1.0], 2, 3.5);
    assert_eq!((rstd[0], y[0], y[1]), (0.25, 1.5, -1.0));
    rmsnorm_forward(&mut y, &mut rstd, &[3.0f64, 4.0], &[1.0, 1.0], 2, 1e-6);
    assert!((rstd[0] - 1.0 / (12.5f64 + 1e-6).sqrt()).abs() < 1e-15);
}

#[test]
fn swiglu_gradients_match_finite_differences() {
    // Three rows of the fused gate/up product, F = 4: each row's gate, then its up.
    let (rows, f) = (3, 4);
    let r = values(rows * f, 7);
    let loss = |v: &[Vec<f64>]| {
        let mut h = vec![0.0; rows * f];
        swiglu_forward(&mut h, &v[0], f);
        dot(&h, &r)
    };
    let gu: Vec<f64> =
        values(2 * rows * f, 8).iter().enumerate().map(|(i, x)| if i % (2 * f) < f { 3.0 * x } else { *x }).collect();
    let inputs = vec![gu];
    let mut dgu = vec![0.0; 2 * rows * f];
    swiglu_backward(&mut dgu, &r, &inputs[0], f);
    check("swiglu", &inputs, &[dgu], loss);
}

/// Llama 3.1's scaling over a short original context (256): wavelengths below 64 are kept,
/// above 256 divided, so small heads have a frequency in every band — with θ = 10,000 and
/// D = 6, λ = 6.3, 135, 2916; with θ = 20,000 and D = 8, λ = 6.3, 75, 889, 10563.
fn short_llama3() -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 256,
    }
}

#[test]
fn rope_gradient_is_the_inverse_rotation_and_decoding_positions_match() {
    for scaling in [None, Some(short_llama3())] {
        rope_case(Rope::<f64>::new(16, 6, 10_000.0, scaling.as_ref()));
    }
}

fn rope_case(rope: Rope<f64>) {
    let (t, heads, d) = (4, 2, 6);
    let r = values(2 * t * heads * d, 10);
    let loss = |v: &[Vec<f64>]| {
        let mut x = v[0].clone();
        rope.apply(&mut x, t, heads, 3, false);
        dot(&x, &r)
    };
    let inputs = vec![values(2 * t * heads * d, 11)];
    let mut dx = r.clone();
    rope.apply(&mut dx, t, heads, 3, true);
    check("rope", &inputs, &[dx], loss);
    // One row at position 3 + 2 rotates like row 2 of a sequence starting at 3.
    let mut full = inputs[0][..t * heads * d].to_vec();
    rope.apply(&mut full, t, heads, 3, false);
    let mut one = inputs[0][2 * heads * d..3 * heads * d].to_vec();
    rope.apply(&mut one, 1, heads, 5, false);
    assert_eq!(one, full[2 * heads * d..3 * heads * d]);
}

#[test]
fn llama3_frequencies_match_hand_derived_values() {
    // Llama 3.1 (θ = 500,000, D = 128, factor 8, bands 1 and 4 over 8192 positions): ω_i =
    // θ^(−i/64); the wavelength 2π/ω_i is below 8192/4 = 2048 up to i = 28 (kept), above 8192
    // from i = 35 (divided by 8), in between for i = 29..=34 (interpolated).
    let llama = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let got = frequencies(128, 500_000.0, Some(&llama));
    let plain = |i: usize| (-(i as f64) / 64.0 * 500_000f64.ln()).exp();
    assert_eq!(got.len(), 64);
    assert_eq!(got[0], 1.0);
    assert!((got[28] - plain(28)).abs() <= 1e-15 * plain(28), "short wavelengths are kept");
    for (i, &w) in got.iter().enumerate().skip(35) {
        assert!((w - plain(i) / 8.0).abs() <= 1e-12 * plain(i), "i = {i}: long wavelengths are divided by 8");
    }
    for (i, &w) in got.iter().enumerate().take(35).skip(29) {
        // s = 8192 / λ − 1 over the band of width 3; ω' = ω · (s + (1 − s)/8).
        let s = (8192.0 * plain(i) / (2.0 * std::f64::consts::PI) - 1.0) / 3.0;
        assert!(s > 0.0 && s < 1.0, "i = {i} lies in the band");
        assert!((w - plain(i) * (s + (1.0 - s) / 8.0)).abs() <= 1e-12 * plain(i), "i = {i} is interpolated");
    }
    // i = 30 by hand: ω = e^(−30·ln(500000)/64) = 2.131120e-3, λ = 2π/ω = 2948.303,
    // s = (8192/λ − 1)/3 = 0.5928493, ω' = ω · (s + (1 − s)/8) = ω · 0.6437431 = 1.371894e-3.
    assert!((got[30] - 1.371_894e-3).abs() < 1e-9, "{}", got[30]);
    // Without scaling the frequencies are θ's powers.
    let unscaled = frequencies(128, 500_000.0, None);
    assert!((0..64).all(|i| (unscaled[i] - plain(i)).abs() <= 1e-15 * plain(i).max(1e-300) + 1e-18));
}

#[test]
fn qk_norm_then_rope_gradients_match_finite_differences() {
    // Qwen3's query path: per-head RMSNorm over D (ε from the config), then the rotation.
    let (t, heads, d, eps) = (3, 2, 8, 1e-6);
    let rope = Rope::<f64>::new(8, d, 20_000.0, Some(&short_llama3()));
    let n = 2 * t * heads;
    let r = values(n * d, 30);
    let forward = |v: &[Vec<f64>]| {
        let (mut q, mut rstd) = (vec![0.0; n * d], vec![0.0; n]);
        rmsnorm_forward(&mut q, &mut rstd, &v[0], &v[1], d, eps);
        rope.apply(&mut q, t, heads, 1, false);
        (q, rstd)
    };
    let loss = |v: &[Vec<f64>]| dot(&forward(v).0, &r);
    let inputs = vec![values(n * d, 31), values(d, 32).iter().map(|w| 1.0 + 0.5 * w).collect()];
    let (_, rstd) = forward(&inputs);
    let mut dq = r.clone();
    rope.apply(&mut dq, t, heads, 1, true);
    let (mut dq_raw, mut dw) = (vec![0.0; n * d], vec![0.0; d]);
    rmsnorm_backward(&mut dq_raw, &mut dw, &dq, &inputs[0], &inputs[1], &rstd, d);
    check("qk-norm + rope", &inputs, &[dq_raw, dw], loss);
}

fn attention_shape(t: usize) -> AttentionShape {
    AttentionShape { b: 2, tq: t, tk: t, t_cap: t, heads: 4, kv_heads: 2, d: 3 }
}

#[test]
fn grouped_query_attention_gradients_match_finite_differences() {
    let s = attention_shape(4);
    let (nq, nkv) = (s.b * s.tq * s.heads * s.d, s.b * s.tk * s.kv_heads * s.d);
    let r = values(nq, 12);
    let loss = |v: &[Vec<f64>]| {
        let (mut out, mut probs) = (vec![0.0; nq], vec![0.0; s.b * s.heads * s.tq * s.tk]);
        attention_forward(&mut out, &mut probs, &v[0], &v[1], &v[2], s, &[]);
        dot(&out, &r)
    };
    let inputs = vec![values(nq, 13), values(nkv, 14), values(nkv, 15)];
    let (mut out, mut probs) = (vec![0.0; nq], vec![0.0; s.b * s.heads * s.tq * s.tk]);
    attention_forward(&mut out, &mut probs, &inputs[0], &inputs[1], &inputs[2], s, &[]);
    let (mut dq, mut dk, mut dv) = (vec![0.0; nq], vec![0.0; nkv], vec![0.0; nkv]);
    attention_backward(&mut dq, &mut dk, &mut dv, &r, &inputs[0], &inputs[1], &inputs[2], &probs, s);
    check("attention", &inputs, &[dq, dk, dv], loss);
}

#[test]
fn decoding_against_a_kv_cache_equals_the_last_row_of_full_attention() {
    let s = attention_shape(5);
    let (row, nkv) = (s.heads * s.d, s.b * s.tk * s.kv_heads * s.d);
    let (q, k, v) = (values(s.b * s.tq * row, 16), values(nkv, 17), values(nkv, 18));
    let mut full = vec![0.0; q.len()];
    attention_forward(&mut full, &mut vec![0.0; s.b * s.heads * s.tq * s.tk], &q, &k, &v, s, &[]);
    // Cache of 8 positions per sequence, 5 valid; one query per sequence at position 4.
    let cached = AttentionShape { tq: 1, t_cap: 8, ..s };
    let (mut kc, mut vc) = (vec![9.0; s.b * 8 * s.kv_heads * s.d], vec![9.0; s.b * 8 * s.kv_heads * s.d]);
    let per = s.tk * s.kv_heads * s.d;
    for b in 0..s.b {
        kc[b * 8 * s.kv_heads * s.d..][..per].copy_from_slice(&k[b * per..(b + 1) * per]);
        vc[b * 8 * s.kv_heads * s.d..][..per].copy_from_slice(&v[b * per..(b + 1) * per]);
    }
    let qlast: Vec<f64> = (0..s.b).flat_map(|b| q[(b * s.tq + 4) * row..(b * s.tq + 5) * row].to_vec()).collect();
    let mut out = vec![0.0; s.b * row];
    attention_forward(&mut out, &mut vec![0.0; s.b * s.heads * s.tk], &qlast, &kc, &vc, cached, &[]);
    for b in 0..s.b {
        for (x, y) in out[b * row..(b + 1) * row].iter().zip(&full[(b * s.tq + 4) * row..(b * s.tq + 5) * row]) {
            assert!((x - y).abs() < 1e-12);
        }
    }
}

/// Left padding masked: a sequence padded by `pad` positions gets, at its real positions, the
/// outputs of the same sequence unpadded, and its pad positions output zero; gradients through
/// the masked call still match finite differences.
#[test]
fn masked_left_padding_leaves_the_real_positions_as_they_were() {
    let (pad, t) = (2, 3);
    let unpadded = attention_shape(t);
    let padded = attention_shape(t + pad);
    let row = unpadded.heads * unpadded.d;
    let kv_row = unpadded.kv_heads * unpadded.d;
    let (q, k, v) =
        (values(unpadded.b * t * row, 21), values(unpadded.b * t * kv_row, 22), values(unpadded.b * t * kv_row, 23));
    // The same rows behind `pad` junk rows per sequence.
    let pad_rows = |x: &[f64], width: usize, seed: u64| -> Vec<f64> {
        let junk = values(pad * width, seed);
        (0..unpadded.b)
            .flat_map(|b| junk.iter().copied().chain(x[b * t * width..(b + 1) * t * width].iter().copied()))
            .collect()
    };
    let (qp, kp, vp) = (pad_rows(&q, row, 24), pad_rows(&k, kv_row, 25), pad_rows(&v, kv_row, 26));
    let mut plain = vec![0.0; q.len()];
    attention_forward(&mut plain, &mut vec![0.0; unpadded.b * unpadded.heads * t * t], &q, &k, &v, unpadded, &[]);
    let (mut masked, mut probs) = (vec![0.0; qp.len()], vec![0.0; padded.b * padded.heads * padded.tq * padded.tk]);
    attention_forward(&mut masked, &mut probs, &qp, &kp, &vp, padded, &[pad, pad]);
    for b in 0..unpadded.b {
        let real = &masked[(b * (t + pad) + pad) * row..(b + 1) * (t + pad) * row];
        assert!(real.iter().zip(&plain[b * t * row..(b + 1) * t * row]).all(|(x, y)| (x - y).abs() < 1e-12));
        assert!(masked[b * (t + pad) * row..(b * (t + pad) + pad) * row].iter().all(|&x| x == 0.0));
    }
    let (r, n_probs) = (values(qp.len(), 27), probs.len());
    let loss = |v: &[Vec<f64>]| {
        let (mut out, mut p) = (vec![0.0; qp.len()], vec![0.0; n_probs]);
        attention_forward(&mut out, &mut p, &v[0], &v[1], &v[2], padded, &[pad, 1]);
        dot(&out, &r)
    };
    let inputs = vec![qp.clone(), kp.clone(), vp.clone()];
    attention_forward(&mut masked, &mut probs, &qp, &kp, &vp, padded, &[pad, 1]);
    let (mut dq, mut dk, mut dv) = (vec![0.0; qp.len()], vec![0.0; kp.len()], vec![0.0; vp.len()]);
    attention_backward(&mut dq, &mut dk, &mut dv, &r, &qp, &kp, &vp, &probs, padded);
    check("masked attention", &inputs, &[dq, dk, dv], loss);
}

#[test]
fn embedding_gradient_matches_finite_differences_on_a_vocabulary_shard() {
    let (c, tokens) = (3, [5u32, 1, 6, 5, 2]);
    let r = values(tokens.len() * c, 19);
    // This rank holds vocabulary rows 4..8 (tokens 1 and 2 belong to another shard).
    let loss = |v: &[Vec<f64>]| {
        let mut out = vec![0.0; tokens.len() * c];
        embedding_forward(&mut out, &tokens, &v[0], 4, c);
        dot(&out, &r)
    };
    let inputs = vec![values(4 * c, 20)];
    let mut dw = vec![0.0; 4 * c];
    embedding_backward(&mut dw, &r, &tokens, 4, c);
    check("embedding", &inputs, &[dw], loss);
}

/// Columns `cols` of every row of `x[N, V]`: one vocabulary chunk of logits.
fn columns(x: &[f64], v: usize, cols: std::ops::Range<usize>) -> Vec<f64> {
    x.chunks(v).flat_map(|row| row[cols.clone()].to_vec()).collect()
}

/// `(logp, lse)` of rows `x[N, V]`, folded `width` columns at a time as the fused head does.
fn chunked_log_probs(x: &[f64], targets: &[u32], v: usize, width: usize) -> (Vec<f64>, Vec<f64>) {
    let n = targets.len();
    let (mut max, mut sum, mut target) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for col0 in (0..v).step_by(width) {
        let chunk = columns(x, v, col0..(col0 + width).min(v));
        let acc = RowStats { max: &mut max, sum: &mut sum, target: &mut target };
        log_probs_fold(acc, &chunk, targets, col0, col0 == 0);
    }
    let (mut logp, mut lse) = (vec![0.0; n], vec![0.0; n]);
    let acc = RowStats { max: &mut max, sum: &mut sum, target: &mut target };
    log_probs_finish(&mut lse, &mut logp, acc, &Local).unwrap();
    (logp, lse)
}

#[test]
fn log_prob_and_value_head_gradients_match_finite_differences() {
    let (n, v) = (4, 7);
    let targets = [3u32, 0, 6, 3];
    let r = values(n, 21);
    // Chunks of 3, 3 and 1 columns: targets in the first, second and last chunk.
    let loss = |x: &[Vec<f64>]| dot(&chunked_log_probs(&x[0], &targets, v, 3).0, &r);
    let inputs = vec![values(n * v, 22).iter().map(|x| 4.0 * x).collect::<Vec<_>>()];
    let (logp, lse) = chunked_log_probs(&inputs[0], &targets, v, 3);
    let (whole_logp, whole_lse) = chunked_log_probs(&inputs[0], &targets, v, v);
    for (a, b) in logp.iter().chain(&lse).zip(whole_logp.iter().chain(&whole_lse)) {
        assert!((a - b).abs() < 1e-12, "folded in chunks {a}, at once {b}");
    }
    let total: f64 = (0..v).map(|j| (inputs[0][j] - lse[0]).exp()).sum();
    assert!((total - 1.0).abs() < 1e-12, "probabilities sum to {total}");
    // The gradient, chunk by chunk in place, laid back into the rows.
    let mut dlogits = vec![0.0; n * v];
    for col0 in (0..v).step_by(3) {
        let cols = col0..(col0 + 3).min(v);
        let mut chunk = columns(&inputs[0], v, cols.clone());
        log_probs_backward(&mut chunk, &r, &lse, &targets, col0);
        for (row, grads) in dlogits.chunks_mut(v).zip(chunk.chunks(cols.len())) {
            row[cols.clone()].copy_from_slice(grads);
        }
    }
    check("log-probs", &inputs, &[dlogits], loss);

    let c = 5;
    let loss = |x: &[Vec<f64>]| {
        let mut value = vec![0.0; n];
        value_forward(&mut value, &x[0], &x[1]);
        dot(&value, &r)
    };
    let inputs = vec![values(n * c, 23), values(c, 24)];
    let (mut dx, mut dw) = (vec![0.0; n * c], vec![0.0; c]);
    value_backward(&mut dx, &mut dw, &r, &inputs[0], &inputs[1]);
    check("value head", &inputs, &[dx, dw], loss);
}
