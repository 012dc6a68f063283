//! Safetensors files of whole tensors under Hugging Face names: serialized from a gathered
//! `(1, 1)` shard, opened memory-mapped (a rank touches only the pages of its own rectangles),
//! checked against the catalogue tensor by tensor, and copied into shards rectangle by
//! rectangle.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};

use super::error::{io, CheckpointError};
use crate::emu::{LocalShard, Section};
use crate::model::Catalogue;

/// Tensor-name prefixes of the optimizer file's two moments (PyTorch's names).
pub const MOMENT_PREFIXES: [&str; 2] = ["exp_avg.", "exp_avg_sq."];

/// One tensor ready to serialize: name, shape, little-endian f32 bytes.
pub type NamedTensor = (String, Vec<usize>, Vec<u8>);

/// Every tensor of section `s` of a gathered `(1, 1)` shard, names prefixed with `prefix`.
pub fn tensors_of(whole: &LocalShard, catalogue: &Catalogue, s: usize, prefix: &str) -> Vec<NamedTensor> {
    let bytes = &whole.buffer[whole.section_range(s)];
    whole
        .table
        .pieces
        .iter()
        .map(|p| {
            let spec = &catalogue.tensors[p.tensor];
            let range = p.offset as usize * 4..(p.offset + p.region.elements()) as usize * 4;
            (format!("{prefix}{}", spec.name), shape_of(spec.rows, spec.cols), bytes[range].to_vec())
        })
        .collect()
}

/// The parameters, and for a training replica the moments, of a gathered shard.
pub fn model_tensors(whole: &LocalShard, catalogue: &Catalogue) -> (Vec<NamedTensor>, Option<Vec<NamedTensor>>) {
    let params = tensors_of(whole, catalogue, 0, "");
    let moments = whole.sections.contains(&Section::AdamM).then(|| {
        let mut both = tensors_of(whole, catalogue, 1, MOMENT_PREFIXES[0]);
        both.extend(tensors_of(whole, catalogue, 2, MOMENT_PREFIXES[1]));
        both
    });
    (params, moments)
}

fn shape_of(rows: u64, cols: u64) -> Vec<usize> {
    if rows == 1 {
        vec![cols as usize]
    } else {
        vec![rows as usize, cols as usize]
    }
}

/// The first tensor holding NaN or infinite values, and how many.
pub fn first_non_finite<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Option<(String, usize)> {
    tensors.into_iter().find_map(|(name, data)| {
        let count = data.chunks_exact(4).filter(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()).count();
        (count > 0).then(|| (name.to_string(), count))
    })
}

/// The bytes of a safetensors file holding `tensors` with `metadata` in its header.
pub fn serialize(
    tensors: &[NamedTensor],
    metadata: HashMap<String, String>,
    path: &Path,
) -> Result<Vec<u8>, CheckpointError> {
    let damaged =
        |e: safetensors::SafeTensorError| CheckpointError::Damaged { path: path.into(), reason: e.to_string() };
    let views = tensors
        .iter()
        .map(|(name, shape, data)| TensorView::new(StDtype::F32, shape.clone(), data).map(|v| (name.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(damaged)?;
    safetensors::serialize(views, Some(metadata)).map_err(damaged)
}

/// A safetensors file, memory-mapped.
pub struct TensorFile {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl TensorFile {
    /// Maps `path` and checks that its header parses.
    pub fn open(path: &Path) -> Result<TensorFile, CheckpointError> {
        let file = File::open(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => {
                CheckpointError::Damaged { path: path.into(), reason: "the file is missing".into() }
            }
            _ => CheckpointError::Io { action: "open", path: path.into(), source },
        })?;
        // SAFETY: checkpoint files are written once, under a temporary directory name, and
        // never modified in place afterwards, so the mapping does not change under us.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io("map", path))?;
        let out = TensorFile { path: path.to_path_buf(), map };
        out.parse()?;
        Ok(out)
    }

    /// The whole file's bytes (for its digest).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn parse(&self) -> Result<SafeTensors<'_>, CheckpointError> {
        SafeTensors::deserialize(&self.map).map_err(|e| CheckpointError::Damaged {
            path: self.path.clone(),
            reason: format!("not a safetensors file: {e}"),
        })
    }

    /// The string metadata of the header (`__metadata__`).
    pub fn metadata(&self) -> HashMap<String, String> {
        SafeTensors::read_metadata(&self.map).ok().and_then(|(_, m)| m.metadata().clone()).unwrap_or_default()
    }

    /// Checks that the file holds exactly the catalogue's tensors under each of `prefixes`,
    /// as F32 with the catalogue's shapes: a dropped layer, an extra tensor or a reshaped one
    /// is named.
    pub fn check_structure(&self, catalogue: &Catalogue, prefixes: &[&str]) -> Result<(), CheckpointError> {
        let st = self.parse()?;
        let damaged = |reason: String| CheckpointError::Damaged { path: self.path.clone(), reason };
        let mut expected = BTreeSet::new();
        for prefix in prefixes {
            for spec in &catalogue.tensors {
                let name = format!("{prefix}{}", spec.name);
                let view = st.tensor(&name).map_err(|_| damaged(format!("tensor `{name}` is missing")))?;
                let shape = shape_of(spec.rows, spec.cols);
                if view.dtype() != StDtype::F32 || view.shape() != shape.as_slice() {
                    return Err(damaged(format!(
                        "tensor `{name}` is {:?} {:?}; the model needs F32 {shape:?}",
                        view.dtype(),
                        view.shape()
                    )));
                }
                expected.insert(name);
            }
        }
        if let Some(extra) = st.names().into_iter().find(|n| !expected.contains(*n)) {
            return Err(damaged(format!("tensor `{extra}` is not part of the model")));
        }
        Ok(())
    }

    /// The first tensor with NaN or infinite values, and how many.
    pub fn first_non_finite(&self) -> Result<Option<(String, usize)>, CheckpointError> {
        let st = self.parse()?;
        let mut tensors = st.tensors();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(first_non_finite(tensors.iter().map(|(name, view)| (name.as_str(), view.data()))))
    }

    /// Fills section `s` of `shard` with its rectangles of the tensors named `prefix + name`.
    pub fn fill(&self, shard: &mut LocalShard, catalogue: &Catalogue, s: usize, prefix: &str) -> Result<(), String> {
        let st = self.parse().map_err(|e| e.to_string())?;
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

/// Fills a new shard: parameters from `params`, moments from `optim` when the shard keeps them
/// (zero when no optimizer file is given: a fresh optimizer, asked for explicitly).
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
                o.fill(shard, catalogue, 1, MOMENT_PREFIXES[0])?;
                o.fill(shard, catalogue, 2, MOMENT_PREFIXES[1])?;
            }
            None => {
                let (m, v) = (shard.section_range(1), shard.section_range(2));
                shard.buffer[m.start..v.end].fill(0);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_are_counted_in_the_first_tensor_holding_them() {
        let ok: Vec<u8> = [1.0f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let bad: Vec<u8> = [f32::NAN, 3.0, f32::INFINITY].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(first_non_finite([("a", ok.as_slice()), ("b", bad.as_slice())]), Some(("b".into(), 2)));
        assert_eq!(first_non_finite([("a", ok.as_slice())]), None);
    }
}
