//! The project's own small text job: arithmetic word problems with worked answers (train and
//! eval splits), a byte-level BPE tokenizer trained on them, and a ChatML-style chat template —
//! written as a model directory's text files, so that a job from random weights trains on text
//! end to end (`nereus data synth`, shipped in `configs/data/tiny-math/`).
//!
//! The training split's worked answers are deliberately imperfect, as supervised data often is:
//! a share of them (`guess_share`) skips the work and answers with the question's first number.
//! A supervised warm-up on them learns both habits; RL with the `math` reward then has something
//! to fix — it moves the policy to working the sum out, and held-out accuracy rises.
//!
//! Everything is a function of the seed: the same seed writes the same bytes.

use std::path::Path;

use serde_json::json;

use nereus_core::file_error::FileError;
use nereus_core::rng::Rng;

use crate::text::{save_tokenizer, train_byte_level_bpe, TextError};

/// The chat template written beside the tokenizer (ChatML, as Qwen and SmolLM2 use).
pub const CHAT_TEMPLATE: &str = "{%- for message in messages %}\n    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";

/// The special tokens, in id order: end of text (padding), turn start, turn end (EOS).
pub const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// What `synth` makes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthSpec {
    /// Training problems.
    pub train: usize,
    /// Held-out problems (drawn from another stream than the training ones).
    pub eval: usize,
    /// Largest operand.
    pub max_operand: u32,
    /// Token ids of the tokenizer.
    pub vocab: usize,
    /// Seed of the draws.
    pub seed: u64,
    /// Share of the training split's worked answers that guess instead of working it out.
    pub guess_share: f64,
}

impl Default for SynthSpec {
    fn default() -> SynthSpec {
        SynthSpec { train: 2000, eval: 200, max_operand: 9, vocab: 384, seed: 7, guess_share: 0.5 }
    }
}

/// One problem: its prompt, answer and worked solution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The question.
    pub prompt: String,
    /// The number that answers it.
    pub answer: i64,
    /// A worked answer ending in `\boxed{answer}`.
    pub solution: String,
}

const NAMES: [&str; 8] = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"];
const THINGS: [&str; 6] = ["apples", "marbles", "books", "coins", "stamps", "shells"];

/// The next problem of the stream `rng`; its worked answer guesses with probability `guess`.
fn problem(rng: &mut Rng, max: u32, guess: f64) -> Problem {
    let (mut a, mut b) = (rng.below(max as usize + 1) as i64, rng.below(max as usize + 1) as i64);
    let (name, things) = (*rng.pick(&NAMES), *rng.pick(&THINGS));
    let (prompt, answer, work) = match rng.below(4) {
        0 => (format!("What is {a} + {b}?"), a + b, format!("{a} + {b} = {}", a + b)),
        1 => {
            if a < b {
                std::mem::swap(&mut a, &mut b);
            }
            (format!("What is {a} - {b}?"), a - b, format!("{a} - {b} = {}", a - b))
        }
        2 => (
            format!("{name} has {a} {things} and gets {b} more. How many {things} does {name} have now?"),
            a + b,
            format!("{name} has {a} + {b} = {} {things}", a + b),
        ),
        _ => {
            if a < b {
                std::mem::swap(&mut a, &mut b);
            }
            (
                format!("{name} had {a} {things} and gave away {b}. How many {things} are left?"),
                a - b,
                format!("{a} - {b} = {} {things} are left", a - b),
            )
        }
    };
    let draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let guessed = draw < guess;
    let solution = match guessed {
        true => format!("The answer is \\boxed{{{a}}}."),
        false => format!("{work}. The answer is \\boxed{{{answer}}}."),
    };
    Problem { prompt, answer, solution }
}

/// `count` problems of stream `stream` of `spec`'s seed, a share `guess` of them with guessed
/// worked answers.
pub fn problems(spec: &SynthSpec, stream: u64, count: usize, guess: f64) -> Vec<Problem> {
    let mut rng = Rng::new(spec.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..count).map(|_| problem(&mut rng, spec.max_operand, guess)).collect()
}

/// Writes `train.jsonl`, `eval.jsonl` and the tokenizer directory `tokenizer/` (tokenizer.json,
/// tokenizer_config.json with the chat template, generation_config.json) under `out`.
pub fn synth(spec: &SynthSpec, out: &Path) -> Result<(), TextError> {
    let dir = out.join("tokenizer");
    std::fs::create_dir_all(&dir).map_err(FileError::on("create", &dir))?;
    let (train, eval) = (problems(spec, 1, spec.train, spec.guess_share), problems(spec, 2, spec.eval, 0.0));
    for (name, split) in [("train.jsonl", &train), ("eval.jsonl", &eval)] {
        let lines: String = split
            .iter()
            .map(|p| {
                json!({"prompt": p.prompt, "answer": p.answer.to_string(), "solution": p.solution}).to_string() + "\n"
            })
            .collect();
        write(&out.join(name), &lines)?;
    }
    // The tokenizer learns the text the job will see: rendered prompts and worked answers.
    let corpus = train.iter().flat_map(|p| {
        [format!("<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n", p.prompt), p.solution.clone()]
    });
    let tokenizer = train_byte_level_bpe(corpus, spec.vocab, &SPECIAL)?;
    save_tokenizer(&tokenizer, &dir.join("tokenizer.json"))?;
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": SPECIAL[2],
        "pad_token": SPECIAL[0],
        "model_max_length": 256,
        "chat_template": CHAT_TEMPLATE,
    });
    write(&dir.join("tokenizer_config.json"), &(serde_json::to_string_pretty(&config).expect("JSON") + "\n"))?;
    let generation = json!({"eos_token_id": [2], "pad_token_id": 0});
    write(&dir.join("generation_config.json"), &(serde_json::to_string_pretty(&generation).expect("JSON") + "\n"))
}

fn write(path: &Path, text: &str) -> Result<(), TextError> {
    std::fs::write(path, text).map_err(FileError::on("write", path))?;
    Ok(())
}
