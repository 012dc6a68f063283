//! The HIP code objects of every kernel source, compiled by hipcc at build time (`rocm` feature,
//! `build.rs`); empty when the crate was built without the feature or without hipcc.

#[cfg(nereus_hip_kernels)]
include!(concat!(env!("OUT_DIR"), "/hip_code_objects.rs"));

/// Every kernel source's HIP code object, by file name.
#[cfg(not(nereus_hip_kernels))]
pub const CODE_OBJECTS: &[(&str, &[u8])] = &[];

/// The code object of kernel source `file`, when embedded.
pub fn code_object(file: &str) -> Option<&'static [u8]> {
    CODE_OBJECTS.iter().find(|(f, _)| *f == file).map(|(_, object)| *object)
}
