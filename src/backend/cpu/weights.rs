//! Reading prepared weights as the layout record says they are stored: dequantize whole rows
//! (scale applied) into f32, from PLAIN or AITER_16x16 (F1) bytes with per-tensor, per-channel,
//! 128×128-block, MX e8m0 or int4 bf16 group scales in any recorded scale layout, and int4
//! uint32 words with per-channel scales.

use once_cell::sync::Lazy;

use crate::layout::Layout;
use crate::prep::maps::{f1_offset, f3_offset};
use crate::quant::{
    e2m1_to_f32, e8m0_to_f32, fp4x2_to_f32, fp8_e4m3fn_to_f32, fp8_e4m3fnuz_to_f32,
};
use crate::tensor::ElemType;
use crate::types::{ScaleLayout, WeightFormat, WeightLayout};

use crate::moe::check::{
    values_per_elem, F1_PACK_BYTES, F1_ROWS, INT4_F1_PACK_BYTES, INT4_GROUP, INT4_PER_WORD,
    MX_BLOCK,
};
use crate::prep::int4::A8W4_NIBBLE_OF_VALUE;

static FP8_FN: Lazy<[f32; 256]> = Lazy::new(|| std::array::from_fn(|b| fp8_e4m3fn_to_f32(b as u8)));
static FP8_FNUZ: Lazy<[f32; 256]> =
    Lazy::new(|| std::array::from_fn(|b| fp8_e4m3fnuz_to_f32(b as u8)));
static FP4X2: Lazy<[[f32; 2]; 256]> = Lazy::new(|| std::array::from_fn(|b| fp4x2_to_f32(b as u8)));

/// The scale of a weight matrix, as the format records it.
#[derive(Debug, Clone, Copy)]
pub enum Scale<'a> {
    None,
    /// One f32 per expert.
    PerTensor(&'a [f32]),
    /// One f32 per (expert, row).
    PerChannel(&'a [f32]),
    /// f32 `[E, ⌈N/128⌉, ⌈K/128⌉]`.
    Block128(&'a [f32]),
    /// e8m0 bytes per 1×32 block in `layout`.
    Mx(&'a [u8], ScaleLayout),
    /// bf16 (little-endian bytes) per 1×32 group of INT4_GROUP32: plain `[E, N, K/32]` or
    /// AITER's `[E, K/64, N, 2]`.
    Int4Group(&'a [u8], ScaleLayout),
}

/// One stacked weight `[E, rows, cols]` (logical), its bytes and its scale.
pub struct WeightMatrix<'a> {
    pub bytes: &'a [u8],
    pub rows: usize,
    /// Logical columns (K, padded).
    pub cols: usize,
    pub elem: ElemType,
    pub format: WeightFormat,
    pub layout: WeightLayout,
    pub scale: Scale<'a>,
}

impl<'a> WeightMatrix<'a> {
    pub fn new(
        layout: &Layout,
        bytes: &'a [u8],
        rows: usize,
        cols: usize,
        elem: ElemType,
        scale: Scale<'a>,
    ) -> WeightMatrix<'a> {
        WeightMatrix {
            bytes,
            rows,
            cols,
            elem,
            format: layout.weight_format,
            layout: layout.weight_layout,
            scale,
        }
    }

    fn elem_bytes(&self) -> usize {
        self.elem.size()
    }
    /// Logical values per storage element (2 for packed fp4 and int4 group32, 8 for the
    /// uint32 words of int4 per channel).
    fn per(&self) -> usize {
        values_per_elem(self.format)
    }
    /// Storage elements per row.
    fn row_storage(&self) -> usize {
        self.cols / self.per()
    }
    /// Bytes of one expert's matrix.
    pub fn expert_bytes(&self) -> usize {
        self.rows * self.row_storage() * self.elem_bytes()
    }

    /// Byte offset (within the expert) of storage element `k` of row `n`. Every 16-byte pack
    /// of a row is contiguous in both layouts.
    #[inline]
    fn byte_offset(&self, n: usize, k: usize) -> usize {
        let ks = self.row_storage();
        let el = match self.layout {
            WeightLayout::Plain => n * ks + k,
            WeightLayout::Aiter16x16 => {
                f1_offset(n, k, ks, F1_ROWS, F1_PACK_BYTES / self.elem_bytes())
            }
        };
        el * self.elem_bytes()
    }

    /// Scale of logical column `k` of row `n` of expert `e` (constant over a 16-byte pack).
    #[inline(always)]
    fn scale_at(&self, e: usize, n: usize, k: usize) -> f32 {
        match self.scale {
            Scale::None => 1.0,
            Scale::PerTensor(s) => s[e],
            Scale::PerChannel(s) => s[e * self.rows + n],
            Scale::Block128(s) => {
                let (nb, kb) = (self.rows.div_ceil(128), self.cols.div_ceil(128));
                s[(e * nb + n / 128) * kb + k / 128]
            }
            Scale::Mx(bytes, layout) => {
                let k32 = self.cols / MX_BLOCK;
                let sn = k32.div_ceil(8) * 8;
                let c = k / MX_BLOCK;
                let off = match layout {
                    // (aiter_int4 never names MX scales: check_record refuses it.)
                    ScaleLayout::Plain | ScaleLayout::AiterInt4 => (e * self.rows + n) * k32 + c,
                    ScaleLayout::AiterE8m0 => f3_offset(e * self.rows + n, c, sn),
                    ScaleLayout::Cdna4Swizzle => {
                        e * self.rows.div_ceil(32) * 32 * sn + f3_offset(n, c, sn)
                    }
                };
                e8m0_to_f32(bytes[off])
            }
            Scale::Int4Group(bytes, layout) => {
                let (g, groups) = (k / INT4_GROUP, self.cols / INT4_GROUP);
                let at = match layout {
                    ScaleLayout::AiterInt4 => {
                        ((e * (groups / 2) + g / 2) * self.rows + n) * 2 + g % 2
                    }
                    _ => (e * self.rows + n) * groups + g,
                };
                f32::from_bits(
                    (u16::from_le_bytes([bytes[2 * at], bytes[2 * at + 1]]) as u32) << 16,
                )
            }
        }
    }

    /// The 32 values of INT4_GROUP32 group `k / 32` of row `n` (natural column order, scale
    /// not applied) from the expert's bytes at `base`. Each 16-value piece of a row is 8
    /// contiguous bytes in both layouts (plain rows, or AITER's F1 of the int8 values in
    /// 16-value packs); inside, byte j < 4 holds values j (low nibble) and j + 4 (high),
    /// byte 4 + j values 8 + j and 12 + j (`pack_int8_to_packed_int4`).
    #[inline]
    fn int4_group(&self, base: usize, n: usize, k: usize, out: &mut [f32; INT4_GROUP]) {
        let row_bytes = self.row_storage();
        for half in 0..2 {
            let byte = (k + 16 * half) / 2;
            let at = base
                + match self.layout {
                    WeightLayout::Plain => n * row_bytes + byte,
                    WeightLayout::Aiter16x16 => {
                        f1_offset(n, byte, row_bytes, F1_ROWS, INT4_F1_PACK_BYTES)
                    }
                };
            let src = &self.bytes[at..at + INT4_F1_PACK_BYTES];
            let dst = &mut out[16 * half..16 * half + 16];
            for (j, &b) in src.iter().enumerate() {
                let (lo, hi) = (((b << 4) as i8 >> 4) as f32, ((b as i8) >> 4) as f32);
                let first = (j / 4) * 8 + j % 4;
                dst[first] = lo;
                dst[first + 4] = hi;
            }
        }
    }

    /// [`Self::dequant_tile`] for INT4_GROUP32: whole 32-value groups, each times its bf16
    /// scale (exact in f32: a 4-bit integer times a bf16), the last one cut to `width`.
    #[allow(clippy::too_many_arguments)]
    fn dequant_int4_tile(
        &self,
        e: usize,
        n0: usize,
        rows: usize,
        k0: usize,
        width: usize,
        tile: &mut [f32],
        ld: usize,
    ) {
        let base = e * self.expert_bytes();
        let mut vals = [0f32; INT4_GROUP];
        for r in 0..rows {
            let n = n0 + r;
            for k in (0..width).step_by(INT4_GROUP) {
                self.int4_group(base, n, k0 + k, &mut vals);
                let s = self.scale_at(e, n, k0 + k);
                let take = (width - k).min(INT4_GROUP);
                for (d, v) in tile[r * ld + k..][..take].iter_mut().zip(&vals) {
                    *d = v * s;
                }
            }
        }
    }

    /// [`Self::dequant_tile`] for INT4_PER_CHANNEL: uint32 words of 8 values (AITER's a8w4
    /// nibble order), plain rows or F1 over the words (4-word packs), each value times its
    /// row's fp32 scale; a last word is cut to `width`.
    #[allow(clippy::too_many_arguments)]
    fn dequant_int4_words_tile(
        &self,
        e: usize,
        n0: usize,
        rows: usize,
        k0: usize,
        width: usize,
        tile: &mut [f32],
        ld: usize,
    ) {
        let base = e * self.expert_bytes();
        for r in 0..rows {
            let n = n0 + r;
            let s = self.scale_at(e, n, 0);
            for k in (0..width).step_by(INT4_PER_WORD) {
                let at = base + self.byte_offset(n, (k0 + k) / INT4_PER_WORD);
                let word = u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap());
                let take = (width - k).min(INT4_PER_WORD);
                for (j, d) in tile[r * ld + k..][..take].iter_mut().enumerate() {
                    let nib = (word >> (4 * A8W4_NIBBLE_OF_VALUE[j])) as u8;
                    *d = ((nib << 4) as i8 >> 4) as f32 * s;
                }
            }
        }
    }

    /// Logical values per 16-byte pack (8 for 16-bit, 16 for fp8, 32 for packed fp4 and
    /// int4).
    pub fn pack_values(&self) -> usize {
        F1_PACK_BYTES / self.elem_bytes() * self.per()
    }

    /// Whether tiles hold each 32-column block in fp4 pack order: the 16 even columns (low
    /// nibbles) first, then the 16 odd ones (high nibbles). Activations must be permuted the
    /// same way ([`to_pack_order`]); a dot product does not care about the order.
    pub fn fp4_order(&self) -> bool {
        self.format == WeightFormat::Mxfp4
    }

    /// Columns the tile kernel computes for `used` logical columns: packed fp4 rounds up to
    /// whole 32-value packs (the extra columns are decoded as zero), others compute `used`.
    pub fn k_extent(&self, used: usize) -> usize {
        if self.fp4_order() {
            used.div_ceil(MX_BLOCK) * MX_BLOCK
        } else {
            used
        }
    }

    /// Dequantize (scale applied) rows `n0..n0 + rows` of expert `e`, logical columns
    /// `k0..k0 + width`, into `tile` (row r at `tile[r * ld..]`). `k0` is a multiple of
    /// [`Self::pack_values`], `width <= ld`, `k0 + width <= self.k_extent(used)`; in fp4 order
    /// (see [`Self::fp4_order`]) and columns at or beyond `used` are zero.
    ///
    /// Reads whole 16-byte packs in storage order (in F1 a 16-row tile is one contiguous run
    /// of packs, k-pack major), each decoded by a fixed-size loop the compiler vectorizes.
    ///
    /// `AVX2`: the caller runs with AVX2 enabled (checked at run time); packed fp4 then
    /// decodes through a byte shuffle ([`decode_fp4_pack_avx2`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn dequant_tile<const AVX2: bool>(
        &self,
        e: usize,
        n0: usize,
        rows: usize,
        k0: usize,
        width: usize,
        used: usize,
        tile: &mut [f32],
        ld: usize,
    ) {
        let eb = self.elem_bytes();
        let pv = self.pack_values();
        debug_assert!(k0 % pv == 0 && width <= ld && rows <= F1_ROWS);
        if self.format == WeightFormat::Int4Group32 {
            return self.dequant_int4_tile(e, n0, rows, k0, width, tile, ld);
        }
        if self.format == WeightFormat::Int4PerChannel {
            return self.dequant_int4_words_tile(e, n0, rows, k0, width, tile, ld);
        }
        // Storage step from one row to the next and from one pack to the next.
        let (row_step, pack_step) = match self.layout {
            WeightLayout::Plain => (self.row_storage() * eb, F1_PACK_BYTES),
            WeightLayout::Aiter16x16 => (F1_PACK_BYTES, F1_ROWS * F1_PACK_BYTES),
        };
        let base = e * self.expert_bytes() + self.byte_offset(n0, 0) + k0 / pv * pack_step;
        let mut row_scale = [1f32; F1_ROWS];
        if let Scale::PerTensor(_) | Scale::PerChannel(_) = self.scale {
            for (r, s) in row_scale[..rows].iter_mut().enumerate() {
                *s = self.scale_at(e, n0 + r, 0);
            }
        }
        // A fn called directly, not a closure: LLVM left a closure out of line, and this runs
        // per pack.
        #[inline(always)]
        fn pack_scale(w: &WeightMatrix, e: usize, n: usize, k: usize, row_scale: f32) -> f32 {
            match w.scale {
                Scale::None | Scale::PerTensor(_) | Scale::PerChannel(_) => row_scale,
                _ => w.scale_at(e, n, k),
            }
        }
        let full = width / pv;
        let pack = |r: usize, kp: usize| -> &[u8; F1_PACK_BYTES] {
            let at = base + r * row_step + kp * pack_step;
            self.bytes[at..at + F1_PACK_BYTES].try_into().unwrap()
        };
        match (self.elem, self.fp4_order()) {
            (ElemType::Bf16, _) => {
                for kp in 0..full {
                    for r in 0..rows {
                        let dst = &mut tile[r * ld + kp * 8..][..8];
                        decode_bf16_pack(
                            pack(r, kp),
                            pack_scale(self, e, n0 + r, k0 + kp * pv, row_scale[r]),
                            dst.try_into().unwrap(),
                        );
                    }
                }
            }
            (_, true) => {
                for kp in 0..full {
                    for r in 0..rows {
                        let dst: &mut [f32; 32] =
                            (&mut tile[r * ld + kp * 32..][..32]).try_into().unwrap();
                        #[cfg(target_arch = "x86_64")]
                        if AVX2 {
                            // SAFETY: AVX2 is set only by callers running with AVX2 enabled
                            // after a run-time check.
                            unsafe {
                                decode_fp4_pack_avx2(
                                    pack(r, kp),
                                    pack_scale(self, e, n0 + r, k0 + kp * pv, row_scale[r]),
                                    dst,
                                )
                            };
                            continue;
                        }
                        decode_fp4_pack(
                            pack(r, kp),
                            pack_scale(self, e, n0 + r, k0 + kp * pv, row_scale[r]),
                            dst,
                        );
                    }
                }
                let valid = used.saturating_sub(k0);
                if valid < width {
                    // The last pack is partly beyond `used`: zero those columns (they may
                    // hold garbage). Position p holds column 2p (p < 16) or 2(p - 16) + 1.
                    let kp = valid / 32;
                    for r in 0..rows {
                        let dst = &mut tile[r * ld + kp * 32..][..32];
                        for (p, d) in dst.iter_mut().enumerate() {
                            let col = kp * 32 + if p < 16 { 2 * p } else { 2 * (p - 16) + 1 };
                            if col >= valid {
                                *d = 0.0;
                            }
                        }
                    }
                }
                return;
            }
            _ => {
                for kp in 0..full {
                    for r in 0..rows {
                        let dst = &mut tile[r * ld + kp * pv..][..pv];
                        let at = base + r * row_step + kp * pack_step;
                        decode(
                            self.elem,
                            self.format,
                            &self.bytes[at..at + F1_PACK_BYTES],
                            dst,
                            pack_scale(self, e, n0 + r, k0 + kp * pv, row_scale[r]),
                        );
                    }
                }
            }
        }
        // A last partial pack (`width` not a multiple of the pack): only its values are read.
        let tail = width - full * pv;
        if tail > 0 {
            for r in 0..rows {
                let at = base + r * row_step + full * pack_step;
                decode(
                    self.elem,
                    self.format,
                    &self.bytes[at..at + tail * eb],
                    &mut tile[r * ld + full * pv..][..tail],
                    pack_scale(self, e, n0 + r, k0 + full * pv, row_scale[r]),
                );
            }
        }
    }
}

/// Permute one activation row into fp4 pack order (see [`WeightMatrix::fp4_order`]):
/// `dst[32b + p]` = `src[32b + 2p]` for p < 16, `src[32b + 2(p - 16) + 1]` otherwise; columns
/// at or beyond `src.len()` are zero.
pub fn to_pack_order(src: &[f32], dst: &mut [f32]) {
    dst.fill(0.0);
    for (b, block) in dst.chunks_mut(MX_BLOCK).enumerate() {
        let s = &src[(b * MX_BLOCK).min(src.len())..((b + 1) * MX_BLOCK).min(src.len())];
        for (j, &v) in s.iter().enumerate() {
            block[j / 2 + (j % 2) * 16] = v;
        }
    }
}

/// 8 bf16 values of a pack, times `scale`.
#[inline(always)]
fn decode_bf16_pack(src: &[u8; 16], scale: f32, dst: &mut [f32; 8]) {
    for (i, d) in dst.iter_mut().enumerate() {
        let bits = u16::from_le_bytes([src[2 * i], src[2 * i + 1]]);
        *d = f32::from_bits((bits as u32) << 16) * scale;
    }
}

/// [`decode_fp4_pack`] with AVX2: one byte shuffle maps 16 nibbles to twice their e2m1
/// value as i8 (0, ±1, …, ±12), which converts exactly to f32 and is multiplied by
/// `scale / 2` (exact: a power of two, and every product has at most 3 significant bits, so
/// it equals `value * scale`). The only difference from the portable decoder is code 8
/// (−0), which gives +0; a dot product that starts from +0 cannot see the sign of a zero
/// term. About 3x fewer instructions than the select-based portable version.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_fp4_pack_avx2(src: &[u8; 16], scale: f32, dst: &mut [f32; 32]) {
    use std::arch::x86_64::*;
    // SAFETY: src holds 16 bytes and dst 32 f32 (four 8-lane stores at 0, 8, 16, 24); all
    // loads and stores are unaligned ones.
    let bytes = _mm_loadu_si128(src.as_ptr() as *const __m128i);
    let low4 = _mm_set1_epi8(15);
    let lo = _mm_and_si128(bytes, low4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low4);
    let twice = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    let (lo, hi) = (_mm_shuffle_epi8(twice, lo), _mm_shuffle_epi8(twice, hi));
    let half_scale = _mm256_set1_ps(scale * 0.5);
    let out = dst.as_mut_ptr();
    for (i, v) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
        .into_iter()
        .enumerate()
    {
        let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        _mm256_storeu_ps(out.add(8 * i), _mm256_mul_ps(f, half_scale));
    }
}

/// 32 fp4 values of a pack (one MX block), times `scale`, in pack order: low nibbles (even
/// columns) then high nibbles (odd columns), so both halves are plain vector loops.
#[inline(always)]
fn decode_fp4_pack(src: &[u8; 16], scale: f32, dst: &mut [f32; 32]) {
    let (lo, hi) = dst.split_at_mut(16);
    for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(src) {
        *l = e2m1_to_f32(b & 15) * scale;
        *h = e2m1_to_f32(b >> 4) * scale;
    }
}

/// Decode storage bytes into `dst.len()` values times `scale`.
#[inline]
fn decode(elem: ElemType, format: WeightFormat, src: &[u8], dst: &mut [f32], scale: f32) {
    match elem {
        ElemType::Bf16 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) * scale;
            }
        }
        ElemType::F16 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32() * scale;
            }
        }
        _ if format == WeightFormat::Mxfp4 => {
            let t = &*FP4X2;
            let mut pairs = dst.chunks_exact_mut(2);
            for (pair, &b) in (&mut pairs).zip(src) {
                let v = t[b as usize];
                pair[0] = v[0] * scale;
                pair[1] = v[1] * scale;
            }
            // An odd tail (a row ending inside a byte) takes the low nibble.
            if let [last] = pairs.into_remainder() {
                *last = t[src[src.len() - 1] as usize][0] * scale;
            }
        }
        ElemType::Fp8E4m3fnuz => {
            let t = &*FP8_FNUZ;
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = t[b as usize] * scale;
            }
        }
        // e4m3fn, and uint8 read as e4m3fn.
        _ => {
            let t = &*FP8_FN;
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = t[b as usize] * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 fp4 decoder equals the portable one for every byte and a range of scales
    /// (up to the sign of zero), so either path gives the same launch results.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn fp4_decoders_agree() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        for scale_byte in [0u8, 1, 100, 127, 130, 254, 255] {
            let scale = e8m0_to_f32(scale_byte);
            for first in (0..=255u8).step_by(16) {
                let src: [u8; 16] = std::array::from_fn(|i| first.wrapping_add(i as u8 * 17));
                let (mut want, mut got) = ([0f32; 32], [0f32; 32]);
                decode_fp4_pack(&src, scale, &mut want);
                // SAFETY: AVX2 checked above.
                unsafe { decode_fp4_pack_avx2(&src, scale, &mut got) };
                for (w, g) in want.iter().zip(&got) {
                    assert!(w == g || (w.is_nan() && g.is_nan()), "{w} vs {g}");
                }
            }
        }
    }
}
