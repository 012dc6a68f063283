//! Checkpoints: one safetensors file of whole tensors per model, under Hugging Face names (so a
//! checkpoint written under one layout loads under any other, and into Hugging Face tools), a
//! second file with AdamW's moments (`exp_avg.<name>`, `exp_avg_sq.<name>`, PyTorch's names)
//! for models that train, and a JSON sidecar with the counters, the step and the data position.
//!
//! Saving gathers each model's replica onto rank 0 (the EMU gather), which writes the files;
//! loading reads the files on every rank (a shared file system, as on any cluster) and copies
//! each shard's rectangles out of the whole tensors.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::comm::DataPlane;
use crate::emu::{Counters, EmuId, EmuSet, LocalShard, Section};
use crate::model::Catalogue;

use super::RuntimeError;

/// Sidecar format version.
pub const FORMAT: u32 = 1;

/// The JSON sidecar of a checkpoint (`state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sidecar {
    /// Format version ([`FORMAT`]).
    pub format: u32,
    /// Job name.
    pub job: String,
    /// `ppo`, `grpo` or `remax`.
    pub algorithm: String,
    /// RL steps completed.
    pub step: u64,
    /// Job seed.
    pub seed: u64,
    /// Prompts consumed (the data loader's position).
    pub data_position: u64,
    /// Counters per model-stage (`actor/training`, …).
    pub counters: BTreeMap<String, Counters>,
    /// How the random state is derived (nothing else to store: draws are counter-based).
    pub rng: String,
}

/// Parameters file of a model.
pub fn params_path(dir: &Path, model: &str) -> PathBuf {
    dir.join(format!("{model}.safetensors"))
}

/// Optimizer file of a model.
pub fn optim_path(dir: &Path, model: &str) -> PathBuf {
    dir.join(format!("{model}.optim.safetensors"))
}

fn io(path: &Path, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Output(std::io::Error::other(format!("{}: {e}", path.display())))
}

/// Saves replica `id` as model `model` in `dir` (every rank calls it; rank 0 writes). Adam's
/// moments go to the optimizer file when the replica trains.
pub fn save_model<P: DataPlane>(
    plane: &mut P,
    set: &EmuSet,
    id: EmuId,
    dir: &Path,
    model: &str,
) -> Result<(), RuntimeError> {
    let Some(whole) = set.gather(plane, id, 0)? else { return Ok(()) };
    let catalogue = set.catalogue(
        set.emu(id).map(|e| e.model_stage.role).ok_or_else(|| RuntimeError::Usage(format!("{id} does not exist")))?,
    );
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    write(tensors_of(&whole, catalogue, 0, ""), &params_path(dir, model))?;
    if whole.sections.contains(&Section::AdamM) {
        let mut both = tensors_of(&whole, catalogue, 1, "exp_avg.");
        both.extend(tensors_of(&whole, catalogue, 2, "exp_avg_sq."));
        write(both, &optim_path(dir, model))?;
    }
    Ok(())
}

/// `(name, shape, little-endian f32 bytes)` of every tensor of a `(1, 1)` shard's section `s`.
fn tensors_of(whole: &LocalShard, catalogue: &Catalogue, s: usize, prefix: &str) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let bytes = &whole.buffer[whole.section_range(s)];
    whole
        .table
        .pieces
        .iter()
        .map(|p| {
            let spec = &catalogue.tensors[p.tensor];
            let shape =
                if spec.rows == 1 { vec![spec.cols as usize] } else { vec![spec.rows as usize, spec.cols as usize] };
            let range = p.offset as usize * 4..(p.offset + p.region.elements()) as usize * 4;
            (format!("{prefix}{}", spec.name), shape, bytes[range].to_vec())
        })
        .collect()
}

fn write(tensors: Vec<(String, Vec<usize>, Vec<u8>)>, path: &Path) -> Result<(), RuntimeError> {
    let views = tensors
        .iter()
        .map(|(name, shape, data)| TensorView::new(StDtype::F32, shape.clone(), data).map(|v| (name.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io(path, e))?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| io(path, e))
}

/// A safetensors file read into memory.
pub struct TensorFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl TensorFile {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<TensorFile, RuntimeError> {
        let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
        SafeTensors::deserialize(&bytes).map_err(|e| io(path, format!("not a safetensors file: {e}")))?;
        Ok(TensorFile { path: path.to_path_buf(), bytes })
    }

    /// Fills section `s` of `shard` with its rectangles of the tensors named `prefix + name`.
    pub fn fill(&self, shard: &mut LocalShard, catalogue: &Catalogue, s: usize, prefix: &str) -> Result<(), String> {
        let st = SafeTensors::deserialize(&self.bytes).map_err(|e| e.to_string())?;
        let range = shard.section_range(s);
        let out = &mut shard.buffer[range];
        for piece in &shard.table.pieces {
            let spec = &catalogue.tensors[piece.tensor];
            let name = format!("{prefix}{}", spec.name);
            let view = st.tensor(&name).map_err(|e| format!("{}: tensor {name}: {e}", self.path.display()))?;
            let want = (spec.rows * spec.cols) as usize;
            if view.dtype() != StDtype::F32 || view.shape().iter().product::<usize>() != want {
                return Err(format!(
                    "{}: tensor {name} is {:?} {:?}, the model needs F32 with {want} elements ({} × {})",
                    self.path.display(),
                    view.dtype(),
                    view.shape(),
                    spec.rows,
                    spec.cols
                ));
            }
            let (r, data) = (piece.region, view.data());
            for row in 0..r.rows {
                let src = (((r.row0 + row) * spec.cols + r.col0) * 4) as usize;
                let dst = ((piece.offset + row * r.cols) * 4) as usize;
                let len = (r.cols * 4) as usize;
                out[dst..dst + len].copy_from_slice(&data[src..src + len]);
            }
        }
        Ok(())
    }
}

/// Fills a new shard from a checkpoint: parameters from `params`, moments from `optim` when
/// the shard keeps them (zero when no optimizer file is given: a fresh optimizer).
pub fn fill_shard(
    shard: &mut LocalShard,
    catalogue: &Catalogue,
    params: &TensorFile,
    optim: Option<&TensorFile>,
) -> Result<(), String> {
    params.fill(shard, catalogue, 0, "")?;
    if shard.sections.len() >= 3 {
        match optim {
            Some(o) => {
                o.fill(shard, catalogue, 1, "exp_avg.")?;
                o.fill(shard, catalogue, 2, "exp_avg_sq.")?;
            }
            None => {
                let (m, v) = (shard.section_range(1), shard.section_range(2));
                shard.buffer[m.start..v.end].fill(0);
            }
        }
    }
    Ok(())
}

/// Writes the sidecar (rank 0 only).
pub fn write_sidecar(dir: &Path, sidecar: &Sidecar) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join("state.json");
    std::fs::write(&path, serde_json::to_string_pretty(sidecar).unwrap_or_default()).map_err(|e| io(&path, e))
}

/// Reads a checkpoint's sidecar.
pub fn read_sidecar(dir: &Path) -> Result<Sidecar, RuntimeError> {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
    let sidecar: Sidecar =
        serde_json::from_str(&text).map_err(|e| io(&path, format!("not a checkpoint sidecar: {e}")))?;
    if sidecar.format != FORMAT {
        return Err(io(&path, format!("checkpoint format {} (this build reads {FORMAT})", sidecar.format)));
    }
    Ok(sidecar)
}
