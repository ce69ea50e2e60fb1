#![allow(dead_code)]
//! Shared test helpers: host tensors and `moeplug_fused_moe_args` built through the C ABI,
//! a small PRNG, and layout writers written from docs/layouts.md independently of `prep::maps`.

use std::ffi::CStr;

#[allow(unused_imports)]
use super::Rng;
use moeplug::capi::types::*;
use moeplug::capi::{moeplug_fused_moe, moeplug_fused_moe_workspace_size, moeplug_last_error};

/// A host tensor owned by the test: bytes, DLPack dtype and shape.
#[derive(Clone, Debug)]
pub struct T {
    pub bytes: Vec<u8>,
    pub shape: Vec<i64>,
    pub code: u8,
    pub bits: u8,
    /// Backing store as u64 so every view is 8-byte aligned.
    store: Vec<u64>,
}

pub const BF16: (u8, u8) = (4, 16);
pub const F16: (u8, u8) = (2, 16);
pub const F32: (u8, u8) = (2, 32);
pub const I32: (u8, u8) = (0, 32);
pub const U8: (u8, u8) = (1, 8);
pub const U32: (u8, u8) = (1, 32);
pub const I8: (u8, u8) = (0, 8);
pub const FP8_FN: (u8, u8) = (10, 8);
pub const FP8_FNUZ: (u8, u8) = (11, 8);
pub const E8M0: (u8, u8) = (14, 8);
pub const FP4: (u8, u8) = (17, 4);

impl T {
    pub fn new(bytes: Vec<u8>, shape: &[usize], dtype: (u8, u8)) -> T {
        T {
            bytes,
            shape: shape.iter().map(|&d| d as i64).collect(),
            code: dtype.0,
            bits: dtype.1,
            store: Vec::new(),
        }
    }
    pub fn f32s(v: &[f32], shape: &[usize]) -> T {
        T::new(v.iter().flat_map(|x| x.to_le_bytes()).collect(), shape, F32)
    }
    pub fn i32s(v: &[i32], shape: &[usize]) -> T {
        T::new(v.iter().flat_map(|x| x.to_le_bytes()).collect(), shape, I32)
    }
    /// 16-bit floats from their bit patterns.
    pub fn u16s(v: &[u16], shape: &[usize], dtype: (u8, u8)) -> T {
        T::new(
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            shape,
            dtype,
        )
    }
    pub fn zeros(shape: &[usize], dtype: (u8, u8)) -> T {
        let n: usize = shape.iter().product();
        let size = if dtype.1 == 4 {
            1
        } else {
            dtype.1 as usize / 8
        };
        let n = if dtype.1 == 4 { n / 2 } else { n };
        T::new(vec![0; n * size], shape, dtype)
    }
    /// The C descriptor; `self` must stay put while it is used.
    pub fn desc(&mut self) -> moeplug_tensor {
        self.store = vec![0u64; self.bytes.len().div_ceil(8)];
        // SAFETY: store holds at least bytes.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.bytes.as_ptr(),
                self.store.as_mut_ptr() as *mut u8,
                self.bytes.len(),
            );
        }
        moeplug_tensor::host(
            self.store.as_mut_ptr() as *mut _,
            &self.shape,
            self.code,
            self.bits,
        )
    }
    pub fn read_back(&mut self) {
        // SAFETY: store holds at least bytes.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.store.as_ptr() as *const u8,
                self.bytes.as_mut_ptr(),
                self.bytes.len(),
            );
        }
    }
    /// Values of a bf16/fp16/f32 tensor.
    pub fn values(&self) -> Vec<f64> {
        match (self.code, self.bits) {
            (4, 16) => self
                .bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) as f64)
                .collect(),
            (2, 16) => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64())
                .collect(),
            (2, 32) => self
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect(),
            other => panic!("values() of dtype {other:?}"),
        }
    }
}

/// A whole launch, every field settable.
#[derive(Clone, Debug)]
pub struct Launch {
    pub layout: moeplug_layout,
    pub activation: i32,
    pub alpha: f32,
    pub limit: f32,
    pub act_dtype: i32,
    pub flags: u32,
    pub hidden: T,
    pub hidden_scale: Option<T>,
    pub w13: T,
    pub w13_scale: Option<T>,
    pub w13_bias: Option<T>,
    pub w2: T,
    pub w2_scale: Option<T>,
    pub w2_bias: Option<T>,
    pub topk_weights: T,
    pub topk_ids: T,
    pub expert_mask: Option<T>,
    pub num_local_tokens: Option<T>,
    pub output: T,
    /// 1.1 fields: static per-tensor act scales and the stage-2 act dtype (0 = stage 1's).
    pub stage1_act_scale: Option<T>,
    pub stage2_act_scale: Option<T>,
    pub stage2_act_dtype: i32,
}

#[allow(clippy::too_many_arguments)]
pub fn layout(
    weight_format: i32,
    gate_mode: i32,
    weight_layout: i32,
    scale_layout: i32,
    e: usize,
    sizes: [usize; 4],
    has_bias: bool,
) -> moeplug_layout {
    moeplug_layout {
        struct_size: std::mem::size_of::<moeplug_layout>() as u32,
        weight_format,
        gate_mode,
        weight_layout,
        scale_layout,
        num_experts: e as i32,
        hidden_size: sizes[0] as i64,
        intermediate_size: sizes[1] as i64,
        hidden_padded: sizes[2] as i64,
        intermediate_padded: sizes[3] as i64,
        flags: has_bias as u32,
        reserved0: 0,
        // 1.1 fields: a record filled by hand has no fingerprint.
        act_dtype: 0,
        reserved1: 0,
        prep_fingerprint: 0,
    }
}

fn opt(t: &mut Option<T>, slot: &mut moeplug_tensor) -> *const moeplug_tensor {
    match t {
        Some(t) => {
            *slot = t.desc();
            slot as *const _
        }
        None => std::ptr::null(),
    }
}

impl Launch {
    fn call(&mut self, workspace_query: bool) -> Result<usize, (i32, String)> {
        let blank = moeplug_tensor {
            data: std::ptr::null_mut(),
            device: moeplug_device {
                device_type: 1,
                device_id: 0,
            },
            ndim: 0,
            dtype: moeplug_dtype {
                code: 0,
                bits: 0,
                lanes: 0,
            },
            shape: std::ptr::null(),
            strides: std::ptr::null(),
            byte_offset: 0,
        };
        let mut d = [blank; 16];
        d[0] = self.hidden.desc();
        d[1] = self.w13.desc();
        d[2] = self.w2.desc();
        d[3] = self.topk_weights.desc();
        d[4] = self.topk_ids.desc();
        d[5] = self.output.desc();
        let [hd, w13d, w2d, twd, tid, outd, r @ ..] = &mut d;
        let [hs, s13, b13, s2, b2, mk, nl, a1, a2, ..] = r;
        let args = moeplug_fused_moe_args {
            struct_size: std::mem::size_of::<moeplug_fused_moe_args>() as u32,
            layout: &self.layout,
            activation: self.activation,
            alpha: self.alpha,
            limit: self.limit,
            act_dtype: self.act_dtype,
            flags: self.flags,
            hidden_states: hd,
            hidden_scale: opt(&mut self.hidden_scale, hs),
            w13: w13d,
            w13_scale: opt(&mut self.w13_scale, s13),
            w13_bias: opt(&mut self.w13_bias, b13),
            w2: w2d,
            w2_scale: opt(&mut self.w2_scale, s2),
            w2_bias: opt(&mut self.w2_bias, b2),
            topk_weights: twd,
            topk_ids: tid,
            expert_mask: opt(&mut self.expert_mask, mk),
            num_local_tokens: opt(&mut self.num_local_tokens, nl),
            output: outd,
            workspace: std::ptr::null(),
            stream: std::ptr::null_mut(),
            stage1_act_scale: opt(&mut self.stage1_act_scale, a1),
            stage2_act_scale: opt(&mut self.stage2_act_scale, a2),
            stage2_act_dtype: self.stage2_act_dtype,
            reserved0: 0,
        };
        let mut bytes = 0usize;
        // SAFETY: every pointer names memory owned by self or this frame.
        let st = unsafe {
            if workspace_query {
                moeplug_fused_moe_workspace_size(&args, &mut bytes)
            } else {
                moeplug_fused_moe(&args)
            }
        } as i32;
        if st != 0 {
            // SAFETY: the library returns a valid C string.
            let msg = unsafe { CStr::from_ptr(moeplug_last_error()) }
                .to_string_lossy()
                .into_owned();
            return Err((st, msg));
        }
        self.output.read_back();
        Ok(bytes)
    }
    /// Run the launch; on success `output` holds the result.
    pub fn run(&mut self) -> Result<(), (i32, String)> {
        self.call(false).map(|_| ())
    }
    pub fn workspace_size(&mut self) -> Result<usize, (i32, String)> {
        self.call(true)
    }
}

/// ||a − b|| / ||b||.
pub fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

/// AITER `shuffle_weight` layout (16, 16) in its original mixed-radix form (docs/layouts.md §2.1):
/// o = [n0|N/16][k0|K/BK][k1|BK/P][n1|16][k2|P], BK = 32 storage elements, P = 16 bytes.
/// `src` is `[batch, n, k]` storage elements of `elem` bytes each.
pub fn shuffle_f1(src: &[u8], batch: usize, n: usize, k: usize, elem: usize) -> Vec<u8> {
    let (bn, bk, p) = (16, 32, 16 / elem);
    assert!(n % bn == 0 && k % bk == 0, "F1 needs N%16 and K%32");
    let mut out = vec![0u8; src.len()];
    let mat = n * k * elem;
    for b in 0..batch {
        let mut o = 0;
        for n0 in 0..n / bn {
            for k0 in 0..k / bk {
                for k1 in 0..bk / p {
                    for n1 in 0..bn {
                        for k2 in 0..p {
                            let (row, col) = (n0 * bn + n1, k0 * bk + k1 * p + k2);
                            let s = b * mat + (row * k + col) * elem;
                            out[b * mat + o * elem..b * mat + (o + 1) * elem]
                                .copy_from_slice(&src[s..s + elem]);
                            o += 1;
                        }
                    }
                }
            }
        }
    }
    out
}

/// e8m0 scale shuffle F3 (docs/layouts.md §3.1) of `[m, n]` bytes with rows padded to `row_align`
/// (256 for AITER's e8m0_shuffle, 32 per expert for the CDNA4 swizzle) and columns to 8;
/// padding bytes are `fill`.
pub fn shuffle_f3(src: &[u8], m: usize, n: usize, row_align: usize, fill: u8) -> Vec<u8> {
    let sm = m.div_ceil(row_align) * row_align;
    let sn = n.div_ceil(8) * 8;
    let mut out = vec![fill; sm * sn];
    let mut o = 0;
    for r0 in 0..sm / 32 {
        for c0 in 0..sn / 8 {
            for cl in 0..4 {
                for rl in 0..16 {
                    for ch in 0..2 {
                        for rh in 0..2 {
                            let (r, c) = (r0 * 32 + rh * 16 + rl, c0 * 8 + ch * 4 + cl);
                            if r < m && c < n {
                                out[o] = src[r * n + c];
                            }
                            o += 1;
                        }
                    }
                }
            }
        }
    }
    out
}

/// Reorder the rows of `[batch, 2h, width]` (gate rows then up rows) into a gate mode's
/// order: 1 SEPARATED (unchanged), 2 INTERLEAVE (16-row blocks g,u,g,u), 3 INTERLEAVE_ROWS.
pub fn reorder_gate_up(src: &[u8], batch: usize, h: usize, row_bytes: usize, mode: i32) -> Vec<u8> {
    let mut out = vec![0u8; src.len()];
    for b in 0..batch {
        for p in 0..2 * h {
            let logical = match mode {
                1 => p,
                2 => {
                    let (pair, within) = (p / 32, p % 32);
                    (within / 16) * h + pair * 16 + within % 16
                }
                3 => (p % 2) * h + p / 2,
                _ => panic!("gate mode {mode}"),
            };
            let (d, s) = (
                (b * 2 * h + p) * row_bytes,
                (b * 2 * h + logical) * row_bytes,
            );
            out[d..d + row_bytes].copy_from_slice(&src[s..s + row_bytes]);
        }
    }
    out
}

/// Read a golden file copied into tests/golden/.
pub fn golden(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}
