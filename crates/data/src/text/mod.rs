//! The model directory's text side: the tokenizer (`tokenizer.json`, read by Hugging Face's
//! `tokenizers`), the chat template (`chat_template.jinja`, or `tokenizer_config.json`'s
//! `chat_template`) and the special tokens (BOS, several EOS ids, padding) from
//! `tokenizer_config.json`, `generation_config.json` and `config.json`.
//!
//! A prompt is rendered the way transformers' `apply_chat_template(…, add_generation_prompt=True)`
//! renders it and then encoded without adding special tokens (the template writes them), so the
//! ids a job generates from are the ids transformers would give the model.

mod special;
mod template;
mod train;

use std::path::{Path, PathBuf};

use thiserror::Error;

use nereus_core::file_error::FileError;

use crate::records::Prompt;
pub use special::SpecialTokens;
pub use template::ChatTemplate;
pub use train::{save as save_tokenizer, train_byte_level_bpe};

/// Why a model directory's text side cannot be used.
#[derive(Debug, Error)]
pub enum TextError {
    /// The system refused a file.
    #[error("{0}")]
    File(#[from] FileError),
    /// A file is not what it should be.
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The chat template did not render: its own message (`raise_exception`), an error Jinja
    /// raises, or a bound it ran past.
    #[error("{}: the chat template failed to render: {reason}", path.display())]
    Render {
        /// The file the template came from.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Chat messages need a template and the directory has none.
    #[error("{}: no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template), so chat messages cannot be rendered; give plain-text prompts or add a template", dir.display())]
    NoTemplate {
        /// The model directory.
        dir: PathBuf,
    },
    /// The tokenizer produces ids the model has no embedding row for.
    #[error("the tokenizer's vocabulary ({tokenizer} ids, up to id {}) does not fit the model's embedding ({model} rows)", tokenizer - 1)]
    VocabMismatch {
        /// Ids the tokenizer can produce (its largest id + 1).
        tokenizer: usize,
        /// The model's vocabulary (embedding rows).
        model: usize,
    },
    /// Encoding or decoding failed inside the tokenizer.
    #[error("the tokenizer failed: {0}")]
    Tokenize(String),
}

/// A model directory's tokenizer, chat template and special tokens.
pub struct ModelText {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    special: SpecialTokens,
    dir: PathBuf,
}

impl std::fmt::Debug for ModelText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelText").field("dir", &self.dir).field("special", &self.special).finish_non_exhaustive()
    }
}

impl ModelText {
    /// Reads `dir/tokenizer.json`, the chat template and the special tokens.
    pub fn load(dir: &Path) -> Result<Self, TextError> {
        let path = dir.join("tokenizer.json");
        let bytes = nereus_core::file_error::read_regular(&path)?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| TextError::Invalid { path: path.clone(), reason: format!("not a tokenizers file: {e}") })?;
        let special = SpecialTokens::load(dir, &tokenizer)?;
        let template = ChatTemplate::load(dir)?;
        Ok(Self { tokenizer, template, special, dir: dir.to_path_buf() })
    }

    /// The special tokens: BOS, EOS ids (generation stops at any), padding.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// Whether the directory has a chat template.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// Ids the tokenizer can produce: its largest id, added tokens included, plus one.
    pub fn id_space(&self) -> usize {
        self.tokenizer.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1)
    }

    /// An error naming both sizes unless every id fits an embedding of `model_vocab` rows.
    pub fn check_fits(&self, model_vocab: usize) -> Result<(), TextError> {
        let tokenizer = self.id_space();
        match tokenizer <= model_vocab {
            true => Ok(()),
            false => Err(TextError::VocabMismatch { tokenizer, model: model_vocab }),
        }
    }

    /// The text the model starts from: chat messages through the template with the generation
    /// prompt appended; plain text as it is when `chat` is false, else as one user message.
    pub fn render(&self, prompt: &Prompt, chat: bool) -> Result<String, TextError> {
        let messages = match prompt {
            Prompt::Text(text) if !chat => return Ok(text.clone()),
            Prompt::Text(text) => std::slice::from_ref(&crate::records::Message::user(text)).to_vec(),
            Prompt::Chat(messages) => messages.clone(),
        };
        let template = self.template.as_ref().ok_or_else(|| TextError::NoTemplate { dir: self.dir.clone() })?;
        template.render(&messages, &self.special, true)
    }

    /// Token ids of `text`, without special tokens added (a rendered template carries its own).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let encoding = self.tokenizer.encode(text, false).map_err(|e| TextError::Tokenize(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        self.tokenizer.decode(ids, true).map_err(|e| TextError::Tokenize(e.to_string()))
    }
}
