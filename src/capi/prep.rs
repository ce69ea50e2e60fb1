//! Weight preparation exports (docs/abi.md §7): each reads its argument struct, converts the
//! fields into a typed request of `crate::prep::request` (which checks one location, dtypes,
//! exact shapes and overlap, and returns the job), and runs the job on the backend that owns
//! the memory: host tensors synchronously on the calling thread, device tensors as kernels on
//! the caller's `stream` (no allocation, no synchronization, byte-identical results).

use super::args::{
    enum_or, flag, optional_tensor, out_struct_size, read_struct, tensor, write_struct,
};
use super::fragment::OutFragment;
use super::panic::{guard, symver};
use super::status;
use super::types::*;
use crate::error::{Error, Result};
use crate::layout::{fingerprint, Fragment, Layout, FLAG_AITER_TARGET};
use crate::prep::request::{
    self, PadWeights, PrepareMoe, PrepareTarget, PrepareTargetArgs, QuantizeMx, ShuffleScale,
    ShuffleWeight, SwizzleScale,
};
use crate::tensor::Tensor;
use crate::types::{RoundMode, ScaleLayout, WeightFormat};

/// AITER `shuffle_weight` (docs/layouts.md F1/F2) from `args->src` into `args->dst`, both
/// `[..., N, K]` (packed fp4 as `{17, 4, 1}` logical or uint8 bytes; K in storage elements
/// for the divisibility rules). `layout_n`/`layout_k` 0 → 16. `dst` has `src`'s shape, with K
/// rounded up to `pad_k_to` when that is > 0 (zero padding). `gate_up` requires
/// `is_guinterleave` (a 3-D `[E, N, K]`). Host tensors run synchronously (`stream` unused);
/// device tensors (all on one device, else INVALID_ARGUMENT) are written by kernels queued on
/// `stream` (NULL = the default stream), byte-identical to the host result. With
/// `out_fragment` (1.1) set, a successful call also writes the layout fragment it
/// established (docs/abi.md §8), for `moeplug_layout_from_fragments`. The same holds for
/// every prep call.
#[no_mangle]
pub unsafe extern "C" fn moeplug_shuffle_weight(
    args: *const moeplug_shuffle_weight_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_shuffle_weight", || {
        let a = read_struct(args, "args")?;
        let fragment = OutFragment::new(a.out_fragment)?;
        let job = ShuffleWeight {
            src: tensor(a.src, "src")?,
            dst: tensor(a.dst, "dst")?,
            layout_n: a.layout_n as i64,
            layout_k: a.layout_k as i64,
            use_int4: flag(a.use_int4),
            is_guinterleave: flag(a.is_guinterleave),
            gate_up: flag(a.gate_up),
            pad_k_to: a.pad_k_to,
        }
        .plan()?;
        job.run(stream)?;
        fragment.write(&job.fragment);
        Ok(())
    }))
}

/// AITER `shuffle_scale` / `e8m0_shuffle` (docs/layouts.md F3/F4): `src` `[m, n]` e8m0 (or uint8).
/// Without `is_guinterleave` (F3): `dst` `[⌈m/256⌉·256, ⌈n/8⌉·8]`, padding bytes 0x00
/// (AITER leaves them undefined); `num_experts` is ignored. With `is_guinterleave` (F4):
/// `num_experts` (> 0) experts of N = m/num_experts rows (N a multiple of 32), `dst`
/// `[m, ⌈n/8⌉·8]`, padding columns 0x7F as AITER; `gate_up` interleaves each expert's gate
/// and up halves in 16-row blocks first. An fp32 `src` is copied unchanged into a `dst` of
/// the same shape (AITER returns fp32 scales as they are).
#[no_mangle]
pub unsafe extern "C" fn moeplug_shuffle_scale(
    args: *const moeplug_shuffle_scale_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_shuffle_scale", || {
        let a = read_struct(args, "args")?;
        let fragment = OutFragment::new(a.out_fragment)?;
        let job = ShuffleScale {
            src: tensor(a.src, "src")?,
            dst: tensor(a.dst, "dst")?,
            num_experts: a.num_experts,
            is_guinterleave: flag(a.is_guinterleave),
            gate_up: flag(a.gate_up),
        }
        .plan()?;
        job.run(stream)?;
        fragment.write(&job.fragment);
        Ok(())
    }))
}

/// Padding of `src` `[E, N, K]` into `dst` `[E, N', K']` (N' >= N, K' >= K; shapes from the
/// tensors), or of `[E, N]` (fp32 biases) into `[E, N']`. The new elements hold `fill`
/// (converted exactly to the element type; 0 → zero bytes; packed fp4 fills both nibbles).
/// With `gate_up` the rows are two halves (gate, up) padded separately: gate rows stay first,
/// up rows start at N'/2. Works for weights, e8m0 scales `[E, N, K/32]` and biases.
#[no_mangle]
pub unsafe extern "C" fn moeplug_pad_weights(
    args: *const moeplug_pad_weights_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_pad_weights", || {
        let a = read_struct(args, "args")?;
        let fragment = OutFragment::new(a.out_fragment)?;
        let job = PadWeights {
            src: tensor(a.src, "src")?,
            dst: tensor(a.dst, "dst")?,
            gate_up: flag(a.gate_up),
            fill: a.fill,
        }
        .plan()?;
        job.run(stream)?;
        fragment.write(&job.fragment);
        Ok(())
    }))
}

/// Scale swizzle of an e8m0 (or uint8) `src` `[E, N, K/32]` into `dst`:
/// `layout` 0 or CDNA4_SWIZZLE (3): triton_kernels' CDNA4 MX scale layout (docs/layouts.md F5),
/// `dst` `[E, ⌈N/32⌉, ⌈(K/32)/8⌉·8·32]` (its storage order), padding 0x00;
/// AITER_E8M0 (2): `e8m0_shuffle` of the `[E·N, K/32]` view, `dst`
/// `[⌈E·N/256⌉·256, ⌈(K/32)/8⌉·8]`, padding 0x00. PLAIN is not a swizzle (UNSUPPORTED).
#[no_mangle]
pub unsafe extern "C" fn moeplug_swizzle_scale(
    args: *const moeplug_swizzle_scale_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_swizzle_scale", || {
        let a = read_struct(args, "args")?;
        let fragment = OutFragment::new(a.out_fragment)?;
        let layout = enum_or(a.layout, ScaleLayout::Cdna4Swizzle, |r| {
            ScaleLayout::from_raw("layout", r)
        })?;
        let job = SwizzleScale {
            src: tensor(a.src, "src")?,
            dst: tensor(a.dst, "dst")?,
            layout,
        }
        .plan()?;
        job.run(stream)?;
        fragment.write(&job.fragment);
        Ok(())
    }))
}

/// MX quantization along the last dimension (AITER `per_1x32_f4_quant` /
/// `per_1x32_f8_scale_f8_quant` with e8m0 scales): `src` fp32/bf16/fp16 `[..., K]`, K a
/// multiple of 32. `format` MXFP4 (0 → MXFP4): `dst_q` packed fp4 (`{17,4,1}` `[..., K]` or
/// uint8 `[..., K/2]`, low nibble = even element). MXFP8: `dst_q` `[..., K]` float8_e4m3fn or
/// float8_e4m3fnuz (its dtype picks the encoding and the e8m0 constants 448 / 240).
/// Per block of 32: b = e8m0 scale of the block's amax under `round_mode` (0 → UP), values
/// y = x / 2^(b-127) encoded with round-to-nearest-even, saturating (NaN: fp4 code 3, fp8
/// NaN). `dst_scale` e8m0/uint8 `[rows, K/32]` (or `[..., K/32]`); with `shuffle_scale` the
/// AITER `e8m0_shuffle` layout `[⌈rows/256⌉·256, ⌈(K/32)/8⌉·8]`, padding 0x00.
#[no_mangle]
pub unsafe extern "C" fn moeplug_quantize_mx(
    args: *const moeplug_quantize_mx_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_quantize_mx", || {
        let a = read_struct(args, "args")?;
        let fragment = OutFragment::new(a.out_fragment)?;
        let format = enum_or(a.format, WeightFormat::Mxfp4, |r| {
            WeightFormat::from_raw("format", r)
        })?;
        let format = request::quantize_format(format, a.format)?;
        let mode = enum_or(a.round_mode, RoundMode::Up, |r| {
            RoundMode::from_raw("round_mode", r)
        })?;
        let (src, dst_q) = (tensor(a.src, "src")?, tensor(a.dst_q, "dst_q")?);
        let dst_scale = tensor(a.dst_scale, "dst_scale")?;
        let written = (dst_q.nbytes() + dst_scale.nbytes()) as u64;
        let job = QuantizeMx {
            format,
            mode,
            src,
            dst_q,
            dst_scale,
            shuffle_scale: flag(a.shuffle_scale),
        }
        .plan()?;
        job.run_reporting(stream, "moeplug_quantize_mx", written)?;
        fragment.write(&job.fragment);
        Ok(())
    }))
}

/// A tensor argument read for its description only (its data may be NULL).
unsafe fn describe(ptr: *const moeplug_tensor, name: &'static str) -> Result<Option<Tensor>> {
    if ptr.is_null() {
        return Ok(None);
    }
    let mut t = std::ptr::read_unaligned(ptr);
    if t.data.is_null() {
        // Never dereferenced: only the shape and dtype are used.
        t.data = std::ptr::NonNull::<u8>::dangling().as_ptr() as *mut libc::c_void;
        t.byte_offset = 0;
    }
    optional_tensor(&t, name)
}

/// The request of `prepare_moe_sizes` (`read` = `describe`) and `prepare_moe`
/// (`read` = `optional_tensor`).
unsafe fn read_prepare(
    a: &moeplug_prepare_moe_args,
    read: unsafe fn(*const moeplug_tensor, &'static str) -> Result<Option<Tensor>>,
) -> Result<PrepareMoe> {
    let target = PrepareTarget::new(PrepareTargetArgs {
        weight_format: a.weight_format,
        gate_mode_in: a.gate_mode_in,
        device_type: a.device_type,
        device_id: a.device_id,
        act_dtype: a.act_dtype,
        hidden_align: a.hidden_align,
        intermediate_align: a.intermediate_align,
        target: a.target,
    })?;
    let need = |t: Option<Tensor>, name: &str| {
        t.ok_or_else(|| Error::invalid(format!("{name}: must not be NULL")))
    };
    Ok(PrepareMoe {
        target,
        w13: need(read(a.w13, "w13")?, "w13")?,
        w2: need(read(a.w2, "w2")?, "w2")?,
        w13_scale: read(a.w13_scale, "w13_scale")?,
        w2_scale: read(a.w2_scale, "w2_scale")?,
        w13_bias: read(a.w13_bias, "w13_bias")?,
        w2_bias: read(a.w2_bias, "w2_bias")?,
    })
}

/// The record of a preparation; `aiter` marks one laid out for an AITER kernel path.
pub(super) fn layout_record(l: &Layout, fragment: &Fragment, aiter: bool) -> moeplug_layout {
    moeplug_layout {
        struct_size: std::mem::size_of::<moeplug_layout>() as u32,
        weight_format: l.weight_format as i32,
        gate_mode: l.gate_mode as i32,
        weight_layout: l.weight_layout as i32,
        scale_layout: l.scale_layout.map_or(0, |s| s as i32),
        num_experts: l.num_experts as i32,
        hidden_size: l.hidden_size as i64,
        intermediate_size: l.intermediate_size as i64,
        hidden_padded: l.hidden_padded as i64,
        intermediate_padded: l.intermediate_padded as i64,
        flags: l.flags() | if aiter { FLAG_AITER_TARGET } else { 0 },
        reserved0: 0,
        act_dtype: fragment.act_dtype.map_or(0, |a| a as i32),
        reserved1: 0,
        prep_fingerprint: fingerprint::encode(fragment),
    }
}

fn shape4(shape: Option<&Vec<usize>>) -> (i32, [i64; 4]) {
    let mut out = [0i64; 4];
    match shape {
        None => (0, out),
        Some(s) => {
            for (o, &d) in out.iter_mut().zip(s) {
                *o = d as i64;
            }
            (s.len() as i32, out)
        }
    }
}

/// Shapes and bytes of each output of `moeplug_prepare_moe` for these arguments (tensors are
/// read for shape and dtype only; their data may be NULL; output tensors are ignored).
/// Shapes are in storage elements: packed fp4 weights count bytes in the last dimension
/// (H/2, I/2), which is also how `out_w13`/`out_w2` may be given (uint8). Absent outputs
/// have ndim 0 and 0 bytes. `out->layout` is the record `moeplug_prepare_moe` will write.
/// `out->struct_size` must be set by the caller.
#[no_mangle]
pub unsafe extern "C" fn moeplug_prepare_moe_sizes(
    args: *const moeplug_prepare_moe_args,
    out: *mut moeplug_prepare_moe_sizes_out,
) -> moeplug_status {
    status(guard("moeplug_prepare_moe_sizes", || {
        let a = read_struct(args, "args")?;
        let size = out_struct_size(out, "out")?;
        let req = read_prepare(&a, describe)?;
        let plan = req.plan()?;
        let p = &plan;
        let (w13_ndim, w13_shape) = shape4(Some(&p.w13));
        let (w13_scale_ndim, w13_scale_shape) = shape4(p.w13_scale.as_ref());
        let (w13_bias_ndim, w13_bias_shape) = shape4(p.w13_bias.as_ref());
        let (w2_ndim, w2_shape) = shape4(Some(&p.w2));
        let (w2_scale_ndim, w2_scale_shape) = shape4(p.w2_scale.as_ref());
        let (w2_bias_ndim, w2_bias_shape) = shape4(p.w2_bias.as_ref());
        // The nested record is as long as the caller's struct leaves room for (a 1.0 caller:
        // the 1.0 record).
        let aiter = req.target.target.is_some();
        let mut layout = layout_record(&p.layout, &req.fragment(p), aiter);
        let room = size - std::mem::offset_of!(moeplug_prepare_moe_sizes_out, layout);
        layout.struct_size = room.min(std::mem::size_of::<moeplug_layout>()) as u32;
        let sizes = moeplug_prepare_moe_sizes_out {
            struct_size: 0, // set by write_struct
            w13_ndim,
            w13_shape,
            w13_scale_ndim,
            reserved0: 0,
            w13_scale_shape,
            w13_bias_ndim,
            reserved1: 0,
            w13_bias_shape,
            w2_ndim,
            reserved2: 0,
            w2_shape,
            w2_scale_ndim,
            reserved3: 0,
            w2_scale_shape,
            w2_bias_ndim,
            reserved4: 0,
            w2_bias_shape,
            w13_bytes: p.w13_bytes() as u64,
            w13_scale_bytes: p.w13_scale_bytes() as u64,
            w13_bias_bytes: p.w13_bias_bytes() as u64,
            w2_bytes: p.w2_bytes() as u64,
            w2_scale_bytes: p.w2_scale_bytes() as u64,
            w2_bias_bytes: p.w2_bias_bytes() as u64,
            layout,
        };
        write_struct(out, &sizes, size);
        Ok(())
    }))
}

/// Prepare checkpoint MoE weights for the target (`device_type` 0/CPU: the CPU backend):
/// `w13` `[E, 2I, H]` in `gate_mode_in` order (0 → SEPARATED; INTERLEAVE = 16-row blocks;
/// INTERLEAVE_ROWS = g0,u0,g1,u1 as gpt-oss), `w2` `[E, H, I]`, scales per format (MXFP4/MXFP8:
/// e8m0 `[E, N, K/32]` or `[E·N, K/32]`; FP8_PER_TENSOR fp32 `[E]`/`[E,1]`; FP8_PER_CHANNEL
/// `[E, N]`/`[E, N, 1]`; FP8_BLOCK128 `[E, N/128, ⌈K/128⌉]`; none for BF16/FP16), fp32
/// biases `[E, 2I]`, `[E, H]`. H and I are zero-padded to the alignment (0 → 256 MX, 128
/// FP8_BLOCK128, else 1; raised to what the (16, 16) shuffle needs: 32, 64 for fp4), rows
/// re-ordered to SEPARATED `[gate(I_pad); up(I_pad)]`, weights shuffled (AITER_16x16), MX
/// scales e8m0-shuffled (AITER_E8M0, 2-D, padding 0x00), fp32 scales and biases re-ordered
/// and padded (plain). Outputs must have exactly the shapes `moeplug_prepare_moe_sizes`
/// reports, the dtypes of their inputs, and not overlap any input. `device_type` 2 (CUDA)
/// gets the same layout (the CUDA fused_moe reads it); all tensors are host memory, or all
/// on one device (then the work is queued on `stream`).
/// `*out_layout` (caller sets `struct_size`) is written on success. 1.1: `target` names an
/// AITER kernel path instead (docs/aiter.md): its rows, shuffles, act dtype, host tensors only.
#[no_mangle]
pub unsafe extern "C" fn moeplug_prepare_moe(
    args: *const moeplug_prepare_moe_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_prepare_moe", || {
        let a = read_struct(args, "args")?;
        let layout_size = out_struct_size(a.out_layout, "out_layout")?;
        let req = read_prepare(&a, optional_tensor)?;
        let outputs = [
            optional_tensor(a.out_w13, "out_w13")?,
            optional_tensor(a.out_w2, "out_w2")?,
            optional_tensor(a.out_w13_scale, "out_w13_scale")?,
            optional_tensor(a.out_w2_scale, "out_w2_scale")?,
            optional_tensor(a.out_w13_bias, "out_w13_bias")?,
            optional_tensor(a.out_w2_bias, "out_w2_bias")?,
        ];
        let written: usize = outputs.iter().flatten().map(|o| o.nbytes()).sum();
        let aiter = req.target.target.is_some();
        let (job, layout) = req.job(outputs)?;
        job.run_reporting(stream, "moeplug_prepare_moe", written as u64)?;
        write_struct(
            a.out_layout,
            &layout_record(&layout, &job.fragment, aiter),
            layout_size,
        );
        Ok(())
    }))
}

symver!(
    moeplug_shuffle_weight,
    moeplug_shuffle_scale,
    moeplug_pad_weights,
    moeplug_swizzle_scale,
    moeplug_quantize_mx,
    moeplug_prepare_moe_sizes,
    moeplug_prepare_moe,
);
