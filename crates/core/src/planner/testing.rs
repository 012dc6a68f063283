//! Jobs for the planner's tests: random tiny ones and the shipped Llama-3.1-8B PPO job, from
//! the config alone, so that a test of any planner file can use them without naming another.

use crate::config::{Algorithm, ConfigSource, JobConfig, Overrides, RawJobConfig};
use crate::rng::Rng;

/// A random tiny job (algorithm, batch, lengths, depths, node shape and device memory).
pub(super) fn tiny(rng: &mut Rng) -> JobConfig {
    let source = ConfigSource::embedded_default();
    let mut config =
        RawJobConfig::parse(&source).unwrap().resolve(&source, &Overrides::default(), &mut || unreachable!()).unwrap();
    config.rl.algorithm = *rng.pick(&[Algorithm::Ppo, Algorithm::Grpo, Algorithm::Remax]);
    if !config.rl.algorithm.uses_critic() {
        config.models.critic = None;
    }
    if config.rl.algorithm == Algorithm::Grpo {
        config.rl.samples_per_prompt = 2;
    }
    config.rl.prompts_per_step = *rng.pick(&[2, 4, 8]);
    config.rl.mini_batch = 2;
    config.rl.micro_batch = *rng.pick(&[1, 2]);
    config.rl.max_response_len = *rng.pick(&[16, 256, 2048]);
    for (_, spec) in
        [("a", &mut config.models.actor), ("r", &mut config.models.reference), ("w", &mut config.models.reward)]
    {
        spec.layers = *rng.pick(&[1, 2, 3, 4]);
    }
    config.cluster.devices_per_node = *rng.pick(&[2, 4]);
    config.cluster.nodes = 2;
    config.cluster.device_memory_gb = *rng.pick(&[0.06, 0.1, 0.3, 2.0]);
    config
}

/// `count` random tiny jobs (seeds from `seed`) on 1 to 8 devices, and Llama-3.1-8B PPO on
/// `llama_gpus` H200.
pub(super) fn tiny_jobs_and_llama(seed: u64, count: u64, llama_gpus: u32) -> Vec<(JobConfig, u32)> {
    let mut configs: Vec<(JobConfig, u32)> = (0..count)
        .map(|case| {
            let mut rng = Rng::new(seed + case);
            (tiny(&mut rng), 1 + rng.below(8) as u32)
        })
        .collect();
    let llama = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama3.1-8b-ppo.toml");
    let llama = JobConfig::load(Some(std::path::Path::new(llama)), &Overrides::default(), &mut || unreachable!());
    configs.push((llama.unwrap(), llama_gpus));
    configs
}
