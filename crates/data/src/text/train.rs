//! Training a byte-level BPE tokenizer (the GPT-2 / Llama 3 family: every byte is a symbol, so
//! no text is out of vocabulary) on a corpus, for the project's own small text jobs.

use std::path::Path;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer, TokenizerImpl};

use nereus_core::file_error::FileError;

use super::TextError;

/// A byte-level BPE tokenizer of at most `vocab_size` ids trained on `corpus`, whose first ids
/// are `special` (in order; never split, never merged).
pub fn train_byte_level_bpe<S: AsRef<str> + Send>(
    corpus: impl Iterator<Item = S> + Send,
    vocab_size: usize,
    special: &[&str],
) -> Result<Tokenizer, TextError> {
    // No prefix space (Llama 3's choice): " 7" and "7" are different words, as the text has them.
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    > = TokenizerImpl::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(byte_level)).with_decoder(Some(byte_level)).with_post_processor(Some(byte_level));
    let special: Vec<AddedToken> = special.iter().map(|s| AddedToken::from(s.to_string(), true)).collect();
    let mut trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(special.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    tokenizer.train(&mut trainer, corpus).map_err(|e| TextError::Tokenize(format!("training failed: {e}")))?;
    tokenizer.add_special_tokens(&special);
    Ok(Tokenizer::from(tokenizer))
}

/// Writes `tokenizer` as `tokenizer.json` (the format `tokenizers` and transformers read).
pub fn save(tokenizer: &Tokenizer, path: &Path) -> Result<(), TextError> {
    let json = tokenizer.to_string(true).map_err(|e| TextError::Tokenize(format!("cannot serialize: {e}")))?;
    std::fs::write(path, json + "\n").map_err(FileError::on("write", path))?;
    Ok(())
}
