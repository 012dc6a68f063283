//! A Llama-architecture GGUF file (llama.cpp's format, as small published models ship) written as
//! a Hugging Face model directory that `train`, `logprobs` and `data preview` read:
//! `config.json`, `generation_config.json`, safetensors weights dequantized to f32 or bf16,
//! `tokenizer.json` and `tokenizer_config.json` with the chat template (`nereus model
//! import-gguf`, docs/models.md).

use std::path::Path;

use serde_json::Value;
use thiserror::Error;

use super::llama::LlamaImport;
use super::{Gguf, GgufError};
use crate::model_files::{write_durably, write_model_dir, ModelFileError, WriteOptions};
use nereus_core::config::{Dtype, ModelSpec};
use nereus_core::exit::{EXIT_FAILURE, EXIT_USAGE};

/// Why an import failed.
#[derive(Debug, Error)]
pub enum ImportError {
    /// The GGUF file is unreadable or not a model the importer takes.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The model directory could not be written.
    #[error(transparent)]
    Write(#[from] ModelFileError),
}

impl ImportError {
    /// 2 for a file the user must change, 1 for a write the system refused.
    pub fn exit_code(&self) -> u8 {
        match self {
            ImportError::Gguf(_) => EXIT_USAGE,
            ImportError::Write(_) => EXIT_FAILURE,
        }
    }
}

/// What an import wrote.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The model's shape.
    pub spec: ModelSpec,
    /// Tensors written.
    pub tensors: usize,
}

/// Reads the GGUF file `file` and writes the model directory `out` (created; files in it are
/// replaced) with weights stored as `dtype`.
pub fn import_gguf(file: &Path, out: &Path, dtype: Dtype) -> Result<Imported, ImportError> {
    let gguf = Gguf::open(file)?;
    let model = LlamaImport::from_gguf(&gguf, dtype)?;
    let tensors: Vec<_> = model
        .tensors
        .iter()
        .map(|(name, shape, values)| {
            (name.clone(), shape.clone(), values.iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    let (config, generation_config) = (model.config_json(), Value::Object(model.generation_config()));
    let write = WriteOptions {
        dtype,
        max_shard_bytes: 2 << 30,
        metadata: [("source".to_string(), file.display().to_string())].into(),
        config: &config,
        generation_config: &generation_config,
        source: None,
        tokenizer: None,
    };
    write_model_dir(out, &tensors, &write)?;
    for (name, value) in [("tokenizer.json", &model.tokenizer), ("tokenizer_config.json", &model.tokenizer_config)] {
        let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
        write_durably(&out.join(name), text.as_bytes())?;
    }
    Ok(Imported { spec: model.spec, tensors: tensors.len() })
}
