//! Models as files: Hugging Face model directories (`config.json`, `generation_config.json`,
//! safetensors weights, sharded above a size, the tokenizer's files) read and written, the
//! safetensors files themselves, and writes that survive a crash. Pure file I/O: `nereus model
//! import-gguf` writes a directory without MPI, and the runtime's checkpoints build on it.

mod dir;
mod durable;
mod error;
mod safetensors;

pub use self::safetensors::{
    encode, first_non_finite, serialize, st_dtype, Absent, Expect, ModelWeights, NamedTensor, TensorFile,
};
pub use dir::{
    digest_file, open_weights, sha256_hex, weight_files, write_model_dir, FileDigest, WriteOptions,
    DEFAULT_MAX_SHARD_BYTES, INDEX, TOKENIZER_FILES, WEIGHTS,
};
pub use durable::{pause_before_each_file_for_tests, replace_durably, sync_dir, write_durably};
pub use error::ModelFileError;
