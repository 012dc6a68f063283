//! `nereus selftest kernels`: every engine kernel in `crates/kernels/device/`, on seeded random shapes
//! and inputs, against the f64 references of [`reference`] (whose backward passes are checked by
//! finite differences in f64 first). On `--device emulated` (the default) the kernels run on the
//! grid emulator at warp 32 and at warp 64; on `cuda` or `rocm`, on this rank's GPU.
//!
//! Tolerances (stated in the summary):
//! - casts: bit-exact (round to nearest even, as `nereus_core::half`);
//! - bf16 outputs: `|got − ref| ≤ 2⁻⁸·|ref| + 10⁻⁵·scale` (one rounding to bf16 is up to 2⁻⁸·|ref|:
//!   half a unit in the last of its 8 significant bits);
//! - f32 outputs (inverse RMS, row max/Σexp/target, RMSNorm weight gradient, AdamW state):
//!   `|got − ref| ≤ 10⁻⁵·(|ref| + scale)`;
//! - the scale is what f32 rounds relative to: the sum of the magnitudes a reduction adds, the
//!   magnitudes of the terms a difference cancels (RMSNorm's `dx`, Adam's moments and update), or
//!   else the tensor's largest `|ref|`;
//! - AdamW's bf16 working copy: exactly the rounding of the f32 master it wrote.

mod attention;
pub mod reference;

use std::time::Instant;

use serde::Serialize;

use nereus_core::config::DeviceChoice;
use nereus_core::half::{bf16_to_f32, f32_to_bf16};
use nereus_core::rng::Rng;
use nereus_exec::backend::blas::{Gemm, GemmOut};
use nereus_exec::backend::emulated::Emulated;
use nereus_exec::backend::gpu::{Device, DeviceArray, DevicePtr};
use nereus_exec::backend::BackendError;
use nereus_exec::engine::{
    draw_uniform, sample_token, DecodeShape, HostDecoding, Op, SampleBuffers, Sampling, StopIds,
};
use nereus_kernels::args::{self as k, AdamTensor};
use nereus_kernels::grid::WarpWidth;
use nereus_kernels::KernelCall;
use nereus_runtime::device::open_device;
use nereus_runtime::{RuntimeError, Session};

use reference::AdamStep;

/// Random cases per kernel and device.
const CASES: u32 = 6;
/// Threads per block of the row kernels: a multiple of both warp widths.
const BLOCK: u32 = 256;

/// One kernel's verdict at one warp width.
#[derive(Debug, Serialize)]
pub struct KernelRun {
    /// Entry point.
    pub kernel: &'static str,
    /// Warp width it ran at.
    pub warp: u32,
    /// Random cases run.
    pub cases: u32,
    /// Largest error over its tolerance (≤ 1 passes; 0 for bit-exact checks that held).
    pub worst: f64,
    /// Seconds the launches took, all cases.
    pub seconds: f64,
}

/// What `selftest kernels` found.
#[derive(Debug, Serialize)]
pub struct KernelSummary {
    /// The device the kernels ran on.
    pub device: String,
    /// Seed of the shapes and inputs.
    pub seed: u64,
    /// The tolerances, as stated in the module documentation.
    pub tolerances: [&'static str; 4],
    /// Per kernel and warp width.
    pub runs: Vec<KernelRun>,
    /// Largest relative disagreement of the f64 backward references with finite differences.
    pub finite_difference_error: f64,
    /// Failed checks (empty on success).
    pub failures: Vec<String>,
}

/// Runs every kernel check on this rank's `device` (default: the emulator at both warp widths).
pub fn kernels(session: &Session, seed: u64, device: Option<DeviceChoice>) -> Result<KernelSummary, RuntimeError> {
    let mut summary = KernelSummary {
        device: String::new(),
        seed,
        tolerances: [
            "casts: bit-exact",
            "bf16 outputs: |got-ref| <= 2^-8*|ref| + 1e-5*scale",
            "f32 outputs: |got-ref| <= 1e-5*(|ref| + scale); scale: magnitudes reduced or cancelled, else max|ref|",
            "AdamW working copy: bf16 rounding of the f32 master, bit-exact",
        ],
        runs: Vec::new(),
        finite_difference_error: finite_differences(seed),
        failures: Vec::new(),
    };
    if summary.finite_difference_error > 1e-5 {
        summary
            .failures
            .push(format!("f64 backward references vs finite differences: {}", summary.finite_difference_error));
    }
    match device.unwrap_or(DeviceChoice::Emulated) {
        DeviceChoice::Emulated => {
            summary.device = "grid emulator (warp 32 and 64)".into();
            for warp in WarpWidth::ALL {
                let device = Device::new(Emulated::new(0, 16 << 30).with_warp(warp))?;
                let (runs, failures) = check_every_kernel(&device, seed, warp.lanes())?;
                summary.runs.extend(runs);
                summary.failures.extend(failures);
            }
        }
        choice => {
            // The plane is opened (and held) only so that every rank brings its device up
            // together; the checks themselves stay on this rank's device.
            let (_plane, memory) = open_device(session, choice)?;
            let (device, d) = (memory.device(), memory.device().runtime().device());
            summary.device = format!("{} device {} ({})", device.runtime().backend(), d.ordinal, d.name);
            let (runs, failures) = check_every_kernel(device, seed, device.runtime().warp_width())?;
            summary.runs = runs;
            summary.failures.extend(failures);
        }
    }
    Ok(summary)
}

/// Every kernel, [`CASES`] random cases each, on `device`: each kernel's run and the failed checks.
fn check_every_kernel(device: &Device, seed: u64, warp: u32) -> Result<(Vec<KernelRun>, Vec<String>), RuntimeError> {
    type Check = fn(&Device, &mut Rng, &mut Verdict) -> Result<(), BackendError>;
    let checks: [(&'static str, Check); 26] = [
        ("nereus_cast_f32_to_bf16", check_cast_to_bf16),
        ("nereus_cast_bf16_to_f32", check_cast_to_f32),
        ("nereus_rmsnorm_forward", check_rmsnorm_forward),
        ("nereus_rmsnorm_backward", check_rmsnorm_backward),
        ("nereus_swiglu_forward", check_swiglu_forward),
        ("nereus_swiglu_backward", check_swiglu_backward),
        ("nereus_residual_add", check_residual_add),
        ("nereus_logits_row_stats", check_row_stats),
        ("nereus_cross_entropy", check_cross_entropy),
        ("nereus_adamw", check_adamw),
        ("nereus_logprob_backward", check_logprob_backward),
        ("nereus_argmax", check_argmax),
        ("nereus_sum_squares", check_sum_squares),
        ("nereus_sample", check_sample),
        ("nereus_decode_advance", check_decode_advance),
        ("gemm (vendor BLAS)", check_gemm),
        ("nereus_embedding_forward", attention::check_embedding_forward),
        ("nereus_embedding_backward", attention::check_embedding_backward),
        ("nereus_rope", attention::check_rope),
        ("nereus_qkv_rope", attention::check_qkv_rope),
        ("nereus_kv_append", attention::check_kv_append),
        ("nereus_attention_forward", attention::check_attention_forward),
        ("nereus_attention_backward", attention::check_attention_backward),
        ("nereus_flash_forward_{32,64,128}", attention::check_flash_forward),
        ("nereus_flash_backward_{dq,dkv}_{32,64,128}", attention::check_flash_backward),
        ("nereus_decode_attention{,_combine}", attention::check_decode_attention),
    ];
    let (mut runs, mut failures) = (Vec::new(), Vec::new());
    for (i, (kernel, check)) in checks.into_iter().enumerate() {
        let mut rng = Rng::new(nereus_core::rng::mix(seed ^ (i as u64 + 1)));
        let mut verdict = Verdict { kernel, worst: 0.0, failures: Vec::new() };
        let started = Instant::now();
        for _ in 0..CASES {
            check(device, &mut rng, &mut verdict)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        failures.extend(verdict.failures.into_iter().map(|f| format!("warp {warp}: {f}")));
        runs.push(KernelRun { kernel, warp, cases: CASES, worst: verdict.worst, seconds });
    }
    Ok((runs, failures))
}

/// One kernel's running verdict.
struct Verdict {
    kernel: &'static str,
    worst: f64,
    failures: Vec<String>,
}

impl Verdict {
    /// Records `|got − want| / tolerance` for output `what`; a failure above 1.
    fn compare(&mut self, what: &str, got: &[f64], want: &[f64], tolerance: impl Fn(usize, f64) -> f64) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let ratio = if g == w { 0.0 } else { (g - w).abs() / tolerance(i, *w) };
            let ratio = if ratio.is_nan() { f64::INFINITY } else { ratio };
            self.worst = self.worst.max(ratio);
            if ratio > 1.0 && self.failures.len() < 5 {
                self.failures
                    .push(format!("{} {what}[{i}]: got {g}, want {w} (error {ratio:.2}× the tolerance)", self.kernel));
            }
        }
    }

    /// bf16 outputs with the tensor's largest `|ref|` as the scale.
    fn bf16(&mut self, what: &str, got: &[u16], want: &[f64]) {
        let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        self.bf16_scaled(what, got, want, &vec![scale; want.len()]);
    }

    /// bf16 outputs: `2⁻⁸·|ref| + 10⁻⁵·scale[i]`.
    fn bf16_scaled(&mut self, what: &str, got: &[u16], want: &[f64], scale: &[f64]) {
        let got: Vec<f64> = got.iter().map(|&h| f64::from(bf16_to_f32(h))).collect();
        self.compare(what, &got, want, |i, w| w.abs() / 256.0 + 1e-5 * scale[i] + f64::MIN_POSITIVE);
    }

    /// bf16 outputs of sums whose terms went through bf16 on the way (a tensor-core product's
    /// probabilities or score gradients): each term's rounding is at most 2⁻⁸ (bf16's unit
    /// roundoff) of its size and the output's own at most 2⁻⁸ of it, so the bound
    /// `2⁻⁸·(|ref| + scale[i])`, with `scale[i]` the sum of the terms' magnitudes.
    fn bf16_products(&mut self, what: &str, got: &[u16], want: &[f64], scale: &[f64]) {
        let got: Vec<f64> = got.iter().map(|&h| f64::from(bf16_to_f32(h))).collect();
        self.compare(what, &got, want, |i, w| (w.abs() + scale[i]) / 256.0 + f64::MIN_POSITIVE);
    }

    /// f32 outputs: `10⁻⁵·(|ref| + scale[i])`.
    fn f32(&mut self, what: &str, got: &[f32], want: &[f64], scale: &[f64]) {
        let got: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
        self.compare(what, &got, want, |i, w| 1e-5 * (w.abs() + scale[i]) + f64::MIN_POSITIVE);
    }
}

/// Launches `call` over `grid` blocks of [`BLOCK`] threads and waits for it.
fn run(device: &Device, call: &impl KernelCall, grid: u64) -> Result<(), BackendError> {
    run_shaped(device, call, [grid.clamp(1, 4096) as u32, 1, 1], BLOCK)
}

/// Launches `call` over `grid` blocks of `block` threads and waits for it.
fn run_shaped(device: &Device, call: &impl KernelCall, grid: [u32; 3], block: u32) -> Result<(), BackendError> {
    // SAFETY: each check passes buffers of the sizes its kernel touches.
    unsafe { device.launch(call, grid, [block, 1, 1])? };
    device.synchronize()
}

/// Blocks of an element-wise launch over `n` elements: a few grid-stride rounds at least.
fn elementwise_grid(n: usize) -> u64 {
    (n as u64).div_ceil(u64::from(BLOCK) * 2)
}

fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// `n` bf16 values spread over `±scale` (with exponents varied, so rounding is exercised).
fn bf16_values(rng: &mut Rng, n: usize, scale: f64) -> Vec<u16> {
    (0..n).map(|_| f32_to_bf16((uniform(rng) * scale * (1.0 + 3.0 * uniform(rng).abs())) as f32)).collect()
}

fn widen(values: &[u16]) -> Vec<f64> {
    values.iter().map(|&h| f64::from(bf16_to_f32(h))).collect()
}

/// A random length in `1..=max`, skewed to cover both tiny and multi-round shapes.
fn length(rng: &mut Rng, max: usize) -> usize {
    if rng.below(3) == 0 {
        1 + rng.below(40)
    } else {
        1 + rng.below(max)
    }
}

fn check_cast_to_bf16(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let n = length(rng, 20_000);
    let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0];
    let x: Vec<f32> =
        (0..n).map(|i| if i < specials.len() { specials[i] } else { f32::from_bits(rng.next_u64() as u32) }).collect();
    let (xs, ys) = (DeviceArray::from(d, &x)?, DeviceArray::from(d, &vec![0u16; n])?);
    run(d, &k::CastF32ToBf16 { y: ys.ptr(), x: xs.ptr(), n: n as u64 }, elementwise_grid(n))?;
    let got: Vec<u16> = ys.read()?;
    let mismatched = x.iter().zip(&got).position(|(x, g)| f32_to_bf16(*x) != *g);
    if let Some(i) = mismatched {
        v.failures.push(format!("{}: bf16({:e}) = {:#06x}, want {:#06x}", v.kernel, x[i], got[i], f32_to_bf16(x[i])));
    }
    Ok(())
}

fn check_cast_to_f32(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let n = length(rng, 20_000);
    let x: Vec<u16> = (0..n).map(|_| rng.next_u64() as u16).collect();
    let (xs, ys) = (DeviceArray::from(d, &x)?, DeviceArray::from(d, &vec![0f32; n])?);
    run(d, &k::CastBf16ToF32 { y: ys.ptr(), x: xs.ptr(), n: n as u64 }, elementwise_grid(n))?;
    let got: Vec<f32> = ys.read()?;
    if let Some(i) = x.iter().zip(&got).position(|(x, g)| bf16_to_f32(*x).to_bits() != g.to_bits()) {
        v.failures.push(format!("{}: f32({:#06x}) = {:e}, want {:e}", v.kernel, x[i], got[i], bf16_to_f32(x[i])));
    }
    Ok(())
}

/// A row width up to 3,000, a multiple of 8 in half the draws (the widths the row and
/// element-wise kernels move as 16-byte vectors).
fn row_width(rng: &mut Rng) -> usize {
    if rng.below(2) == 0 {
        8 * length(rng, 375)
    } else {
        length(rng, 3_000)
    }
}

/// A random `(rows, cols)` row-kernel shape.
fn row_shape(rng: &mut Rng) -> (usize, usize) {
    (1 + rng.below(9), row_width(rng))
}

const EPS: f32 = 1e-5;

/// The norm of `x`, or in half the cases of `x + residual` (the fused residual connection,
/// whose sum must be `nereus_residual_add`'s bit for bit).
fn check_rmsnorm_forward(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, cols) = row_shape(rng);
    let (mut x, w) = (bf16_values(rng, rows * cols, 2.0), bf16_values(rng, cols, 1.0));
    let residual = (rng.below(2) == 0).then(|| bf16_values(rng, rows * cols, 2.0));
    let (xs, ws) = (DeviceArray::from(d, &x)?, DeviceArray::from(d, &w)?);
    let rsd = residual.as_ref().map(|r| DeviceArray::from(d, r)).transpose()?;
    let (ys, rs) = (DeviceArray::from(d, &vec![0u16; rows * cols])?, DeviceArray::from(d, &vec![0f32; rows])?);
    let (rows_, cols_) = (rows as u64, cols as u64);
    let call = k::RmsnormForward {
        y: ys.ptr(),
        inv_rms: rs.ptr(),
        x: xs.ptr(),
        weight: ws.ptr(),
        rows: rows_,
        cols: cols_,
        eps: EPS,
        residual: rsd.as_ref().map_or(DevicePtr::default(), |r| r.ptr()),
    };
    run(d, &call, rows_)?;
    if let Some(residual) = &residual {
        x.iter_mut().zip(residual).for_each(|(x, r)| *x = f32_to_bf16(bf16_to_f32(*x) + bf16_to_f32(*r)));
        if xs.read()? != x {
            v.failures.push(format!("{}: the residual sum x + r differs from bf16(x + r)", v.kernel));
        }
    }
    let (xf, wf) = (widen(&x), widen(&w));
    let (mut want_y, mut want_r) = (Vec::new(), Vec::new());
    for row in xf.chunks(cols) {
        let (y, r) = reference::rmsnorm(row, &wf, f64::from(EPS));
        want_y.extend(y);
        want_r.push(r);
    }
    v.bf16("y", &ys.read()?, &want_y);
    v.f32("inv_rms", &rs.read()?, &want_r, &vec![0.0; rows]);
    Ok(())
}

fn check_rmsnorm_backward(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, cols) = row_shape(rng);
    let (x, w, dy) =
        (bf16_values(rng, rows * cols, 2.0), bf16_values(rng, cols, 1.0), bf16_values(rng, rows * cols, 1.0));
    let (xf, wf, dyf) = (widen(&x), widen(&w), widen(&dy));
    let inv_rms: Vec<f32> = xf.chunks(cols).map(|row| reference::rmsnorm(row, &wf, f64::from(EPS)).1 as f32).collect();
    let (xs, ws, dys, rs) = (
        DeviceArray::from(d, &x)?,
        DeviceArray::from(d, &w)?,
        DeviceArray::from(d, &dy)?,
        DeviceArray::from(d, &inv_rms)?,
    );
    // dx accumulates: it starts from the residual stream's gradient.
    let dx0 = bf16_values(rng, rows * cols, 1.0);
    let (dxs, dws) = (DeviceArray::from(d, &dx0)?, DeviceArray::from(d, &vec![0f32; cols])?);
    let (dx, dweight, dy, x, weight, inv_rms) = (dxs.ptr(), dws.ptr(), dys.ptr(), xs.ptr(), ws.ptr(), rs.ptr());
    let call = k::RmsnormBackward { dx, dweight, dy, x, weight, inv_rms, rows: rows as u64, cols: cols as u64 };
    // Blocks summing several rows each, and blocks narrow enough that some rows do not fit the
    // kernel's registers (its per-element atomics), as well as a row a block.
    let (blocks, threads) = (1 + rng.below(rows), [64, 128, 256][rng.below(3)]);
    run_shaped(d, &call, [blocks as u32, 1, 1], threads)?;
    let (mut want_dx, mut dx_scale, mut want_dw, mut dw_scale) =
        (Vec::new(), Vec::new(), vec![0.0; cols], vec![0.0; cols]);
    for (xr, dyr) in xf.chunks(cols).zip(dyf.chunks(cols)) {
        let (dx, dw) = reference::rmsnorm_backward(dyr, xr, &wf, f64::from(EPS));
        want_dx.extend(dx);
        dx_scale.extend(cancelled_terms(dyr, xr, &wf));
        for c in 0..cols {
            want_dw[c] += dw[c];
            dw_scale[c] += dw[c].abs();
        }
    }
    for ((want, scale), &start) in want_dx.iter_mut().zip(&mut dx_scale).zip(&widen(&dx0)) {
        *want += start;
        *scale += start.abs();
    }
    v.bf16_scaled("dx", &dxs.read()?, &want_dx, &dx_scale);
    v.f32("dweight", &dws.read()?, &want_dw, &dw_scale);
    Ok(())
}

/// The magnitudes RMSNorm's `dx = r·(g − x·r²·mean(g·x))` cancels: `r·(|g| + |x|·r²·mean|g·x|)`.
fn cancelled_terms(dy: &[f64], x: &[f64], weight: &[f64]) -> Vec<f64> {
    let (_, r) = reference::rmsnorm(x, weight, f64::from(EPS));
    let g: Vec<f64> = dy.iter().zip(weight).map(|(d, w)| d * w).collect();
    let mean_gx = g.iter().zip(x).map(|(g, x)| (g * x).abs()).sum::<f64>() / x.len() as f64;
    g.iter().zip(x).map(|(g, x)| r * (g.abs() + x.abs() * r * r * mean_gx)).collect()
}

/// A fused gate/up product `gu[R, 2F]` of random rows and width (gates over ±4, ups over ±2),
/// and its gates and ups apart, widened.
fn gate_up(rng: &mut Rng) -> (usize, usize, Vec<u16>, Vec<f64>, Vec<f64>) {
    let (rows, f) = (1 + rng.below(9), row_width(rng));
    let gu: Vec<u16> = (0..rows).flat_map(|_| [bf16_values(rng, f, 4.0), bf16_values(rng, f, 2.0)].concat()).collect();
    let wide = widen(&gu);
    let (g, u) = wide
        .chunks(2 * f)
        .map(|row| row.split_at(f))
        .map(|(g, u)| (g.to_vec(), u.to_vec()))
        .unzip::<_, _, Vec<_>, Vec<_>>();
    (rows, f, gu, g.concat(), u.concat())
}

fn check_swiglu_forward(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, f, gu, g, u) = gate_up(rng);
    let n = rows * f;
    let (gus, outs) = (DeviceArray::from(d, &gu)?, DeviceArray::from(d, &vec![0u16; n])?);
    run(d, &k::SwigluForward { out: outs.ptr(), gu: gus.ptr(), rows: rows as u64, f: f as u64 }, elementwise_grid(n))?;
    let want: Vec<f64> = g.iter().zip(&u).map(|(g, u)| reference::swiglu(*g, *u)).collect();
    v.bf16("out", &outs.read()?, &want);
    Ok(())
}

fn check_swiglu_backward(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, f, gu, g, u) = gate_up(rng);
    let n = rows * f;
    let dout = bf16_values(rng, n, 1.0);
    let (gus, ds, dgus) =
        (DeviceArray::from(d, &gu)?, DeviceArray::from(d, &dout)?, DeviceArray::from(d, &vec![0u16; 2 * n])?);
    let call = k::SwigluBackward { dgu: dgus.ptr(), dout: ds.ptr(), gu: gus.ptr(), rows: rows as u64, f: f as u64 };
    run(d, &call, elementwise_grid(n))?;
    let df = widen(&dout);
    // The reference laid out as the kernel writes it: each row's gate gradients, then its up's.
    let want: Vec<f64> = (0..rows)
        .flat_map(|r| {
            let grads: Vec<(f64, f64)> = (r * f..(r + 1) * f).map(|i| reference::swiglu_backward(g[i], u[i])).collect();
            let scaled = |pick: fn(&(f64, f64)) -> f64| -> Vec<f64> {
                grads.iter().zip(&df[r * f..(r + 1) * f]).map(|(gr, d)| pick(gr) * d).collect()
            };
            [scaled(|gr| gr.0), scaled(|gr| gr.1)].concat()
        })
        .collect();
    v.bf16("dgu", &dgus.read()?, &want);
    Ok(())
}

fn check_residual_add(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let n = length(rng, 20_000);
    let (x, y) = (bf16_values(rng, n, 3.0), bf16_values(rng, n, 3.0));
    let (xs, ys) = (DeviceArray::from(d, &x)?, DeviceArray::from(d, &y)?);
    run(d, &k::ResidualAdd { x: xs.ptr(), y: ys.ptr(), n: n as u64 }, elementwise_grid(n))?;
    let want: Vec<f64> = widen(&x).iter().zip(widen(&y)).map(|(a, b)| a + b).collect();
    v.bf16("x", &xs.read()?, &want);
    Ok(())
}

/// Statistics an earlier vocabulary chunk left for `fold` to merge into: a row maximum, a sum
/// of exponentials relative to it (at least the maximum's own 1), and the target's logit where
/// that chunk held it: −inf where the target is in this chunk, sometimes where the rank holds
/// only a shard (the target may be in another rank's), never where it holds the whole vocabulary.
fn earlier_chunk(rng: &mut Rng, held_here: bool, whole: bool) -> (f64, f64, f64) {
    let max = f64::from(bf16_to_f32(f32_to_bf16((12.0 * uniform(rng)) as f32)));
    let sum = f64::from((1.0 + 3000.0 * uniform(rng).abs()) as f32);
    let elsewhere = held_here || (!whole && rng.below(2) == 0);
    let target = if elsewhere { f64::NEG_INFINITY } else { max - 4.0 * uniform(rng).abs() };
    (max, sum, f64::from(target as f32))
}

/// The online-softmax merge `nereus_logits_row_stats` makes when folding: `(max, sum, target)`
/// of an earlier chunk and of this one.
fn merged((m0, s0, t0): (f64, f64, f64), (m, s, t): (f64, f64, f64)) -> (f64, f64, f64) {
    let max = m0.max(m);
    (max, s0 * (m0 - max).exp() + s * (m - max).exp(), if t.is_finite() { t } else { t0 })
}

fn check_row_stats(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, cols) = (1 + rng.below(9), length(rng, 50_000));
    // Half the cases hold the whole vocabulary (no TP), where the kernel also writes each row's
    // log-sum-exp and log-prob; the others a shard, with half the targets before or after it.
    // Half fold the shard into an earlier chunk's statistics (the fused head's later chunks).
    let (whole, fold) = (rng.below(2) == 0, rng.below(2) == 0);
    let shard_start = if whole && !fold { 0 } else { rng.below(100_000) as i64 };
    let logits = bf16_values(rng, rows * cols, 8.0);
    let targets: Vec<i32> = (0..rows)
        .map(|_| match rng.below(4) {
            0 if !whole || fold => (shard_start - 1 - rng.below(50) as i64).max(0) as i32,
            1 if !whole || fold => (shard_start + cols as i64 + rng.below(50) as i64) as i32,
            _ => (shard_start + rng.below(cols) as i64) as i32,
        })
        .collect();
    let chunk: Vec<(f64, f64, f64)> = widen(&logits)
        .chunks(cols)
        .zip(&targets)
        .map(|(row, &t)| reference::row_stats(row, i64::from(t), shard_start))
        .collect();
    let earlier: Vec<(f64, f64, f64)> = chunk.iter().map(|c| earlier_chunk(rng, c.2.is_finite(), whole)).collect();
    let f32s = |f: fn(&(f64, f64, f64)) -> f64| -> Vec<f32> { earlier.iter().map(|e| f(e) as f32).collect() };
    let (ls, ts) = (DeviceArray::from(d, &logits)?, DeviceArray::from(d, &targets)?);
    let (maxs, sums, tls) = (
        DeviceArray::from(d, &f32s(|e| e.0))?,
        DeviceArray::from(d, &f32s(|e| e.1))?,
        DeviceArray::from(d, &f32s(|e| e.2))?,
    );
    let (lses, logps) = (DeviceArray::from(d, &vec![0f32; rows])?, DeviceArray::from(d, &vec![0f32; rows])?);
    let call = k::LogitsRowStats {
        row_max: maxs.ptr(),
        row_sum: sums.ptr(),
        target_logit: tls.ptr(),
        lse: if whole { lses.ptr() } else { DevicePtr::NULL },
        logp: if whole { logps.ptr() } else { DevicePtr::NULL },
        logits: ls.ptr(),
        targets: ts.ptr(),
        rows: rows as u64,
        cols: cols as u64,
        shard_start: shard_start as u64,
        fold: i32::from(fold),
    };
    run(d, &call, rows as u64)?;
    let stats: Vec<(f64, f64, f64)> =
        if fold { earlier.iter().zip(&chunk).map(|(&e, &c)| merged(e, c)).collect() } else { chunk };
    let none = vec![0.0; rows];
    v.f32("row_max", &maxs.read()?, &stats.iter().map(|s| s.0).collect::<Vec<_>>(), &none);
    // Σexp's terms are each ≤ 1, so the sum of magnitudes is the sum itself.
    v.f32("row_sum", &sums.read()?, &stats.iter().map(|s| s.1).collect::<Vec<_>>(), &none);
    v.f32("target_logit", &tls.read()?, &stats.iter().map(|s| s.2).collect::<Vec<_>>(), &none);
    if whole {
        let lse: Vec<f64> = stats.iter().map(|&(max, sum, _)| max + sum.ln()).collect();
        let logp: Vec<f64> = stats.iter().zip(&lse).map(|(s, l)| s.2 - l).collect();
        v.f32("lse", &lses.read()?, &lse, &none);
        // The difference of two values of |lse|'s size: lse's rounding is the scale.
        v.f32("logp", &logps.read()?, &logp, &lse.iter().map(|l| l.abs()).collect::<Vec<_>>());
    }
    Ok(())
}

fn check_cross_entropy(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (seq_len, sequences) = (1 + length(rng, 300), 1 + rng.below(4));
    let rows = seq_len * sequences;
    let logp: Vec<f32> = (0..rows).map(|_| (-12.0 * uniform(rng).abs()) as f32).collect();
    let (inv_count, start) = ((1.0 / (1.0 + rng.below(5000) as f64)) as f32, uniform(rng) as f32);
    let (logps, dlogps, loss) =
        (DeviceArray::from(d, &logp)?, DeviceArray::from(d, &vec![7f32; rows])?, DeviceArray::from(d, &[start])?);
    let call = k::CrossEntropy {
        dlogp: dlogps.ptr(),
        loss: loss.ptr(),
        logp: logps.ptr(),
        rows: rows as u64,
        seq_len: seq_len as u64,
        inv_count,
    };
    run(d, &call, 1)?;
    let inv = f64::from(inv_count);
    let counted = |r: usize| r % seq_len != seq_len - 1;
    let dlogp: Vec<f64> = (0..rows).map(|r| if counted(r) { -inv } else { 0.0 }).collect();
    let terms: Vec<f64> = (0..rows).filter(|&r| counted(r)).map(|r| -f64::from(logp[r]) * inv).collect();
    let want = f64::from(start) + terms.iter().sum::<f64>();
    v.f32("dlogp", &dlogps.read()?, &dlogp, &vec![0.0; rows]);
    // Every term is positive: their sum is the sum of magnitudes.
    v.f32("loss", &loss.read()?, &[want], &[f64::from(start).abs() + terms.iter().sum::<f64>()]);
    Ok(())
}

fn check_adamw(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let step = 1 + rng.below(1000) as i32;
    let (beta1, beta2) = (0.9f32, 0.95f32);
    let a = AdamStep {
        lr: 1e-3,
        beta1: f64::from(beta1),
        beta2: f64::from(beta2),
        eps: 1e-8,
        weight_decay: 0.0,
        c1: 1.0 - f64::from(beta1).powi(step),
        c2: 1.0 - f64::from(beta2).powi(step),
    };
    // One to four tensors in one launch, with their own sizes and weight decays.
    let tensors: Vec<AdamCase> = (0..1 + rng.below(4)).map(|_| AdamCase::draw(rng)).collect();
    let mut buffers = Vec::new();
    let mut table = Vec::new();
    for t in &tensors {
        // Each array starts `offsets[i]` elements into its buffer (the vector runs' alignment).
        let at = |i: usize, values: &[f32]| DeviceArray::from(d, &[vec![0.0; t.offsets[i]], values.to_vec()].concat());
        let bufs = [at(0, &t.p)?, at(1, &t.m)?, at(2, &t.v)?, at(3, &t.g)?];
        let work = DeviceArray::from(d, &vec![0u16; t.offsets[4] + t.p.len()])?;
        let ptr = |i: usize, base: DevicePtr, bytes: usize| base.0 + (bytes * t.offsets[i]) as u64;
        let [p, m, vv, g] = [0, 1, 2, 3].map(|i| ptr(i, bufs[i].ptr(), 4));
        table.push(AdamTensor {
            param: p,
            m,
            v: vv,
            working: ptr(4, work.ptr(), 2),
            grad: g,
            n: t.p.len() as u64,
            weight_decay: t.decay as f32,
            pad: 0,
        });
        buffers.push((bufs, work));
    }
    let table_buffer = DeviceArray::from(d, &table)?;
    let grid = elementwise_grid(tensors.iter().map(|t| t.p.len()).max().unwrap_or(1));
    // A clipped step one time in two: the kernel scales each gradient by the factor.
    let clip = [1.0f32, 0.37][rng.below(2)];
    let [lr, beta1, beta2, eps, c1, c2, clip] =
        [a.lr, a.beta1, a.beta2, a.eps, a.c1, a.c2, f64::from(clip)].map(|x| x as f32);
    let call = k::Adamw { tensors: table_buffer.ptr(), count: table.len() as i32, lr, beta1, beta2, eps, c1, c2, clip };
    run(d, &call, grid)?;
    for (t, (bufs, work)) in tensors.iter().zip(&buffers) {
        t.compare(&AdamStep { weight_decay: t.decay, ..a }, f64::from(clip), bufs, work, v)?;
    }
    Ok(())
}

/// One tensor of the AdamW check: master weights, moments, gradient and weight decay, and how
/// many elements into its buffer each array (the four f32 ones, then the working copy) starts.
struct AdamCase {
    p: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    decay: f64,
    offsets: [usize; 5],
}

impl AdamCase {
    fn draw(rng: &mut Rng) -> AdamCase {
        let n = length(rng, 8_000);
        let mut draw = |scale: f64| -> Vec<f32> { (0..n).map(|_| (uniform(rng) * scale) as f32).collect() };
        let (p, m, g) = (draw(1.0), draw(1e-2), draw(1e-1));
        let v = draw(1e-2).iter().map(|x| x * x).collect();
        // Most tensors start at one offset in every array (vectors after a head of up to three
        // elements); some at offsets of their own (one element at a time).
        let shared = rng.below(4);
        let offsets = [0; 5].map(|_| if rng.below(4) == 0 { rng.below(4) } else { shared });
        AdamCase { p, m, v, g, decay: [0.0, 0.1][rng.below(2)], offsets }
    }

    /// The kernel's master, moments and working copy against the f64 update.
    fn compare(
        &self,
        a: &AdamStep,
        clip: f64,
        bufs: &[DeviceArray<'_, f32>; 4],
        work: &DeviceArray<'_, u16>,
        v: &mut Verdict,
    ) -> Result<(), BackendError> {
        let n = self.p.len();
        let want: Vec<(f64, f64, f64)> = (0..n)
            .map(|i| {
                let f = |x: &[f32]| f64::from(x[i]);
                reference::adamw(a, f(&self.p), f(&self.m), f(&self.v), clip * f(&self.g))
            })
            .collect();
        // Scales: the magnitudes each line of the update adds (m's two terms may cancel).
        let (mut p_scale, mut m_scale) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (i, w) in want.iter().enumerate() {
            let (pi, gi) = (f64::from(self.p[i]).abs(), f64::from(self.g[i]).abs());
            m_scale.push(a.beta1 * f64::from(self.m[i]).abs() + (1.0 - a.beta1) * gi);
            let step = (w.1 / a.c1).abs() / ((w.2 / a.c2).sqrt() + a.eps) + a.weight_decay * pi;
            p_scale.push(pi + a.lr * step);
        }
        let read = |i: usize| -> Result<Vec<f32>, BackendError> { Ok(bufs[i].read()?[self.offsets[i]..].to_vec()) };
        let got_p = read(0)?;
        v.f32("param", &got_p, &want.iter().map(|w| w.0).collect::<Vec<_>>(), &p_scale);
        v.f32("m", &read(1)?, &want.iter().map(|w| w.1).collect::<Vec<_>>(), &m_scale);
        v.f32("v", &read(2)?, &want.iter().map(|w| w.2).collect::<Vec<_>>(), &vec![0.0; n]);
        let (whole_p, whole_work) = (bufs[0].read()?, work.read()?);
        if whole_p[..self.offsets[0]].iter().any(|x| *x != 0.0) || whole_work[..self.offsets[4]].iter().any(|x| *x != 0)
        {
            v.failures.push(format!("{}: wrote before the tensor (offsets {:?})", v.kernel, self.offsets));
        }
        let working = whole_work[self.offsets[4]..].to_vec();
        if let Some(i) = got_p.iter().zip(&working).position(|(p, w)| f32_to_bf16(*p) != *w) {
            let (got, want) = (working[i], f32_to_bf16(got_p[i]));
            v.failures.push(format!("{}: working[{i}] = {got:#06x}, want bf16({}) = {want:#06x}", v.kernel, got_p[i]));
        }
        Ok(())
    }
}

fn check_logprob_backward(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, cols) = (1 + rng.below(9), length(rng, 5_000));
    let shard_start = rng.below(10_000);
    let logits = bf16_values(rng, rows * cols, 8.0);
    let targets: Vec<i32> = (0..rows).map(|_| (shard_start + rng.below(cols + cols / 4 + 1)) as i32).collect();
    // The global log-sum-exp: this shard's plus the mass of the other shards (drawn).
    let lse: Vec<f32> = widen(&logits)
        .chunks(cols)
        .map(|row| {
            let (max, sum, _) = reference::row_stats(row, 0, 0);
            (max + (sum + (uniform(rng).abs() * 1e3)).ln()) as f32
        })
        .collect();
    let dlogp: Vec<f32> = (0..rows).map(|_| uniform(rng) as f32).collect();
    let (ls, lses, gs, ts) = (
        DeviceArray::from(d, &logits)?,
        DeviceArray::from(d, &lse)?,
        DeviceArray::from(d, &dlogp)?,
        DeviceArray::from(d, &targets)?,
    );
    // Half the cases write the gradient over the logits (the fused head's chunks do).
    let in_place = rng.below(2) == 0;
    let separate = DeviceArray::from(d, &vec![0u16; if in_place { 1 } else { rows * cols }])?;
    let out = if in_place { &ls } else { &separate };
    let [rows_, cols_, shard_start_] = [rows, cols, shard_start].map(|x| x as u64);
    let call = k::LogprobBackward {
        dlogits: out.ptr(),
        logits: ls.ptr(),
        lse: lses.ptr(),
        dlogp: gs.ptr(),
        targets: ts.ptr(),
        rows: rows_,
        cols: cols_,
        shard_start: shard_start_,
    };
    run(d, &call, elementwise_grid(rows * cols))?;
    let (mut want, mut scale) = (Vec::with_capacity(rows * cols), Vec::with_capacity(rows * cols));
    for (r, row) in widen(&logits).chunks(cols).enumerate() {
        let g = f64::from(dlogp[r]);
        for (c, l) in row.iter().enumerate() {
            let p = (l - f64::from(lse[r])).exp();
            let hit = if targets[r] as usize == shard_start + c { 1.0 } else { 0.0 };
            want.push(g * (hit - p));
            scale.push(g.abs() * (hit + p));
        }
    }
    v.bf16_scaled("dlogits", &out.read()?, &want, &scale);
    Ok(())
}

fn check_argmax(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, cols) = (1 + rng.below(9), length(rng, 50_000));
    let mut logits = bf16_values(rng, rows * cols, 8.0);
    // Ties at the maximum: the lowest column must win.
    for row in logits.chunks_mut(cols) {
        let top = row.iter().copied().max_by(|a, b| bf16_to_f32(*a).total_cmp(&bf16_to_f32(*b))).unwrap_or(0);
        for _ in 0..rng.below(3) {
            row[rng.below(cols)] = top;
        }
    }
    let (ls, ts, vs) = (
        DeviceArray::from(d, &logits)?,
        DeviceArray::from(d, &vec![-1i32; rows])?,
        DeviceArray::from(d, &vec![0f32; rows])?,
    );
    let call = k::Argmax { tokens: ts.ptr(), values: vs.ptr(), logits: ls.ptr(), rows: rows as u64, cols: cols as u64 };
    run(d, &call, rows as u64)?;
    let (tokens, values): (Vec<i32>, Vec<f32>) = (ts.read()?, vs.read()?);
    for (r, row) in widen(&logits).chunks(cols).enumerate() {
        let best = (0..cols).fold(0, |b, c| if row[c] > row[b] { c } else { b });
        if tokens[r] != best as i32 || f64::from(values[r]) != row[best] {
            v.failures
                .push(format!("{} row {r}: ({}, {}), want ({best}, {})", v.kernel, tokens[r], values[r], row[best]));
        }
    }
    Ok(())
}

fn check_sum_squares(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let n = length(rng, 200_000);
    let x: Vec<f32> = (0..n).map(|_| (uniform(rng) * 3.0) as f32).collect();
    let blocks = elementwise_grid(n).min(64);
    let (xs, partial, total) = (
        DeviceArray::from(d, &x)?,
        DeviceArray::from(d, &vec![0f32; blocks as usize])?,
        DeviceArray::from(d, &[0f32])?,
    );
    run(d, &k::SumSquares { partial: partial.ptr(), x: xs.ptr(), n: n as u64, square: 1 }, blocks)?;
    run(d, &k::SumSquares { partial: total.ptr(), x: partial.ptr(), n: blocks, square: 0 }, 1)?;
    let want: f64 = x.iter().map(|&e| f64::from(e) * f64::from(e)).sum();
    // Every term is positive: the sum of magnitudes is the sum.
    v.f32("sum", &total.read()?, &[want], &[want]);
    Ok(())
}

fn check_gemm(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (m, k, n) = (length(rng, 150), length(rng, 300), length(rng, 150));
    let op = |rng: &mut Rng| if rng.below(2) == 0 { Op::N } else { Op::T };
    let (op_a, op_b) = (op(rng), op(rng));
    let accumulate = rng.below(2) == 0;
    let out = if rng.below(2) == 0 { GemmOut::Bf16 { accumulate } } else { GemmOut::F32 { accumulate } };
    let g = Gemm { m, k, n, op_a, op_b, out };
    let (a, b) = (bf16_values(rng, m * k, 1.0), bf16_values(rng, k * n, 1.0));
    // The starting C (added to when accumulating), in the output's dtype.
    let c0_bf16 = bf16_values(rng, m * n, 1.0);
    let c0: Vec<f32> = if matches!(out, GemmOut::Bf16 { .. }) {
        c0_bf16.iter().map(|&h| bf16_to_f32(h)).collect()
    } else {
        (0..m * n).map(|_| uniform(rng) as f32).collect()
    };
    let (af, bf) = (widen(&a), widen(&b));
    let at = |i: usize, l: usize| if op_a == Op::N { af[i * k + l] } else { af[l * m + i] };
    let bt = |l: usize, j: usize| if op_b == Op::N { bf[l * n + j] } else { bf[j * k + l] };
    let (mut want, mut scale) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for l in 0..k {
                want[i * n + j] += at(i, l) * bt(l, j);
                scale[i * n + j] += (at(i, l) * bt(l, j)).abs();
            }
            if accumulate {
                want[i * n + j] += f64::from(c0[i * n + j]);
                scale[i * n + j] += f64::from(c0[i * n + j]).abs();
            }
        }
    }
    let (as_, bs) = (DeviceArray::from(d, &a)?, DeviceArray::from(d, &b)?);
    if matches!(out, GemmOut::Bf16 { .. }) {
        let cs = DeviceArray::from(d, &c0_bf16)?;
        // SAFETY: the buffers hold [m,k], [k,n] bf16 and [m,n] bf16.
        unsafe { d.gemm(&g, as_.ptr(), bs.ptr(), cs.ptr())? };
        d.synchronize()?;
        v.bf16_scaled("C", &cs.read()?, &want, &scale);
    } else {
        let cs = DeviceArray::from(d, &c0)?;
        // SAFETY: the buffers hold [m,k], [k,n] bf16 and [m,n] f32.
        unsafe { d.gemm(&g, as_.ptr(), bs.ptr(), cs.ptr())? };
        d.synchronize()?;
        v.f32("C", &cs.read()?, &want, &scale);
    }
    Ok(())
}

fn check_sample(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (rows, cols) = (1 + rng.below(6), length(rng, 12_000));
    let scale = [0.5, 3.0, 12.0][rng.below(3)];
    let mut logits: Vec<f32> = (0..rows * cols).map(|_| (uniform(rng) * scale) as f32).collect();
    // A quarter of the cases put the logits on a coarse grid: long runs of equal p, which the
    // histogram path sorts by id in its window, or (past 2,048 in one bucket) hands to bisection.
    if rng.below(4) == 0 {
        let grid = [0.25f32, 1.0][rng.below(2)];
        logits.iter_mut().for_each(|z| *z = (*z / grid).round() * grid);
    }
    for row in logits.chunks_mut(cols) {
        // Ties, at the top and elsewhere: ids break them.
        let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for _ in 0..rng.below(4) {
            let (a, b) = (rng.below(cols), rng.below(cols));
            row[a] = if rng.below(2) == 0 { top } else { row[b] };
        }
    }
    // Half the cases draw from bf16 logits, as a decode does (the reference reads them widened,
    // which is exact; bf16 makes runs of equal p common).
    let logits_bf16 = rng.below(2) == 0;
    if logits_bf16 {
        logits.iter_mut().for_each(|z| *z = bf16_to_f32(f32_to_bf16(*z)));
    }
    let s = Sampling {
        greedy: rng.below(4) == 0,
        temperature: [0.3f32, 0.7, 1.0, 1.5][rng.below(4)],
        top_p: [1.0f32, 0.95, 0.8, 0.5][rng.below(4)],
        min_p: [0.0f32, 0.0, 0.05, 0.3][rng.below(4)],
        top_k: [0u32, 0, 1, 7, 64][rng.below(5)],
        seed: rng.below(1 << 20) as u64,
        ..host_sampling()
    };
    let pos = rng.below(4096) as u64;
    let ids: Vec<u64> = (0..rows).map(|_| rng.below(1 << 30) as u64).collect();
    let (is, ts) = (DeviceArray::from(d, &ids)?, DeviceArray::from(d, &vec![-1i32; rows])?);
    let narrow: Vec<u16> = logits.iter().map(|&z| f32_to_bf16(z)).collect();
    let (wide, narrow) = (DeviceArray::from(d, &logits)?, DeviceArray::from(d, &narrow)?);
    let ls = if logits_bf16 { narrow.ptr() } else { wide.ptr() };
    let buffers = SampleBuffers { drawn: ts.ptr(), logits: ls, logits_bf16, ids: is.ptr(), done: DevicePtr::default() };
    let call = s.kernel_call(buffers, rows, cols, pos);
    run(d, &call, rows as u64)?;
    let got: Vec<i32> = ts.read()?;
    for (r, row) in logits.chunks(cols).enumerate() {
        let draw = |u: f64, top_p: f32, min_p: f32| sample_token(row, &Sampling { top_p, min_p, ..s }, u) as i32;
        let ur = draw_uniform(s.seed, ids[r], pos);
        if got[r] == draw(ur, s.top_p, s.min_p) {
            continue;
        }
        // f32 trees against f64 sums: a draw within 10⁻⁵ of a boundary may fall either side.
        let (p, m) = (s.top_p, s.min_p);
        let near = [
            (ur * (1.0 - 1e-5), p, m),
            ((ur * (1.0 + 1e-5)).min(1.0), p, m),
            (ur, p * (1.0 - 1e-5), m),
            (ur, (p * (1.0 + 1e-5)).min(1.0), m),
            (ur, p, m * (1.0 - 1e-5)),
            (ur, p, m * (1.0 + 1e-5)),
        ];
        if near.iter().any(|&(u, p, m)| got[r] == draw(u, p, m)) {
            v.worst = v.worst.max(0.5);
        } else {
            v.failures.push(format!(
                "{} row {r}: drew {}, the host draws {} (u {ur}, {s:?})",
                v.kernel,
                got[r],
                draw(ur, p, m)
            ));
        }
    }
    Ok(())
}

/// `nereus_decode_advance` against the host's bookkeeping ([`HostDecoding::advance`]) over a
/// few steps of random draws, stop ids among them: every token, length and flag exactly.
fn check_decode_advance(d: &Device, rng: &mut Rng, v: &mut Verdict) -> Result<(), BackendError> {
    let (b, p) = (1 + rng.below(300), 1 + rng.below(4));
    let shape = DecodeShape { b, p, t_cap: p + 1 + rng.below(6) };
    let stops: Vec<u32> = (0..1 + rng.below(3)).map(|_| rng.below(8) as u32).collect();
    let s = Sampling { eos: stops[0], also_stop: StopIds::new(&stops[1..]).expect("at most four"), ..host_sampling() };
    let prompts: Vec<u32> = (0..b * p).map(|_| 8 + rng.below(50) as u32).collect();
    let mut host = HostDecoding::new(&prompts, &vec![0; b], shape, &s);
    let as_i32 = |x: &[u32]| x.iter().map(|&t| t as i32).collect::<Vec<i32>>();
    let tokens = DeviceArray::from(d, &as_i32(&host.tokens))?;
    let (lengths, done, last) =
        (DeviceArray::<i32>::zeros(d, b)?, DeviceArray::<i32>::zeros(d, b)?, DeviceArray::<i32>::zeros(d, b)?);
    let stop_ids = DeviceArray::from(d, &as_i32(&host.stops))?;
    // Half the cases keep the position in a row counter the kernel moves on (one block).
    let counter = (rng.below(2) == 0).then(|| DeviceArray::from(d, &[p as i32 - 1])).transpose()?;
    for pos in p..shape.t_cap {
        let drawn: Vec<u32> = (0..b).map(|_| rng.below(24) as u32).collect();
        let drawn_ = DeviceArray::from(d, &as_i32(&drawn))?;
        let call = k::DecodeAdvance {
            tokens: tokens.ptr(),
            lengths: lengths.ptr(),
            done: done.ptr(),
            last: last.ptr(),
            drawn: drawn_.ptr(),
            stops: stop_ids.ptr(),
            rows: b as u64,
            t_cap: shape.t_cap as u64,
            pos: if counter.is_some() { 1 } else { pos as u64 },
            n_stops: host.stops.len() as u64,
            eos: s.eos as i32,
            position: attention::counter_arg(&counter),
        };
        run(d, &call, if counter.is_some() { 1 } else { elementwise_grid(b) })?;
        host.advance(&drawn, pos);
    }
    let flags: Vec<i32> = host.done.iter().map(|&x| i32::from(x)).collect();
    let lengths_: Vec<i32> = host.lengths.iter().map(|&x| x as i32).collect();
    let exact = [
        ("tokens", tokens.read()?, as_i32(&host.tokens)),
        ("lengths", lengths.read()?, lengths_),
        ("done", done.read()?, flags),
        ("last", last.read()?, as_i32(&host.last)),
    ];
    if let Some(counter) = &counter {
        let want = shape.t_cap as i32 - 1;
        if counter.read()? != [want] {
            v.failures.push(format!("{}: the row counter holds {:?}, want {want}", v.kernel, counter.read()?));
        }
    }
    for (what, got, want) in exact {
        if got != want && v.failures.len() < 5 {
            v.failures.push(format!("{} {what}: got {got:?}, want {want:?}", v.kernel));
        }
    }
    Ok(())
}

/// Sampling settings of the checks (only the fields a check sets differ).
fn host_sampling() -> Sampling {
    Sampling {
        temperature: 1.0,
        top_p: 1.0,
        min_p: 0.0,
        top_k: 0,
        max_new_tokens: 1,
        eos: 0,
        also_stop: StopIds::NONE,
        greedy: false,
        seed: 0,
        stop_check_every: 1,
    }
}

/// Largest disagreement of the f64 backward references with central differences on seeded
/// random rows.
fn finite_differences(seed: u64) -> f64 {
    let mut rng = Rng::new(nereus_core::rng::mix(seed ^ 0xfd));
    let mut worst = 0.0f64;
    for _ in 0..CASES {
        let cols = 1 + rng.below(64);
        let draw = |rng: &mut Rng| -> Vec<f64> { (0..cols).map(|_| uniform(rng) * 2.0).collect() };
        let (x, w, dy) = (draw(&mut rng), draw(&mut rng), draw(&mut rng));
        let eps = f64::from(EPS);
        let (dx, dw) = reference::rmsnorm_backward(&dy, &x, &w, eps);
        let dot = |y: Vec<f64>| y.iter().zip(&dy).map(|(a, b)| a * b).sum::<f64>();
        for i in 0..cols {
            let numeric_x = reference::central_difference(&x, i, |x| dot(reference::rmsnorm(x, &w, eps).0));
            let numeric_w = reference::central_difference(&w, i, |w| dot(reference::rmsnorm(&x, w, eps).0));
            worst = worst.max(reference::fd_error(dx[i], numeric_x)).max(reference::fd_error(dw[i], numeric_w));
            let (dg, du) = reference::swiglu_backward(x[i], w[i]);
            let numeric_g = reference::central_difference(&x, i, |g| reference::swiglu(g[i], w[i]));
            let numeric_u = reference::central_difference(&w, i, |u| reference::swiglu(x[i], u[i]));
            worst = worst.max(reference::fd_error(dg, numeric_g)).max(reference::fd_error(du, numeric_u));
        }
        worst = worst.max(attention::attention_finite_differences(&mut rng));
    }
    worst
}
