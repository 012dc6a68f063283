//! Build script for the kernels in `device/` (one source per op family, docs/kernels.md):
//!
//! - **grid emulator** (always): `emulator/grid.cpp` and every kernel source compiled by the host
//!   C++ compiler, once per warp width (32 and 64), linked into this crate (`src/grid.rs` calls
//!   it). A kernel that does not compile fails the build.
//! - **ROCm** (`rocm` feature): every `device/*.cu` compiled by `hipcc --genco
//!   --offload-arch=gfx90a` (LUMI's MI250X; `NEREUS_HIP_ARCHS=gfx90a,gfx942` for more) with the
//!   prelude, failing on any VGPR spill, into code objects this crate embeds (`src/hip.rs`: a
//!   generated table of every source's object). Without hipcc the build goes on with a warning
//!   (the ROCm backend then refuses to start), unless `NEREUS_REQUIRE_KERNEL_TOOLS=1` (CI) makes
//!   a missing hipcc an error too.
//!
//! CUDA needs no build step: NVRTC compiles the same sources at run time (exec's
//! `backend/cuda.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

const DEVICE: &str = "device";
const EMULATOR: &str = "emulator";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(nereus_hip_kernels)");
    println!("cargo::rerun-if-changed={DEVICE}");
    println!("cargo::rerun-if-changed={EMULATOR}");
    build_grid_emulator();
    for var in ["HIPCC", "HIP_PATH", "NEREUS_HIP_ARCHS", "NEREUS_REQUIRE_KERNEL_TOOLS"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_ROCM").is_none() {
        return;
    }
    let mut sources: Vec<PathBuf> = std::fs::read_dir(DEVICE)
        .expect("device/ is in the crate")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut built = true;
    let mut table = String::from(
        "/// Every kernel source's HIP code object, by file name.\npub const CODE_OBJECTS: &[(&str, &[u8])] = &[\n",
    );
    for source in &sources {
        println!("cargo::rerun-if-changed={}", source.display());
        let object = out_dir.join(source.with_extension("co").file_name().expect("a file name"));
        built &= compile(source, &object);
        let file = source.file_name().expect("a file name").to_string_lossy();
        table += &format!("    ({file:?}, include_bytes!({:?})),\n", object.display().to_string());
    }
    table += "];\n";
    if built {
        std::fs::write(out_dir.join("hip_code_objects.rs"), table).expect("OUT_DIR is writable");
        println!("cargo::rustc-cfg=nereus_hip_kernels");
    }
}

/// The grid emulator: the scheduler once, the kernels once per warp width.
fn build_grid_emulator() {
    let base = || {
        let mut build = cc::Build::new();
        build.cpp(true).std("c++17").opt_level(2).warnings(true).extra_warnings(true).warnings_into_errors(true);
        build.include(EMULATOR);
        build
    };
    base().file(format!("{EMULATOR}/grid.cpp")).define("NEREUS_WARP_SIZE", "32").compile("nereus_grid");
    for warp in ["32", "64"] {
        let mut build = base();
        build.file(format!("{EMULATOR}/kernels.cpp")).define("NEREUS_WARP_SIZE", warp);
        build.compile(&format!("nereus_grid_kernels_w{warp}"));
    }
}

/// Compiles one kernel source with hipcc; `false` when hipcc is absent (and allowed to be).
fn compile(source: &Path, object: &Path) -> bool {
    let hipcc = std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".into());
    let archs = std::env::var("NEREUS_HIP_ARCHS").unwrap_or_else(|_| "gfx90a".into());
    let mut command = Command::new(&hipcc);
    command.args(["--genco", "-O3", "-Rpass-analysis=kernel-resource-usage", "-x", "hip", "-include"]);
    command.arg(format!("{DEVICE}/prelude.h"));
    command.args(archs.split(',').map(|a| format!("--offload-arch={}", a.trim())));
    command.arg(source).arg("-o").arg(object);
    match command.output() {
        Ok(o) if o.status.success() => {
            // The resource-usage remarks name every kernel's SGPR/VGPR spills. A VGPR spill goes to
            // scratch memory: any is a failure. SGPRs spill into free VGPR lanes (v_writelane, no
            // memory traffic), which the flash attention's dq pass at width 128 needs a few of.
            let remarks = String::from_utf8_lossy(&o.stderr);
            let spills: Vec<&str> =
                remarks.lines().filter(|l| l.contains("VGPRs Spill: ") && !l.contains("Spill: 0 ")).collect();
            assert!(
                remarks.contains("VGPRs Spill"),
                "hipcc printed no resource usage for {}: {remarks}",
                source.display()
            );
            assert!(spills.is_empty(), "{} spills registers on {archs}:\n{}", source.display(), spills.join("\n"));
            true
        }
        Ok(o) => panic!(
            "hipcc could not compile {} for {archs}:\n{}{}",
            source.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) if std::env::var("NEREUS_REQUIRE_KERNEL_TOOLS").is_ok_and(|v| v == "1") => {
            panic!("NEREUS_REQUIRE_KERNEL_TOOLS=1 but `{hipcc}` did not run: {e}")
        }
        Err(e) => {
            println!(
                "cargo::warning=`{hipcc}` did not run ({e}): {} is not embedded and the ROCm data plane will refuse \
                 to start; install hipcc (Debian: apt-get install hipcc) and rebuild",
                source.display()
            );
            false
        }
    }
}
