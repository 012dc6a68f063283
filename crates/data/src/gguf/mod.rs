//! GGUF files (llama.cpp's model format, version 2 and 3): the metadata, the tensor directory,
//! and tensors dequantized to f32; [`llama`] turns a Llama-architecture file into what a
//! Hugging Face model directory holds. The format is read as the GGUF specification in
//! ggml's repository (`docs/gguf.md`) defines it: little-endian, a header, key–value metadata,
//! tensor infos, then the data aligned to `general.alignment` (32 by default).

pub mod import;
pub mod llama;
pub mod quant;
mod tokenizer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

use nereus_core::file_error::FileError;
pub use quant::GgmlType;

/// Why a GGUF file cannot be used.
#[derive(Debug, Error)]
pub enum GgufError {
    /// The system refused the file.
    #[error("{0}")]
    File(#[from] FileError),
    /// The file is not what the format or the importer needs.
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any integer type, widened.
    Int(i64),
    /// f32 or f64, widened.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Text(String),
    /// An array of values.
    Array(Vec<GgufValue>),
}

/// One tensor's directory entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its dimensions, fastest first (ggml's `ne`): a `[rows, cols]` matrix is `[cols, rows]`.
    pub dims: Vec<u64>,
    /// Its encoding.
    pub kind: GgmlType,
    /// Its byte range in the file.
    pub range: std::ops::Range<usize>,
}

/// A GGUF file, read whole.
pub struct Gguf {
    /// The file.
    pub path: PathBuf,
    /// The metadata, by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// The tensors, in the file's order.
    pub tensors: Vec<TensorInfo>,
    bytes: Vec<u8>,
}

/// A little-endian cursor that names what it was reading when the file ends.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("the file ends inside {what} (at byte {})", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.u64(what)? as usize;
        let raw = self.take(n, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    /// A value of GGUF value type `kind` (0–12, as the specification numbers them).
    fn value(&mut self, kind: u32, what: &str) -> Result<GgufValue, String> {
        use GgufValue::{Bool, Float, Int};
        Ok(match kind {
            0 => Int(i64::from(u8::from_le_bytes(self.array(what)?))),
            1 => Int(i64::from(i8::from_le_bytes(self.array(what)?))),
            2 => Int(i64::from(u16::from_le_bytes(self.array(what)?))),
            3 => Int(i64::from(i16::from_le_bytes(self.array(what)?))),
            4 => Int(i64::from(self.u32(what)?)),
            5 => Int(i64::from(i32::from_le_bytes(self.array(what)?))),
            6 => Float(f64::from(f32::from_le_bytes(self.array(what)?))),
            7 => Bool(self.take(1, what)?[0] != 0),
            8 => GgufValue::Text(self.string(what)?),
            9 => {
                let (inner, n) = (self.u32(what)?, self.u64(what)?);
                // Every element takes at least a byte: a longer array is a damaged count.
                let n = usize::try_from(n).ok().filter(|&n| n <= self.bytes.len() - self.at);
                let n = n.ok_or(format!("{what}: the array is longer than the file"))?;
                GgufValue::Array((0..n).map(|_| self.value(inner, what)).collect::<Result<_, _>>()?)
            }
            10 => Int(i64::try_from(self.u64(what)?).map_err(|_| format!("{what} does not fit an i64"))?),
            11 => Int(i64::from_le_bytes(self.array(what)?)),
            12 => Float(f64::from_le_bytes(self.array(what)?)),
            other => return Err(format!("{what} has unknown value type {other}")),
        })
    }
}

impl Gguf {
    /// Reads and parses the file at `path`; every problem names the file and what was being
    /// read.
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let bytes = nereus_core::file_error::read_regular(path)?;
        let invalid = |reason: String| GgufError::Invalid { path: path.to_path_buf(), reason };
        let (metadata, tensors) = parse(&bytes).map_err(invalid)?;
        Ok(Gguf { path: path.to_path_buf(), metadata, tensors, bytes })
    }

    /// The metadata value at `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The string at `key`, if it is one.
    pub fn text(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(GgufValue::Text(s)) => Some(s),
            _ => None,
        }
    }

    /// An error about this file.
    pub fn invalid(&self, reason: impl Into<String>) -> GgufError {
        GgufError::Invalid { path: self.path.clone(), reason: reason.into() }
    }

    /// The integer at `key`, or an error naming the key.
    pub fn int(&self, key: &str) -> Result<i64, GgufError> {
        match self.get(key) {
            Some(GgufValue::Int(v)) => Ok(*v),
            Some(_) => Err(self.invalid(format!("metadata `{key}` is not an integer"))),
            None => Err(self.invalid(format!("no metadata `{key}`"))),
        }
    }

    /// The directory entry of the tensor named `name`.
    pub fn info(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensors.iter().find(|t| t.name == name).ok_or_else(|| self.invalid(format!("no tensor `{name}`")))
    }

    /// The tensor named `name`, dequantized to f32, and its dimensions (fastest first).
    pub fn tensor(&self, name: &str) -> Result<(Vec<u64>, Vec<f32>), GgufError> {
        let info = self.info(name)?;
        Ok((info.dims.clone(), info.kind.dequantize(&self.bytes[info.range.clone()])))
    }
}

type Parsed = (BTreeMap<String, GgufValue>, Vec<TensorInfo>);

/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
const MAX_RANK: u32 = 4;

/// The metadata and tensor directory of a GGUF file's bytes.
fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor { bytes, at: 0 };
    if c.take(4, "the magic number")? != b"GGUF" {
        return Err("not a GGUF file (it does not start with `GGUF`)".into());
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version}; versions 2 and 3 are read"));
    }
    let (tensor_count, kv_count) = (c.u64("the tensor count")?, c.u64("the metadata count")?);
    let mut metadata = BTreeMap::new();
    for k in 0..kv_count {
        let key = c.string(&format!("metadata key {k}"))?;
        let kind = c.u32(&format!("the type of `{key}`"))?;
        let value = c.value(kind, &format!("metadata `{key}`"))?;
        metadata.insert(key, value);
    }
    let mut infos = Vec::new();
    for k in 0..tensor_count {
        let name = c.string(&format!("tensor name {k}"))?;
        let what = format!("tensor `{name}`");
        let rank = c.u32(&what)?;
        if rank == 0 || rank > MAX_RANK {
            return Err(format!("{what} has {rank} dimensions; ggml tensors have 1 to {MAX_RANK}"));
        }
        let dims = (0..rank).map(|_| c.u64(&what)).collect::<Result<Vec<_>, _>>()?;
        let id = c.u32(&what)?;
        let offset = c.u64(&what)?;
        let kind = GgmlType::from_id(id).ok_or(format!(
            "{what} has ggml type {id}, which this reader does not decode (F32, F16, BF16, Q4_0, Q4_1, Q8_0)"
        ))?;
        infos.push((name, dims, kind, offset));
    }
    let alignment = match metadata.get("general.alignment") {
        Some(GgufValue::Int(a)) if *a > 0 => *a as usize,
        _ => 32,
    };
    let data = c.at.div_ceil(alignment) * alignment;
    let tensors = infos
        .into_iter()
        .map(|(name, dims, kind, offset)| {
            let n = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).and_then(|n| usize::try_from(n).ok());
            let n = n.ok_or(format!("tensor `{name}`: its dimensions {dims:?} overflow"))?;
            let size = kind.bytes_for(n).ok_or(format!("tensor `{name}`: {n} values are not whole blocks"))?;
            let start = usize::try_from(offset).ok().and_then(|o| data.checked_add(o));
            let start = start.ok_or(format!("tensor `{name}` starts past the end of the file"))?;
            let end = start.checked_add(size).filter(|&e| e <= bytes.len());
            let end = end.ok_or(format!("tensor `{name}` runs past the end of the file (truncated?)"))?;
            Ok(TensorInfo { name, dims, kind, range: start..end })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((metadata, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header with one tensor `t` of `dims` (F32) at offset 0, and `payload` bytes of data.
    fn file(dims: &[u64], offset: u64, payload: usize) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.push(b't');
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(0u32.to_le_bytes());
        b.extend(offset.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32 + payload, 0);
        b
    }

    /// A well-formed tensor reads; damaged directories are errors naming the tensor, never a
    /// panic or an allocation the size of a damaged count.
    #[test]
    fn tensor_directories_are_checked() {
        let (_, tensors) = parse(&file(&[4, 2], 0, 32)).unwrap();
        assert_eq!((tensors[0].dims.clone(), tensors[0].range.len()), (vec![4, 2], 32));
        for (bytes, needle) in [
            (file(&[4, 2], 0, 16), "tensor `t` runs past the end of the file"),
            (file(&[1, 1, 1, 1, 1], 0, 4), "tensor `t` has 5 dimensions"),
            (file(&[u64::MAX, 2], 0, 4), "tensor `t`: its dimensions [18446744073709551615, 2] overflow"),
            (file(&[1], u64::MAX, 4), "tensor `t` starts past the end of the file"),
            (file(&[4, 2], 0, 32)[..30].to_vec(), "the file ends inside tensor name 0"),
        ] {
            let e = parse(&bytes).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }
}
