//! Number codecs of the MX and FP8 formats (docs/layouts.md §1, §4): e2m1 (FP4), e8m0 block
//! scales, fp8 e4m3fn / e4m3fnuz. Decoders are exact table or bit maps.

/// Magnitudes of the e2m1 codes 0..7 (bit 3 is the sign).
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Value of one e2m1 code (low 4 bits of `code`), built from bits without a table or a
/// branch so that loops over many codes vectorize (= `E2M1_MAGNITUDES` with the sign).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let c = (code & 7) as u32;
    // Codes 2..7 are normal, exponent c/2 - 1 and mantissa bit c%2: f32 bits (c + 252) << 22.
    // The same bits give 0.5 and 0.75 for the subnormal codes 0 and 1; 2v - 1 maps those to
    // 0 and 0.5 exactly.
    let v = f32::from_bits((c + 252) << 22);
    let m = if c < 2 { 2.0 * v - 1.0 } else { v };
    f32::from_bits(m.to_bits() | (((code & 8) as u32) << 28))
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

// ---------------------------------------------------------------------------------------
// Encoders. All are pure functions of one value; the block quantizers below work over
// caller slices and never allocate.

/// Code of a small float format with `mbits` mantissa bits and exponent bias `bias`, for a
/// finite magnitude `a >= 0`, rounded to nearest with ties to even (the code whose last
/// mantissa bit is 0), not yet saturated. Works for subnormals: below the smallest normal
/// the exponent is clamped and the code is simply round(a / ulp).
#[inline]
fn small_float_code(a: f32, mbits: u32, bias: i32) -> u32 {
    // floor(log2(a)) from the exponent field; f32 subnormals are far below every target.
    let e = (((a.to_bits() >> 23) & 0xFF) as i32 - 127).max(1 - bias);
    // a / ulp is exact: dividing by a power of two inside the normal f32 range.
    let ulp = f32::from_bits(((e - mbits as i32 + 127) as u32) << 23);
    let q = (a / ulp).round_ties_even() as u32;
    // ((e + bias) << mbits) | (q - 2^mbits), written so that q = 2^(mbits+1) carries into
    // the exponent.
    (((e + bias - 1) as u32) << mbits) + q
}

/// e2m1 (FP4) code of `x`: round to nearest, ties to the even code, saturating at ±6
/// (±inf included), sign kept (−0.0 → 8). NaN gives code 3 (1.5), the value AITER's
/// `f32_to_mxfp4` was observed to produce (docs/layouts.md §1.1).
#[inline]
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 3;
    }
    let a = x.abs();
    let code = if a >= 6.0 {
        7
    } else {
        small_float_code(a, 1, 1).min(7) as u8
    };
    if x.is_sign_negative() {
        code | 8
    } else {
        code
    }
}

/// Pack two e2m1 codes into one fp4x2 byte (low nibble = even element).
#[inline]
pub fn pack_fp4x2(even: u8, odd: u8) -> u8 {
    (even & 15) | (odd << 4)
}

/// fp8 e4m3fn byte of `x`: round to nearest even, saturating to ±448 (±inf included; torch's
/// cast would give NaN there, which the MX quantizers never hit because the scale keeps
/// |x| ≤ 448), NaN → 0x7F (sign kept), −0.0 → 0x80.
#[inline]
pub fn f32_to_fp8_e4m3fn(x: f32) -> u8 {
    if x.is_nan() {
        return if x.is_sign_negative() { 0xFF } else { 0x7F };
    }
    let a = x.abs();
    let code = if a >= 448.0 {
        0x7E
    } else {
        small_float_code(a, 3, 7).min(0x7E) as u8
    };
    if x.is_sign_negative() {
        code | 0x80
    } else {
        code
    }
}

/// fp8 e4m3fnuz byte of `x`: round to nearest even, saturating to ±240 (±inf included),
/// NaN → 0x80 (its only NaN), and no negative zero (−0.0 and negatives rounding to 0 → 0x00).
#[inline]
pub fn f32_to_fp8_e4m3fnuz(x: f32) -> u8 {
    if x.is_nan() {
        return 0x80;
    }
    let a = x.abs();
    let code = if a >= 240.0 {
        0x7F
    } else {
        small_float_code(a, 3, 8).min(0x7F) as u8
    };
    if x.is_sign_negative() && code != 0 {
        code | 0x80
    } else {
        code
    }
}

/// Which fp8 flavour: OCP e4m3fn (gfx950, max 448) or e4m3fnuz (gfx942, max 240).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Kind {
    E4m3fn,
    E4m3fnuz,
}

impl Fp8Kind {
    /// Largest finite magnitude.
    pub fn max(self) -> f32 {
        match self {
            Fp8Kind::E4m3fn => 448.0,
            Fp8Kind::E4m3fnuz => 240.0,
        }
    }
    /// Byte of `x` ([`f32_to_fp8_e4m3fn`] / [`f32_to_fp8_e4m3fnuz`]).
    #[inline]
    pub fn encode(self, x: f32) -> u8 {
        match self {
            Fp8Kind::E4m3fn => f32_to_fp8_e4m3fn(x),
            Fp8Kind::E4m3fnuz => f32_to_fp8_e4m3fnuz(x),
        }
    }
    /// Value of byte `b`.
    #[inline]
    pub fn decode(self, b: u8) -> f32 {
        match self {
            Fp8Kind::E4m3fn => fp8_e4m3fn_to_f32(b),
            Fp8Kind::E4m3fnuz => fp8_e4m3fnuz_to_f32(b),
        }
    }
    /// The MX element type of the same encoding.
    pub fn mx_dtype(self) -> MxDtype {
        match self {
            Fp8Kind::E4m3fn => MxDtype::Fp8E4m3,
            Fp8Kind::E4m3fnuz => MxDtype::Fp8E4m3Fnuz,
        }
    }
}

/// The f32 scale of dynamic fp8 quantization (per tensor, per token or per 1x128 group):
/// amax / fp8 max, and 1 for an all-zero group as AITER's per-token quant does.
#[inline]
pub fn fp8_scale_from_amax(amax: f32, kind: Fp8Kind) -> f32 {
    let s = amax / kind.max();
    if s == 0.0 {
        1.0
    } else {
        s
    }
}

/// fp8 bytes of `src / scale` (one f32 scale for the whole slice) into `q`.
/// Panics if the lengths differ.
pub fn quantize_fp8(src: &[f32], scale: f32, kind: Fp8Kind, q: &mut [u8]) {
    assert_eq!(src.len(), q.len(), "q length");
    for (b, &x) in q.iter_mut().zip(src) {
        // Divide (not multiply by the reciprocal): AITER's reference divides.
        *b = kind.encode(x / scale);
    }
}

/// The element format of an MX block (AITER's `MxDtype`), which fixes the e8m0 constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MxDtype {
    Fp4E2m1,
    Fp8E4m3,
    Fp8E4m3Fnuz,
}

impl MxDtype {
    /// (max_pos, target_max_pow2, mbits) of docs/layouts.md §4.
    pub fn constants(self) -> (f32, i32, u32) {
        match self {
            MxDtype::Fp4E2m1 => (6.0, 2, 1),
            MxDtype::Fp8E4m3 => (448.0, 8, 3),
            MxDtype::Fp8E4m3Fnuz => (240.0, 7, 3),
        }
    }
    /// Encode one already-scaled value.
    #[inline]
    pub fn encode(self, y: f32) -> u8 {
        match self {
            MxDtype::Fp4E2m1 => f32_to_e2m1(y),
            MxDtype::Fp8E4m3 => f32_to_fp8_e4m3fn(y),
            MxDtype::Fp8E4m3Fnuz => f32_to_fp8_e4m3fnuz(y),
        }
    }
}

/// Biased f32 exponent field.
#[inline]
fn exp_field(v: f32) -> u32 {
    (v.to_bits() >> 23) & 0xFF
}

/// e8m0 block-scale byte for a block whose largest magnitude is `amax`, under AITER's
/// `f32_to_mx_e8m0_scale(amax, mode, dtype)` (docs/layouts.md §4).
#[inline]
pub fn e8m0_scale_from_amax(amax: f32, mode: crate::types::RoundMode, dtype: MxDtype) -> u8 {
    use crate::types::RoundMode;
    let (max_pos, target_pow2, mbits) = dtype.constants();
    let pow2 = f32::from_bits(((target_pow2 + 127) as u32) << 23);
    // Round the exponent up when any mantissa bit is set (and the value is finite).
    let ceil_exp = |v: f32| -> u8 {
        let e = exp_field(v);
        let m = v.to_bits() & 0x7F_FFFF;
        (e + (m != 0 && e < 255) as u32) as u8
    };
    match mode {
        RoundMode::Up => {
            if !amax.is_finite() {
                255
            } else {
                ceil_exp(amax / max_pos)
            }
        }
        RoundMode::Ceil => {
            if !amax.is_finite() {
                255
            } else {
                ceil_exp(amax / pow2)
            }
        }
        RoundMode::Down => exp_field(amax / pow2) as u8,
        RoundMode::Even => {
            let u = amax.to_bits().wrapping_add(1 << (22 - mbits)) & 0xFF80_0000;
            exp_field(f32::from_bits(u) / pow2) as u8
        }
    }
}

/// Elements per MX block along K.
pub const MX_BLOCK: usize = 32;

/// A row-major source of values to quantize, read 32 at a time as f32.
#[derive(Debug, Clone, Copy)]
pub enum MxSource<'a> {
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
    F16(&'a [half::f16]),
}

impl MxSource<'_> {
    pub fn len(&self) -> usize {
        match self {
            MxSource::F32(s) => s.len(),
            MxSource::Bf16(s) => s.len(),
            MxSource::F16(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy elements `start..start + 32` into `out` as f32.
    #[inline]
    fn block(&self, start: usize, out: &mut [f32; MX_BLOCK]) {
        match self {
            MxSource::F32(s) => out.copy_from_slice(&s[start..start + MX_BLOCK]),
            MxSource::Bf16(s) => {
                for (o, v) in out.iter_mut().zip(&s[start..start + MX_BLOCK]) {
                    *o = v.to_f32();
                }
            }
            MxSource::F16(s) => {
                for (o, v) in out.iter_mut().zip(&s[start..start + MX_BLOCK]) {
                    *o = v.to_f32();
                }
            }
        }
    }
}

/// Quantize one 32-element block: returns the e8m0 byte and writes the codes into `codes`
/// (one per element, unpacked).
#[inline]
fn quantize_block(
    x: &[f32; MX_BLOCK],
    mode: crate::types::RoundMode,
    dtype: MxDtype,
    codes: &mut [u8; MX_BLOCK],
) -> u8 {
    // NaN propagates into amax like torch's max would (it makes the scale 255).
    let amax = x.iter().fold(0.0f32, |m, v| {
        if v.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(v.abs())
        }
    });
    let b = e8m0_scale_from_amax(amax, mode, dtype);
    let scale = e8m0_to_f32(b);
    for (c, &v) in codes.iter_mut().zip(x) {
        // Divide (not multiply by the reciprocal): AITER's reference divides.
        *c = dtype.encode(v / scale);
    }
    b
}

impl<'a> MxSource<'a> {
    /// Elements `start..start + len`.
    fn slice(&self, start: usize, len: usize) -> MxSource<'a> {
        match *self {
            MxSource::F32(s) => MxSource::F32(&s[start..start + len]),
            MxSource::Bf16(s) => MxSource::Bf16(&s[start..start + len]),
            MxSource::F16(s) => MxSource::F16(&s[start..start + len]),
        }
    }
}

/// Blocks below which one thread quantizes faster than several.
const MIN_PARALLEL_BLOCKS: usize = 1 << 14;

/// AITER `per_1x32_f4_quant` (pack_dim −1) / `per_1x32_f8_scale_f8_quant` with e8m0 scales,
/// over a row-major `[rows, k]` source: blocks of 32 along k. `q` receives `rows·k/2` packed
/// fp4x2 bytes (low nibble = even element) for `Fp4E2m1`, else `rows·k` fp8 bytes; `scales`
/// receives `rows·k/32` e8m0 bytes, row-major `[rows, k/32]` (unshuffled). Large inputs are
/// split over all cores (blocks are independent).
/// Panics if `k % 32 != 0` or a slice length disagrees (callers validate first).
pub fn quantize_mx(
    src: MxSource<'_>,
    k: usize,
    mode: crate::types::RoundMode,
    dtype: MxDtype,
    q: &mut [u8],
    scales: &mut [u8],
) {
    assert!(k % MX_BLOCK == 0, "k = {k} must be a multiple of 32");
    let blocks = src.len() / MX_BLOCK;
    let q_per_block = if dtype == MxDtype::Fp4E2m1 { 16 } else { 32 };
    assert_eq!(scales.len(), blocks, "scales length");
    assert_eq!(q.len(), blocks * q_per_block, "q length");
    let threads = crate::runtime::threads::count();
    if threads <= 1 || blocks < MIN_PARALLEL_BLOCKS {
        quantize_blocks(src, mode, dtype, q, scales);
        crate::runtime::progress::advance((q.len() + scales.len()) as u64);
        return;
    }
    // A few parts per worker, so progress moves while they run.
    let per = blocks.div_ceil(threads * 4).max(MIN_PARALLEL_BLOCKS / 4);
    let parts: Vec<_> = scales
        .chunks_mut(per)
        .zip(q.chunks_mut(per * q_per_block))
        .enumerate()
        .collect();
    let mut groups: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
    for (n, part) in parts.into_iter().enumerate() {
        groups[n % threads].push(part);
    }
    let workers = crate::runtime::progress::Workers::new();
    let workers = &workers;
    std::thread::scope(|scope| {
        let jobs = groups.into_iter().filter(|g| !g.is_empty()).map(|group| {
            let running = workers.enter();
            move || {
                let _running = running;
                for (i, (s, qb)) in group {
                    let part = src.slice(i * per * MX_BLOCK, s.len() * MX_BLOCK);
                    let bytes = s.len() + qb.len();
                    quantize_blocks(part, mode, dtype, qb, s);
                    workers.finished(bytes);
                }
            }
        });
        crate::runtime::threads::run_jobs(scope, jobs);
        workers.report_until_done();
    });
}

/// The serial loop of [`quantize_mx`] over whole blocks.
fn quantize_blocks(
    src: MxSource<'_>,
    mode: crate::types::RoundMode,
    dtype: MxDtype,
    q: &mut [u8],
    scales: &mut [u8],
) {
    let q_per_block = q.len() / scales.len().max(1);
    let mut x = [0.0f32; MX_BLOCK];
    let mut codes = [0u8; MX_BLOCK];
    for (i, (s, qb)) in scales
        .iter_mut()
        .zip(q.chunks_exact_mut(q_per_block.max(1)))
        .enumerate()
    {
        src.block(i * MX_BLOCK, &mut x);
        *s = quantize_block(&x, mode, dtype, &mut codes);
        if dtype == MxDtype::Fp4E2m1 {
            for (o, pair) in qb.iter_mut().zip(codes.chunks_exact(2)) {
                *o = pack_fp4x2(pair[0], pair[1]);
            }
        } else {
            qb.copy_from_slice(&codes);
        }
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

    #[test]
    fn fp8_encoders_round_trip_every_code() {
        for b in 0u8..=255 {
            let v = fp8_e4m3fn_to_f32(b);
            if !v.is_nan() {
                assert_eq!(f32_to_fp8_e4m3fn(v), b, "e4m3fn {b:#x}");
            }
            let v = fp8_e4m3fnuz_to_f32(b);
            if !v.is_nan() {
                assert_eq!(f32_to_fp8_e4m3fnuz(v), b, "e4m3fnuz {b:#x}");
            }
        }
        // Ties go to the even code; overflow saturates.
        assert_eq!(f32_to_fp8_e4m3fn(1.0625), 0x38); // between 1.0 (0x38) and 1.125 (0x39)
        assert_eq!(f32_to_fp8_e4m3fn(1.1875), 0x3A); // between 1.125 and 1.25 -> 1.25
        assert_eq!(f32_to_fp8_e4m3fn(1e9), 0x7E);
        assert_eq!(f32_to_fp8_e4m3fn(f32::NEG_INFINITY), 0xFE);
        assert_eq!(f32_to_fp8_e4m3fnuz(-1e9), 0xFF);
        assert_eq!(f32_to_fp8_e4m3fnuz(-0.0), 0x00);
        // Smallest subnormal halves tie to zero.
        assert_eq!(f32_to_fp8_e4m3fn(2f32.powi(-10)), 0x00);
        assert_eq!(f32_to_fp8_e4m3fn(3.0 * 2f32.powi(-10)), 0x02);
    }

    #[test]
    fn e2m1_round_trips_every_code() {
        for c in 0u8..16 {
            let m = E2M1_MAGNITUDES[(c & 7) as usize];
            let want = if c & 8 != 0 { -m } else { m };
            assert_eq!(e2m1_to_f32(c).to_bits(), want.to_bits(), "code {c}");
            assert_eq!(f32_to_e2m1(e2m1_to_f32(c)), c);
        }
    }

    #[test]
    fn e2m1_examples_from_the_spec() {
        // docs/layouts.md §1.1.
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
            assert_eq!(f32_to_e2m1(x), c, "x = {x}");
        }
    }

    #[test]
    fn e8m0_round_up_examples_from_the_spec() {
        // docs/layouts.md §4 (FP4).
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
            assert_eq!(
                e8m0_scale_from_amax(a, crate::types::RoundMode::Up, MxDtype::Fp4E2m1),
                b,
                "amax = {a}"
            );
        }
    }
}
