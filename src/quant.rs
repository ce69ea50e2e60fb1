//! Number codecs of the MX and FP8 formats (LAYOUTS.md §1, §4): e2m1 (FP4), e8m0 block
//! scales, fp8 e4m3fn / e4m3fnuz. Decoders are exact table or bit maps.

/// Magnitudes of the e2m1 codes 0..7 (bit 3 is the sign).
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Value of one e2m1 code (low 4 bits of `code`).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let m = E2M1_MAGNITUDES[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// Both values of a packed fp4x2 byte: (low nibble = even element, high nibble = odd).
#[inline]
pub fn fp4x2_to_f32(byte: u8) -> [f32; 2] {
    [e2m1_to_f32(byte & 15), e2m1_to_f32(byte >> 4)]
}

/// e8m0 block scale: 2^(b-127); b = 0 is 2^-127 (not zero), b = 255 is NaN (AITER's map).
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::from_bits(0x7F80_0001),
        _ => f32::from_bits((b as u32) << 23),
    }
}

/// OCP fp8 e4m3fn (bias 7, max 448, S.1111.111 is NaN, no infinities).
#[inline]
pub fn fp8_e4m3fn_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0xF) as i32;
    let man = (b & 7) as f32;
    if exp == 0xF && (b & 7) == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man * (2f32).powi(-9) // subnormal: man/8 * 2^-6
    } else {
        sign * (1.0 + man / 8.0) * (2f32).powi(exp - 7)
    }
}

/// fp8 e4m3fnuz (bias 8, max 240, 0x80 is the only NaN, no negative zero).
#[inline]
pub fn fp8_e4m3fnuz_to_f32(b: u8) -> f32 {
    if b == 0x80 {
        return f32::NAN;
    }
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0xF) as i32;
    let man = (b & 7) as f32;
    if exp == 0 {
        sign * man * (2f32).powi(-10) // subnormal: man/8 * 2^-7
    } else {
        sign * (1.0 + man / 8.0) * (2f32).powi(exp - 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_decoders_hit_the_format_limits() {
        assert_eq!(fp8_e4m3fn_to_f32(0x7E), 448.0);
        assert!(fp8_e4m3fn_to_f32(0x7F).is_nan());
        assert_eq!(fp8_e4m3fn_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(fp8_e4m3fn_to_f32(0xB8), -1.0);
        assert_eq!(fp8_e4m3fnuz_to_f32(0x7F), 240.0);
        assert!(fp8_e4m3fnuz_to_f32(0x80).is_nan());
        assert_eq!(fp8_e4m3fnuz_to_f32(0x40), 1.0);
        assert_eq!(fp8_e4m3fnuz_to_f32(0x01), 2f32.powi(-10));
    }

    #[test]
    fn e2m1_and_e8m0_tables() {
        assert_eq!(fp4x2_to_f32(0xF1), [0.5, -6.0]);
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(0).to_bits(), 0x0040_0000);
        assert!(e8m0_to_f32(255).is_nan());
    }
}
