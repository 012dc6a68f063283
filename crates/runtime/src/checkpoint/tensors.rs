//! A shard's tensors in and out of safetensors files: a gathered `(1, 1)` shard's sections as
//! named tensors (parameters, Adam's moments, a bf16 model's f32 master weights), and a new shard
//! filled from [`ModelWeights`] (the files themselves are `nereus_data::model_files`).

use nereus_core::config::Dtype;
use nereus_core::half::{bf16_to_f32, f16_to_f32, f32_to_bf16};
use nereus_core::model::Section;
use nereus_core::model::{Catalogue, Piece};
use nereus_data::model_files::{Absent, ModelWeights, NamedTensor};
use nereus_exec::emu::LocalShard;
use nereus_exec::engine::{bf16_sections, f32_sections};

/// Tensor-name prefixes of the optimizer file's two moments (PyTorch's names).
pub const MOMENT_PREFIXES: [&str; 2] = ["exp_avg.", "exp_avg_sq."];

/// Tensor-name prefix of the f32 master weights, kept in the optimizer file of a model whose
/// parameters are below f32 (the model directory holds their bf16 rounding).
pub const MASTER_PREFIX: &str = "master.";

/// The prefixes of the optimizer file of a model of `dtype`: Adam's moments, and below f32 the
/// master weights.
pub fn optimizer_prefixes(dtype: Dtype) -> &'static [&'static str] {
    match dtype {
        Dtype::F32 => &MOMENT_PREFIXES,
        Dtype::Bf16 | Dtype::F16 => &[MOMENT_PREFIXES[0], MOMENT_PREFIXES[1], MASTER_PREFIX],
    }
}

/// Every tensor of `section` of a gathered `(1, 1)` shard as little-endian f32 bytes (bf16 and
/// f16 parameters widened, exactly), names prefixed with `prefix`, in Hugging Face's shapes.
pub fn tensors_of(whole: &LocalShard, catalogue: &Catalogue, section: Section, prefix: &str) -> Vec<NamedTensor> {
    let s = whole.sections.iter().position(|&x| x == section).expect("the shard keeps the section asked for");
    let raw = &whole.buffer[whole.section_range(s)];
    let widened: Vec<u8>;
    let widen = if whole.dtype == Dtype::F16 { f16_to_f32 } else { bf16_to_f32 };
    let bytes = match section.element_bytes(whole.dtype) {
        4 => raw,
        _ => {
            widened = raw.chunks_exact(2).flat_map(|b| widen(u16::from_le_bytes([b[0], b[1]])).to_le_bytes()).collect();
            &widened
        }
    };
    whole
        .table
        .pieces
        .iter()
        .map(|p| {
            let spec = &catalogue.tensors[p.tensor];
            let range = p.offset as usize * 4..(p.offset + p.region.elements()) as usize * 4;
            (format!("{prefix}{}", spec.name), spec.hf_shape(), bytes[range].to_vec())
        })
        .collect()
}

/// The parameters, and for a training replica the optimizer state (Adam's moments, and the f32
/// master weights of a bf16 model), of a gathered shard. A bf16 model's parameters are its
/// master weights where it has them, so the model directory holds their rounding: the working
/// copy the engine computed with.
pub fn model_tensors(whole: &LocalShard, catalogue: &Catalogue) -> (Vec<NamedTensor>, Option<Vec<NamedTensor>>) {
    let master = whole.sections.contains(&Section::Master);
    let params = tensors_of(whole, catalogue, if master { Section::Master } else { Section::Params }, "");
    let optimizer = whole.sections.contains(&Section::AdamM).then(|| {
        let mut all = tensors_of(whole, catalogue, Section::AdamM, MOMENT_PREFIXES[0]);
        all.extend(tensors_of(whole, catalogue, Section::AdamV, MOMENT_PREFIXES[1]));
        if master {
            all.extend(tensors_of(whole, catalogue, Section::Master, MASTER_PREFIX));
        }
        all
    });
    (params, optimizer)
}

/// Fills a new shard: parameters from `params` (a tensor absent there is initialized by
/// `fresh`), the optimizer state from `optim` when the shard keeps one (zero moments when no
/// optimizer file is given: a fresh optimizer, asked for explicitly). A bf16 shard's working
/// copy is the rounding of its f32 master weights, which come from the optimizer file's
/// `master.` tensors, or without one from `params` as they are. Sections are filled in place.
pub fn fill_shard(
    shard: &mut LocalShard,
    catalogue: &Catalogue,
    params: &ModelWeights,
    optim: Option<&ModelWeights>,
    fresh: &mut Absent,
) -> Result<(), String> {
    let pieces = shard.table.pieces.clone();
    let fill_moments = |m: &mut [f32], v: &mut [f32]| match optim {
        Some(o) => {
            o.fill(m, &pieces, catalogue, MOMENT_PREFIXES[0], &mut refuse)?;
            o.fill(v, &pieces, catalogue, MOMENT_PREFIXES[1], &mut refuse)
        }
        None => {
            m.fill(0.0);
            v.fill(0.0);
            Ok(())
        }
    };
    if shard.dtype == Dtype::F32 {
        let (values, moments) = f32_sections(shard).map_err(|e| e.to_string())?;
        params.fill(values, &pieces, catalogue, "", fresh)?;
        return moments.map_or(Ok(()), |(m, v)| fill_moments(m, v));
    }
    let (theta, mixed) = bf16_sections(shard).map_err(|e| e.to_string())?;
    let mut values = Vec::new();
    let weights: &[f32] = match mixed {
        Some((m, v, master)) => {
            fill_moments(m, v)?;
            match optim {
                Some(o) => o.fill(master, &pieces, catalogue, MASTER_PREFIX, &mut refuse)?,
                None => params.fill(master, &pieces, catalogue, "", fresh)?,
            }
            master
        }
        None => {
            values.resize(theta.len(), 0.0);
            params.fill(&mut values, &pieces, catalogue, "", fresh)?;
            &values
        }
    };
    theta.iter_mut().zip(weights).for_each(|(t, &x)| *t = f32_to_bf16(x));
    Ok(())
}

/// What a tensor missing from an optimizer file gets: a refusal.
fn refuse(_: &Piece, _: &mut [f32]) -> Result<(), String> {
    Err("missing from the optimizer file".to_string())
}
