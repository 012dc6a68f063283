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

use super::checkpoint::{fill_shard, open_weights, Expect, ModelWeights, SIDECAR};
use super::{io_error, RuntimeError, Session};
use nereus_core::config::{hf, Dtype};
use nereus_core::model::{Catalogue, Layout, OutputHead};
use nereus_core::plan::{ModelStage, Role, Stage};
use nereus_exec::comm::{DataPlane, MpiPlane};
use nereus_exec::emu::{Counters, EmuSet};
use nereus_exec::engine::parallel::assemble_rows;
use nereus_exec::engine::{with_params, Batch, Replica};

/// What `nereus logprobs` scores and how.
#[derive(Debug, Clone, clap::Args)]
pub struct LogprobsOptions {
    /// The model directory (config.json and *.safetensors), e.g. a checkpoint's step-N/actor.
    pub dir: PathBuf,
    /// JSON file with a list of token-id sequences, e.g. [[1, 5, 9], [2, 7]].
    #[arg(long, value_name = "FILE.json")]
    pub tokens: PathBuf,
    /// Write the JSON here instead of standard output.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Tensor-parallel degree of each replica (the ranks form ranks / (tp x pp) replicas that
    /// share the sequences).
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    /// Pipeline-parallel degree of each replica.
    #[arg(long, default_value_t = 1)]
    pub pp: u32,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: usize,
}

/// Memory the ranks' ledgers allow here: the command runs what the machine holds, so the
/// ledger only counts (1 PiB).
const LEDGER_BYTES: u64 = 1 << 50;

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
    let mut plane = MpiPlane::new(session.world(), session.watchdog().clone());
    let mut set = EmuSet::new(plane.rank(), world, LEDGER_BYTES, [(role, p.catalogue.clone())].into_iter().collect());
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
    let batch = Batch { tokens: &tokens, seq_len };
    let replica = Replica::new(&mut plane, &set, id, seq_len)?;
    let micro_batch = options.micro_batch.max(1);
    let outputs = with_params(&mut set, id, |params, arena| replica.infer(&plane, params, &batch, micro_batch, arena))?;
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
    let catalogue = Catalogue::of_spec(&spec, found.value_head);
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
    let sequences = read_tokens(&options.tokens, spec.vocab)?;
    let weights = open_weights(dir)?;
    weights.check(&catalogue, &[""], Expect::Pretrained { fresh: &[] })?;
    Ok(Prepared { catalogue, weights, sequences, layout })
}

/// The token-id sequences of a JSON file (`[[1, 2, 3], [4, 5]]`), each at least one token,
/// every id inside the vocabulary.
fn read_tokens(path: &Path, vocab: u32) -> Result<Vec<Vec<u32>>, RuntimeError> {
    let usage = |reason: String| RuntimeError::Usage(format!("--tokens `{}`: {reason}", path.display()));
    let text = std::fs::read_to_string(path).map_err(io_error("read", path))?;
    let sequences: Vec<Vec<u64>> =
        serde_json::from_str(&text).map_err(|e| usage(format!("expected a JSON list of lists of token ids: {e}")))?;
    if sequences.is_empty() {
        return Err(usage("holds no sequence".into()));
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
