//! Rule-based rewards over text: a response scored against a reference answer, the same code
//! in a job and offline (`nereus reward`).
//!
//! - [`RuleKind::Math`]: the final answer extracted from the response ([`math::extract`]:
//!   `\boxed{…}`, then "The answer is …", then the last number), normalised, and compared with
//!   the reference as a number when both are numbers (`2.50` = `5/2` = `\frac{5}{2}`), else as
//!   normalised text;
//! - [`RuleKind::Exact`]: the whole response against the reference, both trimmed, lower-cased,
//!   with runs of whitespace as one space and a trailing period dropped.
//!
//! The reward is 1 for a match and 0 otherwise, plus `format_bonus` when the response carries
//! its answer in `\boxed{…}` (the format math prompts ask for), whether or not it matches.

pub mod command;
pub mod math;
mod process;

pub use process::{end_all_scorers, end_scorers_on_signals};

use serde::{Deserialize, Serialize};

/// Which rule scores a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleKind {
    /// The final answer, normalised, against the reference (numbers compared as numbers).
    Math,
    /// The whole response, normalised, against the reference.
    Exact,
}

nereus_core::named_enum!(RuleKind { Math => "math", Exact => "exact" });

/// A rule and its format bonus.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RuleReward {
    /// The rule.
    pub kind: RuleKind,
    /// Added when the response gives its answer in `\boxed{…}`.
    pub format_bonus: f64,
}

/// One response's score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// The reward: 1 or 0 for the match, plus the format bonus.
    pub reward: f64,
    /// Whether the answer matched the reference.
    pub correct: bool,
    /// The answer the rule compared (the extracted final answer, or the normalised response).
    pub extracted: Option<String>,
}

impl RuleReward {
    /// Scores `response` against the reference `answer`.
    pub fn score(&self, response: &str, answer: &str) -> Score {
        let (correct, extracted, boxed) = match self.kind {
            RuleKind::Math => match math::extract(response) {
                Some(found) => (math::equivalent(&found.text, answer), Some(found.text), found.boxed),
                None => (false, None, false),
            },
            RuleKind::Exact => {
                let got = normalize_text(response);
                (got == normalize_text(answer), Some(got), math::extract_boxed(response).is_some())
            }
        };
        let bonus = if boxed { self.format_bonus } else { 0.0 };
        Score { reward: f64::from(u8::from(correct)) + bonus, correct, extracted }
    }
}

/// Trimmed, lower-cased, whitespace runs as one space, one trailing period dropped.
pub fn normalize_text(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    joined.strip_suffix('.').map(str::to_string).unwrap_or(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_matches_normalised_text_and_the_bonus_is_for_the_format() {
        let exact = RuleReward { kind: RuleKind::Exact, format_bonus: 0.0 };
        assert!(exact.score("  Paris.\n", "paris").correct);
        assert!(!exact.score("Paris, France", "Paris").correct);
        let math = RuleReward { kind: RuleKind::Math, format_bonus: 0.1 };
        let s = math.score("so \\boxed{7}", "7");
        assert_eq!((s.reward, s.correct, s.extracted.as_deref()), (1.1, true, Some("7")));
        let wrong = math.score("so \\boxed{8}", "7");
        assert_eq!((wrong.reward, wrong.correct), (0.1, false));
        let plain = math.score("12 + 7 = 8", "19");
        assert_eq!((plain.reward, plain.extracted.as_deref()), (0.0, Some("8")));
        assert_eq!(math.score("no number here", "1").extracted, None);
    }
}
