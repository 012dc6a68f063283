//! Reinforcement learning on the engine: the tasks (arithmetic over token ids, or a user's
//! prompts and reward over text),
//! advantages (GAE, group-relative, greedy baseline), the training objectives, and the
//! synchronous RL step across model-stages (generation → inference → training → weight sync).

pub mod advantage;
pub mod kl;
pub mod losses;
pub mod rollout;
pub mod step;
pub mod task;
pub mod warmup;

pub use losses::{PolicyLoss, ScoreRegression, SequenceCrossEntropy, ValueLoss};
pub use rollout::{AdvantageParams, Rollout};
pub use step::{Ahead, NonFinite, RlJob, StepMetrics, StepSettings};
pub use task::{ArithmeticTask, Scores, Split, Task, TextReward, TextSample, TextTask, TextTerm, EOS};
pub use warmup::{warm_up, Warmup};
