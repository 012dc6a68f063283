//! Hugging Face model directories in and out (docs/models.md): directories written by the
//! project's own writer (random weights; Llama with `llama3` RoPE scaling, Qwen3 with QK-norm,
//! tied and untied embeddings, sharded and unsharded, f32 and bf16) give the same log-probs
//! from `nereus logprobs` on one rank and under TP, PP and DP, and the same as an independent
//! f64 implementation of the published architectures written here; a job starts from model
//! directories, trains, and writes checkpoints whose models are model directories again.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{run_mpi, run_single, set_key, shipped, text, write};
use nereus_core::config::hf::{self, ConfigJsonOptions};
use nereus_core::config::{Dtype, ModelSpec, RopeScaling};
use nereus_core::model::{Catalogue, OutputHead};
use nereus_data::model_files::{write_model_dir, NamedTensor, WriteOptions};
use safetensors::SafeTensors;
use serde_json::Value;

/// A small model of the given family; `vocab` 64 unless set.
fn spec(layers: u32, qk_norm: bool, tie: bool, head_dim: Option<u32>, theta: f64, eps: f64) -> ModelSpec {
    ModelSpec {
        path: None,
        layers,
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        ffn: 48,
        vocab: 64,
        dtype: Dtype::F32,
        tie_embeddings: tie,
        head_dim,
        qk_norm,
        rope_theta: theta,
        rms_norm_eps: eps,
        rope_scaling: None,
    }
}

/// Llama 3.1's scaling over a 512-token original context: with heads 8 wide and θ = 500,000
/// the wavelengths 6.3, 167, 4443 and 118,000 fall in every band (kept, interpolated, divided).
fn llama3() -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 512,
    }
}

/// SplitMix64 uniform in [-1, 1).
fn uniform(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// Writes a model directory of `spec` with random weights through the project's writer:
/// norm gains near one, embeddings of unit scale, matrices small.
fn write_random_model(dir: &Path, spec: &ModelSpec, head: OutputHead, seed: u64, max_shard_bytes: u64) {
    let catalogue = Catalogue::of_spec(spec, head);
    let mut state = seed;
    let tensors: Vec<NamedTensor> = catalogue
        .tensors
        .iter()
        .map(|t| {
            let scale = if t.vector {
                0.2
            } else if t.name.contains("embed") {
                1.0
            } else {
                0.15
            };
            let offset = if t.vector { 1.0 } else { 0.0 };
            let values: Vec<u8> =
                (0..t.elements()).flat_map(|_| (offset + scale * uniform(&mut state)).to_le_bytes()).collect();
            (t.name.clone(), t.hf_shape(), values)
        })
        .collect();
    let options = ConfigJsonOptions { base: None, max_position_embeddings: 64, eos_token_id: Some(0) };
    let config = hf::config_json(spec, head, &options);
    let generation = hf::generation_config_json(&config, 1.0, 1.0);
    let write = WriteOptions {
        dtype: spec.dtype,
        max_shard_bytes,
        metadata: HashMap::new(),
        config: &config,
        generation_config: &generation,
        source: None,
        tokenizer: None,
    };
    write_model_dir(dir, &tensors, &write).unwrap();
}

/// Every tensor of a model directory (any shard), decoded to f64.
fn read_tensors(dir: &Path) -> HashMap<String, (Vec<usize>, Vec<f64>)> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".safetensors") {
            continue;
        }
        let bytes = std::fs::read(entry.path()).unwrap();
        for (tensor, view) in SafeTensors::deserialize(&bytes).unwrap().tensors() {
            let values = match view.dtype() {
                safetensors::Dtype::F32 => {
                    view.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).collect()
                }
                safetensors::Dtype::BF16 => view
                    .data()
                    .chunks_exact(2)
                    .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16) as f64)
                    .collect(),
                other => panic!("{other:?}"),
            };
            out.insert(tensor, (view.shape().to_vec(), values));
        }
    }
    out
}

/// The raw bytes of every tensor of a model directory, by name (for byte-for-byte comparisons).
fn tensor_bytes(dir: &Path) -> HashMap<String, Vec<u8>> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".safetensors") {
            let bytes = std::fs::read(entry.path()).unwrap();
            for (tensor, view) in SafeTensors::deserialize(&bytes).unwrap().tensors() {
                out.insert(tensor, view.data().to_vec());
            }
        }
    }
    out
}

/// An independent f64 implementation of the published Llama / Qwen3 decoder (transformers'
/// `LlamaForCausalLM`, `Qwen3ForCausalLM`, `…ForSequenceClassification` per position), written
/// from the architecture, not from the engine: per token, log p(x_t | x_<t) for t >= 1, or the
/// value at every position.
struct Reference {
    w: HashMap<String, (Vec<usize>, Vec<f64>)>,
    spec: ModelSpec,
    head: OutputHead,
}

impl Reference {
    fn get(&self, name: &str) -> &[f64] {
        &self.w.get(name).unwrap_or_else(|| panic!("{name} missing")).1
    }

    /// `y = W x` for `W[out, in]`.
    fn mv(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let w = self.get(name);
        w.chunks_exact(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
    }

    fn norm(&self, x: &[f64], gain: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + self.spec.rms_norm_eps).sqrt();
        x.iter().zip(gain).map(|(v, g)| v * r * g).collect()
    }

    /// transformers' `inv_freq` (default, or `_compute_llama3_parameters`).
    fn inv_freq(&self, d: usize) -> Vec<f64> {
        (0..d / 2)
            .map(|i| {
                let f = 1.0 / self.spec.rope_theta.powf((2 * i) as f64 / d as f64);
                let Some(RopeScaling::Llama3 {
                    factor,
                    low_freq_factor: lo,
                    high_freq_factor: hi,
                    original_max_position_embeddings: old,
                }) = self.spec.rope_scaling
                else {
                    return f;
                };
                let (old, wavelen) = (f64::from(old), 2.0 * std::f64::consts::PI / f);
                let scaled = if wavelen > old / lo { f / factor } else { f };
                if wavelen < old / hi || wavelen > old / lo {
                    scaled
                } else {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                }
            })
            .collect()
    }

    fn rotate(x: &mut [f64], pos: usize, inv: &[f64]) {
        let half = inv.len();
        for (i, &f) in inv.iter().enumerate() {
            let (c, s) = ((pos as f64 * f).cos(), (pos as f64 * f).sin());
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }

    fn run(&self, tokens: &[u32]) -> Vec<f64> {
        let s = &self.spec;
        let (c, hd) = (s.hidden as usize, s.head_dim.unwrap_or(s.hidden / s.heads) as usize);
        let (heads, kv) = (s.heads as usize, s.kv_heads as usize);
        let inv = self.inv_freq(hd);
        let embed = self.get("model.embed_tokens.weight");
        let mut h: Vec<Vec<f64>> =
            tokens.iter().map(|&t| embed[t as usize * c..(t as usize + 1) * c].to_vec()).collect();
        for l in 0..s.layers {
            let p = |n: &str| format!("model.layers.{l}.{n}");
            let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
            for (pos, x) in h.iter().enumerate() {
                let a = self.norm(x, self.get(&p("input_layernorm.weight")));
                let (mut q, mut k) =
                    (self.mv(&p("self_attn.q_proj.weight"), &a), self.mv(&p("self_attn.k_proj.weight"), &a));
                for (v, heads, norm) in
                    [(&mut q, heads, "self_attn.q_norm.weight"), (&mut k, kv, "self_attn.k_norm.weight")]
                {
                    for head in 0..heads {
                        let part = &mut v[head * hd..(head + 1) * hd];
                        if s.qk_norm {
                            let normed = self.norm(part, self.get(&p(norm)));
                            part.copy_from_slice(&normed);
                        }
                        Self::rotate(part, pos, &inv);
                    }
                }
                qs.push(q);
                ks.push(k);
                vs.push(self.mv(&p("self_attn.v_proj.weight"), &a));
            }
            for t in 0..h.len() {
                let mut o = vec![0.0; heads * hd];
                for head in 0..heads {
                    let g = head / (heads / kv);
                    let q = &qs[t][head * hd..(head + 1) * hd];
                    let scores: Vec<f64> = (0..=t)
                        .map(|j| {
                            q.iter().zip(&ks[j][g * hd..(g + 1) * hd]).map(|(a, b)| a * b).sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                    for (j, sc) in scores.iter().enumerate() {
                        for d in 0..hd {
                            o[head * hd + d] += (sc - m).exp() / z * vs[j][g * hd + d];
                        }
                    }
                }
                let attn = self.mv(&p("self_attn.o_proj.weight"), &o);
                h[t].iter_mut().zip(&attn).for_each(|(x, y)| *x += y);
                let b = self.norm(&h[t], self.get(&p("post_attention_layernorm.weight")));
                let (gate, up) = (self.mv(&p("mlp.gate_proj.weight"), &b), self.mv(&p("mlp.up_proj.weight"), &b));
                let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                let down = self.mv(&p("mlp.down_proj.weight"), &act);
                h[t].iter_mut().zip(&down).for_each(|(x, y)| *x += y);
            }
        }
        let finals: Vec<Vec<f64>> = h.iter().map(|x| self.norm(x, self.get("model.norm.weight"))).collect();
        if self.head == OutputHead::Value {
            return finals.iter().map(|x| self.mv("score.weight", x)[0]).collect();
        }
        let head = if s.tie_embeddings { "model.embed_tokens.weight" } else { "lm_head.weight" };
        (1..tokens.len())
            .map(|t| {
                let logits = self.mv(head, &finals[t - 1]);
                let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + logits.iter().map(|z| (z - m).exp()).sum::<f64>().ln();
                logits[tokens[t] as usize] - lse
            })
            .collect()
    }
}

/// Token sequences of lengths 1 to 12 over a vocabulary of `vocab`.
fn token_file(dir: &Path, vocab: u32) -> (PathBuf, Vec<Vec<u32>>) {
    let lengths = [12, 5, 1, 9, 12, 3, 7];
    let mut state = 99;
    let sequences: Vec<Vec<u32>> = lengths
        .iter()
        .map(|&n| (0..n).map(|_| ((uniform(&mut state) + 1.0) * 0.5 * vocab as f32) as u32 % vocab).collect())
        .collect();
    (write(dir, "tokens.json", &serde_json::to_string(&sequences).unwrap()), sequences)
}

/// `nereus logprobs` on `ranks` ranks (1: a plain process) with `extra` flags; the lists.
fn logprobs(ranks: usize, model: &Path, tokens: &Path, out: &Path, extra: &[&str]) -> Result<Vec<Vec<f64>>, String> {
    let mut args = vec!["logprobs", model.to_str().unwrap(), "--tokens", tokens.to_str().unwrap()];
    args.extend(["--json", out.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let run = if ranks == 1 { run_single(&args) } else { run_mpi(ranks, &args) };
    if !run.status.success() {
        return Err(format!("exit {:?}: {}", run.status.code(), text(&run).1));
    }
    let report: Value = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    assert_eq!(report["model"], model.to_str().unwrap());
    let key = if report.get("values").is_some() { "values" } else { "logprobs" };
    Ok(report[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect())
}

fn max_difference(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(u, v)| (u - v).abs())
        })
        .fold(0.0, f64::max)
}

#[test]
fn logprobs_agree_on_one_rank_under_tp_pp_and_dp_and_with_an_independent_implementation() {
    let dir = tempfile::tempdir().unwrap();
    let llama = ModelSpec { rope_scaling: Some(llama3()), ..spec(3, false, false, None, 500_000.0, 1e-5) };
    let tied = ModelSpec { dtype: Dtype::Bf16, ..spec(2, false, true, None, 10_000.0, 1e-6) };
    let qwen = spec(2, true, true, Some(16), 1_000_000.0, 1e-6);
    let qwen_untied = ModelSpec { dtype: Dtype::Bf16, ..spec(3, true, false, Some(16), 1_000_000.0, 1e-6) };
    // (name, spec, head, shard threshold, layouts as (ranks, tp, pp))
    let untied_layouts: &[(usize, &str, &str)] =
        &[(2, "2", "1"), (2, "1", "2"), (4, "2", "2"), (3, "1", "1"), (3, "1", "3")];
    let tied_layouts: &[(usize, &str, &str)] = &[(2, "2", "1"), (4, "2", "1")];
    let cases = [
        ("llama-llama3-untied-f32", llama.clone(), OutputHead::Lm, u64::MAX, untied_layouts),
        ("llama-tied-bf16-sharded", tied, OutputHead::Lm, 8_000, tied_layouts),
        ("qwen3-tied-f32-sharded", qwen, OutputHead::Lm, 20_000, tied_layouts),
        ("qwen3-untied-bf16", qwen_untied, OutputHead::Lm, u64::MAX, untied_layouts),
        ("llama-value-model", llama, OutputHead::Value, 30_000, untied_layouts),
    ];
    let (tokens, sequences) = token_file(dir.path(), 64);
    let mut report = Vec::new();
    for (k, (name, spec, head, shard, layouts)) in cases.iter().enumerate() {
        let model = dir.path().join(name);
        write_random_model(&model, spec, *head, 7 + k as u64, *shard);
        let out = dir.path().join(format!("{name}.json"));
        let one = logprobs(1, &model, &tokens, &out, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let reference = Reference { w: read_tensors(&model), spec: spec.clone(), head: *head };
        let want: Vec<Vec<f64>> = sequences.iter().map(|s| reference.run(s)).collect();
        let independent = max_difference(&one, &want);
        assert!(independent < 5e-5, "{name}: 1 rank vs the f64 reference: max |Δ| = {independent:e}");
        let mut worst: f64 = 0.0;
        for &(ranks, tp, pp) in layouts.iter() {
            let got = logprobs(ranks, &model, &tokens, &out, &["--tp", tp, "--pp", pp, "--micro-batch", "2"])
                .unwrap_or_else(|e| panic!("{name} on {ranks} ranks, tp {tp} pp {pp}: {e}"));
            let d = max_difference(&got, &one);
            assert!(d < 2e-5, "{name}: {ranks} ranks, tp {tp}, pp {pp} vs 1 rank: max |Δ| = {d:e}");
            worst = worst.max(d);
        }
        report.push(format!("{name}: vs f64 reference {independent:.1e}, layouts vs 1 rank {worst:.1e}"));
    }
    eprintln!("{}", report.join("\n"));
    // Tied embeddings live on the first and the last stage: a pipeline cannot split them.
    let err =
        logprobs(2, &dir.path().join("qwen3-tied-f32-sharded"), &tokens, &dir.path().join("x.json"), &["--pp", "2"]);
    let err = err.unwrap_err();
    assert!(err.starts_with("exit Some(2)") && err.contains("tied embeddings need pp = 1"), "{err}");
}

#[test]
fn bad_model_directories_and_tokens_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    write_random_model(&model, &spec(1, false, false, None, 10_000.0, 1e-5), OutputHead::Lm, 1, u64::MAX);
    let out = dir.path().join("o.json");
    let bad_tokens = write(dir.path(), "bad.json", "[[1, 2], [3, 64]]");
    let err = logprobs(1, &model, &bad_tokens, &out, &[]).unwrap_err();
    assert!(err.contains("sequence 1, position 1: token 64 is outside the vocabulary (0..64)"), "{err}");
    let (tokens, _) = token_file(dir.path(), 64);
    let err = logprobs(1, &dir.path().join("nowhere"), &tokens, &out, &[]).unwrap_err();
    assert!(err.starts_with("exit Some(2)") && err.contains("not a directory"), "{err}");
    let err = logprobs(3, &model, &tokens, &out, &["--tp", "2"]).unwrap_err();
    assert!(err.contains("3 ranks do not divide into replicas of tp × pp = 2 × 1"), "{err}");
    // A tensor of the wrong shape is named with its file.
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let mut wider = config.clone();
    wider["intermediate_size"] = 64.into();
    std::fs::write(model.join("config.json"), wider.to_string()).unwrap();
    let err = logprobs(1, &model, &tokens, &out, &[]).unwrap_err();
    assert!(
        err.contains("model.safetensors") && err.contains("mlp.gate_proj.weight") && err.contains("[64, 32]"),
        "{err}"
    );
    // A job whose table disagrees with config.json.
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let toml = set_key(&shipped("tiny-ppo.toml"), "models.actor", "path", Some(&format!("{:?}", model)));
    let job = write(dir.path(), "job.toml", &toml);
    let run = run_single(&["inspect", "config", job.to_str().unwrap()]);
    let stderr = text(&run).1;
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`models.actor.layers` = 2 in the job disagrees with `num_hidden_layers` = 1"), "{stderr}");
    assert!(stderr.contains("m/config.json"), "{stderr}");
}

/// `[models.<role>]` naming a model directory: the architecture comes from its config.json.
fn from_directory(toml: &str, role: &str, dir: &Path) -> String {
    let section = format!("models.{role}");
    let mut out = toml.to_string();
    for key in ["layers", "hidden", "heads", "kv_heads", "ffn", "vocab"] {
        out = set_key(&out, &section, key, None);
    }
    set_key(&out, &section, "path", Some(&format!("{dir:?}")))
}

/// tiny-ppo on 8 ranks with reference/inference and actor/training under (tp, pp) = (2, 2).
fn tp_pp_plan(toml: &str) -> String {
    let plan = [
        ("actor/generation", 2, 1, 4, "[0, 1, 2, 3, 4, 5, 6, 7]"),
        ("reference/inference", 2, 2, 1, "[0, 1, 2, 3]"),
        ("reward/inference", 2, 1, 1, "[4, 5]"),
        ("critic/inference", 1, 1, 2, "[6, 7]"),
        ("actor/training", 2, 2, 1, "[0, 1, 2, 3]"),
        ("critic/training", 2, 1, 2, "[4, 5, 6, 7]"),
    ];
    let mut out = toml.to_string();
    for (ms, tp, pp, dp, ranks) in plan {
        out.push_str(&format!("\n[plan.\"{ms}\"]\ntp = {tp}\npp = {pp}\ndp = {dp}\nranks = {ranks}\n"));
    }
    out
}

#[test]
fn a_job_starts_from_model_directories_and_checkpoints_model_directories() {
    let dir = tempfile::tempdir().unwrap();
    // The actor and reference start from a Llama 3.1-style LM (f32, tokenizer files beside it);
    // the critic and reward model from a Qwen3 causal LM in bf16 shards, so both get a fresh
    // value head.
    let actor = dir.path().join("llama");
    let llama = ModelSpec {
        hidden: 64,
        ffn: 176,
        vocab: 32,
        rope_scaling: Some(llama3()),
        ..spec(2, false, false, None, 500_000.0, 1e-5)
    };
    write_random_model(&actor, &llama, OutputHead::Lm, 3, u64::MAX);
    std::fs::write(actor.join("tokenizer.json"), "{\"model\": {\"type\": \"WordLevel\"}}").unwrap();
    std::fs::write(actor.join("tokenizer_config.json"), "{}").unwrap();
    let scorer = dir.path().join("qwen3");
    let qwen = ModelSpec {
        hidden: 64,
        ffn: 176,
        vocab: 32,
        dtype: Dtype::Bf16,
        ..spec(2, true, true, Some(16), 1_000_000.0, 1e-6)
    };
    write_random_model(&scorer, &qwen, OutputHead::Lm, 4, 40_000);
    let mut toml = set_key(&shipped("tiny-ppo.toml"), "train", "checkpoint_every", Some("1"));
    toml = set_key(&toml, "train", "checkpoint_shard_gb", Some("0.00003"));
    for (role, from) in [("actor", &actor), ("reference", &actor), ("critic", &scorer), ("reward", &scorer)] {
        toml = from_directory(&toml, role, from);
    }
    let config = write(dir.path(), "job.toml", &tp_pp_plan(&toml));
    let planned = write(dir.path(), "planned.toml", &toml);
    let out = dir.path().join("run");
    let args = ["train", config.to_str().unwrap(), "--steps", "2", "--output-dir", out.to_str().unwrap()];
    let run = run_mpi(8, &args);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("warm-up steps are skipped"), "{stderr}");
    for role in ["critic", "reward"] {
        let fresh = format!(
            "the {role} model starts from the causal LM in {}: its value head score.weight [1, 64] is new",
            scorer.display()
        );
        assert!(stderr.contains(&fresh), "{stderr}");
    }
    assert_eq!(common::step_records(&out).len(), 2);

    let step = out.join("checkpoints/step-2");
    let config_of = |model: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(step.join(model).join("config.json")).unwrap()).unwrap()
    };
    let actor_config = config_of("actor");
    assert_eq!(actor_config["architectures"], serde_json::json!(["LlamaForCausalLM"]));
    assert_eq!(actor_config["rope_scaling"]["rope_type"], "llama3");
    assert_eq!(
        (actor_config["rope_theta"].as_f64(), actor_config["torch_dtype"].as_str()),
        (Some(500_000.0), Some("float32"))
    );
    for model in ["critic", "reward"] {
        let c = config_of(model);
        assert_eq!(c["architectures"], serde_json::json!(["Qwen3ForSequenceClassification"]), "{model}");
        assert_eq!((c["num_labels"].clone(), c["id2label"].as_object().map(|m| m.len())), (Value::Null, Some(1)));
        let tensors = read_tensors(&step.join(model));
        assert_eq!(tensors["score.weight"].0, vec![1, 64], "{model}: score.weight is [num_labels, hidden]");
        assert!(step.join(model).join("model.safetensors.index.json").is_file(), "{model} is sharded");
        assert!(!step.join(model).join("tokenizer.json").exists(), "{model}: its source had no tokenizer");
    }
    for model in ["actor", "reference"] {
        for file in
            ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"]
        {
            assert!(step.join(model).join(file).is_file(), "{model} lacks {file}");
        }
    }
    assert!(step.join("actor.optim.safetensors").is_file() && step.join("critic.optim.safetensors").is_file());
    // The reference never trains: loaded under (tp, pp) = (2, 2), gathered and saved, its
    // tensors are the source's byte for byte.
    let (source, saved) = (tensor_bytes(&actor), tensor_bytes(&step.join("reference")));
    assert_eq!(source.len(), saved.len());
    for (name, bytes) in &source {
        assert!(saved[name] == *bytes, "reference: {name} changed between loading and saving");
    }
    assert!(tensor_bytes(&step.join("actor")) != source, "the actor trained");
    // A checkpoint's model directory scores like any other (here the critic's values), and the
    // checkpoint resumes under another layout.
    let (tokens, _) = token_file(dir.path(), 32);
    let values = logprobs(2, &step.join("critic"), &tokens, &dir.path().join("v.json"), &["--tp", "2"]).unwrap();
    assert_eq!(values[0].len(), 12);
    let step1 = out.join("checkpoints/step-1");
    let resumed = dir.path().join("resumed");
    let args = [
        "train",
        planned.to_str().unwrap(),
        "--steps",
        "2",
        "--output-dir",
        resumed.to_str().unwrap(),
        "--resume",
        step1.to_str().unwrap(),
    ];
    let run = run_mpi(4, &args);
    assert!(run.status.success(), "{}", text(&run).1);
    let (a, b) = (common::step_records(&out), common::step_records(&resumed));
    assert_eq!(a[1]["reward_mean"], b[0]["reward_mean"], "the resumed step samples what the first run sampled");
}
