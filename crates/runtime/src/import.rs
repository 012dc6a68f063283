//! `nereus model import-gguf FILE --out DIR`: a Llama-architecture GGUF file (llama.cpp's
//! format, as small published models ship) written as a Hugging Face model directory that
//! `train`, `logprobs` and `data preview` read: `config.json`, `generation_config.json`,
//! safetensors weights dequantized to f32 or bf16, `tokenizer.json` and `tokenizer_config.json`
//! with the chat template.

use std::path::PathBuf;

use nereus_core::config::Dtype;
use nereus_data::gguf::llama::LlamaImport;
use nereus_data::gguf::Gguf;

use super::checkpoint::{write_model_dir, WriteOptions};
use super::RuntimeError;

/// `nereus model import-gguf`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ImportGgufOptions {
    /// The GGUF file.
    pub file: PathBuf,
    /// The model directory to write (created; files in it are replaced).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Dtype of the written weights: f32 (exactly the dequantized values) or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: Dtype,
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    match s {
        "f32" => Ok(Dtype::F32),
        "bf16" => Ok(Dtype::Bf16),
        other => Err(format!("`{other}`: f32 or bf16")),
    }
}

/// Reads the GGUF file and writes the model directory; prints what it wrote.
pub fn import_gguf(options: &ImportGgufOptions) -> Result<(), RuntimeError> {
    let bad = |e: nereus_data::gguf::GgufError| RuntimeError::Usage(e.to_string());
    let gguf = Gguf::open(&options.file).map_err(bad)?;
    let model = LlamaImport::from_gguf(&gguf, options.dtype).map_err(bad)?;
    let tensors: Vec<_> = model
        .tensors
        .iter()
        .map(|(name, shape, values)| {
            (name.clone(), shape.clone(), values.iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    let write = WriteOptions {
        dtype: options.dtype,
        max_shard_bytes: 2 << 30,
        metadata: [("source".to_string(), options.file.display().to_string())].into(),
        config: &model.config,
        generation_config: &model.generation_config,
        source: None,
        tokenizer: None,
    };
    write_model_dir(&options.out, &tensors, &write)?;
    for (name, value) in [("tokenizer.json", &model.tokenizer), ("tokenizer_config.json", &model.tokenizer_config)] {
        let path = options.out.join(name);
        let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
        std::fs::write(&path, text).map_err(nereus_core::file_error::FileError::on("write", &path))?;
    }
    let s = &model.spec;
    println!(
        "{}: {} layers, hidden {}, {} heads ({} KV), vocab {}, {} tensors as {} in {}",
        options.file.display(),
        s.layers,
        s.hidden,
        s.heads,
        s.kv_heads,
        s.vocab,
        tensors.len(),
        nereus_core::config::hf::hf_dtype_name(options.dtype),
        options.out.display()
    );
    Ok(())
}
