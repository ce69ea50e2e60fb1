//! Reading prepared weights as the layout record says they are stored: dequantize whole rows
//! (scale applied) into f32, from PLAIN or AITER_16x16 (F1) bytes with per-tensor, per-channel,
//! 128×128-block or MX e8m0 scales in any recorded scale layout.

use once_cell::sync::Lazy;

use crate::layout::Layout;
use crate::prep::maps::{f1_offset, f3_offset};
use crate::quant::{e8m0_to_f32, fp4x2_to_f32, fp8_e4m3fn_to_f32, fp8_e4m3fnuz_to_f32};
use crate::tensor::ElemType;
use crate::types::{ScaleLayout, WeightFormat, WeightLayout};

use crate::moe::check::{F1_PACK_BYTES, F1_ROWS, MX_BLOCK};

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
        if self.elem.is_byte() {
            1
        } else {
            2
        }
    }
    /// Logical values per storage element (2 for packed fp4).
    fn per(&self) -> usize {
        if self.format == WeightFormat::Mxfp4 {
            2
        } else {
            1
        }
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
    #[inline]
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
                    ScaleLayout::Plain => (e * self.rows + n) * k32 + c,
                    ScaleLayout::AiterE8m0 => f3_offset(e * self.rows + n, c, sn),
                    ScaleLayout::Cdna4Swizzle => {
                        e * self.rows.div_ceil(32) * 32 * sn + f3_offset(n, c, sn)
                    }
                };
                e8m0_to_f32(bytes[off])
            }
        }
    }

    /// Dequantize the first `used` logical columns of row `n` of expert `e` into `out`.
    pub fn dequant_row(&self, e: usize, n: usize, used: usize, out: &mut [f32]) {
        let eb = self.elem_bytes();
        let pack_values = F1_PACK_BYTES / eb * self.per();
        // A row is a run of 16-byte packs: adjacent in PLAIN, one tile row (16 packs) apart
        // in F1. Walking by stride avoids index math per pack.
        let stride = match self.layout {
            WeightLayout::Plain => F1_PACK_BYTES,
            WeightLayout::Aiter16x16 => F1_ROWS * F1_PACK_BYTES,
        };
        let start = e * self.expert_bytes() + self.byte_offset(n, 0);
        let row_scale = match self.scale {
            Scale::PerTensor(_) | Scale::PerChannel(_) => Some(self.scale_at(e, n, 0)),
            _ => None,
        };
        for (chunk, dst) in out[..used].chunks_mut(pack_values).enumerate() {
            let at = start + chunk * stride;
            let len = dst.len().div_ceil(self.per()) * eb;
            let scale = match (row_scale, self.scale) {
                (_, Scale::None) => 1.0,
                (Some(s), _) => s,
                (None, _) => self.scale_at(e, n, chunk * pack_values),
            };
            decode(
                self.elem,
                self.format,
                &self.bytes[at..at + len],
                dst,
                scale,
            );
        }
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
