//! `bench engine --device … --peer torch`: PyTorch eager on the same shape in the same run
//! (`scripts/peer-torch.py`: f32 master weights, bf16 autocast, SDPA attention, fused AdamW;
//! Hugging Face `generate` for decode), as a user would train and sample it today.
//!
//! The peer's seconds become rows beside ours (`torch_forward`, `torch_train_step`,
//! `hf_generate_decode`) with our counted tokens, FLOPs, GEMM reference, peak and roofline, so
//! every ratio in a peer row means what it means in ours; decode is timed the same way on both
//! sides (generating every new token less generating one, per token step). Its floors are the
//! issues' (49: training step and forward no slower than PyTorch's; 50: decode at least 5× HF
//! generate). Where PyTorch, transformers or a CUDA device is missing the script exits 3 and the
//! benchmark says so plainly, with no peer row.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use super::device::EngineShape;
use super::measure::Row;
use crate::bench::Floor;
use nereus_runtime::RuntimeError;

/// A peer the device engine is compared with in the same run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// PyTorch eager (`scripts/peer-torch.py`).
    Torch,
}

nereus_core::named_enum!(Peer { Torch => "torch" });

/// The script's exit status when it cannot run here (no torch, transformers or CUDA device).
const ABSENT: i32 = 3;

/// What `scripts/peer-torch.py` measured (its JSON line; seconds are medians).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TorchRun {
    /// `torch.__version__`.
    pub torch: String,
    /// The CUDA device's name.
    pub device: String,
    /// One training step.
    pub step_s: f64,
    /// One forward pass (no gradient).
    pub forward_s: f64,
    /// Peak allocated device memory over the training steps.
    pub peak_memory_bytes: u64,
    /// One decode token step of every sequence (generating every new token less one).
    #[serde(default)]
    pub decode_step_s: Option<f64>,
}

/// The peer's run, or why it could not run here.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerOutcome {
    /// It ran.
    Ran(TorchRun),
    /// It cannot run on this machine (the script's own words).
    Absent(String),
}

/// Runs the PyTorch peer on `shape` with `reps` measured repetitions. The script is
/// `NEREUS_PEER_TORCH` or `scripts/peer-torch.py` under the working directory or the
/// repository the binary was built in; the interpreter `NEREUS_PEER_PYTHON` or `python3`.
pub fn run_torch(shape: EngineShape, reps: usize) -> Result<PeerOutcome, RuntimeError> {
    let script = find_script()?;
    let python = std::env::var_os("NEREUS_PEER_PYTHON").unwrap_or_else(|| "python3".into());
    let json = std::env::temp_dir().join(format!("nereus-peer-torch-{}.json", std::process::id()));
    let ran = Command::new(&python)
        .arg(&script)
        .args(["--shape", shape.name(), "--reps", &reps.max(1).to_string(), "--json"])
        .arg(&json)
        .output();
    let output = match ran {
        // No Python, no PyTorch: as plain as the script's own exit 3.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(PeerOutcome::Absent(format!("no {} interpreter", python.to_string_lossy())))
        }
        other => other.map_err(|e| RuntimeError::Usage(format!("--peer torch: cannot run {python:?}: {e}")))?,
    };
    let said = String::from_utf8_lossy(&output.stderr).trim().lines().last().unwrap_or("").to_string();
    if output.status.code() == Some(ABSENT) {
        return Ok(PeerOutcome::Absent(said));
    }
    if !output.status.success() {
        return Err(RuntimeError::Usage(format!(
            "--peer torch: {} failed ({}): {said}",
            script.display(),
            output.status
        )));
    }
    let text = std::fs::read_to_string(&json).map_err(nereus_runtime::io_error("read", &json))?;
    let _ = std::fs::remove_file(&json);
    let run = serde_json::from_str(&text).map_err(|e| {
        RuntimeError::Usage(format!("--peer torch: {} wrote JSON this benchmark cannot read: {e}", script.display()))
    })?;
    Ok(PeerOutcome::Ran(run))
}

/// Where the peer script is: the override, else under the working directory, else under the
/// repository this binary was built from.
fn find_script() -> Result<PathBuf, RuntimeError> {
    if let Some(path) = std::env::var_os("NEREUS_PEER_TORCH") {
        return Ok(PathBuf::from(path));
    }
    let relative = Path::new("scripts/peer-torch.py");
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative);
    [relative.to_path_buf(), built].into_iter().find(|p| p.is_file()).ok_or_else(|| {
        RuntimeError::Usage(
            "--peer torch: scripts/peer-torch.py is not under the working directory (run from the repository or \
             the GPU bundle, or set NEREUS_PEER_TORCH)"
                .into(),
        )
    })
}

/// The peer's rows: each of our `forward`, `train_step` and `decode` rows with the peer's
/// seconds (tokens, FLOPs, and the ratios' references as ours); our decode row spans
/// `decode_steps` token steps.
pub fn peer_rows(ours: &[Row], peer: &TorchRun, decode_steps: u64) -> Vec<Row> {
    let pairs = [
        ("forward", "torch_forward", Some(peer.forward_s)),
        ("train_step", "torch_train_step", Some(peer.step_s)),
        ("decode", "hf_generate_decode", peer.decode_step_s),
    ];
    pairs
        .into_iter()
        .filter_map(|(phase, name, per_run)| {
            let r = ours.iter().find(|r| r.phase == phase)?;
            // The peer's decode time is one token step; our row spans `decode_steps`.
            let seconds = per_run? * if phase == "decode" { decode_steps as f64 } else { 1.0 };
            Some(as_peer(r, name, seconds, peer.peak_memory_bytes))
        })
        .collect()
}

/// `ours` as the peer ran it in `seconds`: every rate rescaled by the time ratio; its
/// training step's row carries the peer's peak memory.
fn as_peer(ours: &Row, phase: &str, seconds: f64, peer_peak_bytes: u64) -> Row {
    let speed = ours.seconds / seconds;
    Row {
        phase: phase.into(),
        seconds,
        tokens_per_second: ours.tokens_per_second * speed,
        gflops_per_second: ours.gflops_per_second * speed,
        fraction_of_gemm: ours.fraction_of_gemm * speed,
        fraction_of_peak: ours.fraction_of_peak.map(|f| f * speed),
        fraction_of_roofline: ours.fraction_of_roofline.map(|f| f * speed),
        counts: None,
        launches_per_token: None,
        kernels_per_token: None,
        syncs_per_token: None,
        peak_bytes: (phase == "torch_train_step").then_some(peer_peak_bytes),
        predicted_peak_bytes: None,
        ..ours.clone()
    }
}

/// The floors against the peer (GPUs only): our training step and forward no slower than
/// PyTorch's (its seconds over ours ≥ 1), our decode at least 5× HF generate's tokens/s, and
/// our training step's peak memory no more than PyTorch's.
pub fn peer_floors(ours: &[Row], peer_rows: &[Row]) -> Vec<Floor> {
    let seconds = |rows: &[Row], phase: &str| rows.iter().find(|r| r.phase == phase).map(|r| r.seconds);
    let mut out = Vec::new();
    for (phase, theirs, name, floor) in [
        ("train_step", "torch_train_step", "torch_train_step_over_engine", 1.0),
        ("forward", "torch_forward", "torch_forward_over_engine", 1.0),
        ("decode", "hf_generate_decode", "engine_decode_over_hf_generate", 5.0),
    ] {
        if let (Some(mine), Some(peer)) = (seconds(ours, phase), seconds(peer_rows, theirs)) {
            out.push(Floor::at_least(name, peer / mine, floor, "ratio"));
        }
    }
    let peak = |rows: &[Row], phase: &str| rows.iter().find(|r| r.phase == phase).and_then(|r| r.peak_bytes);
    if let (Some(mine), Some(peer)) = (peak(ours, "train_step"), peak(peer_rows, "torch_train_step")) {
        out.push(Floor::at_least("torch_peak_memory_over_engine", peer as f64 / mine as f64, 1.0, "ratio"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peers_rows_rescale_ours_and_its_floors_compare_seconds() {
        let step =
            Row { peak_bytes: Some(4), predicted_peak_bytes: Some(5), ..Row::new("train_step", 100, 1.0, 3e9, 1e12) };
        let ours = vec![Row::new("forward", 100, 0.5, 1e9, 1e12), step, Row::new("decode", 28, 0.07, 0.0, 1e12)];
        let peer = TorchRun {
            torch: "2.11".into(),
            device: "H200".into(),
            step_s: 2.0,
            forward_s: 0.25,
            peak_memory_bytes: 6,
            decode_step_s: Some(0.04),
        };
        let theirs = peer_rows(&ours, &peer, 7);
        let seconds: Vec<(&str, f64)> = theirs.iter().map(|r| (r.phase.as_str(), r.seconds)).collect();
        assert_eq!(seconds, [("torch_forward", 0.25), ("torch_train_step", 2.0), ("hf_generate_decode", 0.28)]);
        assert_eq!(theirs[1].tokens_per_second, 50.0);
        // Only the peer's training step carries its peak memory, and no prediction.
        let peaks: Vec<_> = theirs.iter().map(|r| (r.peak_bytes, r.predicted_peak_bytes)).collect();
        assert_eq!(peaks, [(None, None), (Some(6), None), (None, None)]);
        assert!(
            (theirs[1].gflops_per_second - 1.5).abs() < 1e-12 && (theirs[1].fraction_of_gemm - 1.5e-3).abs() < 1e-12
        );
        let floors: Vec<(String, f64, bool)> =
            peer_floors(&ours, &theirs).into_iter().map(|f| (f.name, f.value, f.ok)).collect();
        assert_eq!(
            floors,
            [
                ("torch_train_step_over_engine".to_string(), 2.0, true),
                ("torch_forward_over_engine".to_string(), 0.5, false),
                ("engine_decode_over_hf_generate".to_string(), 0.28 / 0.07, false),
                ("torch_peak_memory_over_engine".to_string(), 1.5, true),
            ]
        );
    }
}
