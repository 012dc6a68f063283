//! The device sampler's distribution (`nereus_sample` under the grid emulator) against the host
//! reference's (`sample_token`): many draws of one row, seeded by sequence id and position as a
//! decode seeds them, and a chi-square test of their counts against the nucleus probabilities
//! the host defines. The seeds here are the test's own (not those the engine tests use).

use crate::backend::emulated::Emulated;
use crate::backend::gpu::{Device, DeviceArray};
use crate::engine::sampling::{draw_uniform, sample_token, SampleBuffers, Sampling, StopIds};
use nereus_kernels::grid::WarpWidth;

/// The probability of each token under `s` as [`sample_token`] defines it: softmax at the
/// temperature; the candidates, the most likely tokens (ties by id) at least `min_p` times
/// the largest and at most `top_k` of them; then the shortest prefix of the candidates reaching
/// `top_p` of their mass (written again here from the definition, not from `sample_token`).
fn nucleus_probabilities(logits: &[f32], s: &Sampling) -> Vec<f64> {
    let t = f64::from(s.temperature);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f64> = logits.iter().map(|&z| ((f64::from(z) - f64::from(max)) / t).exp()).collect();
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    order.retain(|&i| p[i] >= f64::from(s.min_p));
    if s.top_k > 0 {
        order.truncate(s.top_k as usize);
    }
    let total: f64 = order.iter().map(|&i| p[i]).sum();
    let (mut kept, mut mass) = (vec![0.0; p.len()], 0.0);
    for &i in &order {
        if mass >= f64::from(s.top_p) * total && mass > 0.0 {
            break;
        }
        kept[i] = p[i];
        mass += p[i];
    }
    kept.iter().map(|&q| q / mass).collect()
}

/// The upper 0.1% point of the chi-square distribution with `df` degrees of freedom
/// (Wilson–Hilferty: within 1% of the tables for `df ≥ 3`).
fn chi_square_critical(df: f64) -> f64 {
    let z = 3.0902; // the normal's upper 0.1% point
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Draws `n` tokens from `logits` on `device`, sequence ids `0..n` at position `pos`.
fn device_draws(device: &Device, logits: &[f32], s: &Sampling, n: usize, pos: u64) -> Vec<i32> {
    let rows: Vec<f32> = (0..n).flat_map(|_| logits.iter().copied()).collect();
    let ids: Vec<u64> = (0..n as u64).collect();
    let (l, i) = (DeviceArray::from(device, &rows).unwrap(), DeviceArray::from(device, &ids).unwrap());
    let drawn = DeviceArray::<i32>::zeros(device, n).unwrap();
    let buffers = SampleBuffers {
        drawn: drawn.ptr(),
        logits: l.ptr(),
        logits_bf16: false,
        ids: i.ptr(),
        done: Default::default(),
    };
    let call = s.kernel_call(buffers, n, logits.len(), pos);
    let lanes = device.runtime().warp_width();
    // SAFETY: the buffers hold [n, V] logits, n ids and n draws.
    unsafe { device.launch(&call, [n.min(4096) as u32, 1, 1], [lanes, 1, 1]).unwrap() };
    drawn.read().unwrap()
}

#[test]
fn the_device_sampler_draws_the_host_references_distribution() {
    let n = 3000;
    let logits: [f32; 12] = [2.0, 1.5, 1.5, 0.25, -0.5, 1.0, 3.0, 0.0, -2.0, 2.5, 0.75, -1.0];
    // (temperature, top-p, min-p, top-k, seed): each cut alone, and all of them at once.
    let cases = [
        (1.0f32, 1.0f32, 0.0f32, 0u32, 901u64),
        (0.7, 0.9, 0.0, 0, 902),
        (1.6, 0.75, 0.0, 0, 903),
        (1.0, 1.0, 0.2, 0, 904),
        (1.3, 1.0, 0.0, 5, 905),
        (1.5, 0.9, 0.05, 7, 906),
    ];
    for (case, (temperature, top_p, min_p, top_k, seed)) in cases.into_iter().enumerate() {
        let warp = WarpWidth::ALL[case % 2];
        let device = Device::new(Emulated::new(0, 1 << 30).with_warp(warp)).unwrap();
        let s = Sampling {
            temperature,
            top_p,
            min_p,
            top_k,
            max_new_tokens: 1,
            eos: 0,
            also_stop: StopIds::NONE,
            greedy: false,
            seed,
            stop_check_every: 1,
        };
        let pos = 17;
        let drawn = device_draws(&device, &logits, &s, n, pos);
        let probs = nucleus_probabilities(&logits, &s);
        let mut counts = vec![0usize; logits.len()];
        for (id, &token) in drawn.iter().enumerate() {
            let t = usize::try_from(token).expect("a token id");
            assert!(probs[t] > 0.0, "case {case}: drew {t}, outside the nucleus");
            // The host draws the same token from the same counters (no draw lands this close
            // to a boundary here, so f32 block sums and f64 sorted sums agree).
            assert_eq!(
                token as u32,
                sample_token(&logits, &s, draw_uniform(seed, id as u64, pos)),
                "case {case}, draw {id}"
            );
            counts[t] += 1;
        }
        let kept: Vec<usize> = (0..logits.len()).filter(|&i| probs[i] > 0.0).collect();
        let chi2: f64 = kept
            .iter()
            .map(|&i| {
                let expected = probs[i] * n as f64;
                (counts[i] as f64 - expected).powi(2) / expected
            })
            .sum();
        let df = (kept.len() - 1) as f64;
        assert!(
            chi2 < chi_square_critical(df),
            "case {case}: χ² {chi2:.1} over {df} df; counts {counts:?}, p {probs:?}"
        );
    }
}
