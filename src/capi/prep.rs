//! Weight preparation exports (docs/abi.md §7). Each reads its argument struct, validates the
//! tensors (one location, dtypes, exact shapes, no overlap) and calls `crate::prep`.
//! Host tensors run synchronously on the calling thread (and its worker threads). Device
//! tensors (CUDA; ROCm once the HIP backend is validated) go through the same validation and
//! then run the same steps (`crate::prep::steps`) as kernels on the caller's `stream`
//! (`backend::gpu::prep`): no allocation, no synchronization, byte-identical results.

use super::args::{
    enum_or, flag, optional_tensor, out_struct_size, read_struct, tensor, write_struct,
};
use super::panic::{guard, symver};
use super::status;
use super::types::*;
use crate::backend::gpu::prep as gpu_prep;
use crate::backend::gpu::Vendor;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::prep::steps::Step;
use crate::prep::{pad, prepare, scale, shuffle, swizzle};
use crate::quant::{self, MxDtype, MxSource};
use crate::runtime::progress;
use crate::tensor::{DeviceKind, ElemType, Tensor};
use crate::types::{ActDtype, GateMode, RoundMode, ScaleLayout, WeightFormat};

/// Where the call runs: None for host tensors, else the one device every tensor is on
/// (mixed locations are INVALID_ARGUMENT naming the tensor). Device work goes to
/// `backend::gpu::prep` after the same validation as host work.
fn location(tensors: &[&Tensor]) -> Result<Option<(Vendor, i32)>> {
    gpu_prep::location(tensors)
}

/// The alignment `host_slice` demands of host tensors, asked of device tensors too, so that
/// both answer alike.
fn check_align(t: &Tensor, align: usize) -> Result<()> {
    if (t.ptr as usize) % align != 0 {
        crate::bail!(
            invalid,
            "{}: data address {:p} is not aligned to {} bytes",
            t.name,
            t.ptr,
            align
        );
    }
    Ok(())
}

/// `dst` must not share bytes with `src`.
fn no_overlap(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.overlaps(src) {
        return Err(Error::invalid(format!(
            "{}: overlaps {} (the output may not alias an input)",
            dst.name, src.name
        )));
    }
    Ok(())
}

/// Same storage type: equal, or both 1-byte with one of them given as uint8 (raw bytes).
fn same_storage(dst: &Tensor, src: &Tensor) -> Result<()> {
    let ok = dst.elem == src.elem
        || (dst.elem.is_byte()
            && src.elem.is_byte()
            && (dst.elem == ElemType::U8 || src.elem == ElemType::U8));
    if !ok {
        return Err(Error::invalid(format!(
            "{}: expected dtype {} (like {}), got {}",
            dst.name,
            src.elem.name(),
            src.name,
            dst.elem.name()
        )));
    }
    Ok(())
}

/// A non-negative integer field, 0 → `default`.
fn count_or(raw: i64, default: usize, name: &str) -> Result<usize> {
    match raw {
        0 => Ok(default),
        r if r < 0 => Err(Error::invalid(format!(
            "{name}: expected >= 0 (0 = default {default}), got {r}"
        ))),
        r => Ok(r as usize),
    }
}

/// AITER `shuffle_weight` (docs/layouts.md F1/F2) from `args->src` into `args->dst`, both
/// `[..., N, K]` (packed fp4 as `{17, 4, 1}` logical or uint8 bytes; K in storage elements
/// for the divisibility rules). `layout_n`/`layout_k` 0 → 16. `dst` has `src`'s shape, with K
/// rounded up to `pad_k_to` when that is > 0 (zero padding). `gate_up` requires
/// `is_guinterleave` (a 3-D `[E, N, K]`). Host tensors run synchronously (`stream` unused);
/// device tensors (all on one device, else INVALID_ARGUMENT) are written by kernels queued on
/// `stream` (NULL = the default stream), byte-identical to the host result. The same holds
/// for every prep call.
#[no_mangle]
pub unsafe extern "C" fn moeplug_shuffle_weight(
    args: *const moeplug_shuffle_weight_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_shuffle_weight", || {
        let a = read_struct(args, "args")?;
        let src = tensor(a.src, "src")?;
        let dst = tensor(a.dst, "dst")?;
        let at = location(&[&src, &dst])?;
        if src.elem.size() > 2 {
            crate::bail!(
                invalid,
                "src: expected a 1- or 2-byte dtype, got {}",
                src.elem.name()
            );
        }
        same_storage(&dst, &src)?;
        let params = shuffle::ShuffleWeightParams {
            layout_n: count_or(a.layout_n as i64, 16, "layout_n")?,
            layout_k: count_or(a.layout_k as i64, 16, "layout_k")?,
            use_int4: flag(a.use_int4),
            is_guinterleave: flag(a.is_guinterleave),
            gate_up: flag(a.gate_up),
            pad_k_to: count_or(a.pad_k_to, 0, "pad_k_to")?,
        };
        let plan = shuffle::plan_shuffle_weight("src", &src.shape, src.elem.size(), &params)?;
        dst.expect_shape(&plan.out_shape)?;
        no_overlap(&dst, &src)?;
        match at {
            None => shuffle::shuffle_weight(&plan, src.host_bytes(), dst.host_bytes_mut()),
            Some((v, id)) => gpu_prep::run_step(v, id, stream, &shuffle::step(&plan), &src, &dst),
        }
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
        let src = tensor(a.src, "src")?;
        let dst = tensor(a.dst, "dst")?;
        let at = location(&[&src, &dst])?;
        src.expect_ndim(2)?;
        same_storage(&dst, &src)?;
        if a.num_experts < 0 {
            crate::bail!(invalid, "num_experts: expected >= 0, got {}", a.num_experts);
        }
        let (gui, gate_up) = (flag(a.is_guinterleave), flag(a.gate_up));
        if gate_up && !gui {
            crate::bail!(invalid, "gate_up: requires is_guinterleave");
        }
        if src.elem == ElemType::F32 {
            dst.expect_shape(&src.shape)?;
            no_overlap(&dst, &src)?;
            return match at {
                None => {
                    dst.host_bytes_mut().copy_from_slice(src.host_bytes());
                    Ok(())
                }
                Some((v, id)) => {
                    gpu_prep::run_step(v, id, stream, &Step::copy(src.nbytes()), &src, &dst)
                }
            };
        }
        if !src.elem.is_byte() {
            crate::bail!(
                invalid,
                "src: expected dtype float8_e8m0fnu, uint8 or float32, got {}",
                src.elem.name()
            );
        }
        let (m, n) = (src.dim(0), src.dim(1));
        if gui {
            let shape = scale::plan_shuffle_scale_gui("src", m, n, a.num_experts as usize)?;
            dst.expect_shape(&shape)?;
            no_overlap(&dst, &src)?;
            let ne = a.num_experts as usize;
            match at {
                None => scale::shuffle_scale_gui(
                    src.host_bytes(),
                    m,
                    n,
                    ne,
                    gate_up,
                    dst.host_bytes_mut(),
                ),
                Some((v, id)) => {
                    let step = scale::gui_step(m, n, ne, gate_up);
                    gpu_prep::run_step(v, id, stream, &step, &src, &dst)?
                }
            }
        } else {
            dst.expect_shape(&scale::f3_shape(m, n))?;
            no_overlap(&dst, &src)?;
            match at {
                None => scale::shuffle_scale(src.host_bytes(), m, n, dst.host_bytes_mut()),
                Some((v, id)) => {
                    gpu_prep::run_step(v, id, stream, &scale::f3_step(m, n), &src, &dst)?
                }
            }
        }
        Ok(())
    }))
}

/// The bytes of one element of `elem` holding `fill`, or INVALID_ARGUMENT when `fill` is not
/// exactly representable. 0 is always zero bytes.
fn fill_bytes(elem: ElemType, fill: f64) -> Result<Vec<u8>> {
    let size = elem.size();
    if fill == 0.0 {
        return Ok(vec![0; size]);
    }
    let not_exact = || {
        Error::invalid(format!(
            "fill: {fill} is not exactly representable in {}",
            elem.name()
        ))
    };
    let int = |lo: f64, hi: f64| -> Result<i64> {
        if fill.fract() != 0.0 || fill < lo || fill > hi {
            return Err(not_exact());
        }
        Ok(fill as i64)
    };
    let bytes = match elem {
        ElemType::U8 => vec![int(0.0, 255.0)? as u8],
        ElemType::I8 => vec![int(-128.0, 127.0)? as i8 as u8],
        ElemType::I32 => (int(i32::MIN as f64, i32::MAX as f64)? as i32)
            .to_le_bytes()
            .to_vec(),
        ElemType::I64 => int(-(2f64.powi(63)), 2f64.powi(63) - 1.0)?
            .to_le_bytes()
            .to_vec(),
        ElemType::F32 => {
            let v = fill as f32;
            if v as f64 != fill {
                return Err(not_exact());
            }
            v.to_le_bytes().to_vec()
        }
        ElemType::F16 => {
            let v = half::f16::from_f64(fill);
            if v.to_f64() != fill {
                return Err(not_exact());
            }
            v.to_le_bytes().to_vec()
        }
        ElemType::Bf16 => {
            let v = half::bf16::from_f64(fill);
            if v.to_f64() != fill {
                return Err(not_exact());
            }
            v.to_le_bytes().to_vec()
        }
        ElemType::Fp8E4m3fn => {
            let b = quant::f32_to_fp8_e4m3fn(fill as f32);
            if quant::fp8_e4m3fn_to_f32(b) as f64 != fill {
                return Err(not_exact());
            }
            vec![b]
        }
        ElemType::Fp8E4m3fnuz => {
            let b = quant::f32_to_fp8_e4m3fnuz(fill as f32);
            if quant::fp8_e4m3fnuz_to_f32(b) as f64 != fill {
                return Err(not_exact());
            }
            vec![b]
        }
        ElemType::E8m0 => {
            // Code 0x00 is 2^-127 (a subnormal f32), 0xFF is NaN.
            let b = (0..=254u8).find(|&b| quant::e8m0_to_f32(b) as f64 == fill);
            vec![b.ok_or_else(not_exact)?]
        }
        ElemType::Fp4x2 => {
            let c = quant::f32_to_e2m1(fill as f32);
            if quant::e2m1_to_f32(c) as f64 != fill {
                return Err(not_exact());
            }
            vec![quant::pack_fp4x2(c, c)]
        }
    };
    Ok(bytes)
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
        let src = tensor(a.src, "src")?;
        let dst = tensor(a.dst, "dst")?;
        let at = location(&[&src, &dst])?;
        same_storage(&dst, &src)?;
        let as3 = |t: &Tensor| -> Result<[usize; 3]> {
            match t.shape[..] {
                [e, n, k] => Ok([e, n, k]),
                [e, n] => Ok([e, n, 1]),
                _ => Err(Error::invalid(format!(
                    "{}: expected [E, N, K] or [E, N], got shape {}",
                    t.name,
                    t.shape_str()
                ))),
            }
        };
        let s3 = as3(&src)?;
        dst.expect_ndim(src.ndim())?;
        let d3 = as3(&dst)?;
        let gate_up = flag(a.gate_up);
        pad::plan_pad(s3, d3, gate_up)?;
        if !a.fill.is_finite() {
            crate::bail!(invalid, "fill: expected a finite value, got {}", a.fill);
        }
        let fill = fill_bytes(src.elem, a.fill)?;
        no_overlap(&dst, &src)?;
        match at {
            None => {
                pad::pad_weights(
                    src.host_bytes(),
                    s3,
                    dst.host_bytes_mut(),
                    d3,
                    gate_up,
                    &fill,
                );
                Ok(())
            }
            Some((v, id)) => {
                let step = pad::step(s3, d3, gate_up, &fill);
                gpu_prep::run_step(v, id, stream, &step, &src, &dst)
            }
        }
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
        let layout = enum_or(a.layout, ScaleLayout::Cdna4Swizzle, |r| {
            ScaleLayout::from_raw("layout", r)
        })?;
        let src = tensor(a.src, "src")?;
        let dst = tensor(a.dst, "dst")?;
        let at = location(&[&src, &dst])?;
        src.expect_elem(&[ElemType::E8m0, ElemType::U8])?;
        same_storage(&dst, &src)?;
        src.expect_ndim(3)?;
        let (e, n, ks) = (src.dim(0), src.dim(1), src.dim(2));
        match layout {
            ScaleLayout::Cdna4Swizzle => {
                dst.expect_shape(&swizzle::cdna4_shape(e, n, ks))?;
                no_overlap(&dst, &src)?;
                match at {
                    None => {
                        swizzle::swizzle_cdna4(src.host_bytes(), e, n, ks, dst.host_bytes_mut())
                    }
                    Some((v, id)) => {
                        let step = swizzle::cdna4_step(e, n, ks);
                        gpu_prep::run_step(v, id, stream, &step, &src, &dst)?
                    }
                }
            }
            ScaleLayout::AiterE8m0 => {
                dst.expect_shape(&scale::f3_shape(e * n, ks))?;
                no_overlap(&dst, &src)?;
                match at {
                    None => scale::shuffle_scale(src.host_bytes(), e * n, ks, dst.host_bytes_mut()),
                    Some((v, id)) => {
                        let step = scale::f3_step(e * n, ks);
                        gpu_prep::run_step(v, id, stream, &step, &src, &dst)?
                    }
                }
            }
            ScaleLayout::Plain => {
                crate::bail!(
                    unsupported,
                    "layout: plain is not a swizzle (expected 2 aiter_e8m0 or 3 cdna4_swizzle)"
                );
            }
        }
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
        let format = enum_or(a.format, WeightFormat::Mxfp4, |r| {
            WeightFormat::from_raw("format", r)
        })?;
        if !format.is_mx() {
            crate::bail!(
                invalid,
                "format: expected 6 mxfp4 or 7 mxfp8, got {} {}",
                a.format,
                format.label()
            );
        }
        let mode = enum_or(a.round_mode, RoundMode::Up, |r| {
            RoundMode::from_raw("round_mode", r)
        })?;
        let src = tensor(a.src, "src")?;
        let q = tensor(a.dst_q, "dst_q")?;
        let sc = tensor(a.dst_scale, "dst_scale")?;
        let at = location(&[&src, &q, &sc])?;
        src.expect_elem(&[ElemType::F32, ElemType::Bf16, ElemType::F16])?;
        if src.ndim() == 0 {
            crate::bail!(
                invalid,
                "src: expected at least 1 dimension [..., K], got shape []"
            );
        }
        let k = src.shape[src.ndim() - 1];
        if k % 32 != 0 {
            crate::bail!(invalid, "src: K = {k} must be a multiple of 32 (MX block)");
        }
        let rows = src.numel() / k.max(1);
        let lead = &src.shape[..src.ndim() - 1];
        let dtype = if format == WeightFormat::Mxfp4 {
            q.expect_elem(&[ElemType::Fp4x2, ElemType::U8])?;
            MxDtype::Fp4E2m1
        } else {
            q.expect_elem(&[ElemType::Fp8E4m3fn, ElemType::Fp8E4m3fnuz])?;
            if q.elem == ElemType::Fp8E4m3fn {
                MxDtype::Fp8E4m3
            } else {
                MxDtype::Fp8E4m3Fnuz
            }
        };
        let mut q_shape = src.shape.clone();
        if dtype == MxDtype::Fp4E2m1 {
            q_shape[src.ndim() - 1] = k / 2;
        }
        q.expect_shape(&q_shape)?;
        sc.expect_elem(&[ElemType::E8m0, ElemType::U8])?;
        let shuffled = flag(a.shuffle_scale);
        if shuffled {
            sc.expect_shape(&scale::f3_shape(rows, k / 32))?;
        } else {
            let mut nd = lead.to_vec();
            nd.push(k / 32);
            if sc.shape != [rows, k / 32] && sc.shape != nd {
                crate::bail!(
                    invalid,
                    "dst_scale: expected shape [{rows}, {}] or {}, got {}",
                    k / 32,
                    crate::tensor::format_shape(&nd),
                    sc.shape_str()
                );
            }
        }
        no_overlap(&q, &src)?;
        no_overlap(&sc, &src)?;
        no_overlap(&sc, &q)?;
        if let Some((v, id)) = at {
            let (src_type, align) = match src.elem {
                ElemType::F32 => (0, 4),
                ElemType::Bf16 => (1, 2),
                _ => (2, 2),
            };
            check_align(&src, align)?;
            let sn = if shuffled {
                scale::f3_shape(rows, k / 32)[1]
            } else {
                0
            };
            return gpu_prep::quantize_mx(
                v,
                id,
                stream,
                &src,
                src_type,
                &q,
                &sc,
                k / 32,
                sn,
                mode,
                dtype,
            );
        }
        let source = match src.elem {
            ElemType::F32 => MxSource::F32(src.host_slice::<f32>()?),
            ElemType::Bf16 => MxSource::Bf16(src.host_slice::<half::bf16>()?),
            _ => MxSource::F16(src.host_slice::<half::f16>()?),
        };
        let written = (q.nbytes() + sc.nbytes()) as u64;
        progress::task("moeplug_quantize_mx", written, || {
            if shuffled {
                let mut raw = vec![0u8; rows * (k / 32)];
                quant::quantize_mx(source, k, mode, dtype, q.host_bytes_mut(), &mut raw);
                scale::shuffle_scale(&raw, rows, k / 32, sc.host_bytes_mut());
            } else {
                quant::quantize_mx(
                    source,
                    k,
                    mode,
                    dtype,
                    q.host_bytes_mut(),
                    sc.host_bytes_mut(),
                );
            }
            Ok(())
        })
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

/// Everything `prepare_moe_sizes` and `prepare_moe` read from the arguments.
struct PrepareRequest {
    plan: prepare::PreparedShapes,
    w13: Tensor,
    w2: Tensor,
    w13_scale: Option<Tensor>,
    w2_scale: Option<Tensor>,
    w13_bias: Option<Tensor>,
    w2_bias: Option<Tensor>,
}

unsafe fn read_prepare(
    a: &moeplug_prepare_moe_args,
    read: unsafe fn(*const moeplug_tensor, &'static str) -> Result<Option<Tensor>>,
) -> Result<PrepareRequest> {
    if a.weight_format == 0 {
        crate::bail!(
            invalid,
            "weight_format: required (it has no default), got 0"
        );
    }
    let format = WeightFormat::from_raw("weight_format", a.weight_format)?;
    let gate_mode_in = enum_or(a.gate_mode_in, GateMode::Separated, |r| {
        GateMode::from_raw("gate_mode_in", r)
    })?;
    let device = enum_or(a.device_type, DeviceKind::Cpu, |r| {
        DeviceKind::from_raw("device_type", r)
    })?;
    // The CPU and the CUDA fused_moe read the same layout; which memory the tensors live in
    // is independent of the target.
    match device {
        DeviceKind::Cpu | DeviceKind::Cuda => {}
        DeviceKind::Rocm => {
            crate::backend::gpu::backend(Vendor::Hip, a.device_id)?;
        }
        _ => crate::bail!(
            unsupported,
            "device_type: prepare_moe produces layouts for the CPU and CUDA backends, got {}",
            device.name()
        ),
    }
    if a.act_dtype != 0 {
        let act = ActDtype::from_raw("act_dtype", a.act_dtype)?;
        if !format.allowed_act_dtypes().contains(&act) {
            crate::bail!(
                unsupported,
                "act_dtype: {} cannot be used with weight_format {}",
                act.label(),
                format.label()
            );
        }
    }
    let align = |v: i32, name: &str| count_or(v as i64, 0, name);
    let hidden_align = align(a.hidden_align, "hidden_align")?;
    let intermediate_align = align(a.intermediate_align, "intermediate_align")?;
    let need = |t: Option<Tensor>, name: &str| {
        t.ok_or_else(|| Error::invalid(format!("{name}: must not be NULL")))
    };
    let w13 = need(read(a.w13, "w13")?, "w13")?;
    let w2 = need(read(a.w2, "w2")?, "w2")?;
    let w13_scale = read(a.w13_scale, "w13_scale")?;
    let w2_scale = read(a.w2_scale, "w2_scale")?;
    let w13_bias = read(a.w13_bias, "w13_bias")?;
    let w2_bias = read(a.w2_bias, "w2_bias")?;

    let weight_types: &[ElemType] = match format {
        WeightFormat::Bf16 => &[ElemType::Bf16],
        WeightFormat::Fp16 => &[ElemType::F16],
        WeightFormat::Mxfp4 => &[ElemType::Fp4x2, ElemType::U8],
        _ => &[ElemType::Fp8E4m3fn, ElemType::Fp8E4m3fnuz, ElemType::U8],
    };
    w13.expect_elem(weight_types)?;
    w2.expect_elem(weight_types)?;
    if w2.elem != w13.elem {
        crate::bail!(
            invalid,
            "w2: expected dtype {} (like w13), got {}",
            w13.elem.name(),
            w2.elem.name()
        );
    }
    let scale_types: &[ElemType] = if format.is_mx() {
        &[ElemType::E8m0, ElemType::U8]
    } else {
        &[ElemType::F32]
    };
    for s in [&w13_scale, &w2_scale].into_iter().flatten() {
        s.expect_elem(scale_types)?;
    }
    for b in [&w13_bias, &w2_bias].into_iter().flatten() {
        b.expect_elem(&[ElemType::F32])?;
    }
    let spec = prepare::PrepareSpec {
        format,
        gate_mode_in,
        hidden_align,
        intermediate_align,
        w13: w13.shape.clone(),
        w2: w2.shape.clone(),
        w13_scale: w13_scale.as_ref().map(|t| t.shape.clone()),
        w2_scale: w2_scale.as_ref().map(|t| t.shape.clone()),
        w13_bias: w13_bias.as_ref().map(|t| t.shape.clone()),
        w2_bias: w2_bias.as_ref().map(|t| t.shape.clone()),
    };
    let plan = prepare::plan(&spec)?;
    Ok(PrepareRequest {
        plan,
        w13,
        w2,
        w13_scale,
        w2_scale,
        w13_bias,
        w2_bias,
    })
}

fn layout_record(l: &Layout) -> moeplug_layout {
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
        flags: l.flags(),
        reserved0: 0,
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
        let p = &req.plan;
        let (w13_ndim, w13_shape) = shape4(Some(&p.w13));
        let (w13_scale_ndim, w13_scale_shape) = shape4(p.w13_scale.as_ref());
        let (w13_bias_ndim, w13_bias_shape) = shape4(p.w13_bias.as_ref());
        let (w2_ndim, w2_shape) = shape4(Some(&p.w2));
        let (w2_scale_ndim, w2_scale_shape) = shape4(p.w2_scale.as_ref());
        let (w2_bias_ndim, w2_bias_shape) = shape4(p.w2_bias.as_ref());
        // The nested record is as long as the caller's struct leaves room for (a 1.0 caller:
        // the 1.0 record).
        let mut layout = layout_record(&p.layout);
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

/// An output tensor matching its planned shape and its input's dtype, or None if unplanned.
unsafe fn output(
    ptr: *const moeplug_tensor,
    name: &'static str,
    planned: Option<&Vec<usize>>,
    like: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let t = optional_tensor(ptr, name)?;
    match (planned, t, like) {
        (None, None, _) => Ok(None),
        (None, Some(_), _) => Err(Error::invalid(format!(
            "{name}: must be NULL (its input is absent)"
        ))),
        (Some(_), None, _) => Err(Error::invalid(format!("{name}: must not be NULL"))),
        (Some(shape), Some(t), like) => {
            if let Some(like) = like {
                same_storage(&t, like)?;
            }
            t.expect_shape(shape)?;
            Ok(Some(t))
        }
    }
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
/// `*out_layout` (caller sets `struct_size`) is written on success.
#[no_mangle]
pub unsafe extern "C" fn moeplug_prepare_moe(
    args: *const moeplug_prepare_moe_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    status(guard("moeplug_prepare_moe", || {
        let a = read_struct(args, "args")?;
        let layout_size = out_struct_size(a.out_layout, "out_layout")?;
        let req = read_prepare(&a, optional_tensor)?;
        let p = &req.plan;
        let inputs = [
            Some(&req.w13),
            Some(&req.w2),
            req.w13_scale.as_ref(),
            req.w2_scale.as_ref(),
            req.w13_bias.as_ref(),
            req.w2_bias.as_ref(),
        ];
        let ins: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
        location(&ins)?;
        let o13 = output(a.out_w13, "out_w13", Some(&p.w13), Some(&req.w13))?.unwrap();
        let o2 = output(a.out_w2, "out_w2", Some(&p.w2), Some(&req.w2))?.unwrap();
        let o13s = output(
            a.out_w13_scale,
            "out_w13_scale",
            p.w13_scale.as_ref(),
            req.w13_scale.as_ref(),
        )?;
        let o2s = output(
            a.out_w2_scale,
            "out_w2_scale",
            p.w2_scale.as_ref(),
            req.w2_scale.as_ref(),
        )?;
        let o13b = output(
            a.out_w13_bias,
            "out_w13_bias",
            p.w13_bias.as_ref(),
            req.w13_bias.as_ref(),
        )?;
        let o2b = output(
            a.out_w2_bias,
            "out_w2_bias",
            p.w2_bias.as_ref(),
            req.w2_bias.as_ref(),
        )?;
        let outputs = [
            Some(&o13),
            Some(&o2),
            o13s.as_ref(),
            o2s.as_ref(),
            o13b.as_ref(),
            o2b.as_ref(),
        ];
        for (oi, o) in outputs.iter().enumerate() {
            let Some(o) = o else { continue };
            for i in inputs.iter().flatten() {
                no_overlap(o, i)?;
            }
            for o2 in outputs[oi + 1..].iter().flatten() {
                no_overlap(o2, o)?;
            }
        }
        let all: Vec<&Tensor> = inputs.iter().chain(&outputs).flatten().copied().collect();
        if let Some((v, id)) = location(&all)? {
            let addr = |t: Option<&Tensor>| t.map_or(0, |t| t.ptr as u64);
            let steps: Vec<(Step, u64, u64)> = prepare::steps(p)
                .into_iter()
                .map(|(part, step)| {
                    let i = match part {
                        prepare::Part::W13 => 0,
                        prepare::Part::W2 => 1,
                        prepare::Part::W13Scale => 2,
                        prepare::Part::W2Scale => 3,
                        prepare::Part::W13Bias => 4,
                        prepare::Part::W2Bias => 5,
                    };
                    (step, addr(inputs[i]), addr(outputs[i]))
                })
                .collect();
            gpu_prep::run_steps(v, id, stream, &steps)?;
            write_struct(a.out_layout, &layout_record(&p.layout), layout_size);
            return Ok(());
        }
        unsafe fn bytes(t: &Option<Tensor>) -> Option<&[u8]> {
            t.as_ref().map(|t| t.host_bytes())
        }
        // The outputs were checked not to overlap each other or any input above.
        #[allow(clippy::mut_from_ref)]
        unsafe fn bytes_mut(t: &Option<Tensor>) -> Option<&mut [u8]> {
            t.as_ref().map(|t| t.host_bytes_mut())
        }
        let written: usize = outputs.iter().flatten().map(|o| o.nbytes()).sum();
        progress::task("moeplug_prepare_moe", written as u64, || {
            prepare::prepare_host(
                p,
                prepare::PrepareInputs {
                    w13: req.w13.host_bytes(),
                    w2: req.w2.host_bytes(),
                    w13_scale: bytes(&req.w13_scale),
                    w2_scale: bytes(&req.w2_scale),
                    w13_bias: bytes(&req.w13_bias),
                    w2_bias: bytes(&req.w2_bias),
                },
                prepare::PrepareOutputs {
                    w13: o13.host_bytes_mut(),
                    w2: o2.host_bytes_mut(),
                    w13_scale: bytes_mut(&o13s),
                    w2_scale: bytes_mut(&o2s),
                    w13_bias: bytes_mut(&o13b),
                    w2_bias: bytes_mut(&o2b),
                },
            )
        })?;
        write_struct(a.out_layout, &layout_record(&p.layout), layout_size);
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
