//! Half-precision conversions (IEEE f16 and bfloat16) to and from f32, written out so that every
//! reader and writer of model files (safetensors, GGUF) rounds and decodes alike.

/// bfloat16 to single precision (exact: bf16 is f32's upper half).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// IEEE half to single precision (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exponent = u32::from((h >> 10) & 0x1f);
    let mantissa = u32::from(h & 0x3ff);
    let bits = match (exponent, mantissa) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalize the mantissa into f32's implicit-one form.
            let shift = m.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((m << shift) & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// f32 to bfloat16, rounding to nearest even (NaN stays NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// f32 to IEEE half, rounding to nearest even; out of range becomes ±infinity.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        return sign | 0x7c00 | if mantissa != 0 { 0x200 } else { 0 };
    }
    let e = exponent - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    // Normal halves keep 10 mantissa bits; subnormal ones shift the implicit one in.
    let (m, shift) = if e <= 0 { (mantissa | 0x80_0000, (14 - e) as u32) } else { (mantissa, 13) };
    if shift > 24 {
        return sign;
    }
    let half = 1u32 << (shift - 1);
    let rest = m & ((1 << shift) - 1);
    let mut out = m >> shift;
    if rest > half || (rest == half && out & 1 == 1) {
        out += 1;
    }
    let biased = if e <= 0 { out } else { ((e as u32) << 10) + out };
    sign | biased as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_round_to_nearest_even_and_decode_exactly() {
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80, "a tie rounds to even");
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82, "a tie rounds to even");
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "past the largest half: infinity");
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24), "the smallest subnormal half");
        assert_eq!(f32_to_f16(2f32.powi(-24)), 0x0001);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        for (h, x) in [(0x3C00, 1.0), (0xC000, -2.0), (0x7BFF, 65504.0), (0x0400, 2f32.powi(-14))] {
            assert_eq!(f16_to_f32(h), x, "{h:#06x}");
        }
        assert!(f16_to_f32(0x7E00).is_nan() && f16_to_f32(0xFC00) == f32::NEG_INFINITY);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }
}
