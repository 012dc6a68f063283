//! The synthetic task: continue an arithmetic sequence over the symbols `1..vocab` (wrapping),
//! with a verifiable reward. A prompt is `P` consecutive terms `a, a+k, a+2k, …` (`k ∈ {1,2,3}`);
//! a response earns `correct terms / cap` if it is nothing but correct next terms followed by
//! EOS (or cut at the length limit), and 0 if it contains a wrong term. Token 0 is EOS.
//!
//! The actor starts from a short supervised warm-up (1–3 correct terms, then EOS), so it learns
//! the format and the rule but stops early; RL then pays for every extra correct term, and the
//! response length grows as the policy learns — the sequence-length drift the runtime absorbs.

use serde::{Deserialize, Serialize};

use crate::engine::init::uniform;

/// End of sequence (and padding after it).
pub const EOS: u32 = 0;

/// The arithmetic-continuation task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArithmeticTask {
    /// Prompt terms `P`.
    pub prompt_len: usize,
    /// Vocabulary size (symbols are `1..vocab`).
    pub vocab: u32,
    /// Correct terms that earn the full reward.
    pub cap: usize,
}

impl ArithmeticTask {
    fn symbols(&self) -> u32 {
        self.vocab - 1
    }

    fn term(&self, start: u32, step: u32, i: usize) -> u32 {
        (start - 1 + step * i as u32) % self.symbols() + 1
    }

    /// `(start, step)` of prompt number `index` of a job seeded `seed`.
    fn draw(&self, seed: u64, index: u64) -> (u32, u32) {
        let u = |k: u64| (uniform(seed ^ 0x7A5C, index, k) + 1.0) / 2.0;
        let start = 1 + (u(0) * f64::from(self.symbols())) as u32 % self.symbols();
        let step = 1 + (u(1) * 3.0) as u32 % 3;
        (start, step)
    }

    /// Prompt number `index`: `P` terms.
    pub fn prompt(&self, seed: u64, index: u64) -> Vec<u32> {
        let (start, step) = self.draw(seed, index);
        (0..self.prompt_len).map(|i| self.term(start, step, i)).collect()
    }

    /// The correct continuation of `prompt` (its next `n` terms).
    pub fn continuation(&self, prompt: &[u32], n: usize) -> Vec<u32> {
        let p = prompt.len();
        let step = (prompt[p - 1] + self.symbols() - prompt[p - 2]) % self.symbols();
        (1..=n).map(|i| (prompt[p - 1] - 1 + step * i as u32) % self.symbols() + 1).collect()
    }

    /// Correct terms at the start of `response` (stopping at a mistake or EOS), at most the cap.
    pub fn correct_terms(&self, prompt: &[u32], response: &[u32]) -> usize {
        let want = self.continuation(prompt, self.cap);
        response.iter().zip(&want).take_while(|(got, want)| got == want).count()
    }

    /// The verifiable reward in `[0, 1]`: the share of the cap in correct terms, for a response
    /// that is correct terms only (then EOS, or cut at the length limit); 0 otherwise.
    pub fn reward(&self, prompt: &[u32], response: &[u32]) -> f32 {
        let k = self.correct_terms(prompt, response);
        let clean = response.len() == k || (response.len() == k + 1 && response[k] == EOS) || k == self.cap;
        if clean {
            k as f32 / self.cap as f32
        } else {
            0.0
        }
    }

    /// A warm-up answer: mostly short (1–3 correct terms, EOS); one in eight is long (4 up to the
    /// cap), so the rule is seen at every position while short answers stay the habit.
    pub fn warmup_response(&self, prompt: &[u32], index: u64) -> Vec<u32> {
        let k = if index % 8 == 7 {
            4 + (uniform(0x10C, index, 0).abs() * (self.cap.saturating_sub(3)) as f64) as usize
        } else {
            1 + (index % 3) as usize
        };
        let mut r = self.continuation(prompt, k.min(self.cap));
        if r.len() < self.cap {
            r.push(EOS);
        }
        r
    }

    /// A reward-model training response of at most `max_len` tokens: `k` correct terms (`k`
    /// uniform over `0..=max_len`), then EOS, or a wrong term and random symbols then EOS.
    pub fn graded_response(&self, prompt: &[u32], seed: u64, index: u64, max_len: usize) -> Vec<u32> {
        let u = |k: u64| (uniform(seed ^ 0x5EED, index, k) + 1.0) / 2.0;
        let k = ((u(0) * (max_len + 1) as f64) as usize).min(max_len);
        let mut r = self.continuation(prompt, k);
        if r.len() < max_len && u(1) >= 0.5 {
            let right = self.continuation(prompt, k + 1)[k];
            r.push(right % self.symbols() + 1); // the next symbol: never the right one
            let junk = (u(2) * (max_len - r.len()) as f64) as usize;
            r.extend((0..junk as u64).map(|j| 1 + (u(3 + j) * f64::from(self.symbols())) as u32 % self.symbols()));
        }
        if r.len() < max_len {
            r.push(EOS);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_arithmetic_and_rewards_count_correct_terms() {
        let task = ArithmeticTask { prompt_len: 4, vocab: 32, cap: 8 };
        let prompt = [29, 31, 2, 4]; // step 2, wrapping 31 -> 2
        assert_eq!(task.continuation(&prompt, 3), vec![6, 8, 10]);
        assert_eq!(task.correct_terms(&prompt, &[6, 8, 9, 12]), 2);
        assert_eq!(task.correct_terms(&prompt, &[6, EOS]), 1);
        assert_eq!(task.reward(&prompt, &[6, 8, EOS]), 0.25);
        assert_eq!(task.reward(&prompt, &[6, 8]), 0.25, "cut at the length limit");
        assert_eq!(task.reward(&prompt, &[6, 8, 9, EOS]), 0.0, "a wrong term earns nothing");
        assert_eq!(task.reward(&prompt, &[6, 8, 10, 12, 14, 16, 18, 20, 22]), 1.0);
        for index in 0..50 {
            let p = task.prompt(9, index);
            assert!(p.iter().all(|&t| (1..32).contains(&t)));
            assert_eq!(task.continuation(&p[..3], 1)[0], p[3], "prompt {p:?} is arithmetic");
        }
    }
}
