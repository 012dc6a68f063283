//! Method (b) of `bench scaling`, checkpoint/restart as UCP does it: rank-local safetensors of
//! each model's first replica (one file per rank and state section: `<model>-<stage>.tp<i>-pp<j>.
//! <section>.safetensors`, tensors under their catalogue names in the shape of the rank's
//! rectangle, fsynced with the project's checkpoint code) and `restart.json`, the job to load;
//! then the old job's state is dropped and rank 0 launches a fresh job of this binary with the
//! new rank count (`nereus bench scaling-restore DIR`, hidden) while the old ranks sleep. The
//! new job creates the target EMUs, every rank filling its shards from the rectangles of the
//! saved ones that overlap them (memory-mapped), waits for all ranks, and rank 0 writes
//! `held.json`: the wall-clock time at which every rank held its state, then every replica's
//! digest.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use safetensors::SafeTensors;

use nereus_core::config::{DeviceChoice, Dtype};
use nereus_core::model::Section;
use nereus_core::model::{Catalogue, Layout, Position, Region};
use nereus_core::plan::{ModelStage, Plan, Role};
use nereus_data::model_files::{serialize, write_durably, NamedTensor, TensorFile};
use nereus_exec::comm::calm_barrier;
use nereus_exec::emu::{
    Counters, DeviceMemory, Digest, EmuSet, Exchange, HostMemory, LocalShard, RectCopy, ShardMemory,
};
use nereus_runtime::device::{open_device, Plane};
use nereus_runtime::{io_error, RuntimeError, Session};

use super::{Bench, Case, CAPACITY};
use crate::bench::primitives::Measured;

/// The job the restarted ranks load.
const JOB: &str = "restart.json";
/// What the restarted job reports.
const HELD: &str = "held.json";

/// What the restarted job needs: the models, the plan to load, where each model-stage was
/// saved from.
#[derive(Debug, Serialize, Deserialize)]
struct RestartJob {
    /// The device the state is restored onto (`None`: host memory).
    device: Option<DeviceChoice>,
    catalogues: Vec<(Role, Catalogue)>,
    target: Plan,
    saved: Vec<Saved>,
}

/// One model-stage as saved: the layout of the replica whose ranks wrote it, and its counters.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Saved {
    model_stage: ModelStage,
    layout: Layout,
    counters: Counters,
}

/// What the restarted job reports.
#[derive(Debug, Serialize, Deserialize)]
struct Held {
    /// Seconds since the Unix epoch when every rank held its state.
    at_unix_s: f64,
    /// Every replica's digest.
    digests: Vec<(ModelStage, Digest)>,
}

fn unix_seconds() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The file position `position` of `ms` saved section `section` in.
fn file_name(ms: ModelStage, position: Position, section: Section) -> String {
    let section = match section {
        Section::Params => "params",
        Section::AdamM => "exp_avg",
        Section::AdamV => "exp_avg_sq",
        Section::Master => "master",
    };
    format!("{}.tp{}-pp{}.{section}.safetensors", ms.to_string().replace('/', "-"), position.tp, position.pp)
}

/// Writes this rank's shard of `ms`'s first replica (`bytes`, its buffer read to the host), one
/// file per section; returns bytes written.
fn save_shard<B>(
    dir: &Path,
    ms: ModelStage,
    shard: &LocalShard<B>,
    bytes: &[u8],
    catalogue: &Catalogue,
) -> Result<u64, RuntimeError> {
    let mut written = 0;
    for (s, section) in shard.sections.iter().enumerate() {
        let data = &bytes[shard.section_range(s)];
        let tensors: Vec<NamedTensor> = shard
            .table
            .pieces
            .iter()
            .map(|p| {
                let range = p.offset as usize * 4..(p.offset + p.region.elements()) as usize * 4;
                let shape = vec![p.region.rows as usize, p.region.cols as usize];
                (catalogue.tensors[p.tensor].name.clone(), shape, data[range].to_vec())
            })
            .collect();
        let path = dir.join(file_name(ms, shard.position, *section));
        let meta =
            HashMap::from([("format".to_string(), "pt".to_string()), ("nereus.model_stage".into(), ms.to_string())]);
        let bytes = serialize(&tensors, Dtype::F32, meta, &path)?;
        write_durably(&path, &bytes)?;
        written += bytes.len() as u64;
    }
    Ok(written)
}

/// Where a rank's state is filled from: the saved files of one model-stage, memory-mapped.
struct SavedFiles {
    layout: Layout,
    /// Per saved position (layout index) and section: the file.
    files: Vec<Vec<TensorFile>>,
}

impl SavedFiles {
    fn open(dir: &Path, saved: &Saved, sections: &[Section]) -> Result<SavedFiles, String> {
        let files = saved
            .layout
            .positions()
            .map(|p| {
                sections
                    .iter()
                    .map(|s| TensorFile::open(&dir.join(file_name(saved.model_stage, p, *s))))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        Ok(SavedFiles { layout: saved.layout, files })
    }

    /// Fills every section of `shard` from the saved rectangles that overlap its own.
    fn fill(&self, shard: &mut LocalShard, catalogue: &Catalogue) -> Result<(), String> {
        let (tp, pp) = (self.layout.tp, self.layout.pp);
        for s in 0..shard.sections.len() {
            let base = shard.section_range(s).start as u64;
            let eb = shard.sections[s].element_bytes(shard.dtype);
            let parsed: Vec<SafeTensors> = self
                .files
                .iter()
                .map(|f| SafeTensors::deserialize(f[s].bytes()).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?;
            for piece in shard.table.pieces.clone() {
                let stage = catalogue.stage_of(piece.tensor, pp);
                let mut seen: Vec<Region> = Vec::new();
                for i in 0..tp {
                    let held = catalogue.region(piece.tensor, tp, i);
                    let Some(overlap) = held.intersect(&piece.region).filter(|_| !seen.contains(&held)) else {
                        continue;
                    };
                    seen.push(held);
                    let file = &parsed[self.layout.index(Position { tp: i, pp: stage })];
                    let name = &catalogue.tensors[piece.tensor].name;
                    let view = file.tensor(name).map_err(|e| format!("{name}: {e}"))?;
                    let copy = RectCopy {
                        src_offset: ((overlap.row0 - held.row0) * held.cols + overlap.col0 - held.col0) * eb,
                        src_pitch: held.cols * eb,
                        dst_offset: base
                            + (piece.offset + (overlap.row0 - piece.region.row0) * piece.region.cols + overlap.col0
                                - piece.region.col0)
                                * eb,
                        dst_pitch: piece.region.cols * eb,
                        row_bytes: overlap.cols * eb,
                        rows: overlap.rows,
                    };
                    copy.copy_on_host(view.data(), &mut shard.buffer);
                }
            }
        }
        Ok(())
    }
}

/// The launcher's command for `ranks` ranks of this binary restoring from `dir`, with the
/// variables by which MPI marks a launched process removed (a child job must start its own).
fn restart_command(launcher: &str, ranks: u32, dir: &Path) -> Result<Command, RuntimeError> {
    let mut words = launcher.split_whitespace();
    let program = words.next().ok_or_else(|| RuntimeError::Usage("--launcher is empty".into()))?;
    let exe = std::env::current_exe().map_err(io_error("locate", Path::new("the nereus binary")))?;
    let mut command = Command::new(program);
    command.args(words).args(["-n", &ranks.to_string()]).arg(exe).args(["bench", "scaling-restore"]).arg(dir);
    for (key, _) in std::env::vars() {
        let launched = ["OMPI_", "ORTE_", "OPAL_", "PMIX_", "PMI_"].iter().any(|p| key.starts_with(p));
        if launched && !key.starts_with("OMPI_ALLOW_RUN_AS_ROOT") {
            command.env_remove(key);
        }
    }
    Ok(command)
}

/// Runs the restarted job (rank 0) and reads what it reported.
fn launch(launcher: &str, ranks: u32, dir: &Path) -> Result<Held, RuntimeError> {
    let out = restart_command(launcher, ranks, dir)?.output().map_err(io_error("run", Path::new(launcher)))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(RuntimeError::Usage(format!("the restarted job failed ({}):\n{}", out.status, tail.join("\n"))));
    }
    let path = dir.join(HELD);
    let text = std::fs::read(&path).map_err(io_error("read", &path))?;
    serde_json::from_slice(&text).map_err(|e| RuntimeError::Usage(format!("{}: {e}", path.display())))
}

/// When every rank of the restarted job held its state, if every replica's digest is its
/// model-stage's digest `before` the save.
fn unchanged(held: &Held, before: &BTreeMap<ModelStage, Digest>, case: &Case) -> Result<f64, RuntimeError> {
    match held.digests.iter().find(|(ms, d)| before.get(ms) != Some(d)) {
        None => Ok(held.at_unix_s),
        Some((ms, d)) => Err(RuntimeError::SelftestFailed(format!(
            "checkpoint/restart on {}: a replica of {ms} has digest {d} after the restart, {} before",
            case.name,
            before.get(ms).map_or_else(|| "none".into(), ToString::to_string)
        ))),
    }
}

impl<P: Measured + Exchange<M>, M: ShardMemory + Clone> Bench<'_, '_, P, M> {
    /// The case's checkpoint directory, emptied by rank 0.
    fn checkpoint_dir(&self, case: &Case) -> Result<PathBuf, RuntimeError> {
        let dir = self.options.dir.join(case.name);
        if self.session.rank() == 0 {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(io_error("remove", &dir))?;
            }
            std::fs::create_dir_all(&dir).map_err(io_error("create directory", &dir))?;
        }
        Ok(dir)
    }

    /// Saves the first replica of every model-stage (its ranks, each its own files) and, on
    /// rank 0, the job to restart; returns the bytes this rank wrote.
    fn save(&self, set: &EmuSet<M>, case: &Case, dir: &Path) -> Result<u64, RuntimeError> {
        let mut written = 0;
        let mut saved = Vec::new();
        for p in &case.from.placements {
            let ms = p.candidate.model_stage;
            let first = set.replicas(ms)[0];
            saved.push(Saved { model_stage: ms, layout: first.layout, counters: first.counters });
            if let Some(shard) = set.store().get(first.id) {
                let bytes = self.memory.read(&shard.buffer)?;
                written += save_shard(dir, ms, shard, &bytes, set.catalogue(ms.role))?;
            }
        }
        if self.session.rank() == 0 {
            let catalogues = self.catalogues.iter().map(|(r, c)| (*r, c.clone())).collect();
            let job = RestartJob { device: self.device, catalogues, target: case.to.clone(), saved };
            let text = serde_json::to_vec_pretty(&job).expect("jobs serialize");
            write_durably(&dir.join(JOB), &text)?;
        }
        Ok(written)
    }

    /// (b): save, drop the state, restart with the new rank count, load; seconds from the
    /// save's start until every new rank holds its state, and the checkpoint's bytes.
    pub(super) fn checkpoint_restart(&mut self, case: &Case) -> Result<(f64, u64), RuntimeError> {
        let dir = self.checkpoint_dir(case)?;
        let (set, before) = self.materialize(&case.from)?;
        self.plane.settle()?;
        self.plane.barrier(self.all)?;
        let start = unix_seconds();
        let saved = self.save(&set, case, &dir);
        drop(set);
        // A GPU's freed buffers return to its pool in stream order: wait, so the restarted job
        // finds the memory free (on a GPU in Default compute mode both jobs share it).
        self.plane.settle()?;
        let (world, watchdog) = (self.session.world(), self.session.watchdog());
        calm_barrier(world, watchdog, "checkpoint written", Duration::from_millis(20));
        let mut written = [*saved.as_ref().unwrap_or(&0)];
        let saved = self.session.agree("checkpoint save", saved.map(|_| ()));
        saved?;
        self.plane.all_reduce_sum_u64(self.all, &mut written)?;
        let held = match self.session.rank() {
            0 => launch(&self.options.launcher, Case::ranks(&case.to), &dir)
                .and_then(|held| unchanged(&held, &before, case))
                .map(Some),
            _ => Ok(None),
        };
        calm_barrier(world, watchdog, "restarted job", Duration::from_millis(20));
        let held_at = self.session.agree("restarted job", held)?;
        Ok((held_at.map_or(0.0, |at| at - start), written[0]))
    }
}

/// `nereus bench scaling-restore DIR` (launched by `bench scaling`): loads the job of
/// `DIR/restart.json` into EMUs of its target plan, in host memory or on the device the job
/// names, and reports when every rank holds its state.
pub fn restore(session: &Session, dir: &Path) -> Result<(), RuntimeError> {
    let path = dir.join(JOB);
    let text = std::fs::read(&path).map_err(io_error("read", &path))?;
    let job: RestartJob =
        serde_json::from_slice(&text).map_err(|e| RuntimeError::Usage(format!("{}: {e}", path.display())))?;
    match job.device {
        None => {
            let mut plane = session.control_plane();
            restore_into(session, &mut plane, HostMemory, &job, dir)
        }
        Some(choice) => {
            let (mut plane, memory) = open_device(session, choice)?;
            Restore { session, job: &job, dir }.run(&mut plane, memory)
        }
    }
}

/// The restarted job on the device its checkpoint names.
struct Restore<'a> {
    session: &'a Session,
    job: &'a RestartJob,
    dir: &'a Path,
}

impl Restore<'_> {
    /// Runs on this rank's device plane, with shards in `memory`.
    fn run(self, plane: &mut Plane<'_>, memory: DeviceMemory) -> Result<(), RuntimeError> {
        restore_into(self.session, plane, memory, self.job, self.dir)
    }
}

/// Fills the target plan's EMUs in `memory` from the saved files, then (rank 0) writes when
/// every rank held its state and every replica's digest.
fn restore_into<P: Measured + Exchange<M>, M: ShardMemory + Clone>(
    session: &Session,
    plane: &mut P,
    memory: M,
    job: &RestartJob,
    dir: &Path,
) -> Result<(), RuntimeError> {
    let world = session.world().size();
    let catalogues: BTreeMap<Role, Catalogue> = job.catalogues.iter().cloned().collect();
    let mut set = EmuSet::in_memory(session.rank(), world, CAPACITY, catalogues, memory);
    // Replicas on disjoint ranks load at the same time, as every rank of a restarted job does.
    set.set_participants_only(true);
    for p in &job.target.placements {
        let ms = p.candidate.model_stage;
        let saved =
            job.saved.iter().find(|s| s.model_stage == ms).ok_or_else(|| {
                RuntimeError::Usage(format!("{}: nothing was saved for {ms}", dir.join(JOB).display()))
            })?;
        let sections = Section::of(ms.trains(), set.catalogue(ms.role).arch.dtype);
        let mut files: Option<SavedFiles> = None;
        for r in 0..p.candidate.dp as usize {
            set.create(plane, ms, p.candidate.layout, p.replica(r), saved.counters, |shard, catalogue| {
                if files.is_none() {
                    files = Some(SavedFiles::open(dir, saved, &sections)?);
                }
                files.as_ref().expect("opened").fill(shard, catalogue)
            })?;
        }
    }
    set.set_participants_only(false);
    let all = plane.group(&(0..world).collect::<Vec<_>>())?;
    plane.settle()?;
    plane.barrier(all)?;
    let at_unix_s = unix_seconds();
    let digests = set.digests(plane)?;
    if session.rank() == 0 {
        let digests = set.emus().map(|e| (e.model_stage, digests[&e.id])).collect();
        let text = serde_json::to_vec(&Held { at_unix_s, digests }).expect("reports serialize");
        write_durably(&dir.join(HELD), &text)?;
    }
    Ok(())
}
