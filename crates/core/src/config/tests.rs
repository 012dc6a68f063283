//! Unit tests of loading, precedence and hashing (bad configs are in `tests/config_errors.rs`).

use super::*;
use std::path::Path;

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn no_detection() -> ClusterSection {
    panic!("detection must not run unless `cluster.detect = true`")
}

fn load(rel: &str, overrides: &Overrides) -> Result<JobConfig, ConfigError> {
    JobConfig::load(Some(&repo_path(rel)), overrides, &mut no_detection)
}

fn source(text: &str) -> ConfigSource {
    ConfigSource { name: "test.toml".into(), text: text.into(), base_dir: repo_path("configs") }
}

#[test]
fn every_shipped_job_config_is_valid() {
    for name in ["tiny-ppo", "tiny-grpo", "tiny-remax", "llama3.1-8b-ppo"] {
        let config =
            load(&format!("configs/{name}.toml"), &Overrides::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(config.job.name, name);
    }
    let embedded = JobConfig::load(None, &Overrides::default(), &mut no_detection).unwrap();
    assert_eq!(embedded, load("configs/tiny-ppo.toml", &Overrides::default()).unwrap());
}

#[test]
fn the_training_device_follows_cluster_device_then_the_data_plane() {
    let cluster = load("configs/tiny-ppo.toml", &Overrides::default()).unwrap().cluster;
    let on =
        |plane: DataPlane, device: Option<DeviceChoice>| ClusterSpec { data_plane: plane, device, ..cluster.clone() };
    use DeviceChoice::{Auto, Cuda, Emulated, Rocm};
    for (plane, device, trains_on) in [
        (DataPlane::Mpi, None, None),
        (DataPlane::Nccl, None, Some(Cuda)),
        (DataPlane::Rccl, None, Some(Rocm)),
        (DataPlane::Mpi, Some(Emulated), Some(Emulated)),
        (DataPlane::Rccl, Some(Auto), Some(Rocm)),
        (DataPlane::Nccl, Some(Auto), Some(Cuda)),
        (DataPlane::Mpi, Some(Auto), Some(Auto)),
        (DataPlane::Rccl, Some(Cuda), Some(Cuda)),
    ] {
        assert_eq!(on(plane, device).train_device(), trains_on, "{plane:?} with {device:?}");
    }
    // A named device plans with the device engine; a plane alone keeps its engine.
    assert_eq!(crate::cost::EngineKind::of(&on(DataPlane::Nccl, None)), crate::cost::EngineKind::Gpu);
    assert_eq!(crate::cost::EngineKind::of(&on(DataPlane::Nccl, Some(Cuda))), crate::cost::EngineKind::Device);
    assert_eq!(crate::cost::EngineKind::of(&on(DataPlane::Mpi, None)), crate::cost::EngineKind::Reference);
}

#[test]
fn the_paper_clusters_have_their_published_figures() {
    let spec = |name: &str| {
        load_cluster_file(&repo_path(&format!("configs/clusters/{name}.toml"))).unwrap().resolve().unwrap()
    };
    let lumi = spec("lumi-g");
    assert_eq!((lumi.devices_per_node, lumi.device_memory_gb, lumi.data_plane), (8, 64.0, DataPlane::Rccl));
    // Bandwidths are per direction.
    assert_eq!((lumi.intra_node_gbps, lumi.inter_node_gbps()), (100.0, 100.0));
    let a100 = spec("a100");
    assert_eq!(
        (a100.nodes, a100.devices_per_node, a100.device_memory_gb, a100.intra_node_gbps, a100.inter_node_gbps()),
        (64, 4, 64.0, 300.0, 50.0),
        "the paper's Cluster #2: 64 nodes of 4 A100"
    );
    let h200 = spec("h200");
    assert_eq!(
        (h200.nodes, h200.devices_per_node, h200.device_memory_gb, h200.intra_node_gbps, h200.inter_node_gbps()),
        (8, 8, 141.0, 450.0, 25.0),
        "the paper's Cluster #3: 8 nodes of 8 H200"
    );
    assert_eq!(h200.data_plane, DataPlane::Nccl);
}

#[test]
fn cli_beats_toml_beats_included_file_beats_detection() {
    let model = "layers = 1\nhidden = 8\nheads = 2\nkv_heads = 1\nffn = 16\nvocab = 8\ndtype = \"f32\"\n";
    let text = format!(
        r#"
[job]
name = "p"
steps = 3
[cluster]
include = "clusters/h200.toml"
detect = true
nodes = 4
[models.actor]
{model}
[models.reference]
{model}
[models.reward]
{model}
[rl]
algorithm = "remax"
prompts_per_step = 4
prompt_len = 2
max_response_len = 2
mini_batch = 4
micro_batch = 2
"#
    );
    let src = source(&text);
    let detected_calls = std::cell::Cell::new(0);
    let mut detect = || {
        detected_calls.set(detected_calls.get() + 1);
        ClusterSection { nodes: Some(99), devices_per_node: Some(3), nic_gbps: Some(7.0), ..ClusterSection::default() }
    };
    let config = RawJobConfig::parse(&src).unwrap().resolve(&src, &Overrides::default(), &mut detect).unwrap();
    assert_eq!(detected_calls.get(), 1);
    assert_eq!(config.cluster.nodes, 4, "TOML beats the included file and detection");
    assert_eq!(config.cluster.devices_per_node, 8, "the included file beats detection");
    assert_eq!(config.cluster.nic_gbps, 25.0, "the included file beats detection");
    assert_eq!(config.job.seed, 0, "default");
    assert_eq!(config.job.output_dir, PathBuf::from("runs"), "default");
    assert_eq!(config.policy, PolicySection::default(), "a missing [policy] takes defaults");
    assert_eq!(config.rl.samples_per_prompt, 1, "default");

    let overrides = Overrides { nodes: Some(2), steps: Some(9), seed: Some(5), ..Overrides::default() };
    let config = RawJobConfig::parse(&src).unwrap().resolve(&src, &overrides, &mut detect).unwrap();
    assert_eq!((config.cluster.nodes, config.job.steps, config.job.seed), (2, 9, 5), "CLI beats TOML");

    // `inspect config` names each value's layer.
    let sets = vec!["rl.mini_batch=4".parse().unwrap()];
    let provenance = provenance::Provenance::of(&config, &src, &Overrides { sets, ..overrides });
    let at = |key: &str| provenance.source(&key.split('.').map(String::from).collect::<Vec<_>>());
    use provenance::ValueSource::*;
    assert_eq!(at("cluster.nodes"), Flag("--nodes"));
    assert_eq!(at("job.steps"), Flag("--steps"));
    assert_eq!(at("rl.mini_batch"), Set);
    assert_eq!(at("rl.algorithm"), JobFile);
    assert_eq!(at("rl.samples_per_prompt"), Default);
    assert_eq!(at("cluster.devices_per_node"), ClusterFile(repo_path("configs/clusters/h200.toml")));
    assert_eq!(at("models.actor.rope_theta"), Default);
    let printed = provenance::annotated_toml(&config, &provenance);
    for line in ["steps = 9  # --steps", "name = \"p\"  # job file", "devices_per_node = 8  # cluster file "] {
        assert!(printed.contains(line), "`{line}` missing:\n{printed}");
    }
    assert_eq!(toml::from_str::<JobConfig>(&printed).unwrap(), config, "the comments leave the TOML as it was");
}

#[test]
fn cluster_flag_replaces_the_written_cluster_table() {
    let overrides = Overrides { cluster_file: Some(repo_path("configs/clusters/lumi-g.toml")), ..Overrides::default() };
    let config = load("configs/tiny-ppo.toml", &overrides).unwrap();
    assert_eq!(config.cluster.name, "lumi-g");
    assert_eq!(config.cluster.device_memory_gb, 64.0);
}

#[test]
fn a_cluster_file_may_not_include_another() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("nested.toml");
    std::fs::write(&nested, "[cluster]\ninclude = \"h200.toml\"\n").unwrap();
    let err = load_cluster_file(&nested).unwrap_err();
    assert_eq!(err.key(), Some("cluster.include"));
}

#[test]
fn the_hash_follows_the_resolved_values_not_the_text() {
    let base = load("configs/tiny-ppo.toml", &Overrides::default()).unwrap();
    let text = std::fs::read_to_string(repo_path("configs/tiny-ppo.toml")).unwrap();
    let reformatted = text.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n\n");
    let src = source(&reformatted);
    let same = RawJobConfig::parse(&src).unwrap().resolve(&src, &Overrides::default(), &mut no_detection).unwrap();
    assert_eq!(base.hash(), same.hash(), "comments and blank lines do not change the job");
    let reseeded = load("configs/tiny-ppo.toml", &Overrides { seed: Some(1235), ..Overrides::default() }).unwrap();
    assert_ne!(base.hash(), reseeded.hash());
}

#[test]
fn the_printed_config_reads_back_to_the_same_job() {
    let config = load("configs/llama3.1-8b-ppo.toml", &Overrides::default()).unwrap();
    let printed = config.to_toml();
    let back: JobConfig = parse_toml(&printed, Path::new("printed")).unwrap();
    assert_eq!(back, config);
    assert_eq!(back.hash(), config.hash());
}

#[test]
fn parse_errors_carry_line_column_and_key() {
    let text = "[job]\nname = \"x\"\nsteps = -1\n";
    let err = parse_toml::<RawJobConfig>(text, Path::new("t.toml")).unwrap_err();
    match err {
        ConfigError::Parse { line, column, key, .. } => {
            assert_eq!((line, column), (3, 9));
            assert_eq!(key.as_deref(), Some("job.steps"));
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn an_algorithm_fills_the_keys_of_its_recipe_and_written_keys_win() {
    let dapo = Overrides { algorithm: Some(Algorithm::Dapo), ..Overrides::default() };
    let config = load("configs/tiny-grpo.toml", &dapo).unwrap();
    let (rl, t) = (&config.rl, &config.train);
    assert_eq!((rl.loss_agg, rl.kl_in, rl.dynamic_sampling), (Some(LossAgg::TokenMean), Some(KlIn::Off), Some(true)));
    assert_eq!((rl.overlong_buffer, t.clip_low, t.clip_high), (Some(24 / 5), Some(0.2), Some(0.28)));
    let text = std::fs::read_to_string(repo_path("configs/tiny-grpo.toml")).unwrap();
    let written = text
        .replace("epochs = 1\n", "epochs = 1\nkl_in = \"loss\"\n")
        .replace("kl_coef = 0.01\n", "kl_coef = 0.01\nclip_high = 0.3\n");
    let source = source(&written);
    let config = RawJobConfig::parse(&source).unwrap().resolve(&source, &dapo, &mut no_detection).unwrap();
    assert_eq!((config.rl.kl_in, config.train.clip_range(Algorithm::Dapo)), (Some(KlIn::Loss), (0.2, 0.3)));
    let provenance = provenance::Provenance::of(&config, &source, &dapo);
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(provenance.source(&path(&["rl", "kl_in"])).to_string(), "job file");
    assert_eq!(provenance.source(&path(&["train", "clip_low"])).to_string(), "default for dapo");
    // PPO, GRPO and ReMax keep what they always did.
    let ppo = load("configs/tiny-ppo.toml", &Overrides::default()).unwrap();
    assert_eq!(
        (ppo.rl.kl_in(), ppo.rl.kl_estimator(), ppo.rl.loss_agg()),
        (KlIn::Reward, KlEstimator::K1, LossAgg::TokenMean)
    );
    assert_eq!(ppo.train.clip_range(Algorithm::Ppo), (ppo.train.clip_ratio, ppo.train.clip_ratio));
}
