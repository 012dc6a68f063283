//! The checks of the embedding, RoPE, KV-cache append and attention kernels (scalar and flash).

use nereus_core::half::{bf16_to_f32, f32_to_bf16};
use nereus_core::rng::Rng;
use nereus_exec::backend::gpu::DevicePtr;
use nereus_exec::backend::gpu::{Device, DeviceArray};
use nereus_exec::backend::BackendError;
use nereus_exec::engine::ops::frequencies;
use nereus_kernels::args::{self as k, AttentionDims, AttentionInputs};
use nereus_kernels::attention::{
    attention_grid, decode_combine_grid, decode_grid, flash_keys_grid, flash_rows_grid, flash_threads, FlashWidth,
    ATTENTION_BLOCK, DECODE_THREADS, DECODE_TILE,
};

use super::reference::{self, Attention};
use super::{bf16_values, elementwise_grid, run, run_shaped, uniform, widen, Verdict};

/// A vocab shard `(v0, V)`, `n` tokens of which about half fall in it, and the width `C`.
fn vocab_case(rng: &mut Rng) -> (usize, usize, Vec<i32>, usize) {
    let (v0, v, c) = (rng.below(1000), 1 + rng.below(300), 1 + rng.below(200));
    let n = 1 + rng.below(64);
    let tokens = (0..n).map(|_| rng.below(v0 + 2 * v) as i32).collect();
    (v0, v, tokens, c)
}

fn in_shard(token: i32, v0: usize, v: usize) -> Option<usize> {
    (token as usize).checked_sub(v0).filter(|&row| row < v)
}

pub(super) fn check_embedding_forward(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let (v0, v, tokens, c) = vocab_case(rng);
    let w = bf16_values(rng, v * c, 1.0);
    let (ws, ts, outs) = (
        DeviceArray::from(d, &w)?,
        DeviceArray::from(d, &tokens)?,
        DeviceArray::from(d, &vec![0xffffu16; tokens.len() * c])?,
    );
    let [n, c_, v0_, v_] = [tokens.len(), c, v0, v].map(|x| x as u64);
    let call = k::EmbeddingForward { out: outs.ptr(), tokens: ts.ptr(), w: ws.ptr(), n, c: c_, v0: v0_, v: v_ };
    run(d, &call, elementwise_grid(tokens.len() * c))?;
    let want: Vec<u16> = tokens
        .iter()
        .flat_map(|&t| match in_shard(t, v0, v) {
            Some(row) => w[row * c..(row + 1) * c].to_vec(),
            None => vec![0; c],
        })
        .collect();
    let got: Vec<u16> = outs.read()?;
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        verdict.failures.push(format!("{}: out[{i}] = {:#06x}, want {:#06x}", verdict.kernel, got[i], want[i]));
    }
    Ok(())
}

pub(super) fn check_embedding_backward(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let (v0, v, tokens, c) = vocab_case(rng);
    let dy = bf16_values(rng, tokens.len() * c, 1.0);
    let (dys, ts, dws) =
        (DeviceArray::from(d, &dy)?, DeviceArray::from(d, &tokens)?, DeviceArray::from(d, &vec![0f32; v * c])?);
    let [n, c_, v0_, v_] = [tokens.len(), c, v0, v].map(|x| x as u64);
    let call = k::EmbeddingBackward { dw: dws.ptr(), dy: dys.ptr(), tokens: ts.ptr(), n, c: c_, v0: v0_, v: v_ };
    run(d, &call, elementwise_grid(tokens.len() * c))?;
    let (mut want, mut scale) = (vec![0.0; v * c], vec![0.0; v * c]);
    for (row, &t) in widen(&dy).chunks(c).zip(&tokens) {
        if let Some(r) = in_shard(t, v0, v) {
            for (i, g) in row.iter().enumerate() {
                want[r * c + i] += g;
                scale[r * c + i] += g.abs();
            }
        }
    }
    verdict.f32("dw", &dws.read()?, &want, &scale);
    Ok(())
}

/// Half a head's width for the rotary kernels: a multiple of 8 half the time (their 8-pair
/// vectors), any width up to 64 otherwise (one pair an item).
fn half_width(rng: &mut Rng) -> usize {
    if rng.below(2) == 0 {
        8 * (1 + rng.below(8))
    } else {
        1 + rng.below(64)
    }
}

pub(super) fn check_rope(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let (b, t, heads, half) = (1 + rng.below(3), 1 + rng.below(40), 1 + rng.below(4), half_width(rng));
    let (pos0, inverse) = (rng.below(100), rng.below(2) == 1);
    let (cos, sin) = rope_tables(pos0 + t, half);
    let x = bf16_values(rng, b * t * heads * 2 * half, 2.0);
    let (xs, cs, ss) = (DeviceArray::from(d, &x)?, DeviceArray::from(d, &cos)?, DeviceArray::from(d, &sin)?);
    let [rows, t_, heads_, half_, pos0_] = [b * t, t, heads, half, pos0].map(|x| x as u64);
    let (counter, counter_value) = row_counter(d, rng, pos0)?;
    let call = k::Rope {
        x: xs.ptr(),
        cos_table: cs.ptr(),
        sin_table: ss.ptr(),
        rows,
        t: t_,
        heads: heads_,
        half: half_,
        pos0: pos0_.wrapping_sub(counter_value),
        inverse: i32::from(inverse),
        position: counter_arg(&counter),
    };
    run(d, &call, elementwise_grid(b * t * heads * half))?;
    let xf = widen(&x);
    let (mut want, mut scale) = (xf.clone(), vec![0.0; xf.len()]);
    for (head, chunk) in xf.chunks(2 * half).enumerate() {
        let pos = pos0 + (head / heads) % t;
        for j in 0..half {
            let (c, s) = (f64::from(cos[pos * half + j]), f64::from(sin[pos * half + j]));
            let s = if inverse { -s } else { s };
            let at = head * 2 * half + j;
            rotate_pair((&mut want, &mut scale), (at, half), (chunk[j], chunk[j + half]), (c, s));
        }
    }
    verdict.bf16_scaled("x", &xs.read()?, &want, &scale);
    Ok(())
}

/// The reference rotation of channel pair `(a, b)` by `(cos, sin)` into `want[at]` and
/// `want[at + half]`, each with the tolerance's scale `|a| + |b|`.
fn rotate_pair(
    (want, scale): (&mut [f64], &mut [f64]),
    (at, half): (usize, usize),
    (a, b): (f64, f64),
    (c, s): (f64, f64),
) {
    (want[at], want[at + half]) = (a * c - b * s, b * c + a * s);
    (scale[at], scale[at + half]) = (a.abs() + b.abs(), a.abs() + b.abs());
}

/// RoPE tables for `positions` and `D/2 = half` as the engine builds them: its frequencies, f64
/// angles rounded to f32.
fn rope_tables(positions: usize, half: usize) -> (Vec<f32>, Vec<f32>) {
    let omega = frequencies(2 * half, 500_000.0, None);
    let angles: Vec<f64> = (0..positions).flat_map(|p| omega.iter().map(move |w| p as f64 * w)).collect();
    (angles.iter().map(|a| a.cos() as f32).collect(), angles.iter().map(|a| a.sin() as f32).collect())
}

/// `nereus_qkv_rope`: a split (rotating or not, into buffers or a KV cache at a position) or a
/// merge (rotating back or not), every buffer checked — what the call must not write included.
pub(super) fn check_qkv_rope(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let (b, t, kv_heads, half) = (1 + rng.below(3), 1 + rng.below(12), 1 + rng.below(3), half_width(rng));
    let heads = kv_heads * (1 + rng.below(4));
    let (pos0, rotate, merge) = (rng.below(50), rng.below(3) != 0, rng.below(2) == 1);
    let kv_t = if !merge && rng.below(2) == 1 { pos0 + t + rng.below(4) } else { 0 };
    let (cos, sin) = rope_tables(pos0 + t, half);
    let (width, rows) = (heads + 2 * kv_heads, b * t);
    let kv_rows = if kv_t > 0 { b * kv_t } else { rows };
    // [qkv, q, k, v]
    let lens = [rows * width, rows * heads, kv_rows * kv_heads, kv_rows * kv_heads].map(|heads| heads * 2 * half);
    let inputs: Vec<Vec<u16>> = lens.iter().map(|&n| bf16_values(rng, n, 2.0)).collect();
    let arrays = inputs.iter().map(|x| DeviceArray::from(d, x)).collect::<Result<Vec<_>, _>>()?;
    let (cs, ss) = (DeviceArray::from(d, &cos)?, DeviceArray::from(d, &sin)?);
    let (counter, value) = row_counter(d, rng, pos0)?;
    let [rows_, t_, heads_, kv_heads_, half_, pos0_, kv_t_] =
        [rows, t, heads, kv_heads, half, pos0, kv_t].map(|x| x as u64);
    let call = k::QkvRope {
        qkv: arrays[0].ptr(),
        q: arrays[1].ptr(),
        k: arrays[2].ptr(),
        v: arrays[3].ptr(),
        cos_table: cs.ptr(),
        sin_table: ss.ptr(),
        rows: rows_,
        t: t_,
        heads: heads_,
        kv_heads: kv_heads_,
        half: half_,
        pos0: pos0_.wrapping_sub(value),
        kv_t: kv_t_,
        rotate: i32::from(rotate),
        merge: i32::from(merge),
        position: counter_arg(&counter),
    };
    run(d, &call, elementwise_grid(rows * width * half))?;
    let x: Vec<Vec<f64>> = inputs.iter().map(|v| widen(v)).collect();
    let (mut want, mut scale) = (x.clone(), x.iter().map(|v| vec![0.0; v.len()]).collect::<Vec<_>>());
    for (row, head, j) in (0..rows).flat_map(|r| (0..width).flat_map(move |h| (0..half).map(move |j| (r, h, j)))) {
        let pos = pos0 + row % t;
        let kv_row = if kv_t > 0 { row / t * kv_t + pos } else { row };
        let part = match head {
            h if h < heads => (1, (row * heads + h) * 2 * half),
            h if h < heads + kv_heads => (2, (kv_row * kv_heads + h - heads) * 2 * half),
            h => (3, (kv_row * kv_heads + h - heads - kv_heads) * 2 * half),
        };
        let fused = (0, (row * width + head) * 2 * half);
        let (from, to) = if merge { (part, fused) } else { (fused, part) };
        let (a, bb) = (x[from.0][from.1 + j], x[from.0][from.1 + j + half]);
        let (c, s) = if rotate && head < heads + kv_heads {
            let s = f64::from(sin[pos * half + j]);
            (f64::from(cos[pos * half + j]), if merge { -s } else { s })
        } else {
            (1.0, 0.0)
        };
        rotate_pair((&mut want[to.0], &mut scale[to.0]), (to.1 + j, half), (a, bb), (c, s));
    }
    for (i, name) in ["qkv", "q", "k", "v"].into_iter().enumerate() {
        verdict.bf16_scaled(name, &arrays[i].read()?, &want[i], &scale[i]);
    }
    Ok(())
}

pub(super) fn check_kv_append(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let (b, tn, kd) = (1 + rng.below(3), 1 + rng.below(20), 1 + rng.below(300));
    let at = rng.below(30);
    let tc = at + tn + rng.below(5);
    let cache: Vec<u16> = (0..b * tc * kd).map(|_| rng.next_u64() as u16).collect();
    let fresh: Vec<u16> = (0..b * tn * kd).map(|_| rng.next_u64() as u16).collect();
    let (cs, fs) = (DeviceArray::from(d, &cache)?, DeviceArray::from(d, &fresh)?);
    let [b_, tn_, tc_, at_, kd_] = [b, tn, tc, at, kd].map(|x| x as u64);
    let (counter, value) = row_counter(d, rng, at)?;
    let (at_, position) = (at_.wrapping_sub(value), counter_arg(&counter));
    let call = k::KvAppend { cache: cs.ptr(), fresh: fs.ptr(), b: b_, tn: tn_, tc: tc_, at: at_, kd: kd_, position };
    run(d, &call, elementwise_grid(fresh.len()))?;
    let mut want = cache.clone();
    for seq in 0..b {
        let to = (seq * tc + at) * kd;
        want[to..to + tn * kd].copy_from_slice(&fresh[seq * tn * kd..(seq + 1) * tn * kd]);
    }
    let got: Vec<u16> = cs.read()?;
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        verdict.failures.push(format!("{}: cache[{i}] = {:#06x}, want {:#06x}", verdict.kernel, got[i], want[i]));
    }
    Ok(())
}

/// A decode's row counter for half the cases: a device `int` holding part of position `pos`
/// (possibly more than all of it: the kernels add in `u64`, wrapping), and the part it holds;
/// else none and 0.
pub(super) fn row_counter<'d>(
    d: &'d Device,
    rng: &mut Rng,
    pos: usize,
) -> Result<(Option<DeviceArray<'d, i32>>, u64), BackendError> {
    if rng.below(2) == 0 {
        return Ok((None, 0));
    }
    let value = rng.below(pos + 2) as i32 - 1;
    Ok((Some(DeviceArray::from(d, &[value])?), value as i64 as u64))
}

/// The counter's address, or null.
pub(super) fn counter_arg(counter: &Option<DeviceArray<'_, i32>>) -> DevicePtr {
    counter.as_ref().map_or(DevicePtr::NULL, DeviceArray::ptr)
}

/// A random attention shape (training, prefill or decode), its inputs and per-sequence starts.
struct AttentionCase {
    shape: Attention,
    q: Vec<u16>,
    k: Vec<u16>,
    v: Vec<u16>,
    starts: Vec<i32>,
    /// Pass a null `starts` (every sequence starts at 0).
    no_starts: bool,
}

fn attention_case(rng: &mut Rng) -> AttentionCase {
    // Two cases in three span several key tiles (128 keys), where the online softmax rescales.
    // Training shapes (Tq = Tk) are the short ones; long ones are decodes or chunked prefills of
    // at most 64 queries, whose every query still spans the tiles.
    let tk = if rng.below(3) == 0 { 1 + rng.below(40) } else { 260 + rng.below(100) };
    let tq = match rng.below(3) {
        0 => 1,
        1 => tk.min(64),
        _ => 1 + rng.below(tk.min(64)),
    };
    // Long prefills keep few, narrow heads: the emulator runs Tq·Tk·H·D multiply-adds one by one.
    let heavy = tq > 16 && tk > 128;
    let kv_heads = 1 + rng.below(2);
    let heads = kv_heads * if heavy { 1 } else { [1, 2, 4][rng.below(3)] };
    let d = if heavy { [8, 16, 32][rng.below(3)] } else { [8, 16, 64, 80, 128, 256][rng.below(6)] };
    let b = if tk > 128 { 1 } else { 1 + rng.below(2) };
    let shape = Attention { b, tq, tk, tc: tk + rng.below(9), heads, kv_heads, d };
    // Starts (left padding) before the first key tile ends, so padded rows still span tiles.
    let starts = (0..shape.b).map(|_| rng.below(tk.div_ceil(2).min(100)) as i32).collect();
    // One case in four has no padding and passes no `starts` at all (a null pointer).
    let (starts, no_starts) = if rng.below(4) == 0 { (vec![0; shape.b], true) } else { (starts, false) };
    AttentionCase::draw(rng, shape, starts, no_starts)
}

impl AttentionCase {
    /// The case of `shape` with uniform bf16 inputs drawn from `rng` (q, then k, then v).
    fn draw(rng: &mut Rng, shape: Attention, starts: Vec<i32>, no_starts: bool) -> AttentionCase {
        let kv = shape.b * shape.tc * shape.kv_heads * shape.d;
        let q = bf16_values(rng, shape.b * shape.tq * shape.heads * shape.d, 1.0);
        let (k, v) = (bf16_values(rng, kv, 1.0), bf16_values(rng, kv, 1.0));
        AttentionCase { shape, q, k, v, starts, no_starts }
    }

    fn grid(&self) -> [u32; 3] {
        attention_grid(self.shape.b, self.shape.tq, self.shape.heads)
    }

    fn dims(&self) -> AttentionDims {
        let a = &self.shape;
        let [b, tq, tk, tc, heads, kv_heads, d] = [a.b, a.tq, a.tk, a.tc, a.heads, a.kv_heads, a.d].map(|x| x as u64);
        AttentionDims { b, tq, tk, tc, heads, kv_heads, d }
    }

    fn starts(&self) -> Vec<usize> {
        self.starts.iter().map(|&s| s as usize).collect()
    }

    /// The `starts` argument: the buffer, or null for a case without padding.
    fn starts_arg(&self, buffer: &DeviceArray<'_, i32>) -> DevicePtr {
        if self.no_starts {
            DevicePtr::NULL
        } else {
            buffer.ptr()
        }
    }
}

/// Runs a forward kernel on `case` (`launch` gets its arguments: out, lse, q, k, v, starts and
/// the shape, as the scalar kernel takes them), checks `lse` against the f64 reference (finite
/// where the reference is, −inf for a pad query), and returns the output read back, the
/// reference's, and max |v| (the scale of the caller's tolerance for the output).
fn run_forward(
    d: &Device,
    case: &AttentionCase,
    verdict: &mut Verdict,
    launch: impl FnOnce(k::AttentionForward) -> Result<(), BackendError>,
) -> Result<(Vec<u16>, Vec<f64>, f64), BackendError> {
    let a = case.shape;
    let (qs, ks, vs) = (DeviceArray::from(d, &case.q)?, DeviceArray::from(d, &case.k)?, DeviceArray::from(d, &case.v)?);
    let starts = DeviceArray::from(d, &case.starts)?;
    // Poisoned, so an output the kernel never writes fails the comparison.
    let outs = DeviceArray::from(d, &vec![0xffffu16; case.q.len()])?;
    let lses = DeviceArray::from(d, &vec![0f32; a.b * a.heads * a.tq])?;
    let inputs =
        AttentionInputs { q: qs.ptr(), k: ks.ptr(), v: vs.ptr(), starts: case.starts_arg(&starts), dims: case.dims() };
    launch(k::AttentionForward { out: outs.ptr(), lse: lses.ptr(), inputs })?;
    let (out, lse) = reference::attention(&a, &widen(&case.q), &widen(&case.k), &widen(&case.v), &case.starts());
    let got_lse: Vec<f32> = lses.read()?;
    let (finite_got, finite_want): (Vec<f32>, Vec<f64>) =
        got_lse.iter().zip(&lse).filter(|(_, w)| w.is_finite()).map(|(g, w)| (*g, *w)).unzip();
    verdict.f32("lse", &finite_got, &finite_want, &vec![1.0; finite_want.len()]);
    if let Some(i) = got_lse.iter().zip(&lse).position(|(g, w)| w.is_infinite() && g.is_finite()) {
        verdict.failures.push(format!("{}: lse[{i}] of a pad query = {}, want -inf", verdict.kernel, got_lse[i]));
    }
    let v_scale = widen(&case.v).iter().fold(0.0f64, |m, x| m.max(x.abs()));
    Ok((outs.read()?, out, v_scale))
}

pub(super) fn check_attention_forward(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let case = attention_case(rng);
    let (got, out, v_scale) =
        run_forward(d, &case, verdict, |call| run_shaped(d, &call, case.grid(), ATTENTION_BLOCK))?;
    // The output is a convex combination of value rows: f32 rounds relative to their size.
    verdict.bf16_scaled("out", &got, &out, &vec![v_scale; out.len()]);
    Ok(())
}

/// A backward case on the device: the inputs, and the forward's outputs as training stores them
/// (bf16 out, f32 lse), with a random output gradient; and on the host what the f64 reference
/// of the backward needs.
struct BackwardCase<'d> {
    qs: DeviceArray<'d, u16>,
    ks: DeviceArray<'d, u16>,
    vs: DeviceArray<'d, u16>,
    starts: DeviceArray<'d, i32>,
    outs: DeviceArray<'d, u16>,
    lses: DeviceArray<'d, f32>,
    dos: DeviceArray<'d, u16>,
    /// The reference's gradients of q, k, v and the scales of their tolerances.
    want: ([Vec<f64>; 3], [Vec<f64>; 3]),
}

impl<'d> BackwardCase<'d> {
    fn upload(d: &'d Device, rng: &mut Rng, case: &AttentionCase) -> Result<BackwardCase<'d>, BackendError> {
        let a = case.shape;
        let (q, k, v) = (widen(&case.q), widen(&case.k), widen(&case.v));
        let (out, lse) = reference::attention(&a, &q, &k, &v, &case.starts());
        let out_bf16: Vec<u16> = out.iter().map(|&x| f32_to_bf16(x as f32)).collect();
        let lse_f32: Vec<f32> = lse.iter().map(|&x| x as f32).collect();
        let dout = bf16_values(rng, out.len(), 1.0);
        let seen_out: Vec<f64> = out_bf16.iter().map(|&h| f64::from(bf16_to_f32(h))).collect();
        let want = reference::attention_backward(&a, (&q, &k, &v), &seen_out, &widen(&dout), &case.starts());
        Ok(BackwardCase {
            qs: DeviceArray::from(d, &case.q)?,
            ks: DeviceArray::from(d, &case.k)?,
            vs: DeviceArray::from(d, &case.v)?,
            starts: DeviceArray::from(d, &case.starts)?,
            outs: DeviceArray::from(d, &out_bf16)?,
            lses: DeviceArray::from(d, &lse_f32)?,
            dos: DeviceArray::from(d, &dout)?,
            want,
        })
    }

    /// What every attention kernel reads besides its outputs.
    fn inputs(&self, case: &AttentionCase) -> AttentionInputs {
        let (q, k, v, starts) = (self.qs.ptr(), self.ks.ptr(), self.vs.ptr(), case.starts_arg(&self.starts));
        AttentionInputs { q, k, v, starts, dims: case.dims() }
    }
}

pub(super) fn check_attention_backward(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let case = attention_case(rng);
    let c = BackwardCase::upload(d, rng, &case)?;
    let dqs = DeviceArray::from(d, &vec![0u16; case.q.len()])?;
    let (dks, dvs) =
        (DeviceArray::from(d, &vec![0f32; case.k.len()])?, DeviceArray::from(d, &vec![0f32; case.v.len()])?);
    let (dout, out, lse, inputs) = (c.dos.ptr(), c.outs.ptr(), c.lses.ptr(), c.inputs(&case));
    let call = k::AttentionBackward { dq: dqs.ptr(), dk: dks.ptr(), dv: dvs.ptr(), dout, out, lse, inputs };
    run_shaped(d, &call, case.grid(), ATTENTION_BLOCK)?;
    let ([dq, dk, dv], [sq, sk, sv]) = &c.want;
    verdict.bf16_scaled("dq", &dqs.read()?, dq, sq);
    verdict.f32("dk", &dks.read()?, dk, sk);
    verdict.f32("dv", &dvs.read()?, dv, sv);
    Ok(())
}

/// A random case for the flash kernels: every padded width (32, 64, 128) with head widths that
/// fill it or not (and one not a multiple of 8, which stages element by element), GQA 1:1 to
/// 4:1, training shapes (Tq = Tk), prefills and decodes, lengths that are not multiples of the
/// 64-row tiles, left padding that leaves rows with one key or none.
fn flash_case(rng: &mut Rng) -> AttentionCase {
    let tk = if rng.below(3) == 0 { 1 + rng.below(40) } else { 60 + rng.below(140) };
    let tq = match rng.below(4) {
        0 => 1,
        1 | 2 => tk,
        _ => 1 + rng.below(tk),
    };
    let kv_heads = 1 + rng.below(2);
    let heads = kv_heads * [1, 2, 4][rng.below(3)];
    let d = [16, 20, 32, 48, 64, 64, 96, 128, 128][rng.below(9)];
    let b = 1 + rng.below(2);
    let shape = Attention { b, tq, tk, tc: tk + rng.below(9), heads, kv_heads, d };
    // Starts up to the last key: a query at the start sees one key, one before it none.
    let starts = (0..b).map(|_| if rng.below(3) == 0 { 0 } else { rng.below(tk) as i32 }).collect();
    let (starts, no_starts) = if rng.below(4) == 0 { (vec![0; b], true) } else { (starts, false) };
    AttentionCase::draw(rng, shape, starts, no_starts)
}

/// Threads of a flash block on `d`: its warps at the device's width.
fn threads(d: &Device) -> u32 {
    flash_threads(d.runtime().warp_width())
}

pub(super) fn check_flash_forward(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let case = flash_case(rng);
    let a = case.shape;
    let width = FlashWidth::for_head(a.d).expect("flash cases fit a width");
    let grid = flash_rows_grid(a.b, a.tq, a.heads, a.kv_heads);
    let (got, out, v_scale) = run_forward(d, &case, verdict, |a| {
        let call = k::FlashForward { width, out: a.out, lse: a.lse, inputs: a.inputs };
        run_shaped(d, &call, grid, threads(d))
    })?;
    // The probabilities enter the product as bf16: at most 2⁻⁸ (bf16's unit roundoff) of max |v|
    // off, besides the output's own rounding.
    verdict.bf16_products("out", &got, &out, &vec![v_scale; out.len()]);
    Ok(())
}

pub(super) fn check_flash_backward(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let case = flash_case(rng);
    let a = case.shape;
    let width = FlashWidth::for_head(a.d).expect("flash cases fit a width");
    let c = BackwardCase::upload(d, rng, &case)?;
    // The outputs start zeroed, as the engine passes them; the kernels write every key below Tk.
    let dqs = DeviceArray::from(d, &vec![0xffffu16; case.q.len()])?;
    let (dks, dvs) =
        (DeviceArray::from(d, &vec![0u16; case.k.len()])?, DeviceArray::from(d, &vec![0u16; case.v.len()])?);
    let delta = DeviceArray::from(d, &vec![0f32; a.b * a.heads * a.tq])?;
    let (dout, out, lse, delta, inputs) = (c.dos.ptr(), c.outs.ptr(), c.lses.ptr(), delta.ptr(), c.inputs(&case));
    let dq_call = k::FlashBackwardDq { width, dq: dqs.ptr(), delta, dout, out, lse, inputs };
    run_shaped(d, &dq_call, flash_rows_grid(a.b, a.tq, a.heads, a.kv_heads), threads(d))?;
    let dkv_call = k::FlashBackwardDkv { width, dk: dks.ptr(), dv: dvs.ptr(), dout, lse, delta, inputs };
    run_shaped(d, &dkv_call, flash_keys_grid(a.b, a.tk, a.kv_heads), threads(d))?;
    let ([dq, dk, dv], [sq, sk, sv]) = &c.want;
    verdict.bf16_products("dq", &dqs.read()?, dq, sq);
    verdict.bf16_products("dk", &dks.read()?, dk, sk);
    verdict.bf16_products("dv", &dvs.read()?, dv, sv);
    Ok(())
}

/// Largest disagreement of the f64 attention backward with central differences of the f64
/// forward, on a few entries of q, k and v of small random cases.
pub(super) fn attention_finite_differences(rng: &mut Rng) -> f64 {
    let mut worst = 0.0f64;
    let shape = Attention { b: 2, tq: 5, tk: 7, tc: 8, heads: 4, kv_heads: 2, d: 6 };
    let draw = |rng: &mut Rng, n: usize| -> Vec<f64> { (0..n).map(|_| uniform(rng)).collect() };
    let (q, k, v) = (draw(rng, 2 * 5 * 4 * 6), draw(rng, 2 * 8 * 2 * 6), draw(rng, 2 * 8 * 2 * 6));
    let dout = draw(rng, q.len());
    let starts = [0, 3];
    let (out, _) = reference::attention(&shape, &q, &k, &v, &starts);
    let (grads, _) = reference::attention_backward(&shape, (&q, &k, &v), &out, &dout, &starts);
    let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
        reference::attention(&shape, q, k, v, &starts).0.iter().zip(&dout).map(|(o, d)| o * d).sum()
    };
    for _ in 0..12 {
        let (iq, ik) = (rng.below(q.len()), rng.below(k.len()));
        worst = worst
            .max(reference::fd_error(grads[0][iq], reference::central_difference(&q, iq, |x| loss(x, &k, &v))))
            .max(reference::fd_error(grads[1][ik], reference::central_difference(&k, ik, |x| loss(&q, x, &v))))
            .max(reference::fd_error(grads[2][ik], reference::central_difference(&v, ik, |x| loss(&q, &k, x))));
    }
    worst
}

/// Flash-decoding (`nereus_decode_attention` then `nereus_decode_attention_combine`) on a random
/// decode: one query per sequence, GQA groups of 1 to 8 heads, heads 8 to 256 wide, keys over
/// several tiles and splits (the split drawn, not the engine's choice, so one key per split, a
/// split past the last key and a single split all occur), left padding, and the key count
/// taken partly from a row counter in device memory; some sequences marked finished, which the
/// reference sees as queries before their first key (zero out, `lse` −inf). Checked as the
/// scalar kernel is: the probabilities stay f32.
pub(super) fn check_decode_attention(d: &Device, rng: &mut Rng, verdict: &mut Verdict) -> Result<(), BackendError> {
    let tk = 1 + rng.below(300);
    let kv_heads = 1 + rng.below(2);
    let group = [1, 2, 4, 8][rng.below(4)];
    let d_head = [8, 20, 64, 128, 256][rng.below(5)].min(1024 / group);
    let b = 1 + rng.below(3);
    let shape = Attention { b, tq: 1, tk, tc: tk + rng.below(40), heads: kv_heads * group, kv_heads, d: d_head };
    let starts = (0..b).map(|_| if rng.below(3) == 0 { 0 } else { rng.below(tk + 1) as i32 }).collect();
    let (mut starts, no_starts) = if rng.below(4) == 0 { (vec![0; b], true) } else { (starts, false) };
    // The kernel reads the drawn starts and the flags; the reference sees a finished sequence as
    // one whose keys all lie after its query.
    let done: Vec<i32> = (0..b).map(|_| i32::from(!no_starts && rng.below(4) == 0)).collect();
    let kernel_starts = DeviceArray::from(d, &starts)?;
    for (start, _) in starts.iter_mut().zip(&done).filter(|(_, &d)| d == 1) {
        *start = tk as i32;
    }
    let case = AttentionCase::draw(rng, shape, starts, no_starts);
    let done = DeviceArray::from(d, &done)?;
    // A quarter of the cases in one split covering the cache (a batch that fills the device).
    let split_keys = match rng.below(4) {
        0 => shape.tc.div_ceil(DECODE_TILE) * DECODE_TILE,
        _ => DECODE_TILE * (1 + rng.below(4)),
    };
    let splits = shape.tc.div_ceil(split_keys) + rng.below(2);
    let (counter, value) = row_counter(d, rng, tk)?;
    // One split finishes in its own launch in half the cases that allow it, as the engine runs it.
    let direct = splits == 1 && rng.below(2) == 0;
    let scratch = DeviceArray::<f32>::zeros(d, b * shape.heads * splits * (d_head + 2))?;
    let (got, out, v_scale) = run_forward(d, &case, verdict, |a| {
        let i = a.inputs;
        let (partial, stats) = (scratch.ptr(), scratch.at(b * shape.heads * splits * d_head));
        let [splits_, split_keys_] = [splits, split_keys].map(|x| x as u64);
        let call = k::DecodeAttention {
            partial,
            stats,
            q: i.q,
            k: i.k,
            v: i.v,
            starts: if no_starts { DevicePtr::NULL } else { kernel_starts.ptr() },
            position: counter_arg(&counter),
            done: done.ptr(),
            b: i.dims.b,
            tk: i.dims.tk.wrapping_sub(value),
            tc: i.dims.tc,
            heads: i.dims.heads,
            kv_heads: i.dims.kv_heads,
            d: i.dims.d,
            splits: splits_,
            split_keys: split_keys_,
            out: if direct { a.out } else { DevicePtr::NULL },
            lse: if direct { a.lse } else { DevicePtr::NULL },
        };
        run_shaped(d, &call, decode_grid(splits, b, kv_heads), DECODE_THREADS)?;
        if direct {
            return Ok(());
        }
        let (heads, d_) = (i.dims.heads, i.dims.d);
        let combine = k::DecodeAttentionCombine {
            out: a.out,
            lse: a.lse,
            partial,
            stats,
            b: i.dims.b,
            heads,
            d: d_,
            splits: splits_,
        };
        run_shaped(d, &combine, decode_combine_grid(b, shape.heads), DECODE_THREADS)
    })?;
    verdict.bf16_scaled("out", &got, &out, &vec![v_scale; out.len()]);
    Ok(())
}
