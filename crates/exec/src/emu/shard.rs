//! This rank's shard of one EMU: one flat buffer, carved per tensor by the position's size
//! table and per state section (θ, then ω), in whatever memory holds it ([`ShardBuffer`]).

use std::ops::Range;

use nereus_core::config::Dtype;
use nereus_core::cost::{MemoryBreakdown, MemoryItem};
use nereus_core::model::{shard_bytes, Piece, Position, ShardTable};

use super::{EmuId, Section};

/// A flat shard buffer in some memory.
pub trait ShardBuffer {
    /// Its length in bytes (what the ledger charges for it).
    fn byte_len(&self) -> u64;
}

impl ShardBuffer for Vec<u8> {
    fn byte_len(&self) -> u64 {
        self.len() as u64
    }
}

/// This rank's shard of one EMU: `sections.len()` back-to-back copies of the size table's
/// layout, section `s` holding `table.elements` elements of `s.element_bytes(dtype)` bytes.
///
/// The buffer may be longer than the table needs (a Merge that sliced its resident source in
/// place keeps the source's allocation); the ledger charges what the buffer really occupies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalShard<B = Vec<u8>> {
    /// The EMU.
    pub emu: EmuId,
    /// This rank's position in it.
    pub position: Position,
    /// Which rectangles of which tensors, in buffer order.
    pub table: ShardTable,
    /// State sections, in buffer order.
    pub sections: Vec<Section>,
    /// Parameter dtype.
    pub dtype: Dtype,
    /// The flat buffer.
    pub buffer: B,
}

/// A shard's bytes as the ledger charges them: the parameters under `params`, the moments and
/// the master copy under `optimizer`.
pub fn shard_charges(table: &ShardTable, sections: &[Section], dtype: Dtype) -> MemoryBreakdown {
    let mut m = MemoryBreakdown::default();
    for s in sections {
        let item = if *s == Section::Params { MemoryItem::Params } else { MemoryItem::Optimizer };
        m.add(item, table.elements * s.element_bytes(dtype));
    }
    m
}

impl LocalShard {
    /// A zero-filled host shard (the caller has charged its bytes).
    pub fn zeroed(
        emu: EmuId,
        position: Position,
        table: ShardTable,
        sections: Vec<Section>,
        dtype: Dtype,
    ) -> LocalShard {
        let bytes = shard_bytes(&table, &sections, dtype) as usize;
        LocalShard { emu, position, table, sections, dtype, buffer: vec![0u8; bytes] }
    }
}

impl<B> LocalShard<B> {
    /// Byte range of section `s` in the buffer.
    pub fn section_range(&self, s: usize) -> Range<usize> {
        let start: u64 = self.sections[..s].iter().map(|x| self.table.elements * x.element_bytes(self.dtype)).sum();
        let len = self.table.elements * self.sections[s].element_bytes(self.dtype);
        start as usize..(start + len) as usize
    }

    /// The piece of tensor `tensor`, if this shard holds part of it.
    pub fn piece(&self, tensor: usize) -> Option<&Piece> {
        self.table.pieces.iter().find(|p| p.tensor == tensor)
    }

    /// Bytes the table needs (the buffer holds at least this many).
    pub fn table_bytes(&self) -> u64 {
        shard_bytes(&self.table, &self.sections, self.dtype)
    }

    /// The same shard with another buffer (a host copy of a device shard, say).
    pub fn with_buffer<C>(&self, buffer: C) -> LocalShard<C> {
        LocalShard {
            emu: self.emu,
            position: self.position,
            table: self.table.clone(),
            sections: self.sections.clone(),
            dtype: self.dtype,
            buffer,
        }
    }

    /// Its bytes as the ledger charges them.
    pub fn charges(&self) -> MemoryBreakdown {
        shard_charges(&self.table, &self.sections, self.dtype)
    }
}

impl<B: ShardBuffer> LocalShard<B> {
    /// Bytes in the buffer.
    pub fn bytes(&self) -> u64 {
        self.buffer.byte_len()
    }

    /// What the ledger holds for it: its items, and under `params` the buffer bytes beyond
    /// what its table needs (a Merge that sliced a larger source in place keeps the source's
    /// allocation).
    pub fn held(&self) -> MemoryBreakdown {
        let mut m = self.charges();
        m.add(MemoryItem::Params, self.bytes().saturating_sub(self.table_bytes()));
        m
    }
}
