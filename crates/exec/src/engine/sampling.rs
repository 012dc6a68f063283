//! How responses are sampled: the settings ([`Sampling`], [`StopIds`]), the counter-based draws
//! ([`draw_uniform`]) and the host's draw of one token from a row of logits ([`sample_token`],
//! the reference a device's sampler is checked against).

use serde::{Deserialize, Serialize};

use nereus_core::rng::mix;
use nereus_kernels::args as k;
use nereus_kernels::DevicePtr;

/// How responses are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Softmax temperature.
    pub temperature: f32,
    /// Nucleus: sample among the most likely candidates whose probabilities sum to at least this
    /// share of the candidates' (Holtzman et al., 2020, arXiv:1904.09751).
    pub top_p: f32,
    /// Min-p: candidates have at least this probability relative to the most likely token's
    /// (Nguyen et al., 2024, arXiv:2407.01082); 0 turns it off.
    pub min_p: f32,
    /// Top-k: at most this many candidates, the most likely (Fan et al., 2018,
    /// arXiv:1805.04833); 0 turns it off.
    pub top_k: u32,
    /// Longest response.
    pub max_new_tokens: usize,
    /// End-of-sequence token (also the padding after a response ends).
    pub eos: u32,
    /// Further ids a response ends at (Llama 3 and Qwen models stop at several).
    pub also_stop: StopIds,
    /// Take the most likely token instead of sampling (ReMax's baseline rollout).
    pub greedy: bool,
    /// Seed of the draws.
    pub seed: u64,
    /// How often, in token steps, a device's host reads whether every sequence has finished
    /// (one wait each time; between reads no token step waits, and the steps after the last
    /// sequence ends cost a little compute). The host engine checks every step, except under
    /// TP on one stage, where every rank draws and the ranks check together at this cadence.
    pub stop_check_every: usize,
}

/// Up to four more token ids a response stops at, beside [`Sampling::eos`] (a fixed array, so
/// that [`Sampling`] stays `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StopIds {
    ids: [u32; 4],
    len: u8,
}

impl StopIds {
    /// No further stop ids.
    pub const NONE: StopIds = StopIds { ids: [0; 4], len: 0 };

    /// `ids` (at most four), or `None` when there are more.
    pub fn new(ids: &[u32]) -> Option<StopIds> {
        let mut stop = StopIds::NONE;
        for &id in ids {
            *stop.ids.get_mut(stop.len as usize)? = id;
            stop.len += 1;
        }
        Some(stop)
    }

    /// The ids.
    pub fn as_slice(&self) -> &[u32] {
        &self.ids[..self.len as usize]
    }
}

/// The device buffers one launch of the sampler kernel works on ([`Sampling::kernel_call`]).
#[derive(Debug, Clone, Copy)]
pub struct SampleBuffers {
    /// `[rows]` i32: the drawn tokens.
    pub drawn: DevicePtr,
    /// `[rows, v]` logits, f32 or bf16.
    pub logits: DevicePtr,
    /// Whether `logits` are bf16 (a decode's own) rather than f32.
    pub logits_bf16: bool,
    /// `[rows]` u64: each row's sequence id (its draws' counter).
    pub ids: DevicePtr,
    /// `[rows]` flags of finished rows, which draw nothing (null: none is finished).
    pub done: DevicePtr,
}

impl Sampling {
    /// The sampler kernel's call (`kernels/device/sample.cu`) drawing one token for each of
    /// `rows` rows of `v` logits at position `pos` under these settings: the one place the
    /// settings become the kernel's arguments (the engine, its tests and the kernel selftest).
    pub fn kernel_call(&self, b: SampleBuffers, rows: usize, v: usize, pos: u64) -> k::Sample {
        k::Sample {
            drawn: b.drawn,
            logits: b.logits,
            ids: b.ids,
            done: b.done,
            rows: rows as u64,
            v: v as u64,
            seed: self.seed,
            pos,
            temperature: self.temperature,
            top_p: self.top_p,
            min_p: self.min_p,
            top_k: u64::from(self.top_k),
            greedy: i32::from(self.greedy),
            logits_bf16: i32::from(b.logits_bf16),
            position: DevicePtr::NULL,
        }
    }
}

/// The uniform draw in `[0, 1)` of sequence `id` at position `pos`: SplitMix64's finalizer
/// chained over the three counters, its top 24 bits over 2^24 (exact in f32, so a device's
/// sampler, `nereus_draw_uniform` in `kernels/device/sample.cu`, draws the same value).
pub fn draw_uniform(seed: u64, id: u64, pos: u64) -> f64 {
    let bits = mix(mix(seed ^ mix(id)) ^ pos);
    (bits >> 40) as f64 / (1u64 << 24) as f64
}

/// Picks a token from `logits` with the uniform draw `u ∈ [0, 1)`: greedy takes the arg-max
/// (lowest index on ties); otherwise softmax at `temperature`; in the order of probability (ties
/// by lower index) the candidates are the longest prefix whose probabilities are at least
/// `min_p` times the largest and which holds at most `top_k` tokens; keep the shortest prefix
/// of the candidates whose mass reaches `top_p` of theirs, and invert its cumulative
/// distribution at `u`.
pub fn sample_token(logits: &[f32], s: &Sampling, u: f64) -> u32 {
    let argmax = (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best });
    if s.greedy || s.temperature <= 0.0 {
        return argmax as u32;
    }
    let t = f64::from(s.temperature);
    let max = f64::from(logits[argmax]);
    let mut probs: Vec<(usize, f64)> =
        logits.iter().enumerate().map(|(i, &z)| (i, ((f64::from(z) - max) / t).exp())).collect();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    // The most likely token has probability 1 here (its logit is the maximum).
    let mut candidates = probs.iter().take_while(|p| p.1 >= f64::from(s.min_p)).count().max(1);
    if s.top_k > 0 {
        candidates = candidates.min(s.top_k as usize);
    }
    let total: f64 = probs[..candidates].iter().map(|p| p.1).sum();
    let (mut kept, mut mass) = (0, 0.0);
    while kept < candidates && (kept == 0 || mass < f64::from(s.top_p) * total) {
        mass += probs[kept].1;
        kept += 1;
    }
    let target = u.clamp(0.0, 1.0) * mass;
    let mut acc = 0.0;
    for &(i, p) in &probs[..kept] {
        acc += p;
        if target < acc {
            return i as u32;
        }
    }
    probs[kept - 1].0 as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32, top_p: f32) -> Sampling {
        Sampling {
            temperature,
            top_p,
            min_p: 0.0,
            top_k: 0,
            max_new_tokens: 4,
            eos: 0,
            also_stop: StopIds::NONE,
            greedy: false,
            seed: 1,
            stop_check_every: 1,
        }
    }

    #[test]
    fn sampling_inverts_the_nucleus_distribution() {
        // Probabilities ∝ e^{0}, e^{ln 2}, e^{ln 5}: 1/8, 2/8, 5/8.
        let logits = [0.0, 2f32.ln(), 5f32.ln()];
        let s = sampling(1.0, 1.0);
        assert_eq!(sample_token(&logits, &s, 0.0), 2);
        assert_eq!(sample_token(&logits, &s, 0.62), 2);
        assert_eq!(sample_token(&logits, &s, 0.63), 1);
        assert_eq!(sample_token(&logits, &s, 0.9), 0);
        // top_p = 0.8 keeps {2, 1} (mass 7/8): u = 0.9 lands in token 1.
        assert_eq!(sample_token(&logits, &sampling(1.0, 0.8), 0.9), 1);
        assert_eq!(sample_token(&logits, &Sampling { greedy: true, ..s }, 0.9), 2);
        // top_k = 2 keeps {2, 1} too; min_p = 0.3 keeps p ≥ 0.3 × 5/8: {2, 1} again.
        assert_eq!(sample_token(&logits, &Sampling { top_k: 2, ..s }, 0.9), 1);
        assert_eq!(sample_token(&logits, &Sampling { min_p: 0.3, ..s }, 0.9), 1);
        // top_k = 1 is greedy; top_p = 0.5 of the two candidates {2, 1} keeps {2} alone.
        assert_eq!(sample_token(&logits, &Sampling { top_k: 1, ..s }, 0.99), 2);
        assert_eq!(sample_token(&logits, &Sampling { top_k: 2, top_p: 0.5, ..s }, 0.99), 2);
    }

    #[test]
    fn draws_are_uniform_on_the_unit_interval() {
        // Ten bins over 20,000 draws of distinct (id, pos): each holds 2,000 ± 5σ (σ ≈ 42).
        let mut bins = [0u32; 10];
        for id in 0..200 {
            for pos in 0..100 {
                let u = draw_uniform(7, id, pos);
                assert!((0.0..1.0).contains(&u), "{u}");
                assert_eq!(u, f64::from(u as f32), "a draw is exact in f32");
                bins[(u * 10.0) as usize] += 1;
            }
        }
        assert!(bins.iter().all(|&n| n.abs_diff(2000) < 210), "{bins:?}");
    }
}
