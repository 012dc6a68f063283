//! Hand-made GGUF files: a writer of metadata and F32 tensors, and a one-layer Llama.

/// A metadata value of a hand-made GGUF file.
pub enum Meta {
    U32(u32),
    Str(&'static str),
    Strs(Vec<String>),
}

/// A GGUF v3 file of `meta` and F32 tensors of dims `tensors` (ggml order, fastest first), all
/// values 0.01.
pub fn gguf_file(meta: &[(&str, Meta)], tensors: &[(String, Vec<u64>)]) -> Vec<u8> {
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        string(&mut b, key);
        match value {
            Meta::U32(v) => {
                b.extend(4u32.to_le_bytes());
                b.extend(v.to_le_bytes());
            }
            Meta::Str(s) => {
                b.extend(8u32.to_le_bytes());
                string(&mut b, s);
            }
            Meta::Strs(list) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((list.len() as u64).to_le_bytes());
                list.iter().for_each(|s| string(&mut b, s));
            }
        }
    }
    let sizes: Vec<usize> = tensors.iter().map(|(_, d)| 4 * d.iter().product::<u64>() as usize).collect();
    let mut offset = 0usize;
    for ((name, dims), size) in tensors.iter().zip(&sizes) {
        string(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(0u32.to_le_bytes()); // F32
        b.extend((offset as u64).to_le_bytes());
        offset += size.div_ceil(32) * 32;
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    for size in sizes {
        let start = b.len();
        b.extend((0..size / 4).flat_map(|_| 0.01f32.to_le_bytes()));
        b.resize(start + size.div_ceil(32) * 32, 0);
    }
    b
}

/// One layer of hidden 8 (2 heads of 4), ffn 16, 258 tokens, tied embeddings: its metadata with
/// EOS `eos` (and `extra` keys, replacing any of the same name), and its tensors with
/// `token_embd.weight` of dims `embedding`.
pub fn tiny_llama(eos: u32, embedding: [u64; 2], extra: &[(&'static str, u32)]) -> Vec<u8> {
    let mut tokens: Vec<String> = (0..256).map(|i| format!("t{i}")).collect();
    tokens.extend(["<s>".to_string(), "</s>".to_string()]);
    let mut meta = vec![
        ("general.architecture", Meta::Str("llama")),
        ("llama.block_count", Meta::U32(1)),
        ("llama.embedding_length", Meta::U32(8)),
        ("llama.attention.head_count", Meta::U32(2)),
        ("llama.attention.head_count_kv", Meta::U32(2)),
        ("llama.feed_forward_length", Meta::U32(16)),
        ("llama.context_length", Meta::U32(32)),
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.merges", Meta::Strs(Vec::new())),
        ("tokenizer.ggml.bos_token_id", Meta::U32(256)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(eos)),
    ];
    for &(key, value) in extra {
        meta.retain(|(k, _)| *k != key);
        meta.push((key, Meta::U32(value)));
    }
    let mut tensors = vec![("token_embd.weight".to_string(), embedding.to_vec())];
    for (name, dims) in [
        ("attn_norm", vec![8]),
        ("attn_q", vec![8, 8]),
        ("attn_k", vec![8, 8]),
        ("attn_v", vec![8, 8]),
        ("attn_output", vec![8, 8]),
        ("ffn_norm", vec![8]),
        ("ffn_gate", vec![8, 16]),
        ("ffn_up", vec![8, 16]),
        ("ffn_down", vec![16, 8]),
    ] {
        tensors.push((format!("blk.0.{name}.weight"), dims));
    }
    tensors.push(("output_norm.weight".into(), vec![8]));
    gguf_file(&meta, &tensors)
}
