//! GGML tensor encodings, dequantized to f32: the float types and the block quantizations
//! small published models ship in (Q4_0, Q4_1, Q8_0). Block layouts as ggml defines them: 32
//! values per block, an f16 scale `d` (and for Q4_1 an f16 minimum `m`) before the quants; a 4-bit
//! block holds values `j` and `j + 16` in the low and high nibble of byte `j`.

/// A tensor's encoding in a GGUF file (ggml's type ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit, scale only: `x = d · (q − 8)`.
    Q4_0,
    /// 4-bit, scale and minimum: `x = d · q + m`.
    Q4_1,
    /// 8-bit, scale only: `x = d · q`.
    Q8_0,
}

use nereus_core::half::{bf16_to_f32, f16_to_f32};

/// Values per quantized block.
const BLOCK: usize = 32;

impl GgmlType {
    /// The type with ggml's id `id`, or `None` for one this reader does not decode.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// Bytes that hold `n` values (`None` when `n` is not whole blocks).
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        let blocks = |per_block: usize| (n.is_multiple_of(BLOCK)).then_some(n / BLOCK * per_block);
        match self {
            GgmlType::F32 => Some(4 * n),
            GgmlType::F16 | GgmlType::Bf16 => Some(2 * n),
            GgmlType::Q4_0 => blocks(2 + BLOCK / 2),
            GgmlType::Q4_1 => blocks(4 + BLOCK / 2),
            GgmlType::Q8_0 => blocks(2 + BLOCK),
        }
    }

    /// `bytes` (exactly [`GgmlType::bytes_for`] of the values) decoded to f32.
    pub fn dequantize(self, bytes: &[u8]) -> Vec<f32> {
        let half = |b: &[u8]| f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        match self {
            GgmlType::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            GgmlType::F16 => bytes.chunks_exact(2).map(half).collect(),
            GgmlType::Bf16 => bytes.chunks_exact(2).map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
            GgmlType::Q4_0 => nibble_blocks(bytes, 2, |block| (half(block), -8.0 * half(block))),
            GgmlType::Q4_1 => nibble_blocks(bytes, 4, |block| (half(block), half(&block[2..]))),
            GgmlType::Q8_0 => bytes
                .chunks_exact(2 + BLOCK)
                .flat_map(|block| {
                    let d = half(block);
                    block[2..].iter().map(move |&q| d * f32::from(q as i8))
                })
                .collect(),
        }
    }
}

/// 4-bit blocks of `header` bytes then 16 bytes of nibbles: `x = scale · q + offset`, with
/// `(scale, offset)` read from the header.
fn nibble_blocks(bytes: &[u8], header: usize, scale_offset: impl Fn(&[u8]) -> (f32, f32)) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / (header + BLOCK / 2) * BLOCK);
    for block in bytes.chunks_exact(header + BLOCK / 2) {
        let (d, m) = scale_offset(block);
        let quants = &block[header..];
        out.extend(quants.iter().map(|&q| d * f32::from(q & 0x0F) + m));
        out.extend(quants.iter().map(|&q| d * f32::from(q >> 4) + m));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One block of each quantization, built by hand: the nibble order (value j low, j + 16
    /// high), the scales and the minimum.
    #[test]
    fn blocks_decode_as_ggml_lays_them_out() {
        let (d, m) = (0x3800u16.to_le_bytes(), 0xBC00u16.to_le_bytes()); // 0.5, -1.0
        let nibbles: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
        let q4_1: Vec<u8> = [&d[..], &m[..], &nibbles].concat();
        let x = GgmlType::Q4_1.dequantize(&q4_1);
        assert_eq!((x.len(), x[0], x[3], x[16], x[31]), (32, -1.0, 0.5, 6.5, -1.0));
        let q4_0: Vec<u8> = [&d[..], &nibbles].concat();
        let x = GgmlType::Q4_0.dequantize(&q4_0);
        assert_eq!((x[0], x[15], x[16]), (-4.0, 3.5, 3.5));
        let q8: Vec<u8> = [&d[..], &(0..32).map(|i| (i as i8 - 16) as u8).collect::<Vec<_>>()].concat();
        let x = GgmlType::Q8_0.dequantize(&q8);
        assert_eq!((x[0], x[16], x[31]), (-8.0, 0.0, 7.5));
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
    }
}
