//! Build script: with the `rocm` feature, compiles every `hip/*.hip` into a code object for
//! LUMI's MI250X (`hipcc --genco --offload-arch=gfx90a`; `NEREUS_HIP_ARCHS=gfx90a,gfx942` for
//! more) and lets `src/backend/rocm.rs` embed `pack.co`. A kernel that does not compile fails
//! the build.
//! Without hipcc the build goes on with a warning (the ROCm plane then refuses to start), unless
//! `NEREUS_REQUIRE_KERNEL_TOOLS=1` (CI) makes a missing hipcc an error too. CUDA kernels need no
//! build step: NVRTC compiles `cuda/pack.cu` at run time.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(nereus_hip_kernels)");
    println!("cargo::rerun-if-changed=../../hip");
    for var in ["HIPCC", "HIP_PATH", "NEREUS_HIP_ARCHS", "NEREUS_REQUIRE_KERNEL_TOOLS"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_ROCM").is_none() {
        return;
    }
    let mut sources: Vec<PathBuf> = std::fs::read_dir("../../hip")
        .expect("hip/ is in the repository")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "hip"))
        .collect();
    sources.sort();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut built = true;
    for source in &sources {
        println!("cargo::rerun-if-changed={}", source.display());
        let object = out_dir.join(source.with_extension("co").file_name().expect("a file name"));
        built &= compile(source, &object);
    }
    if built {
        println!("cargo::rustc-cfg=nereus_hip_kernels");
    }
}

/// Compiles one HIP source; `false` when hipcc is absent (and allowed to be).
fn compile(source: &Path, object: &Path) -> bool {
    let hipcc = std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".into());
    let archs = std::env::var("NEREUS_HIP_ARCHS").unwrap_or_else(|_| "gfx90a".into());
    let mut command = Command::new(&hipcc);
    command.args(["--genco", "-O3"]);
    command.args(archs.split(',').map(|a| format!("--offload-arch={}", a.trim())));
    command.arg(source).arg("-o").arg(object);
    match command.output() {
        Ok(o) if o.status.success() => true,
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
