//! Reinforcement learning on the engine: the synthetic task and its verifiable reward,
//! advantages (GAE, group-relative, greedy baseline), the training objectives, and the
//! synchronous RL step across model-stages (generation → inference → training → weight sync).

pub mod advantage;
pub mod losses;
pub mod rollout;
pub mod task;

pub use losses::{PolicyLoss, ResponseCrossEntropy, ScoreRegression, ValueLoss};
pub use rollout::{AdvantageParams, Rollout};
pub use task::{ArithmeticTask, EOS};
