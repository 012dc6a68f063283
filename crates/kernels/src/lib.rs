//! Nereus's device kernels: each op family written once, in `device/*.cu` over a small
//! portability prelude (`device/prelude.h`), and compiled by three compilers — NVRTC at run time
//! for CUDA, hipcc at build time for ROCm (`rocm` feature), and the host C++ compiler for the
//! grid emulator (`emulator/`, always), which is how CI runs the kernels without a GPU.
//!
//! The Rust side names every entry point by a typed id ([`Kernel`]) and passes each kernel its
//! arguments as a typed struct ([`args`], one per kernel, [`KernelCall`]); a backend resolves
//! its table of loaded functions once, indexed by [`Kernel::index`], and never looks a kernel up
//! by name at a launch. The launch geometry that belongs to a kernel's source (block sizes, tile
//! sizes) lives beside it: [`pack`] for the rectangle copies, [`attention`] for the attention
//! kernels. docs/kernels.md describes the kernels themselves.

pub mod args;
pub mod attention;
pub mod grid;
pub mod hip;
mod kernel;
pub mod pack;
mod source;

pub use kernel::{DevicePtr, Kernel, KernelArg, KernelArgs, KernelCall, Launch, PushArgs};
pub use source::{Source, PRELUDE};
