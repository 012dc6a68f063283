//! The state sections of an EMU's flat buffer (θ, Adam's moments, the master copy) and their
//! sizes: with the catalogue's shard tables, where every byte of a replica lives.

use serde::{Deserialize, Serialize};

use crate::config::Dtype;

use super::ShardTable;

/// One kind of per-parameter state in an EMU's flat buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Section {
    /// Parameters θ, in the model dtype.
    Params,
    /// Adam first moment (f32).
    AdamM,
    /// Adam second moment (f32).
    AdamV,
    /// f32 master copy of low-precision parameters.
    Master,
}

impl Section {
    /// The sections an EMU keeps: parameters, plus moments (and a master copy below f32)
    /// when it trains.
    pub fn of(trains: bool, dtype: Dtype) -> Vec<Section> {
        match (trains, dtype) {
            (false, _) => vec![Section::Params],
            (true, Dtype::F32) => vec![Section::Params, Section::AdamM, Section::AdamV],
            (true, _) => vec![Section::Params, Section::AdamM, Section::AdamV, Section::Master],
        }
    }

    /// Bytes per element.
    pub fn element_bytes(self, dtype: Dtype) -> u64 {
        match self {
            Section::Params => dtype.bytes(),
            _ => 4,
        }
    }

    /// A small integer for digests.
    pub fn code(self) -> u64 {
        self as u64
    }
}

/// Bytes of a shard with `table` and `sections`.
pub fn shard_bytes(table: &ShardTable, sections: &[Section], dtype: Dtype) -> u64 {
    sections.iter().map(|s| table.elements * s.element_bytes(dtype)).sum()
}
