//! The NCCL C API, bound at run time with libloading: NCCL for the NVIDIA data plane (`cuda`
//! feature) and RCCL, which exports the same API, for the AMD one (`rocm`). Building needs
//! neither installed; [`SYMBOLS`] is the whole surface the GPU data plane uses. NCCL is found by
//! its soname `libnccl.so.2` (what the CUDA 12 and 13 packages and PyPI's wheels install), RCCL
//! as ROCm installs it; `NEREUS_NCCL_LIBRARY` and `NEREUS_RCCL_LIBRARY` name another.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use libloading::Library;

use super::collectives::{
    Aborter, CollectiveError, CollectiveLib, DataType, Elements, On, RawComm, UniqueId, REDUCE_SUM, SPLIT_SINCE_VERSION,
};
use crate::backend::library::{symbol, LibrarySearch, Opened};
use crate::backend::BackendError;
use nereus_kernels::DevicePtr;

/// A library exporting the NCCL API, and the backend it serves (for messages).
#[derive(Debug)]
pub struct CollectiveVendor {
    /// Where the library is looked for.
    pub search: LibrarySearch,
    /// `CUDA` or `ROCm`.
    pub backend: &'static str,
}

/// NVIDIA's NCCL.
pub static NCCL: CollectiveVendor = CollectiveVendor {
    search: LibrarySearch { name: "NCCL", env: "NEREUS_NCCL_LIBRARY", sonames: &["libnccl.so.2", "libnccl.so"] },
    backend: "CUDA",
};

/// AMD's RCCL.
pub static RCCL: CollectiveVendor = CollectiveVendor {
    search: LibrarySearch {
        name: "RCCL",
        env: "NEREUS_RCCL_LIBRARY",
        sonames: &["librccl.so", "librccl.so.1", "/opt/rocm/lib/librccl.so"],
    },
    backend: "ROCm",
};

/// Every symbol resolved, and whether the plane needs it (`ncclCommSplit` came with NCCL and
/// RCCL 2.18; without it groups are made from unique ids).
pub const SYMBOLS: [(&str, bool); 14] = [
    ("ncclGetVersion", true),
    ("ncclGetUniqueId", true),
    ("ncclCommInitRank", true),
    ("ncclCommSplit", false),
    ("ncclAllGather", true),
    ("ncclBroadcast", true),
    ("ncclAllReduce", true),
    ("ncclSend", true),
    ("ncclRecv", true),
    ("ncclGroupStart", true),
    ("ncclGroupEnd", true),
    ("ncclCommAbort", true),
    ("ncclCommDestroy", true),
    ("ncclGetErrorString", true),
];

/// `ncclUniqueId`, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawId {
    internal: [c_char; 128],
}

type Res = c_int;
type Comm = *mut c_void;
type Stream = *mut c_void;

/// The resolved entry points (valid while the library stays loaded).
struct Table {
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    get_unique_id: unsafe extern "C" fn(*mut RawId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, RawId, c_int) -> Res,
    comm_split: Option<unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> Res>,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Res,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    comm_abort: unsafe extern "C" fn(Comm) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
}

/// The NCCL API of one vendor's library, loaded in this process.
pub struct NcclApi {
    vendor: &'static CollectiveVendor,
    table: Arc<Table>,
    // Keeps the entry points valid; dropped after every clone of the table.
    _library: Arc<Library>,
    path: String,
    version: i32,
}

fn load_error(vendor: &CollectiveVendor, reason: String) -> BackendError {
    BackendError::Driver { backend: vendor.backend, reason }
}

impl NcclApi {
    /// Loads `vendor`'s library from its environment variable, else from its sonames.
    pub fn load(vendor: &'static CollectiveVendor) -> Result<NcclApi, BackendError> {
        let opened = vendor.search.open().map_err(|reason| load_error(vendor, reason))?;
        NcclApi::bind(vendor, opened)
    }

    /// Loads `vendor`'s library from one path and resolves [`SYMBOLS`].
    pub fn load_from(vendor: &'static CollectiveVendor, path: &str) -> Result<NcclApi, BackendError> {
        // SAFETY: loading a shared library runs its initializers; NCCL's and RCCL's are benign.
        let library =
            unsafe { Library::new(path) }.map_err(|e| load_error(vendor, format!("cannot load {path}: {e}")))?;
        NcclApi::bind(vendor, Opened { library, path: path.into() })
    }

    fn bind(vendor: &'static CollectiveVendor, opened: Opened) -> Result<NcclApi, BackendError> {
        let Opened { library, path } = opened;
        let name = vendor.search.name;
        let missing = |reason: String| load_error(vendor, format!("{reason}; is it {name} (2.x)?"));
        // SAFETY: each type below is the C signature of the symbol of that name in nccl.h.
        let table = unsafe {
            Table {
                get_version: symbol(&library, &path, "ncclGetVersion").map_err(missing)?,
                get_unique_id: symbol(&library, &path, "ncclGetUniqueId").map_err(missing)?,
                comm_init_rank: symbol(&library, &path, "ncclCommInitRank").map_err(missing)?,
                comm_split: symbol(&library, &path, "ncclCommSplit").ok(),
                all_gather: symbol(&library, &path, "ncclAllGather").map_err(missing)?,
                broadcast: symbol(&library, &path, "ncclBroadcast").map_err(missing)?,
                all_reduce: symbol(&library, &path, "ncclAllReduce").map_err(missing)?,
                send: symbol(&library, &path, "ncclSend").map_err(missing)?,
                recv: symbol(&library, &path, "ncclRecv").map_err(missing)?,
                group_start: symbol(&library, &path, "ncclGroupStart").map_err(missing)?,
                group_end: symbol(&library, &path, "ncclGroupEnd").map_err(missing)?,
                comm_abort: symbol(&library, &path, "ncclCommAbort").map_err(missing)?,
                comm_destroy: symbol(&library, &path, "ncclCommDestroy").map_err(missing)?,
                error_string: symbol(&library, &path, "ncclGetErrorString").map_err(missing)?,
            }
        };
        let mut version = 0;
        // SAFETY: an out-parameter.
        let status = unsafe { (table.get_version)(&mut version) };
        let api = NcclApi { vendor, table: Arc::new(table), _library: Arc::new(library), path, version };
        api.check(status).map_err(|e| load_error(vendor, format!("ncclGetVersion: {e}")))?;
        Ok(api)
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn check(&self, status: Res) -> Result<(), CollectiveError> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static C string for any code.
        let text = unsafe { CStr::from_ptr((self.table.error_string)(status)) };
        Err(CollectiveError::Library { code: status, text: text.to_string_lossy().into_owned() })
    }
}

fn ptr(p: DevicePtr) -> *mut c_void {
    p.0 as *mut c_void
}

impl CollectiveLib for NcclApi {
    fn name(&self) -> &'static str {
        self.vendor.search.name
    }

    fn version(&self) -> Result<i32, CollectiveError> {
        Ok(self.version)
    }

    fn has_split(&self) -> bool {
        self.table.comm_split.is_some() && self.version >= SPLIT_SINCE_VERSION
    }

    fn unique_id(&self) -> Result<UniqueId, CollectiveError> {
        let mut id = RawId { internal: [0; 128] };
        // SAFETY: an out-parameter of the right size.
        self.check(unsafe { (self.table.get_unique_id)(&mut id) })?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    unsafe fn init_rank(&self, id: &UniqueId, rank: i32, members: &[i32]) -> Result<RawComm, CollectiveError> {
        let mut comm: Comm = std::ptr::null_mut();
        let id = RawId { internal: id.0.map(|b| b as c_char) };
        self.check((self.table.comm_init_rank)(&mut comm, members.len() as c_int, id, rank))?;
        Ok(RawComm(comm))
    }

    unsafe fn split(
        &self,
        comm: RawComm,
        color: i32,
        key: i32,
        _members: &[i32],
    ) -> Result<Option<RawComm>, CollectiveError> {
        let split = self.table.comm_split.ok_or(CollectiveError::Unsupported("this library has no ncclCommSplit"))?;
        let mut out: Comm = std::ptr::null_mut();
        self.check(split(comm.0, color, key, &mut out, std::ptr::null_mut()))?;
        Ok((!out.is_null()).then_some(RawComm(out)))
    }

    unsafe fn all_gather(&self, send: Elements, recv: DevicePtr, on: On) -> Result<(), CollectiveError> {
        let (ty, c, s) = (send.ty as c_int, on.comm.0, on.stream.0);
        self.check((self.table.all_gather)(ptr(send.buf), ptr(recv), send.count, ty, c, s))
    }

    unsafe fn broadcast(&self, data: Elements, root: i32, on: On) -> Result<(), CollectiveError> {
        let (p, ty, c, s) = (ptr(data.buf), data.ty as c_int, on.comm.0, on.stream.0);
        self.check((self.table.broadcast)(p, p, data.count, ty, root, c, s))
    }

    unsafe fn all_reduce_sum(&self, data: Elements, on: On) -> Result<(), CollectiveError> {
        let (p, ty, c, s) = (ptr(data.buf), data.ty as c_int, on.comm.0, on.stream.0);
        self.check((self.table.all_reduce)(p, p, data.count, ty, REDUCE_SUM, c, s))
    }

    unsafe fn send(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        self.check((self.table.send)(ptr(buf), bytes, DataType::U8 as c_int, peer, on.comm.0, on.stream.0))
    }

    unsafe fn recv(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        self.check((self.table.recv)(ptr(buf), bytes, DataType::U8 as c_int, peer, on.comm.0, on.stream.0))
    }

    fn group_start(&self) -> Result<(), CollectiveError> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.table.group_start)() })
    }

    fn group_end(&self) -> Result<(), CollectiveError> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.table.group_end)() })
    }

    fn aborter(&self) -> Aborter {
        let (table, library) = (self.table.clone(), self._library.clone());
        Arc::new(move |c: RawComm| {
            let _keep_loaded = &library;
            // SAFETY: the watchdog aborts communicators this plane created and never uses again.
            unsafe { (table.comm_abort)(c.0) };
        })
    }

    unsafe fn destroy(&self, comm: RawComm) {
        (self.table.comm_destroy)(comm.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn the_symbol_table_lists_the_nccl_api_the_plane_calls() {
        let required: Vec<&str> = SYMBOLS.iter().filter(|(_, r)| *r).map(|(n, _)| *n).collect();
        for name in ["ncclGetUniqueId", "ncclCommInitRank", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclCommAbort"] {
            assert!(required.contains(&name), "{name} must be required");
        }
        assert_eq!(SYMBOLS.iter().filter(|(_, r)| !*r).map(|(n, _)| *n).collect::<Vec<_>>(), ["ncclCommSplit"]);
        assert!(SYMBOLS.iter().all(|(n, _)| n.starts_with("nccl")), "RCCL exports NCCL's names");
    }

    #[test]
    fn a_missing_library_or_symbol_is_named_in_the_error() {
        let Err(missing) = NcclApi::load_from(&RCCL, "/nonexistent/librccl.so") else {
            panic!("loaded a missing library")
        };
        assert!(missing.to_string().contains("cannot load /nonexistent/librccl.so"), "{missing}");
        let Err(not_nccl) = NcclApi::load_from(&NCCL, "libc.so.6") else { panic!("libc is not NCCL") };
        let text = not_nccl.to_string();
        assert!(text.contains("has no `ncclGetVersion`") && text.contains("is it NCCL"), "{text}");
    }

    /// A stand-in library built from C: the table resolves, the optional split is detected as
    /// absent, and a unique id passed by value arrives intact.
    #[test]
    fn a_library_with_the_api_loads_and_answers_through_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("fake_rccl.c");
        let names = SYMBOLS.iter().filter(|(n, r)| {
            *r && !matches!(*n, "ncclGetVersion" | "ncclGetUniqueId" | "ncclCommInitRank" | "ncclGetErrorString")
        });
        let mut c = String::from(
            "typedef struct { char internal[128]; } ncclUniqueId;\n\
             int ncclGetVersion(int* v) { *v = 21700; return 0; }\n\
             int ncclGetUniqueId(ncclUniqueId* id) { for (int i = 0; i < 128; i++) id->internal[i] = (char)i; return 0; }\n\
             int ncclCommInitRank(void** c, int n, ncclUniqueId id, int r) { *c = (void*)(long)(id.internal[127] * 1000 + n * 10 + r); return 0; }\n\
             const char* ncclGetErrorString(int r) { return \"fake error\"; }\n",
        );
        for (name, _) in names {
            c.push_str(&format!("int {name}() {{ return 0; }}\n"));
        }
        std::fs::write(&source, c).unwrap();
        let lib = dir.path().join("librccl.so");
        let Ok(out) = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&source).output() else {
            eprintln!("skipped: no C compiler");
            return;
        };
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rccl = NcclApi::load_from(&RCCL, lib.to_str().unwrap()).unwrap();
        assert_eq!((rccl.version(), rccl.has_split()), (Ok(21700), false));
        let id = rccl.unique_id().unwrap();
        assert_eq!(id.0[5], 5);
        // SAFETY: the fake library only writes the out-parameter.
        let comm = unsafe { rccl.init_rank(&id, 2, &[10, 11, 12]) }.unwrap();
        assert_eq!(comm.0 as usize, 127 * 1000 + 3 * 10 + 2, "id by value, nranks and rank arrive");
        assert!(rccl.group_start().is_ok() && rccl.group_end().is_ok());
    }

    /// Where NCCL is installed (scripts/kernel-env.sh puts PyPI's on LD_LIBRARY_PATH), it loads by
    /// its soname and answers without a GPU: its version, whether it splits, and a unique id the
    /// plane would broadcast; elsewhere the error names the sonames tried and the variable.
    #[test]
    fn nccl_loads_by_soname_or_says_what_it_tried() {
        match NcclApi::load(&NCCL) {
            Ok(nccl) => {
                assert!(nccl.version().unwrap() >= 20_000, "NCCL 2.x");
                assert_eq!(nccl.has_split(), nccl.version().unwrap() >= SPLIT_SINCE_VERSION);
                assert_ne!(nccl.unique_id().unwrap().0, [0u8; 128]);
                assert_eq!(nccl.name(), "NCCL");
            }
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains("libnccl.so.2") && text.contains("NEREUS_NCCL_LIBRARY"), "{text}");
            }
        }
    }
}
