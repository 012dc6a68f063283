//! NVRTC, the CUDA runtime compiler, opened at run time (`cuda` feature) by soname across CUDA
//! 12 and 13 (`libnvrtc.so.13`, `libnvrtc.so.12`; `NEREUS_NVRTC_LIBRARY` names another). The
//! nine functions the engine calls are its whole surface here; their C signatures are the same
//! in both majors.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use super::library::{symbol, LibrarySearch, Opened};
use super::BackendError;

/// Where NVRTC is looked for.
pub const NVRTC: LibrarySearch = LibrarySearch {
    name: "NVRTC",
    env: "NEREUS_NVRTC_LIBRARY",
    sonames: &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
};

type Program = *mut c_void;
type Status = c_int;

/// The resolved entry points (valid for the life of the process: the library is never closed).
struct Table {
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    /// Where it was loaded from.
    path: String,
    _library: libloading::Library,
}

/// NVRTC loaded in this process (once), or why it cannot be.
fn table() -> Result<&'static Table, BackendError> {
    static TABLE: OnceLock<Result<Table, String>> = OnceLock::new();
    TABLE.get_or_init(|| NVRTC.open().and_then(resolve)).as_ref().map_err(|reason| kernels_error(reason.clone()))
}

/// Whether NVRTC loads here (the compile tests skip where it does not, outside CI).
pub fn is_present() -> bool {
    table().is_ok()
}

/// Where NVRTC was loaded from.
pub fn loaded_from() -> Result<&'static str, BackendError> {
    table().map(|t| t.path.as_str())
}

fn kernels_error(reason: String) -> BackendError {
    BackendError::Kernels { backend: "CUDA", reason }
}

fn resolve(opened: Opened) -> Result<Table, String> {
    let Opened { library, path } = opened;
    let missing = |reason: String| format!("{reason}; is it NVRTC from CUDA 12 or later?");
    // SAFETY: each type is the C signature of the symbol of that name in nvrtc.h (CUDA 12 and 13).
    unsafe {
        Ok(Table {
            create: symbol(&library, &path, "nvrtcCreateProgram").map_err(missing)?,
            compile: symbol(&library, &path, "nvrtcCompileProgram").map_err(missing)?,
            log_size: symbol(&library, &path, "nvrtcGetProgramLogSize").map_err(missing)?,
            log: symbol(&library, &path, "nvrtcGetProgramLog").map_err(missing)?,
            ptx_size: symbol(&library, &path, "nvrtcGetPTXSize").map_err(missing)?,
            ptx: symbol(&library, &path, "nvrtcGetPTX").map_err(missing)?,
            cubin_size: symbol(&library, &path, "nvrtcGetCUBINSize").map_err(missing)?,
            cubin: symbol(&library, &path, "nvrtcGetCUBIN").map_err(missing)?,
            destroy: symbol(&library, &path, "nvrtcDestroyProgram").map_err(missing)?,
            error_string: symbol(&library, &path, "nvrtcGetErrorString").map_err(missing)?,
            path,
            _library: library,
        })
    }
}

impl Table {
    fn check(&self, what: &str, status: Status) -> Result<(), BackendError> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static C string for any code.
        let text = unsafe { CStr::from_ptr((self.error_string)(status)) }.to_string_lossy();
        Err(kernels_error(format!("NVRTC {what}: {text} ({status})")))
    }

    /// One of the program's outputs (log, PTX or cubin), through its size and copy functions.
    ///
    /// # Safety
    /// `program` is live; `size` and `copy` are a matching pair of NVRTC getters.
    unsafe fn output(
        &self,
        what: &str,
        program: Program,
        size: unsafe extern "C" fn(Program, *mut usize) -> Status,
        copy: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ) -> Result<Vec<u8>, BackendError> {
        let mut bytes = 0usize;
        self.check(what, size(program, &mut bytes))?;
        let mut out = vec![0u8; bytes];
        self.check(what, copy(program, out.as_mut_ptr().cast()))?;
        Ok(out)
    }
}

/// Compiles CUDA source `source` (named `name` in messages) with `options`; returns the PTX, or
/// the cubin when `cubin` is set. A failed compile's error carries NVRTC's log.
pub fn compile(source: &str, name: &str, options: &[&str], cubin: bool) -> Result<Vec<u8>, BackendError> {
    let t = table()?;
    let source = CString::new(source).map_err(|e| kernels_error(format!("NVRTC source: {e}")))?;
    let name = CString::new(name).map_err(|e| kernels_error(format!("NVRTC name: {e}")))?;
    let options: Vec<CString> = options.iter().map(|o| CString::new(*o).expect("options hold no NUL")).collect();
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let mut program: Program = std::ptr::null_mut();
    // SAFETY: the strings outlive the program; no headers are passed.
    unsafe {
        t.check(
            "create",
            (t.create)(&mut program, source.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
        )?;
        let compiled = t.check("compile", (t.compile)(program, option_ptrs.len() as c_int, option_ptrs.as_ptr()));
        let out = match compiled {
            Err(e) => {
                let log = t.output("log", program, t.log_size, t.log).unwrap_or_default();
                Err(kernels_error(format!("{e}: {}", text_of(&log))))
            }
            Ok(()) if cubin => t.output("cubin", program, t.cubin_size, t.cubin),
            Ok(()) => t.output("PTX", program, t.ptx_size, t.ptx).map(|ptx| text_of(&ptx).into_bytes()),
        };
        (t.destroy)(&mut program);
        out
    }
}

/// A NUL-terminated C string's text.
fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes.split(|&b| b == 0).next().unwrap_or_default()).into_owned()
}
