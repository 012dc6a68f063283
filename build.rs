//! Build script: with the `rocm` feature, compiles `hip/pack.hip` into a code object for
//! LUMI's MI250X (`hipcc --genco --offload-arch=gfx90a`; `NEREUS_HIP_ARCHS=gfx90a,gfx942` for
//! more) and lets `src/backend/rocm.rs` embed it. A kernel that does not compile fails the build.
//! Without hipcc the build goes on with a warning (the ROCm plane then refuses to start), unless
//! `NEREUS_REQUIRE_KERNEL_TOOLS=1` (CI) makes a missing hipcc an error too. CUDA kernels need no
//! build step: NVRTC compiles `cuda/pack.cu` at run time.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(nereus_hip_kernels)");
    println!("cargo::rerun-if-changed=hip/pack.hip");
    for var in ["HIPCC", "HIP_PATH", "NEREUS_HIP_ARCHS", "NEREUS_REQUIRE_KERNEL_TOOLS"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_ROCM").is_none() {
        return;
    }
    let hipcc = std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".into());
    let archs = std::env::var("NEREUS_HIP_ARCHS").unwrap_or_else(|_| "gfx90a".into());
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("pack.co");
    let mut command = Command::new(&hipcc);
    command.args(["--genco", "-O3"]);
    command.args(archs.split(',').map(|a| format!("--offload-arch={}", a.trim())));
    command.arg("hip/pack.hip").arg("-o").arg(&out);
    match command.output() {
        Ok(o) if o.status.success() => println!("cargo::rustc-cfg=nereus_hip_kernels"),
        Ok(o) => panic!(
            "hipcc could not compile hip/pack.hip for {archs}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) if std::env::var("NEREUS_REQUIRE_KERNEL_TOOLS").is_ok_and(|v| v == "1") => {
            panic!("NEREUS_REQUIRE_KERNEL_TOOLS=1 but `{hipcc}` did not run: {e}")
        }
        Err(e) => println!(
            "cargo::warning=`{hipcc}` did not run ({e}): hip/pack.hip is not embedded and the ROCm data plane will \
             refuse to start; install hipcc (Debian: apt-get install hipcc) and rebuild"
        ),
    }
}
