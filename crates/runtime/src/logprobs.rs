//! `nereus logprobs DIR --tokens FILE.json`: the engine's per-token log-probabilities (or, for
//! a value model, per-position values) of given token sequences under a Hugging Face model
//! directory (a released model, or a checkpoint's `step-N/<model>/`), for comparing the engine
//! with another implementation (docs/models.md).
//!
//! Every rank reads `config.json` and the tokens and agrees; the world is divided into `dp`
//! replicas of the layout `(tp, pp)` (`--tp`, `--pp`; `dp` = ranks / (tp·pp)), each rank fills
//! its shard from the memory-mapped weights, each replica scores its share of the sequences,
//! and one sum over the world assembles every row for rank 0 to print. Sequences of different
//! lengths are padded at the end: attention is causal, so padding changes no earlier position.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::checkpoint::{fill_shard, CheckpointError, SIDECAR};
use super::{io_error, RuntimeError, Session};
use nereus_core::config::check::MAX_TOKENS;
use nereus_core::config::{hf, Dtype};
use nereus_core::model::{Catalogue, Layout, OutputHead};
use nereus_core::plan::{ModelStage, Role, Stage};
use nereus_data::model_files::{open_weights, Expect, ModelWeights};
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{Counters, EmuSet, HostMemory};
use nereus_exec::engine::parallel::assemble_rows;
use nereus_exec::engine::{Batch, EngineMemory, Replica};

/// What `nereus logprobs` scores and how.
#[derive(Debug, Clone)]
pub struct LogprobsOptions {
    /// The model directory (config.json and *.safetensors), e.g. a checkpoint's step-N/actor.
    pub dir: PathBuf,
    /// JSON file with a list of token-id sequences, e.g. [[1, 5, 9], [2, 7]].
    pub tokens: PathBuf,
    /// Write the JSON here instead of standard output.
    pub json: Option<PathBuf>,
    /// Tensor-parallel degree of each replica (the ranks form ranks / (tp x pp) replicas that
    /// share the sequences).
    pub tp: u32,
    /// Pipeline-parallel degree of each replica.
    pub pp: u32,
    /// Sequences per forward pass.
    pub micro_batch: usize,
}

/// Most token ids a `--tokens` file may hold, all sequences together (2^24): far past what
/// the reference engine scores in reasonable time, small enough to read into memory.
const MAX_TOTAL_TOKENS: usize = 1 << 24;

/// The memory this rank may use: the node's available memory (`/proc/meminfo`) shared by the
/// ranks on it. The ledger charges every buffer before it is allocated, so a batch too large
/// for the machine is refused with the buffer, its size and this capacity named, instead of
/// the allocator aborting the process.
fn ledger_bytes(session: &Session) -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
    });
    let ranks_here = session.layout().max_ranks_per_node().max(1) as u64;
    available.map_or(u64::MAX / 2, |bytes| bytes / ranks_here)
}

/// The model and the input, checked on every rank.
struct Prepared {
    catalogue: Catalogue,
    weights: ModelWeights,
    sequences: Vec<Vec<u32>>,
    layout: Layout,
}

/// Runs `nereus logprobs` on every rank; rank 0 writes the result.
pub fn run(session: &Session, options: &LogprobsOptions) -> Result<(), RuntimeError> {
    let world = session.world().size();
    let p = session.agree("model directory and tokens", prepare(options, world))?;
    let value = p.catalogue.arch.head == OutputHead::Value;
    let role = if value { Role::Critic } else { Role::Actor };
    let ms = ModelStage::new(role, Stage::Inference);
    let mut plane = session.control_plane();
    let capacity = ledger_bytes(session);
    let mut set = EmuSet::new(plane.rank(), world, capacity, [(role, p.catalogue.clone())].into_iter().collect());
    let size = p.layout.size() as i32;
    let mut mine = None;
    for r in 0..world / size {
        let ranks: Vec<i32> = (r * size..(r + 1) * size).collect();
        let mut refuse = |_: &_, _: &mut [f32]| Err("missing from the model directory".to_string());
        let fill = |shard: &mut _, catalogue: &_| fill_shard(shard, catalogue, &p.weights, None, &mut refuse);
        let id = set.create(&mut plane, ms, p.layout, &ranks, Counters::default(), fill)?;
        if ranks.contains(&plane.rank()) {
            mine = Some(id);
        }
    }
    let id = mine.ok_or_else(|| RuntimeError::Usage("this rank belongs to no replica".into()))?;
    let seq_len = p.sequences.iter().map(Vec::len).max().unwrap_or(1);
    let tokens: Vec<u32> =
        p.sequences.iter().flat_map(|s| s.iter().copied().chain(std::iter::repeat(0)).take(seq_len)).collect();
    let batch = Batch { tokens: &tokens, seq_len, starts: &[] };
    let replica = Replica::new(&mut plane, &set, id, seq_len)?;
    let micro_batch = options.micro_batch.max(1);
    let outputs = HostMemory::infer(&plane, &mut set, &replica, &batch, micro_batch)?;
    let contribution =
        replica.groups.speaks_for_outputs().then(|| (batch.share(replica.groups.replica).start, outputs));
    let everyone = plane.group(&(0..world).collect::<Vec<_>>())?;
    let rows = assemble_rows(
        &plane,
        everyone,
        p.sequences.len(),
        seq_len,
        contribution.as_ref().map(|(first, rows)| (*first, rows.as_slice())),
    )?;
    if let Some(k) = rows.iter().position(|x| !x.is_finite()) {
        // Every rank holds the assembled rows: every rank refuses alike.
        let what = if value { "values" } else { "log-probabilities" };
        return Err(RuntimeError::everywhere(
            "scoring",
            RuntimeError::Usage(format!(
                "`{}`: the {what} of sequence {} are not finite ({}): the model's weights hold NaN or infinite values",
                options.dir.display(),
                k / seq_len,
                rows[k]
            )),
        ));
    }
    if session.rank() == 0 {
        write_report(options, &p.sequences, &rows, seq_len, value)?;
    }
    Ok(())
}

/// Reads and checks everything the ranks need before any state exists.
fn prepare(options: &LogprobsOptions, world: i32) -> Result<Prepared, RuntimeError> {
    let dir = &options.dir;
    let usage = |reason: String| RuntimeError::Usage(format!("`{}`: {reason}", dir.display()));
    if dir.join(SIDECAR).is_file() {
        let models: Vec<String> = std::fs::read_dir(dir)
            .map(|d| d.flatten().filter(|e| e.path().is_dir()).map(|e| e.path().display().to_string()).collect())
            .unwrap_or_default();
        return Err(usage(format!("this is a checkpoint; pass one of its model directories: {}", models.join(", "))));
    }
    let found = hf::read_model_config(dir).map_err(usage)?;
    // The engine computes in f32 whatever the files hold (bf16 and f16 convert exactly).
    let spec = nereus_core::config::ModelSpec { dtype: Dtype::F32, ..found.spec };
    spec.validate("model").map_err(|e| usage(format!("config.json describes a model the engine cannot hold: {e}")))?;
    let catalogue = Catalogue::of_spec(&spec, found.head);
    if options.micro_batch == 0 {
        return Err(RuntimeError::Usage("--micro-batch 0: a forward pass takes at least 1 sequence".into()));
    }
    let layout = Layout::new(options.tp, options.pp);
    catalogue.check_layout(layout).map_err(|e| RuntimeError::Usage(e.to_string()))?;
    if world % layout.size() as i32 != 0 {
        return Err(RuntimeError::Usage(format!(
            "{world} ranks do not divide into replicas of tp × pp = {} × {}; start a multiple of {} ranks",
            options.tp,
            options.pp,
            layout.size()
        )));
    }
    // The longest sequence the model was made for, when its config.json says.
    let max_len = found.json.get("max_position_embeddings").and_then(|v| v.as_u64()).unwrap_or(u64::from(MAX_TOKENS));
    let sequences = read_tokens(&options.tokens, spec.vocab, max_len.min(u64::from(MAX_TOKENS)) as usize)?;
    let weights = open_weights(dir).map_err(CheckpointError::outside_checkpoint)?;
    weights.check(&catalogue, &[""], Expect::Pretrained { fresh: &[] }).map_err(CheckpointError::outside_checkpoint)?;
    Ok(Prepared { catalogue, weights, sequences, layout })
}

/// The token-id sequences of a JSON file (`[[1, 2, 3], [4, 5]]`), each at least one token and
/// at most `max_len`, every id inside the vocabulary, [`MAX_TOTAL_TOKENS`] in all.
fn read_tokens(path: &Path, vocab: u32, max_len: usize) -> Result<Vec<Vec<u32>>, RuntimeError> {
    let usage = |reason: String| RuntimeError::Usage(format!("--tokens `{}`: {reason}", path.display()));
    // A file of more digits than the bound allows tokens is refused before it is read.
    nereus_core::file_error::check_regular(path).map_err(|e| usage(e.source.to_string()))?;
    let bytes = std::fs::metadata(path).map_err(io_error("read", path))?.len();
    if bytes > 24 * MAX_TOTAL_TOKENS as u64 {
        return Err(usage(format!("{bytes} bytes: more than {MAX_TOTAL_TOKENS} token ids can take")));
    }
    let bytes = std::fs::read(path).map_err(io_error("read", path))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| usage(format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to())))?;
    let sequences: Vec<Vec<u64>> =
        serde_json::from_str(&text).map_err(|e| usage(format!("expected a JSON list of lists of token ids: {e}")))?;
    if sequences.is_empty() {
        return Err(usage("holds no sequence".into()));
    }
    let total: usize = sequences.iter().map(Vec::len).sum();
    if total > MAX_TOTAL_TOKENS {
        return Err(usage(format!("{total} token ids: at most {MAX_TOTAL_TOKENS} in all")));
    }
    if let Some((i, s)) = sequences.iter().enumerate().find(|(_, s)| s.len() > max_len) {
        return Err(usage(format!(
            "sequence {i} has {} tokens; the model takes at most {max_len} (its max_position_embeddings)",
            s.len()
        )));
    }
    sequences
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if s.is_empty() {
                return Err(usage(format!("sequence {i} is empty")));
            }
            s.iter()
                .enumerate()
                .map(|(t, &id)| {
                    u32::try_from(id).ok().filter(|&id| id < vocab).ok_or_else(|| {
                        usage(format!("sequence {i}, position {t}: token {id} is outside the vocabulary (0..{vocab})"))
                    })
                })
                .collect()
        })
        .collect()
}

/// Rank 0: `{"model": DIR, "logprobs": [[log p(x_t | x_<t) for t >= 1], …]}`, or `"values"`
/// (one per position) for a value model, to `--json PATH` or standard output.
fn write_report(
    options: &LogprobsOptions,
    sequences: &[Vec<u32>],
    rows: &[f32],
    seq_len: usize,
    value: bool,
) -> Result<(), RuntimeError> {
    // Row t of a sequence holds log p(x_{t+1} | x_{<=t}) (the engine's next-token targets), or
    // the value after x_{<=t}.
    let lists: Vec<Vec<f32>> = sequences
        .iter()
        .zip(rows.chunks_exact(seq_len))
        .map(|(s, row)| row[..if value { s.len() } else { s.len() - 1 }].to_vec())
        .collect();
    let key = if value { "values" } else { "logprobs" };
    let report = json!({"model": options.dir.display().to_string(), key: lists});
    let mut text = serde_json::to_string(&report).expect("JSON values serialize");
    text.push('\n');
    match &options.json {
        Some(path) => std::fs::write(path, text).map_err(io_error("write", path)),
        None => {
            use std::io::Write as _;
            std::io::stdout().write_all(text.as_bytes()).map_err(RuntimeError::Stdout)
        }
    }
}
