use super::*;
use crate::model::{Architecture, Layout};

/// Parameter counts of the published checkpoints (sum of tensor sizes in the Hugging Face
/// safetensors index); the model cards round them to 8.0B, 14.8B, 32.8B and 70.6B.
/// A published model: name, architecture, parameter count.
type Published = (&'static str, fn() -> Architecture, u64);

const PUBLISHED: [Published; 4] = [
    ("Llama-3.1-8B", Architecture::llama3_1_8b, 8_030_261_248),
    ("Qwen3-14B", Architecture::qwen3_14b, 14_768_307_200),
    ("Qwen3-32B", Architecture::qwen3_32b, 32_762_123_264),
    ("Llama-3.3-70B", Architecture::llama3_3_70b, 70_553_706_496),
];

#[test]
fn published_models_have_their_published_parameter_counts() {
    for (name, arch, published) in PUBLISHED {
        let ours = Catalogue::new(arch()).parameter_count();
        let relative = (ours as f64 - published as f64).abs() / published as f64;
        assert!(relative < 1e-3, "{name}: {ours} vs published {published} ({:.4}%)", relative * 100.0);
        eprintln!("{name}: {ours} (published {published})");
    }
}

#[test]
fn names_follow_hugging_face() {
    let c = Catalogue::new(Architecture::qwen3_14b());
    let names: Vec<&str> = c.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names[0], "model.embed_tokens.weight");
    assert!(names.contains(&"model.layers.3.self_attn.q_proj.weight"));
    assert!(names.contains(&"model.layers.39.self_attn.k_norm.weight"));
    assert_eq!(names[names.len() - 1], "lm_head.weight");
    let critic = Catalogue::new(Architecture::llama3_1_8b().with_value_head());
    assert_eq!(critic.tensors.last().unwrap().name, "score.weight");
}

/// Every element of every tensor is held by exactly `tp / (shards of the tensor)` positions
/// of the right stage — once per TP rank for split tensors, `tp` times for replicated ones.
#[test]
fn shards_tile_every_tensor_exactly() {
    let arch = Architecture { layers: 5, ..Architecture::qwen3_14b() };
    let arch = Architecture { vocab: 96, hidden: 16, heads: 4, kv_heads: 4, head_dim: 4, ffn: 24, ..arch };
    let c = Catalogue::new(arch);
    for (tp, pp) in [(1, 1), (2, 1), (1, 5), (2, 3), (4, 2)] {
        let layout = Layout::new(tp, pp);
        c.check_layout(layout).unwrap();
        let mut covered = vec![0u64; c.tensors.len()];
        for position in layout.positions() {
            let table = c.shard(layout, position);
            let mut expected_offset = 0;
            for p in &table.pieces {
                assert_eq!(p.offset, expected_offset, "pieces are packed back to back");
                expected_offset += p.region.elements();
                covered[p.tensor] += p.region.elements();
            }
            assert_eq!(table.elements, expected_offset);
        }
        for (t, spec) in c.tensors.iter().enumerate() {
            let copies = if spec.sharding == Sharding::Replicated { u64::from(tp) } else { 1 };
            assert_eq!(covered[t], spec.elements() * copies, "{} under {layout}", spec.name);
        }
    }
}

#[test]
fn stages_are_balanced_and_contiguous() {
    let c = Catalogue::new(Architecture { layers: 10, ..Architecture::llama3_1_8b() });
    let ranges: Vec<_> = (0..4).map(|s| c.blocks_of_stage(4, s)).collect();
    assert_eq!(ranges, [0..3, 3..6, 6..8, 8..10]);
    assert_eq!(c.stage_of(0, 4), 0, "embedding on the first stage");
    assert_eq!(c.stage_of(c.tensors.len() - 1, 4), 3, "head on the last stage");
}

#[test]
fn layouts_that_split_heads_or_overrun_blocks_are_rejected() {
    let c = Catalogue::new(Architecture::llama3_1_8b());
    assert!(c.check_layout(Layout::new(8, 4)).is_ok());
    assert!(matches!(c.check_layout(Layout::new(16, 1)), Err(LayoutError::TpDoesNotDivide { what: "kv_heads", .. })));
    assert!(matches!(c.check_layout(Layout::new(1, 33)), Err(LayoutError::TooManyStages { .. })));
    let tied = Catalogue::new(Architecture { tie_embeddings: true, ..Architecture::llama3_1_8b() });
    assert!(matches!(tied.check_layout(Layout::new(1, 2)), Err(LayoutError::TiedAcrossStages { .. })));
}

#[test]
fn column_shards_are_whole_heads() {
    let c = Catalogue::new(Architecture::llama3_1_8b());
    let k = c.tensors.iter().position(|t| t.name == "model.layers.0.self_attn.k_proj.weight").unwrap();
    let r = c.region(k, 4, 3);
    assert_eq!((r.row0, r.rows, r.cols), (768, 256, 4096), "kv heads 6-7 of 8, 128 rows each");
    assert_eq!(r.row0 % 128, 0);
}
