//! One SPMD session: MPI world, watchdog, world layout, and the agreed job config.

use std::path::Path;
use std::time::Duration;

use nereus_core::config::{ClusterSection, JobConfig, Overrides};
use nereus_exec::comm::{agree, agree_outcome, all_gather_bytes, broadcast_bytes, MpiPlane, Watchdog, World};
use nereus_topology::{detect_cluster, Launcher, NodeTopology, WorldLayout};

use super::RuntimeError;

/// Collective time limit before a job config has set one, in seconds.
const DEFAULT_COLLECTIVE_TIMEOUT_S: f64 = 300.0;

/// How the session starts (global CLI flags).
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// `--collective-timeout`: wins over `job.collective_timeout_s`.
    pub collective_timeout_s: Option<f64>,
}

/// Everything a rank needs to take part in the job; passed by reference, never global.
pub struct Session {
    world: World,
    watchdog: Watchdog,
    layout: WorldLayout,
    launcher: Launcher,
    hostname: String,
    timeout_from_cli: bool,
}

impl Session {
    /// Initializes MPI and learns which node every rank is on (the caller installs the logger
    /// once it knows its rank).
    pub fn start(options: SessionOptions) -> Result<Session, RuntimeError> {
        // Read before MPI_Init: a singleton's MPI library sets PMIx variables of its own.
        let launcher = Launcher::of_this_process();
        let world = World::init()?;
        let timeout = options.collective_timeout_s.unwrap_or(DEFAULT_COLLECTIVE_TIMEOUT_S);
        let watchdog =
            Watchdog::new(Duration::from_secs_f64(timeout.max(0.001)), world.rank(), world.threads_may_call_mpi());
        let hostname = world.processor_name();
        let hosts = all_gather_bytes(&world, &watchdog, "host exchange", hostname.as_bytes())?;
        let hosts: Vec<String> = hosts.iter().map(|h| String::from_utf8_lossy(h).into_owned()).collect();
        let layout = WorldLayout::from_hostnames(&hosts);
        log::debug!(
            "rank {} of {} on {hostname} ({}), {}",
            world.rank(),
            world.size(),
            launcher.describe(),
            world.library_version()
        );
        Ok(Session {
            world,
            watchdog,
            layout,
            launcher,
            hostname,
            timeout_from_cli: options.collective_timeout_s.is_some(),
        })
    }

    /// The MPI world.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// This rank.
    pub fn rank(&self) -> i32 {
        self.world.rank()
    }

    /// A host data plane over the world, under this session's watchdog (the control plane of a
    /// device plane, or the data plane of a host job).
    pub fn control_plane(&self) -> MpiPlane<'_> {
        MpiPlane::new(&self.world, self.watchdog.clone())
    }

    /// The collective watchdog.
    pub fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// Which node each rank runs on.
    pub fn layout(&self) -> &WorldLayout {
        &self.layout
    }

    /// How this job was launched.
    pub fn launcher(&self) -> &Launcher {
        &self.launcher
    }

    /// This rank's host name.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// Every rank loads the job config, then all ranks agree on its hash with one all-reduce.
    ///
    /// A rank whose config fails to load still joins the agreement, so nobody hangs; any failure
    /// or mismatch makes every rank return an error, and rank 0's names the ranks involved.
    /// When the agreed config detects its cluster on CPU-only nodes, every rank then runs the
    /// start-up probes together ([`probe`](super::probe)) and resolves it again with what they
    /// measured, agreeing once more.
    pub fn load_config(&mut self, path: Option<&Path>, overrides: &Overrides) -> Result<JobConfig, RuntimeError> {
        let mut detected_cpu = false;
        let config = self.load_agreed(path, overrides, &mut |s: &Session| {
            let detected = s.detect_cluster();
            detected_cpu = detected.data_plane == Some(nereus_core::config::DataPlane::Mpi);
            detected
        })?;
        if !detected_cpu {
            return Ok(config);
        }
        let probed = super::probe::measure(&self.world, &self.watchdog);
        log::debug!("start-up probes: {probed:?}");
        self.load_agreed(path, overrides, &mut |s: &Session| probed.apply(s.detect_cluster()))
    }

    /// Loads the config on every rank (`detect` fills a `detect = true` cluster) and agrees on it.
    fn load_agreed(
        &mut self,
        path: Option<&Path>,
        overrides: &Overrides,
        detect: &mut dyn FnMut(&Session) -> ClusterSection,
    ) -> Result<JobConfig, RuntimeError> {
        let local = JobConfig::load(path, overrides, &mut || detect(self));
        let hash = local.as_ref().map(JobConfig::hash).map_err(ToString::to_string);
        let agreement = agree(&self.world, &self.watchdog, "config agreement", hash);
        let config = match (local, agreement) {
            (Ok(config), Ok(_)) => config,
            // Alone, a rank's own error is the clearest message.
            (Err(e), _) if self.world.size() == 1 => return Err(e.into()),
            (Err(e), Ok(_)) => return Err(e.into()),
            (_, Err(e)) => return Err(e.into()),
        };
        if !self.timeout_from_cli {
            self.watchdog = self.watchdog.with_timeout(Duration::from_secs_f64(config.job.collective_timeout_s));
        }
        Ok(config)
    }

    /// Ends a phase every rank runs on its own (see [`agree_outcome`]): `local` on every rank
    /// when all succeeded; else every rank returns [`RuntimeError::Phase`] with the highest exit
    /// status, and rank 0's error names what failed on which ranks. Nobody is left waiting.
    pub fn agree<T>(&self, op: &str, local: Result<T, RuntimeError>) -> Result<T, RuntimeError> {
        let verdict = match &local {
            Ok(_) => Ok(()),
            Err(e) => Err((e.exit_code(), e.to_string())),
        };
        match agree_outcome(&self.world, &self.watchdog, op, verdict)? {
            Ok(()) => local,
            Err(failure) => Err(RuntimeError::Phase(failure)),
        }
    }

    /// Rank 0's outcome on every rank: `local` agreed first (a failure on any rank stops every
    /// rank, so nobody waits on a broadcast that never comes), then rank 0's bytes broadcast.
    pub fn from_root(&self, op: &str, local: Result<Vec<u8>, RuntimeError>) -> Result<Vec<u8>, RuntimeError> {
        let bytes = self.agree(op, local)?;
        self.broadcast(op, &bytes)
    }

    /// Rank 0's `bytes`, on every rank.
    pub fn broadcast(&self, op: &str, bytes: &[u8]) -> Result<Vec<u8>, RuntimeError> {
        Ok(broadcast_bytes(&self.world, &self.watchdog, op, bytes)?)
    }

    /// This rank's view of the cluster for `[cluster] detect = true`.
    fn detect_cluster(&self) -> ClusterSection {
        match NodeTopology::discover(&self.hostname) {
            Ok(node) => detect_cluster(&node, &self.layout),
            Err(e) => {
                log::warn!("cluster detection failed ({e}); only values written in the config are used");
                ClusterSection::default()
            }
        }
    }
}
