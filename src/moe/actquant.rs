//! Activation quantization as AITER's torch reference does it (LAYOUTS.md §4, §7): the value a
//! GEMM sees after quantize → dequantize, computed in f32. Each quantizer rewrites a row
//! slice in place with the dequantized values.
//!
// TODO(merge): use quant::... — the encoders below (e2m1 RNE, fp8 RNE saturating, e8m0
// RoundUp) duplicate the ones being written in src/quant.rs on the prep branch; they are kept
// private here to avoid a merge conflict and are deduplicated at merge time.

use crate::quant::{e2m1_to_f32, e8m0_to_f32};

/// Which fp8 flavour: OCP e4m3fn (gfx950, max 448) or e4m3fnuz (gfx942, max 240).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Kind {
    E4m3fn,
    E4m3fnuz,
}

impl Fp8Kind {
    pub fn max(self) -> f32 {
        match self {
            Fp8Kind::E4m3fn => 448.0,
            Fp8Kind::E4m3fnuz => 240.0,
        }
    }
    /// Exponent of the smallest normal number (subnormals share its quantum).
    fn min_normal_exp(self) -> i32 {
        match self {
            Fp8Kind::E4m3fn => -6,
            Fp8Kind::E4m3fnuz => -7,
        }
    }
}

/// f32 → fp8 value: round to nearest even on the 3-bit mantissa grid, saturating at ±max.
/// NaN stays NaN.
pub fn fp8_round(x: f32, kind: Fp8Kind) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a == 0.0 {
        return 0.0 * x.signum();
    }
    let max = kind.max();
    if a >= max {
        return max.copysign(x);
    }
    // Quantum of the binade of a (3 mantissa bits); below the normal range the quantum stays
    // that of the smallest normal binade (subnormals).
    let e = (a.to_bits() >> 23) as i32 - 127;
    let e = e.max(kind.min_normal_exp());
    let quantum = 2f32.powi(e - 3);
    // a / quantum is exact (power-of-two scaling), so one rounding happens.
    let r = (a / quantum).round_ties_even() * quantum;
    r.min(max).copysign(x)
}

/// f32 → e2m1 code: nearest magnitude, ties to the even code, |x| ≥ 6 (and ±inf) saturate
/// to code 7, NaN → code 3 (as observed upstream). Sign in bit 3.
pub fn e2m1_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8u8 } else { 0 };
    if x.is_nan() {
        return 3;
    }
    let a = x.abs();
    // Midpoints between consecutive magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; at a midpoint the
    // even code wins, so code c wins its upper midpoint iff c is even.
    const MID: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    let mut code = 0u8;
    for (i, &m) in MID.iter().enumerate() {
        let upper_tie_goes_down = i % 2 == 0; // code i is even: the tie stays at i
        if a > m || (a == m && !upper_tie_goes_down) {
            code = i as u8 + 1;
        }
    }
    sign | code
}

/// e8m0 RoundUp (AITER's default MxScaleRoundMode): the smallest power of two ≥ amax/max_pos,
/// as a biased exponent byte; NaN/inf → 255.
pub fn e8m0_round_up(amax: f32, max_pos: f32) -> u8 {
    let v = amax / max_pos;
    if !v.is_finite() {
        return 255;
    }
    let bits = v.to_bits();
    let exp = (bits >> 23) & 0xFF;
    let mant = bits & 0x7F_FFFF;
    (exp + u32::from(mant != 0 && exp < 255)).min(255) as u8
}

/// The element type of an MX block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MxElem {
    Fp4,
    Fp8(Fp8Kind),
}

impl MxElem {
    fn max_pos(self) -> f32 {
        match self {
            MxElem::Fp4 => 6.0,
            MxElem::Fp8(k) => k.max(),
        }
    }
}

fn amax(xs: &[f32]) -> f32 {
    xs.iter().fold(0f32, |m, &x| m.max(x.abs()))
}

/// MX 1×32 blocks along the row (the last block may be short), e8m0 RoundUp scale.
pub fn mx_quant_row(row: &mut [f32], elem: MxElem) {
    for block in row.chunks_mut(32) {
        let b = e8m0_round_up(amax(block), elem.max_pos());
        let scale = e8m0_to_f32(b);
        for x in block.iter_mut() {
            let y = *x / scale;
            let q = match elem {
                MxElem::Fp4 => e2m1_to_f32(e2m1_encode(y)),
                MxElem::Fp8(k) => fp8_round(y, k),
            };
            *x = q * scale;
        }
    }
}

/// fp8 with one f32 scale = amax/fp8max over `xs` (a token row, a 1×128 group or a whole
/// tensor); an all-zero group gets scale 1 as AITER's per-token quant does.
pub fn fp8_scale_for(amax: f32, kind: Fp8Kind) -> f32 {
    let s = amax / kind.max();
    if s == 0.0 {
        1.0
    } else {
        s
    }
}

/// Quantize `xs` to fp8 with the given f32 scale and write back the dequantized values.
pub fn fp8_quant_with_scale(xs: &mut [f32], scale: f32, kind: Fp8Kind) {
    for x in xs.iter_mut() {
        *x = fp8_round(*x / scale, kind) * scale;
    }
}

/// Per-row dynamic fp8 (per-token) quantization.
pub fn fp8_quant_row(row: &mut [f32], kind: Fp8Kind) {
    let s = fp8_scale_for(amax(row), kind);
    fp8_quant_with_scale(row, s, kind);
}

/// 1×128 groups along the row, each with its own amax scale (the last group may be short).
pub fn fp8_quant_row_block128(row: &mut [f32], kind: Fp8Kind) {
    for g in row.chunks_mut(128) {
        fp8_quant_row(g, kind);
    }
}

/// Max |x| over rows, for per-tensor scaling.
pub fn amax_of(xs: &[f32]) -> f32 {
    amax(xs)
}

/// Round to bf16 / fp16 and back (the 16-bit GEMM input or the stage-1 output cast).
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_examples_from_the_spec() {
        // LAYOUTS.md §1.1.
        let cases = [
            (0.25, 0),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
            (5.9999, 7),
            (1e-30, 0),
            (-0.0, 8),
            (7.0, 7),
            (f32::INFINITY, 7),
            (-100.0, 15),
        ];
        for (x, c) in cases {
            assert_eq!(e2m1_encode(x), c, "x = {x}");
        }
    }

    #[test]
    fn e8m0_round_up_examples_from_the_spec() {
        // LAYOUTS.md §4.2 (FP4).
        let cases = [
            (0.0, 0),
            (1e-40, 1),
            (6.0, 127),
            (6.000_000_5, 128),
            (7.0, 128),
            (12.0, 128),
            (24.0, 129),
            (100.0, 132),
            (f32::INFINITY, 255),
            (f32::NAN, 255),
        ];
        for (a, b) in cases {
            assert_eq!(e8m0_round_up(a, 6.0), b, "amax = {a}");
        }
    }

    #[test]
    fn fp8_round_is_rne_and_saturating() {
        let k = Fp8Kind::E4m3fn;
        assert_eq!(fp8_round(1.0 + 1.0 / 16.0, k), 1.0); // tie → even mantissa 0
        assert_eq!(fp8_round(1.0 + 3.0 / 16.0, k), 1.25); // tie → even mantissa 2
        assert_eq!(fp8_round(460.0, k), 448.0);
        assert_eq!(fp8_round(-1e9, k), -448.0);
        assert_eq!(fp8_round(2f32.powi(-10), k), 0.0); // half the smallest subnormal: tie → 0
        assert_eq!(fp8_round(3.0 * 2f32.powi(-10), k), 2f32.powi(-8));
        assert_eq!(fp8_round(250.0, Fp8Kind::E4m3fnuz), 240.0);
        assert_eq!(fp8_round(2f32.powi(-10), Fp8Kind::E4m3fnuz), 2f32.powi(-10));
    }
}
