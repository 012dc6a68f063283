//! Hugging Face model directories, the form every model takes outside the job: `config.json`,
//! `generation_config.json`, the weights as `model.safetensors` or, above a size threshold, as
//! shards `model-0000k-of-0000n.safetensors` with `model.safetensors.index.json`, and the
//! tokenizer files of the directory the model came from. [`open_weights`] reads one (every rank
//! maps the files and copies out its own rectangles); [`write_model_dir`] writes one, each file
//! fsynced, and returns every file's digest for the checkpoint's sidecar.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::ops::Range;
use std::path::Path;

use serde_json::{json, Map, Value};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::durable::{pause_before_each_file_for_tests, sync_dir, write_durably};
use super::error::{io, open_model_file, ModelFileError};
use super::safetensors::{serialize, ModelWeights, NamedTensor, TensorFile};
use nereus_core::config::hf::{CONFIG_JSON, GENERATION_CONFIG_JSON};
use nereus_core::config::Dtype;

/// One written file: its name (relative to where it is recorded), size and SHA-256 (a
/// checkpoint's sidecar lists them; a model directory's files are named `<model>/<file>` there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDigest {
    /// Path inside the directory recorded.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the whole file, lowercase hex.
    pub sha256: String,
}

impl FileDigest {
    /// The digest of `bytes` written as `file`.
    pub fn of(file: &str, bytes: &[u8]) -> FileDigest {
        FileDigest { file: file.into(), bytes: bytes.len() as u64, sha256: sha256_hex(bytes) }
    }
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The weights of an unsharded model directory.
pub const WEIGHTS: &str = "model.safetensors";

/// The index of a sharded model directory (`weight_map`: tensor name → shard file).
pub const INDEX: &str = "model.safetensors.index.json";

/// Files of a tokenizer that a model directory may hold; copied through unchanged.
pub const TOKENIZER_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Shards above this many bytes start a new file: transformers' own default (`"5GB"`).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// The file names of a model directory's weights: the shards its index names (each once, in
/// order), or `model.safetensors`.
pub fn weight_files(dir: &Path) -> Result<Vec<String>, ModelFileError> {
    let index = dir.join(INDEX);
    if !index.is_file() {
        return Ok(vec![WEIGHTS.into()]);
    }
    let damaged = |reason: String| ModelFileError::Damaged { path: index.clone(), reason };
    let text = std::io::read_to_string(open_model_file(&index)?).map_err(io("read", &index))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| damaged(format!("not JSON: {e}")))?;
    let map = json.get("weight_map").and_then(Value::as_object).ok_or_else(|| damaged("no weight_map".into()))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| damaged(format!("the file of `{tensor}` is not a string")))?;
        // Shards live beside the index: a path elsewhere is refused rather than followed.
        if file.contains('/') || file.contains('\\') || file == ".." || !file.ends_with(".safetensors") {
            return Err(damaged(format!("`{tensor}` names `{file}`, which is not a .safetensors file beside it")));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.into());
        }
    }
    files.sort();
    Ok(files)
}

/// Opens the weights of model directory `dir`, memory-mapped.
pub fn open_weights(dir: &Path) -> Result<ModelWeights, ModelFileError> {
    let files = weight_files(dir)?.iter().map(|f| TensorFile::open(&dir.join(f))).collect::<Result<Vec<_>, _>>()?;
    ModelWeights::of_files(files)
}

/// How [`write_model_dir`] writes a model.
#[derive(Debug, Clone)]
pub struct WriteOptions<'a> {
    /// Dtype of the stored tensors.
    pub dtype: Dtype,
    /// Largest shard in bytes (a single tensor larger than this gets a shard of its own).
    pub max_shard_bytes: u64,
    /// Header metadata of every weight file (besides `format = "pt"`, which transformers wants).
    pub metadata: HashMap<String, String>,
    /// The `config.json` object.
    pub config: &'a Map<String, Value>,
    /// The `generation_config.json` object, unless `source` has one.
    pub generation_config: &'a Value,
    /// The directory the model came from: its generation config is copied, and its tokenizer
    /// files unless `tokenizer` names another directory.
    pub source: Option<&'a Path>,
    /// The directory the tokenizer files are copied from when it is not `source` (a text job's
    /// `data.tokenizer`, for a model that started from random weights).
    pub tokenizer: Option<&'a Path>,
}

/// Writes model directory `dir` (created if needed) holding `tensors` (f32, Hugging Face names
/// and shapes, in catalogue order); fsyncs every file and the directory. Returns each file's
/// size and SHA-256, names relative to `dir`.
pub fn write_model_dir(
    dir: &Path,
    tensors: &[NamedTensor],
    options: &WriteOptions,
) -> Result<Vec<FileDigest>, ModelFileError> {
    std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
    let mut digests = vec![write_file(dir, CONFIG_JSON, &pretty(&Value::Object(options.config.clone())))?];
    let copied_generation = options.source.map(|s| s.join(GENERATION_CONFIG_JSON)).filter(|p| p.is_file());
    digests.push(match copied_generation {
        Some(path) => write_file(dir, GENERATION_CONFIG_JSON, &std::fs::read(&path).map_err(io("read", &path))?)?,
        None => write_file(dir, GENERATION_CONFIG_JSON, &pretty(options.generation_config))?,
    });
    let mut metadata = options.metadata.clone();
    metadata.insert("format".into(), "pt".into());
    let shards = shard_ranges(tensors, options.dtype.bytes(), options.max_shard_bytes);
    let mut weight_map = BTreeMap::new();
    for (k, range) in shards.iter().enumerate() {
        let name = if shards.len() == 1 {
            WEIGHTS.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, shards.len())
        };
        let part = &tensors[range.clone()];
        let bytes = serialize(part, options.dtype, metadata.clone(), &dir.join(&name))?;
        weight_map.extend(part.iter().map(|(tensor, _, _)| (tensor.clone(), name.clone())));
        digests.push(write_file(dir, &name, &bytes)?);
    }
    if shards.len() > 1 {
        let total: u64 = tensors.iter().map(|(_, _, d)| d.len() as u64 / 4 * options.dtype.bytes()).sum();
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        digests.push(write_file(dir, INDEX, &pretty(&index))?);
    }
    for name in TOKENIZER_FILES {
        if let Some(path) = options.tokenizer.or(options.source).map(|s| s.join(name)).filter(|p| p.is_file()) {
            digests.push(write_file(dir, name, &std::fs::read(&path).map_err(io("read", &path))?)?);
        }
    }
    sync_dir(dir)?;
    Ok(digests)
}

/// Consecutive runs of tensors of at most `max` bytes each (stored with `element` bytes per
/// value), a larger tensor alone; at least one run.
fn shard_ranges(tensors: &[NamedTensor], element: u64, max: u64) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0u64);
    for (i, (_, _, data)) in tensors.iter().enumerate() {
        let bytes = data.len() as u64 / 4 * element;
        if i > start && size + bytes > max {
            out.push(start..i);
            (start, size) = (i, 0);
        }
        size += bytes;
    }
    out.push(start..tensors.len());
    out
}

fn pretty(value: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).expect("JSON values serialize");
    bytes.push(b'\n');
    bytes
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<FileDigest, ModelFileError> {
    pause_before_each_file_for_tests();
    write_durably(&dir.join(name), bytes)?;
    Ok(FileDigest::of(name, bytes))
}

/// The SHA-256 and size of a file, streamed (a multi-gigabyte shard is never held in memory).
pub fn digest_file(path: &Path, name: &str) -> Result<FileDigest, ModelFileError> {
    let mut file = open_model_file(path)?;
    let mut hasher = Sha256::new();
    let bytes = std::io::copy(&mut file, &mut hasher).map_err(io("read", path))?;
    hasher.flush().map_err(io("read", path))?;
    let sha256 = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(FileDigest { file: name.into(), bytes, sha256 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, values: usize) -> NamedTensor {
        (name.into(), vec![values], (0..values).flat_map(|i| (i as f32).to_le_bytes()).collect())
    }

    #[test]
    fn shards_fill_up_to_the_threshold_and_a_large_tensor_stands_alone() {
        let t = [tensor("a", 10), tensor("b", 10), tensor("c", 100), tensor("d", 5)];
        assert_eq!(shard_ranges(&t, 4, 80), vec![0..2, 2..3, 3..4]);
        assert_eq!(shard_ranges(&t, 2, 1000), vec![0..4]);
        assert_eq!(shard_ranges(&t, 2, 40), vec![0..2, 2..3, 3..4]);
        assert_eq!(shard_ranges(&[], 4, 10), vec![0..0]);
    }

    #[test]
    fn a_sharded_directory_reads_back_through_its_index_and_refuses_paths_outside_it() {
        let dir = tempfile::tempdir().unwrap();
        let t = [tensor("a", 10), tensor("b", 10), tensor("c", 30)];
        let config = Map::new();
        let options = WriteOptions {
            dtype: Dtype::Bf16,
            max_shard_bytes: 40,
            metadata: HashMap::new(),
            config: &config,
            generation_config: &json!({}),
            source: None,
            tokenizer: None,
        };
        let digests = write_model_dir(dir.path(), &t, &options).unwrap();
        let names: Vec<&str> = digests.iter().map(|d| d.file.as_str()).collect();
        assert_eq!(
            names,
            [
                CONFIG_JSON,
                GENERATION_CONFIG_JSON,
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                INDEX
            ]
        );
        let weights = open_weights(dir.path()).unwrap();
        assert_eq!(weights.files().len(), 2);
        assert_eq!(digest_file(&dir.path().join(INDEX), INDEX).unwrap(), digests[4]);
        std::fs::write(dir.path().join(INDEX), r#"{"weight_map": {"a": "../x.safetensors"}}"#).unwrap();
        assert!(open_weights(dir.path()).unwrap_err().to_string().contains("not a .safetensors file beside it"));
    }
}
