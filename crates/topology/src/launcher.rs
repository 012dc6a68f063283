//! Which launcher started this process, read from the environment it leaves behind.

use serde::{Deserialize, Serialize};

/// How the job was started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// Open MPI's `mpirun`/`mpiexec` (`OMPI_COMM_WORLD_SIZE` is set).
    Mpirun,
    /// Slurm's `srun` (direct launch, e.g. `--mpi=pmix`).
    Srun {
        /// `SLURM_JOB_ID`.
        job_id: String,
        /// `SLURM_STEP_ID`.
        step_id: String,
    },
    /// Another PMIx launcher (`PMIX_RANK` is set).
    Pmix,
    /// Started by hand: a one-rank MPI job.
    Singleton,
}

impl Launcher {
    /// Reads the launcher from environment lookups (`std::env::var` in production).
    pub fn detect(env: &dyn Fn(&str) -> Option<String>) -> Launcher {
        if env("OMPI_COMM_WORLD_SIZE").is_some() {
            return Launcher::Mpirun;
        }
        if let (Some(job_id), Some(step_id), Some(_)) = (env("SLURM_JOB_ID"), env("SLURM_STEP_ID"), env("SLURM_PROCID"))
        {
            return Launcher::Srun { job_id, step_id };
        }
        if env("PMIX_RANK").is_some() {
            return Launcher::Pmix;
        }
        Launcher::Singleton
    }

    /// From this process's environment.
    pub fn of_this_process() -> Launcher {
        Launcher::detect(&|k| std::env::var(k).ok())
    }

    /// `srun (job 42, step 0)`, `mpirun`, …
    pub fn describe(&self) -> String {
        match self {
            Launcher::Mpirun => "mpirun".into(),
            Launcher::Srun { job_id, step_id } => format!("srun (job {job_id}, step {step_id})"),
            Launcher::Pmix => "PMIx launcher".into(),
            Launcher::Singleton => "singleton (started by hand)".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launchers_are_told_apart() {
        assert_eq!(
            Launcher::detect(&env_of(&[("OMPI_COMM_WORLD_SIZE", "4"), ("SLURM_JOB_ID", "7")])),
            Launcher::Mpirun
        );
        let srun = env_of(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "3"), ("PMIX_RANK", "3")]);
        assert_eq!(Launcher::detect(&srun), Launcher::Srun { job_id: "7".into(), step_id: "0".into() });
        assert_eq!(Launcher::detect(&env_of(&[("SLURM_JOB_ID", "7")])), Launcher::Singleton);
        assert_eq!(Launcher::detect(&env_of(&[])), Launcher::Singleton);
    }
}
