//! Safetensors files of whole tensors under Hugging Face names: serialized in any dtype,
//! opened memory-mapped (a reader touches only the pages of the rectangles it copies), and copied
//! out rectangle by rectangle, converted to f32. [`ModelWeights`] is a set of such files under one
//! name space (a model directory's shards, or one file); it checks a catalogue's tensors against
//! them and fills the f32 values of a shard's pieces from them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};

use super::error::{io, open_model_file, ModelFileError};
use nereus_core::config::Dtype;
use nereus_core::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use nereus_core::model::{Catalogue, Piece};

/// One tensor ready to serialize: name, shape, little-endian f32 bytes.
pub type NamedTensor = (String, Vec<usize>, Vec<u8>);

/// The safetensors dtype that stores `dtype`.
pub fn st_dtype(dtype: Dtype) -> StDtype {
    match dtype {
        Dtype::F32 => StDtype::F32,
        Dtype::Bf16 => StDtype::BF16,
        Dtype::F16 => StDtype::F16,
    }
}

/// Bytes per element of the dtypes weights may come in; `None` for any other.
fn element_bytes(dtype: StDtype) -> Option<usize> {
    match dtype {
        StDtype::F32 => Some(4),
        StDtype::BF16 | StDtype::F16 => Some(2),
        _ => None,
    }
}

/// Decodes little-endian elements of `dtype` (F32, BF16 or F16) into f32: exactly, since f32
/// holds every bf16 and f16 value.
fn decode(dtype: StDtype, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        StDtype::F32 => out.iter_mut().zip(bytes.chunks_exact(4)).for_each(|(o, b)| {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }),
        StDtype::BF16 => out.iter_mut().zip(bytes.chunks_exact(2)).for_each(|(o, b)| {
            *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }),
        _ => out.iter_mut().zip(bytes.chunks_exact(2)).for_each(|(o, b)| {
            *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }),
    }
}

/// Little-endian f32 bytes re-encoded as `dtype` (rounding to nearest even).
pub fn encode(f32_bytes: &[u8], dtype: Dtype) -> Vec<u8> {
    let values = f32_bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    match dtype {
        Dtype::F32 => f32_bytes.to_vec(),
        Dtype::Bf16 => values.flat_map(|x| f32_to_bf16(x).to_le_bytes()).collect(),
        Dtype::F16 => values.flat_map(|x| f32_to_f16(x).to_le_bytes()).collect(),
    }
}

/// The first tensor holding NaN or infinite values, and how many.
pub fn first_non_finite<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Option<(String, usize)> {
    tensors.into_iter().find_map(|(name, data)| {
        let count = data.chunks_exact(4).filter(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()).count();
        (count > 0).then(|| (name.to_string(), count))
    })
}

/// The bytes of a safetensors file holding `tensors` (f32) stored as `dtype`, with `metadata`
/// in its header.
pub fn serialize(
    tensors: &[NamedTensor],
    dtype: Dtype,
    metadata: HashMap<String, String>,
    path: &Path,
) -> Result<Vec<u8>, ModelFileError> {
    let damaged =
        |e: safetensors::SafeTensorError| ModelFileError::Damaged { path: path.into(), reason: e.to_string() };
    let encoded: Vec<Vec<u8>> = tensors.iter().map(|(_, _, data)| encode(data, dtype)).collect();
    let views = tensors
        .iter()
        .zip(&encoded)
        .map(|((name, shape, _), data)| {
            TensorView::new(st_dtype(dtype), shape.clone(), data).map(|v| (name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(damaged)?;
    safetensors::serialize(views, Some(metadata)).map_err(damaged)
}

/// A safetensors file, memory-mapped.
pub struct TensorFile {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl std::fmt::Debug for TensorFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorFile({}, {} bytes)", self.path.display(), self.map.len())
    }
}

impl TensorFile {
    /// Maps `path` and checks that its header parses.
    pub fn open(path: &Path) -> Result<TensorFile, ModelFileError> {
        let file = open_model_file(path)?;
        // SAFETY: checkpoint files are written once, under a temporary directory name, and
        // never modified in place afterwards, so the mapping does not change under us; a model
        // directory is read-only input by contract (docs/models.md).
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

    fn parse(&self) -> Result<SafeTensors<'_>, ModelFileError> {
        SafeTensors::deserialize(&self.map).map_err(|e| ModelFileError::Damaged {
            path: self.path.clone(),
            reason: format!("not a safetensors file: {e}"),
        })
    }

    /// The names of its tensors.
    pub fn names(&self) -> Result<Vec<String>, ModelFileError> {
        Ok(self.parse()?.names().into_iter().map(String::from).collect())
    }

    /// The string metadata of the header (`__metadata__`).
    pub fn metadata(&self) -> HashMap<String, String> {
        SafeTensors::read_metadata(&self.map).ok().and_then(|(_, m)| m.metadata().clone()).unwrap_or_default()
    }

    /// The first tensor with NaN or infinite values, and how many.
    pub fn first_non_finite(&self) -> Result<Option<(String, usize)>, ModelFileError> {
        let st = self.parse()?;
        let mut tensors = st.tensors();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(tensors.iter().find_map(|(name, view)| {
            let mut values = vec![0f32; view.shape().iter().product()];
            decode(view.dtype(), view.data(), &mut values);
            let count = values.iter().filter(|x| !x.is_finite()).count();
            (count > 0).then(|| (name.clone(), count))
        }))
    }
}

/// What filling does with a tensor the weights lack: initializes its rectangle (the piece and
/// the piece's values), or refuses with a reason.
pub type Absent<'a> = dyn FnMut(&Piece, &mut [f32]) -> Result<(), String> + 'a;

/// What [`ModelWeights::check`] accepts.
#[derive(Debug, Clone, Copy)]
pub enum Expect<'a> {
    /// A checkpoint's file: exactly the catalogue's tensors, all in this dtype.
    Exactly(Dtype),
    /// A model directory: F32, BF16 or F16 tensors; the tensors named in `fresh` may be absent
    /// (a value head the model does not have yet); an `lm_head.weight` the catalogue has no
    /// place for (a value model, or tied embeddings) and rotary buffers are ignored.
    Pretrained {
        /// Tensors allowed to be absent.
        fresh: &'a [&'a str],
    },
}

/// The tensors of one model spread over one or more safetensors files (a model directory's
/// shards, a checkpoint's optimizer file, a warm-up output), by name.
#[derive(Debug)]
pub struct ModelWeights {
    files: Vec<TensorFile>,
    index: BTreeMap<String, usize>,
}

impl ModelWeights {
    /// The tensors of `files`; a name in two files is an error naming both.
    pub fn of_files(files: Vec<TensorFile>) -> Result<ModelWeights, ModelFileError> {
        let mut index = BTreeMap::new();
        for (i, file) in files.iter().enumerate() {
            for name in file.names()? {
                if let Some(j) = index.insert(name.clone(), i) {
                    return Err(ModelFileError::Damaged {
                        path: file.path().into(),
                        reason: format!("tensor `{name}` is also in `{}`", files[j].path().display()),
                    });
                }
            }
        }
        Ok(ModelWeights { files, index })
    }

    /// The tensors of one file.
    pub fn single(file: TensorFile) -> Result<ModelWeights, ModelFileError> {
        ModelWeights::of_files(vec![file])
    }

    /// The files.
    pub fn files(&self) -> &[TensorFile] {
        &self.files
    }

    fn view(&self, name: &str) -> Option<(TensorView<'_>, &Path)> {
        let file = &self.files[*self.index.get(name)?];
        // The view borrows the mapping, not the parsed header.
        let view = SafeTensors::deserialize(&file.map).ok()?.tensor(name).ok()?;
        Some((view, file.path()))
    }

    /// Checks the catalogue's tensors under each of `prefixes` — present, in Hugging Face's
    /// shapes and an accepted dtype — and that nothing else is there; names the first problem
    /// with its file. Returns the `fresh` tensors that are absent.
    pub fn check(
        &self,
        catalogue: &Catalogue,
        prefixes: &[&str],
        expect: Expect,
    ) -> Result<Vec<String>, ModelFileError> {
        let first = self.files.first().map_or(PathBuf::new(), |f| f.path().to_path_buf());
        let damaged = |path: &Path, reason: String| ModelFileError::Damaged { path: path.into(), reason };
        let mut expected = BTreeSet::new();
        let mut absent = Vec::new();
        for prefix in prefixes {
            for spec in &catalogue.tensors {
                let name = format!("{prefix}{}", spec.name);
                expected.insert(name.clone());
                let Some((view, path)) = self.view(&name) else {
                    match expect {
                        Expect::Pretrained { fresh } if fresh.contains(&name.as_str()) => absent.push(name),
                        _ => return Err(damaged(&first, format!("tensor `{name}` is missing"))),
                    }
                    continue;
                };
                let shape = spec.hf_shape();
                let dtype_ok = match expect {
                    Expect::Exactly(dtype) => view.dtype() == st_dtype(dtype),
                    Expect::Pretrained { .. } => element_bytes(view.dtype()).is_some(),
                };
                if !dtype_ok || view.shape() != shape.as_slice() {
                    let want = match expect {
                        Expect::Exactly(dtype) => format!("{:?}", st_dtype(dtype)),
                        Expect::Pretrained { .. } => "F32, BF16 or F16".into(),
                    };
                    return Err(damaged(
                        path,
                        format!(
                            "tensor `{name}` is {:?} {:?}; the model needs {want} {shape:?}",
                            view.dtype(),
                            view.shape()
                        ),
                    ));
                }
            }
        }
        let ignored = |name: &str| match expect {
            Expect::Exactly(_) => false,
            Expect::Pretrained { .. } => name == "lm_head.weight" || name.ends_with("rotary_emb.inv_freq"),
        };
        if let Some((extra, &i)) = self.index.iter().find(|(n, _)| !expected.contains(*n) && !ignored(n)) {
            return Err(damaged(self.files[i].path(), format!("tensor `{extra}` is not part of the model")));
        }
        Ok(absent)
    }

    /// Fills `out` (the f32 values of a shard's pieces, in table order) with their rectangles
    /// of the tensors named `prefix + name`, converted to f32; a tensor that is absent goes to
    /// `absent` (which may initialize it, or refuse).
    pub fn fill(
        &self,
        out: &mut [f32],
        pieces: &[Piece],
        catalogue: &Catalogue,
        prefix: &str,
        absent: &mut Absent,
    ) -> Result<(), String> {
        for piece in pieces {
            let spec = &catalogue.tensors[piece.tensor];
            let name = format!("{prefix}{}", spec.name);
            let target = &mut out[piece.offset as usize..(piece.offset + piece.region.elements()) as usize];
            let Some((view, path)) = self.view(&name) else {
                absent(piece, target).map_err(|e| format!("tensor {name}: {e}"))?;
                continue;
            };
            let want = spec.elements() as usize;
            let size = element_bytes(view.dtype()).filter(|_| view.shape().iter().product::<usize>() == want);
            let Some(size) = size else {
                return Err(format!(
                    "{}: tensor {name} is {:?} {:?}, the model needs F32, BF16 or F16 with {want} elements ({} × {})",
                    path.display(),
                    view.dtype(),
                    view.shape(),
                    spec.rows,
                    spec.cols
                ));
            };
            copy_rect(view.dtype(), size, view.data(), spec.cols, piece, target);
        }
        Ok(())
    }
}

/// Copies the rectangle `piece.region` of a row-major tensor `cols` wide, stored as `dtype`
/// (`size` bytes an element) in `data`, into `out`, converted to f32: the one rectangle copier
/// between files and shards.
fn copy_rect(dtype: StDtype, size: usize, data: &[u8], cols: u64, piece: &Piece, out: &mut [f32]) {
    let r = piece.region;
    for row in 0..r.rows {
        let src = (((r.row0 + row) * cols + r.col0) as usize) * size;
        let dst = (row * r.cols) as usize;
        let len = r.cols as usize;
        decode(dtype, &data[src..src + len * size], &mut out[dst..dst + len]);
    }
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

    #[test]
    fn half_precision_encodings_round_to_nearest_even_and_decode_exactly() {
        let values = [0.0f32, -0.0, 1.0, -2.5, 1.0 / 3.0, 65504.0, 1e-7, 6.0e-5, 3.0e38, f32::INFINITY];
        let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        for (dtype, st) in [(Dtype::Bf16, StDtype::BF16), (Dtype::F16, StDtype::F16)] {
            let mut back = vec![0f32; values.len()];
            decode(st, &encode(&bytes, dtype), &mut back);
            for (&x, &y) in values.iter().zip(&back) {
                let tolerance = if dtype == Dtype::Bf16 { 2f32.powi(-8) } else { 2f32.powi(-11) };
                let representable = dtype == Dtype::Bf16 || x.abs() <= 65504.0;
                if representable && x.is_finite() && x.abs() >= 6.2e-5 {
                    assert!((x - y).abs() <= tolerance * x.abs(), "{dtype:?}: {x} came back as {y}");
                }
            }
            // What the format holds comes back bit for bit (encode ∘ decode is the identity).
            let mut again = vec![0f32; values.len()];
            let re = encode(&back.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(), dtype);
            decode(st, &re, &mut again);
            assert_eq!(
                back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                again.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
