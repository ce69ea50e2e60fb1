//! Activation quantization as AITER's torch reference does it (docs/layouts.md §4, §7): the value a
//! GEMM sees after quantize → dequantize, computed in f32. Each quantizer rewrites a row
//! slice in place with the dequantized values.
//!
//! The codecs themselves (e2m1, fp8 e4m3fn/e4m3fnuz, e8m0 RoundUp) are those of
//! [`crate::quant`]; this module only composes them into row quantizers.

use crate::quant::{
    e2m1_to_f32, e8m0_scale_from_amax, e8m0_to_f32, f32_to_e2m1, pack_fp4x2, MxDtype,
};
use crate::types::{ActDtype, RoundMode};

pub use crate::quant::Fp8Kind;

/// f32 → fp8 value (quantize, then decode): round to nearest even on the 3-bit mantissa
/// grid, saturating at ±max; NaN stays NaN.
#[inline]
pub fn fp8_round(x: f32, kind: Fp8Kind) -> f32 {
    kind.decode(kind.encode(x))
}

/// The element type of an MX block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MxElem {
    Fp4,
    Fp8(Fp8Kind),
}

impl MxElem {
    /// The codec of the block elements.
    pub fn dtype(self) -> MxDtype {
        match self {
            MxElem::Fp4 => MxDtype::Fp4E2m1,
            MxElem::Fp8(k) => k.mx_dtype(),
        }
    }
}

fn amax(xs: &[f32]) -> f32 {
    xs.iter().fold(0f32, |m, &x| m.max(x.abs()))
}

/// MX 1×32 blocks along the row (the last block may be short), e8m0 RoundUp scale.
pub fn mx_quant_row(row: &mut [f32], elem: MxElem) {
    for block in row.chunks_mut(32) {
        let b = e8m0_scale_from_amax(amax(block), RoundMode::Up, elem.dtype());
        let scale = e8m0_to_f32(b);
        for x in block.iter_mut() {
            let y = *x / scale;
            let q = match elem {
                MxElem::Fp4 => e2m1_to_f32(f32_to_e2m1(y)),
                MxElem::Fp8(k) => fp8_round(y, k),
            };
            *x = q * scale;
        }
    }
}

/// fp8 with one f32 scale = amax/fp8max over `xs` (a token row, a 1×128 group or a whole
/// tensor); an all-zero group gets scale 1 as AITER's per-token quant does.
pub fn fp8_scale_for(amax: f32, kind: Fp8Kind) -> f32 {
    crate::quant::fp8_scale_from_amax(amax, kind)
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

/// Storage bytes of `cols` activation codes: two per byte for MXFP4, else one.
pub fn code_bytes(act: ActDtype, cols: usize) -> usize {
    if act == ActDtype::Mxfp4 {
        cols.div_ceil(2)
    } else {
        cols
    }
}

/// Scales per row of `cols` columns (1 per token, one per 1x128 group or 1x32 block) and
/// their byte size (f32 for fp8, e8m0 for MX); None for act dtypes without row scales.
pub fn row_scales(act: ActDtype, cols: usize) -> Option<(usize, usize)> {
    match act.scale_group()? {
        0 => Some((1, 4)),
        g if act == ActDtype::Fp8Block128 => Some((cols.div_ceil(g), 4)),
        g => Some((cols.div_ceil(g), 1)),
    }
}

/// The codes and scales of one activation row as moeplug's own activation quantizer makes
/// them, in the layout a caller passes pre-quantized `hidden_states` / `hidden_scale`
/// (docs/layouts.md "Pre-quantized activations"): fp8 codes one byte each with f32 scales
/// per row (FP8_PER_TOKEN) or per 1x128 group (FP8_BLOCK128); MX codes (fp4x2 packed, low
/// nibble = even element, or fp8) with e8m0 RoundUp scales per 1x32 block. The values are
/// those the launch's own quantization gives the GEMM (`code · scale`, [`dequantize_row`]).
/// Returns None for act dtypes that have no pre-quantized form.
pub fn quantize_row(
    row: &[f32],
    act: ActDtype,
    kind: Fp8Kind,
    codes: &mut [u8],
    scales: &mut [u8],
) -> Option<()> {
    let cols = row.len();
    let (groups, scale_bytes) = row_scales(act, cols)?;
    assert_eq!(codes.len(), code_bytes(act, cols), "codes length");
    assert_eq!(scales.len(), groups * scale_bytes, "scales length");
    let group = match act.scale_group()? {
        0 => cols.max(1),
        g => g,
    };
    for (b, block) in row.chunks(group).enumerate() {
        let k0 = b * group;
        if let Some(elem) = mx_elem(act, kind) {
            let e = e8m0_scale_from_amax(amax(block), RoundMode::Up, elem.dtype());
            scales[b] = e;
            let scale = e8m0_to_f32(e);
            for (j, &x) in block.iter().enumerate() {
                let k = k0 + j;
                match elem {
                    MxElem::Fp4 => {
                        let c = f32_to_e2m1(x / scale);
                        let byte = &mut codes[k / 2];
                        *byte = if k % 2 == 0 {
                            pack_fp4x2(c, 0)
                        } else {
                            pack_fp4x2(*byte & 15, c)
                        };
                    }
                    MxElem::Fp8(k8) => codes[k] = k8.encode(x / scale),
                }
            }
        } else {
            let scale = fp8_scale_for(amax(block), kind);
            scales[4 * b..4 * b + 4].copy_from_slice(&scale.to_le_bytes());
            for (j, &x) in block.iter().enumerate() {
                codes[k0 + j] = kind.encode(x / scale);
            }
        }
    }
    Some(())
}

/// The MX element of an MX act dtype.
fn mx_elem(act: ActDtype, kind: Fp8Kind) -> Option<MxElem> {
    match act {
        ActDtype::Mxfp4 => Some(MxElem::Fp4),
        ActDtype::Mxfp8 => Some(MxElem::Fp8(kind)),
        _ => None,
    }
}

/// The values a GEMM reads from a pre-quantized row: `out[k] = code[k] · scale[group of k]`
/// for the first `out.len()` columns of a row quantized as [`quantize_row`] says.
pub fn dequantize_row(codes: &[u8], scales: &[u8], act: ActDtype, kind: Fp8Kind, out: &mut [f32]) {
    let group = match act.scale_group() {
        Some(0) | None => usize::MAX,
        Some(g) => g,
    };
    let mx = mx_elem(act, kind);
    for (k, o) in out.iter_mut().enumerate() {
        let b = if group == usize::MAX { 0 } else { k / group };
        let (q, scale) = match mx {
            Some(MxElem::Fp4) => (
                e2m1_to_f32((codes[k / 2] >> (4 * (k % 2))) & 15),
                e8m0_to_f32(scales[b]),
            ),
            Some(MxElem::Fp8(k8)) => (k8.decode(codes[k]), e8m0_to_f32(scales[b])),
            None => (
                kind.decode(codes[k]),
                f32::from_le_bytes(scales[4 * b..4 * b + 4].try_into().unwrap()),
            ),
        };
        *o = q * scale;
    }
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
