//! Enums that users name by a fixed word per variant, in job files and on the command line
//! (`--policy every-k`, `--kind math`): one list of words per enum, which the binary's argument
//! parser offers as the possible values and a file's deserializer accepts.

/// An enum with one word per variant.
pub trait Named: Copy + 'static {
    /// Every variant, in the order `--help` lists them.
    const ALL: &'static [Self];

    /// The variant's word.
    fn name(self) -> &'static str;

    /// The variant named `word`, if there is one.
    fn from_name(word: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == word)
    }

    /// Every word, comma-separated (for messages).
    fn names() -> String {
        Self::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", ")
    }
}

/// Implements [`Named`] for an enum from `Variant => "word"` pairs, an inherent `name()` (so
/// callers need no import), and `FromStr` by those words (the error names the word and the
/// choices).
#[macro_export]
macro_rules! named_enum {
    ($ty:ty { $($variant:ident => $word:literal),+ $(,)? }) => {
        impl $ty {
            /// The word that names the variant in files and on the command line.
            pub fn name(self) -> &'static str {
                match self { $(<$ty>::$variant => $word,)+ }
            }
        }

        impl $crate::named::Named for $ty {
            const ALL: &'static [Self] = &[$(<$ty>::$variant),+];

            fn name(self) -> &'static str {
                <$ty>::name(self)
            }
        }

        impl std::str::FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                <Self as $crate::named::Named>::from_name(s).ok_or_else(|| {
                    format!("unknown value `{s}`; expected one of {}", <Self as $crate::named::Named>::names())
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Named;
    use crate::config::{Algorithm, DeviceChoice, PolicyMode};

    /// A file's word and the command line's are one word.
    fn serde_agrees<T: Named + serde::Serialize>() {
        for v in T::ALL {
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
            assert_eq!(T::from_name(v.name()).map(Named::name), Some(v.name()));
        }
    }

    #[test]
    fn every_named_enum_is_written_and_parsed_by_its_word() {
        serde_agrees::<Algorithm>();
        serde_agrees::<PolicyMode>();
        serde_agrees::<DeviceChoice>();
        let err = "every_k".parse::<PolicyMode>().unwrap_err();
        assert_eq!(err, "unknown value `every_k`; expected one of off, nereus, static, every-k, greedy");
    }
}
