//! Vendor libraries opened at run time (NVRTC, cuBLAS, hipBLAS, NCCL, RCCL), so building needs
//! no toolkit and one binary serves every CUDA or ROCm release whose ABI it speaks.
//!
//! Each library is looked for under an environment variable naming its path, then under its
//! sonames across majors (`libnvrtc.so.13`, then `.12`): a machine with CUDA 12 or 13 installed
//! as it comes needs no hand-made links.

use libloading::Library;

/// Where a vendor library is looked for.
#[derive(Debug, Clone, Copy)]
pub struct LibrarySearch {
    /// The library's name in messages (`NCCL`, `cuBLAS`).
    pub name: &'static str,
    /// The environment variable that names its path instead.
    pub env: &'static str,
    /// Names tried in order after it (sonames, found through the loader's search path).
    pub sonames: &'static [&'static str],
}

/// A library that loaded, and the name it loaded under.
pub struct Opened {
    /// The library (its symbols stay valid while it is held).
    pub library: Library,
    /// The path or soname it was opened by.
    pub path: String,
}

impl LibrarySearch {
    /// The names tried, in order: the environment variable's value when set, then the sonames.
    pub fn candidates(&self) -> Vec<String> {
        let named = std::env::var(self.env).ok().filter(|p| !p.is_empty());
        named.into_iter().chain(self.sonames.iter().map(|s| s.to_string())).collect()
    }

    /// Opens the first candidate that loads; the error lists what was tried and the variable.
    pub fn open(&self) -> Result<Opened, String> {
        let candidates = self.candidates();
        let mut last = String::new();
        for path in &candidates {
            // SAFETY: loading a vendor library runs its initializers, as linking it would.
            match unsafe { Library::new(path) } {
                Ok(library) => return Ok(Opened { library, path: path.clone() }),
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!(
            "{} not found: none of {candidates:?} loads ({last}); install it, add its directory to LD_LIBRARY_PATH, or set {} to its path",
            self.name, self.env
        ))
    }
}

/// Resolves `name` from `library` (opened by `path`, for the message).
///
/// # Safety
/// `T` is the symbol's true C signature.
pub unsafe fn symbol<T: Copy>(library: &Library, path: &str, name: &str) -> Result<T, String> {
    library.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| format!("{path} has no `{name}` ({e})"))
}

#[cfg(test)]
mod tests {
    use super::LibrarySearch;

    #[test]
    fn the_first_loadable_name_wins_and_a_miss_names_every_candidate_and_the_variable() {
        let libc =
            LibrarySearch { name: "libc", env: "NEREUS_TEST_UNSET_LIBRARY", sonames: &["libnope.so.9", "libc.so.6"] };
        assert_eq!(libc.open().map(|o| o.path).unwrap(), "libc.so.6");
        let none = LibrarySearch { name: "NCCL", env: "NEREUS_TEST_UNSET_LIBRARY", sonames: &["libnope.so.2"] };
        let Err(e) = none.open() else { panic!("loaded a missing library") };
        assert!(
            e.starts_with("NCCL not found") && e.contains("libnope.so.2") && e.contains("NEREUS_TEST_UNSET_LIBRARY"),
            "{e}"
        );
    }
}
