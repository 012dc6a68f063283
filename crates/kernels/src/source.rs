//! The kernel sources in `device/`, one per op family, as the run-time compiler (NVRTC) takes
//! them.

use crate::Kernel;

/// The portability prelude every source is compiled with.
pub const PRELUDE: &str = include_str!("../device/prelude.h");

macro_rules! sources {
    ($( $(#[$doc:meta])* $id:ident = $file:literal; )*) => {
        /// One kernel source file of `device/`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Source {
            $( $(#[$doc])* $id, )*
        }

        impl Source {
            /// Every source.
            pub const ALL: &'static [Source] = &[$(Source::$id),*];

            /// File name in `device/`, e.g. `pack.cu`.
            pub fn file(self) -> &'static str {
                match self { $(Source::$id => $file,)* }
            }

            /// The source text (without the prelude).
            pub fn text(self) -> &'static str {
                match self { $(Source::$id => include_str!(concat!("../device/", $file)),)* }
            }
        }
    };
}

sources! {
    /// The data plane's rectangle copies.
    Pack = "pack.cu";
    /// Precision casts.
    Cast = "cast.cu";
    /// RMSNorm and the residual add.
    Norm = "norm.cu";
    /// The SwiGLU activation.
    Swiglu = "swiglu.cu";
    /// Rotary position embeddings.
    Rope = "rope.cu";
    /// The token embedding.
    Embedding = "embedding.cu";
    /// The KV-cache append and the scalar attention.
    Attention = "attention.cu";
    /// Flash attention on the warp-level matrix multiply.
    FlashAttention = "flash_attention.cu";
    /// Flash-decoding: one query per sequence against the KV cache, keys split across blocks.
    DecodeAttention = "decode_attention.cu";
    /// The LM head's log-softmax statistics, log-prob backward and argmax.
    Logits = "logits.cu";
    /// AdamW and the gradient norm.
    Adamw = "adamw.cu";
    /// Sampling.
    Sample = "sample.cu";
    /// The execution-model probes.
    Probe = "probe.cu";
}

impl Source {
    /// The text a run-time compiler (NVRTC) is given: the prelude, then the source.
    pub fn with_prelude(self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.file(), self.text())
    }

    /// The entry points it defines.
    pub fn kernels(self) -> impl Iterator<Item = Kernel> {
        Kernel::ALL.iter().copied().filter(move |k| k.source() == self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_file_is_listed_and_every_kernel_is_defined_in_its_source() {
        let mut files: Vec<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/device"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".cu"))
            .collect();
        files.sort();
        let mut listed: Vec<&str> = Source::ALL.iter().map(|s| s.file()).collect();
        listed.sort();
        assert_eq!(files, listed);
        for k in Kernel::ALL {
            let text = k.source().text();
            // Entry points are spelled out, or made by a macro from their stem (`_##W`).
            let stem = k.name().trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('_');
            assert!(text.contains(k.name()) || text.contains(stem), "{} is not in {}", k.name(), k.source().file());
        }
    }
}
