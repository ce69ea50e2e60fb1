//! The prep calls as typed requests (docs/abi.md §7). Each request holds the caller's tensors
//! and parameters as read from C; `plan` checks them (one location, dtypes, exact shapes, no
//! overlap) in the order the contract's messages follow and returns a [`PrepJob`]: where it
//! runs, the operations to run, and the layout [`Fragment`] they produce. [`PrepJob::run`]
//! hands the job to the backend that owns the memory (`Backend::run_prep`); host memory runs
//! [`run_host`] on the calling thread, device memory the same steps as kernels on `stream`.

use std::sync::Arc;

use super::steps::{self, Step};
use super::{pad, prepare, scale, shuffle, swizzle};
use crate::backend::{self, Backend};
use crate::error::{Error, Result};
use crate::layout::{Fragment, Layout};
use crate::quant::{self, MxDtype, MxSource};
use crate::tensor::{DeviceKind, ElemType, Tensor};
use crate::types::{
    enum_or, ActDtype, AiterTarget, GateMode, RoundMode, ScaleLayout, WeightFormat, WeightLayout,
};

/// Where a prep call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Every tensor is host memory.
    Host,
    /// Every non-host tensor is on this device (the first tensor's device kind).
    Device(DeviceKind, i32),
}

/// The runtime that serves memory of `kind` (None for host memory): managed CUDA memory is
/// CUDA memory.
fn runtime_of(kind: DeviceKind) -> Option<DeviceKind> {
    match kind {
        DeviceKind::Cuda | DeviceKind::CudaManaged => Some(DeviceKind::Cuda),
        DeviceKind::Rocm => Some(DeviceKind::Rocm),
        _ => None,
    }
}

/// Host when every tensor is host memory, else the one device all of them are on. A mix is
/// INVALID_ARGUMENT naming the first tensor that differs.
pub fn location(tensors: &[&Tensor]) -> Result<Location> {
    let Some(first) = tensors.iter().find(|t| !t.device.is_host()) else {
        return Ok(Location::Host);
    };
    let runtime = runtime_of(first.device);
    for t in tensors {
        if runtime_of(t.device) != runtime || t.device_id != first.device_id {
            return Err(Error::invalid(format!(
                "{}: expected device {}:{} like {} (inputs and outputs of a prep call must be \
                 on one device), got {}:{}",
                t.name,
                first.device.name(),
                first.device_id,
                first.name,
                t.device.name(),
                t.device_id
            )));
        }
    }
    match runtime {
        Some(_) => Ok(Location::Device(first.device, first.device_id)),
        None => Err(Error::unsupported(format!(
            "{}: device {} is not supported by prep",
            first.name,
            first.device.name()
        ))),
    }
}

/// MX quantization of every 32-element block of `src` along its last dimension (`k`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizeOp {
    /// Indexes into [`PrepJob::tensors`].
    pub src: usize,
    pub q: usize,
    pub scale: usize,
    pub rows: usize,
    pub k: usize,
    /// Scales written F3-shuffled ([`scale::f3_shape`] of `[rows, k/32]`, padding 0x00).
    pub shuffled: bool,
    pub mode: RoundMode,
    pub dtype: MxDtype,
}

/// One operation of a job; tensors are indexes into [`PrepJob::tensors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepOp {
    Step {
        step: Step,
        src: usize,
        dst: usize,
    },
    /// Pack the int8-held int4 values of `src` as `format` stores them (each checked to lie
    /// in [-8, 7]; [`prepare::pack_int4_input`]), then run `step` over the packed bytes.
    /// Host only.
    PackInt4 {
        format: WeightFormat,
        step: Step,
        src: usize,
        dst: usize,
    },
    QuantizeMx(QuantizeOp),
}

/// A checked prep call: what to run, where, and what it produces.
#[derive(Debug, Clone)]
pub struct PrepJob {
    pub location: Location,
    pub tensors: Vec<Tensor>,
    /// Run in order (outputs never overlap inputs or each other).
    pub ops: Vec<PrepOp>,
    /// What the operations establish about the layout of the outputs.
    pub fragment: Fragment,
}

impl PrepJob {
    fn step(location: Location, src: Tensor, dst: Tensor, step: Step, fragment: Fragment) -> Self {
        PrepJob {
            location,
            tensors: vec![src, dst],
            ops: vec![PrepOp::Step {
                step,
                src: 0,
                dst: 1,
            }],
            fragment,
        }
    }

    /// The backend that owns the job's memory.
    pub fn backend(&self) -> Result<Arc<dyn Backend>> {
        match self.location {
            Location::Host => Ok(backend::cpu::backend()),
            Location::Device(kind, id) => backend::for_device(kind, id),
        }
    }

    /// Run the job on its backend; device work is queued on `stream` (NULL = default stream).
    ///
    /// # Safety
    /// Every tensor names memory of its size that stays valid for the call (host) or until the
    /// stream reaches the work (device), as the C contract promises.
    pub unsafe fn run(&self, stream: *mut libc::c_void) -> Result<()> {
        self.backend()?.run_prep(self, stream as usize)
    }

    /// [`PrepJob::run`], reporting progress of a host job as `operation` writing `total`
    /// bytes (the ABI 1.1 progress callback; device work is queued, not reported).
    ///
    /// # Safety
    /// As [`PrepJob::run`].
    pub unsafe fn run_reporting(
        &self,
        stream: *mut libc::c_void,
        operation: &'static str,
        total: u64,
    ) -> Result<()> {
        match self.location {
            Location::Host => crate::runtime::progress::task(operation, total, || self.run(stream)),
            Location::Device(..) => self.run(stream),
        }
    }
}

/// The host path of a job (the CPU backend's `run_prep`).
///
/// # Safety
/// As [`PrepJob::run`].
pub unsafe fn run_host(job: &PrepJob) -> Result<()> {
    for t in &job.tensors {
        t.expect_host()?;
    }
    let t = &job.tensors;
    for op in &job.ops {
        match *op {
            PrepOp::Step { step, src, dst } => {
                let (s, d) = (t[src].host_bytes(), t[dst].host_bytes_mut());
                if s.len() != step.src_bytes() || d.len() != step.dst_bytes {
                    return Err(Error::internal(format!(
                        "prep: {} / {} hold {} / {} bytes, the step reads {} and writes {}",
                        t[src].name,
                        t[dst].name,
                        s.len(),
                        d.len(),
                        step.src_bytes(),
                        step.dst_bytes
                    )));
                }
                steps::run_host(&step, s, d);
            }
            PrepOp::PackInt4 {
                format,
                step,
                src,
                dst,
            } => {
                let packed = prepare::pack_int4_input(format, t[src].name, t[src].host_bytes())?;
                let d = t[dst].host_bytes_mut();
                if packed.len() != step.src_bytes() || d.len() != step.dst_bytes {
                    return Err(Error::internal(format!(
                        "prep: {} packs to {} bytes and {} holds {}, the step reads {} and writes {}",
                        t[src].name,
                        packed.len(),
                        t[dst].name,
                        d.len(),
                        step.src_bytes(),
                        step.dst_bytes
                    )));
                }
                steps::run_host(&step, &packed, d);
            }
            PrepOp::QuantizeMx(q) => {
                let src = &t[q.src];
                let source = match src.elem {
                    ElemType::F32 => MxSource::F32(src.host_slice::<f32>()?),
                    ElemType::Bf16 => MxSource::Bf16(src.host_slice::<half::bf16>()?),
                    _ => MxSource::F16(src.host_slice::<half::f16>()?),
                };
                let (qb, sb) = (t[q.q].host_bytes_mut(), t[q.scale].host_bytes_mut());
                if q.shuffled {
                    let mut raw = vec![0u8; q.rows * (q.k / 32)];
                    quant::quantize_mx(source, q.k, q.mode, q.dtype, qb, &mut raw);
                    scale::shuffle_scale(&raw, q.rows, q.k / 32, sb);
                } else {
                    quant::quantize_mx(source, q.k, q.mode, q.dtype, qb, sb);
                }
            }
        }
    }
    Ok(())
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

/// The weight format a weight dtype alone determines (None where several share it: fp8 and
/// raw bytes).
fn format_of_weight(elem: ElemType) -> Option<WeightFormat> {
    match elem {
        ElemType::Bf16 => Some(WeightFormat::Bf16),
        ElemType::F16 => Some(WeightFormat::Fp16),
        ElemType::Fp4x2 => Some(WeightFormat::Mxfp4),
        _ => None,
    }
}

/// AITER `shuffle_weight` (docs/layouts.md F1/F2): `src` `[..., N, K]` into `dst`.
#[derive(Debug, Clone)]
pub struct ShuffleWeight {
    pub src: Tensor,
    pub dst: Tensor,
    /// 0 → 16.
    pub layout_n: i64,
    pub layout_k: i64,
    pub use_int4: bool,
    pub is_guinterleave: bool,
    pub gate_up: bool,
    /// 0 → no K padding.
    pub pad_k_to: i64,
}

impl ShuffleWeight {
    pub fn plan(self) -> Result<PrepJob> {
        let (src, dst) = (self.src, self.dst);
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
            layout_n: count_or(self.layout_n, 16, "layout_n")?,
            layout_k: count_or(self.layout_k, 16, "layout_k")?,
            use_int4: self.use_int4,
            is_guinterleave: self.is_guinterleave,
            gate_up: self.gate_up,
            pad_k_to: count_or(self.pad_k_to, 0, "pad_k_to")?,
        };
        let plan = shuffle::plan_shuffle_weight("src", &src.shape, src.elem.size(), &params)?;
        dst.expect_shape(&plan.out_shape)?;
        no_overlap(&dst, &src)?;
        // Only F1 with the (16, 16) tiles is a layout fused_moe reads (AITER_16x16).
        let f1_16 = !params.is_guinterleave
            && !params.use_int4
            && (params.layout_n, params.layout_k) == (16, 16);
        let fragment = Fragment {
            weight_format: format_of_weight(src.elem),
            weight_layout: f1_16.then_some(WeightLayout::Aiter16x16),
            ..Fragment::default()
        };
        let step = shuffle::step(&plan);
        Ok(PrepJob::step(at, src, dst, step, fragment))
    }
}

/// AITER `shuffle_scale` / `e8m0_shuffle` (docs/layouts.md F3/F4) of `src` `[m, n]`.
#[derive(Debug, Clone)]
pub struct ShuffleScale {
    pub src: Tensor,
    pub dst: Tensor,
    pub num_experts: i32,
    pub is_guinterleave: bool,
    pub gate_up: bool,
}

impl ShuffleScale {
    pub fn plan(self) -> Result<PrepJob> {
        let (src, dst) = (self.src, self.dst);
        let at = location(&[&src, &dst])?;
        src.expect_ndim(2)?;
        same_storage(&dst, &src)?;
        if self.num_experts < 0 {
            crate::bail!(
                invalid,
                "num_experts: expected >= 0, got {}",
                self.num_experts
            );
        }
        let (gui, gate_up) = (self.is_guinterleave, self.gate_up);
        if gate_up && !gui {
            crate::bail!(invalid, "gate_up: requires is_guinterleave");
        }
        if src.elem == ElemType::F32 {
            // AITER returns fp32 scales as they are.
            dst.expect_shape(&src.shape)?;
            no_overlap(&dst, &src)?;
            let step = Step::copy(src.nbytes());
            return Ok(PrepJob::step(at, src, dst, step, Fragment::default()));
        }
        if !src.elem.is_byte() {
            crate::bail!(
                invalid,
                "src: expected dtype float8_e8m0fnu, uint8 or float32, got {}",
                src.elem.name()
            );
        }
        let (m, n) = (src.dim(0), src.dim(1));
        let (step, fragment) = if gui {
            let ne = self.num_experts as usize;
            let shape = scale::plan_shuffle_scale_gui("src", m, n, ne)?;
            dst.expect_shape(&shape)?;
            no_overlap(&dst, &src)?;
            // F4 is no scale layout fused_moe reads: nothing to report.
            (scale::gui_step(m, n, ne, gate_up), Fragment::default())
        } else {
            dst.expect_shape(&scale::f3_shape(m, n))?;
            no_overlap(&dst, &src)?;
            let fragment = Fragment {
                scale_layout: Some(ScaleLayout::AiterE8m0),
                ..Fragment::default()
            };
            (scale::f3_step(m, n), fragment)
        };
        Ok(PrepJob::step(at, src, dst, step, fragment))
    }
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
        ElemType::U32 => (int(0.0, u32::MAX as f64)? as u32).to_le_bytes().to_vec(),
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

/// Padding of `src` `[E, N, K]` into `dst` `[E, N', K']` (or `[E, N]` into `[E, N']`).
#[derive(Debug, Clone)]
pub struct PadWeights {
    pub src: Tensor,
    pub dst: Tensor,
    pub gate_up: bool,
    pub fill: f64,
}

impl PadWeights {
    pub fn plan(self) -> Result<PrepJob> {
        let (src, dst) = (self.src, self.dst);
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
        let gate_up = self.gate_up;
        pad::plan_pad(s3, d3, gate_up)?;
        if !self.fill.is_finite() {
            crate::bail!(invalid, "fill: expected a finite value, got {}", self.fill);
        }
        let fill = fill_bytes(src.elem, self.fill)?;
        no_overlap(&dst, &src)?;
        let fragment = pad_fragment(&src, s3, d3, gate_up);
        let step = pad::step(s3, d3, gate_up, &fill);
        Ok(PrepJob::step(at, src, dst, step, fragment))
    }
}

/// What a padding establishes: of a 3-D weight (a dtype only weights have) with `gate_up`,
/// w13 `[E, 2I, H]` padded to `[E, 2Ip, Hp]` in SEPARATED order; without, w2 `[E, H, I]`
/// padded to `[E, Hp, Ip]`. Scales, biases and raw bytes report the expert count only.
fn pad_fragment(src: &Tensor, s3: [usize; 3], d3: [usize; 3], gate_up: bool) -> Fragment {
    let mut f = Fragment {
        num_experts: Some(s3[0]),
        ..Fragment::default()
    };
    let values = match src.elem {
        ElemType::Bf16 | ElemType::F16 | ElemType::Fp8E4m3fn | ElemType::Fp8E4m3fnuz => 1,
        ElemType::Fp4x2 => 2,
        _ => return f,
    };
    if src.ndim() != 3 {
        return f;
    }
    f.weight_format = format_of_weight(src.elem);
    let ([_, n, k], [_, n2, k2]) = (s3, d3);
    if gate_up {
        f.gate_mode = Some(GateMode::Separated);
        f.intermediate_size = Some(n / 2);
        f.intermediate_padded = Some(n2 / 2);
        f.hidden_size = Some(k * values);
        f.hidden_padded = Some(k2 * values);
    } else {
        f.hidden_size = Some(n);
        f.hidden_padded = Some(n2);
        f.intermediate_size = Some(k * values);
        f.intermediate_padded = Some(k2 * values);
    }
    f
}

/// Scale swizzle of an e8m0 `src` `[E, N, K/32]` into `dst` for `layout`.
#[derive(Debug, Clone)]
pub struct SwizzleScale {
    pub src: Tensor,
    pub dst: Tensor,
    pub layout: ScaleLayout,
}

impl SwizzleScale {
    pub fn plan(self) -> Result<PrepJob> {
        let (src, dst) = (self.src, self.dst);
        let at = location(&[&src, &dst])?;
        src.expect_elem(&[ElemType::E8m0, ElemType::U8])?;
        same_storage(&dst, &src)?;
        src.expect_ndim(3)?;
        let (e, n, ks) = (src.dim(0), src.dim(1), src.dim(2));
        let step = match self.layout {
            ScaleLayout::Cdna4Swizzle => {
                dst.expect_shape(&swizzle::cdna4_shape(e, n, ks))?;
                no_overlap(&dst, &src)?;
                swizzle::cdna4_step(e, n, ks)
            }
            ScaleLayout::AiterE8m0 => {
                dst.expect_shape(&scale::f3_shape(e * n, ks))?;
                no_overlap(&dst, &src)?;
                scale::f3_step(e * n, ks)
            }
            ScaleLayout::Plain => {
                crate::bail!(
                    unsupported,
                    "layout: plain is not a swizzle (expected 2 aiter_e8m0 or 3 cdna4_swizzle)"
                );
            }
            ScaleLayout::AiterInt4 => {
                crate::bail!(
                    unsupported,
                    "layout: aiter_int4 is the bf16 scale layout of int4_group32 (prepare_moe \
                     writes it), not an e8m0 swizzle (expected 2 aiter_e8m0 or 3 cdna4_swizzle)"
                );
            }
        };
        let fragment = Fragment {
            scale_layout: Some(self.layout),
            num_experts: Some(e),
            ..Fragment::default()
        };
        Ok(PrepJob::step(at, src, dst, step, fragment))
    }
}

/// `quantize_mx`'s `format` (0 → MXFP4): an MX format, `raw` as the caller gave it.
pub fn quantize_format(format: WeightFormat, raw: i32) -> Result<WeightFormat> {
    if !format.is_mx() {
        crate::bail!(
            invalid,
            "format: expected 6 mxfp4 or 7 mxfp8, got {} {}",
            raw,
            format.label()
        );
    }
    Ok(format)
}

/// MX quantization along the last dimension into `dst_q` and e8m0 `dst_scale`.
#[derive(Debug, Clone)]
pub struct QuantizeMx {
    /// From [`quantize_format`].
    pub format: WeightFormat,
    pub mode: RoundMode,
    pub src: Tensor,
    pub dst_q: Tensor,
    pub dst_scale: Tensor,
    pub shuffle_scale: bool,
}

impl QuantizeMx {
    pub fn plan(self) -> Result<PrepJob> {
        let (src, q, sc) = (self.src, self.dst_q, self.dst_scale);
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
        let dtype = if self.format == WeightFormat::Mxfp4 {
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
        let shuffled = self.shuffle_scale;
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
        check_align(&src, src.elem.size())?;
        let fragment = Fragment {
            weight_format: Some(self.format),
            scale_layout: Some(if shuffled {
                ScaleLayout::AiterE8m0
            } else {
                ScaleLayout::Plain
            }),
            ..Fragment::default()
        };
        Ok(PrepJob {
            location: at,
            tensors: vec![src, q, sc],
            ops: vec![PrepOp::QuantizeMx(QuantizeOp {
                src: 0,
                q: 1,
                scale: 2,
                rows,
                k,
                shuffled,
                mode: self.mode,
                dtype,
            })],
            fragment,
        })
    }
}

/// The arguments of `prepare_moe` that are not tensors, checked ([`PrepareTarget::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareTarget {
    pub format: WeightFormat,
    /// The AITER kernel path laid out for (None: moeplug's own kernels).
    pub target: Option<AiterTarget>,
    pub gate_mode_in: GateMode,
    pub hidden_align: usize,
    pub intermediate_align: usize,
    /// The activation dtype the caller prepares for (0 in the arguments: any).
    pub act_dtype: Option<ActDtype>,
}

/// `prepare_moe`'s scalar arguments as the caller gave them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareTargetArgs {
    pub weight_format: i32,
    pub gate_mode_in: i32,
    pub device_type: i32,
    pub device_id: i32,
    pub act_dtype: i32,
    pub hidden_align: i32,
    pub intermediate_align: i32,
    /// A `moeplug_prep_target` value (0: moeplug's kernels).
    pub target: i32,
}

impl PrepareTarget {
    pub fn new(a: PrepareTargetArgs) -> Result<PrepareTarget> {
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
        let target = match a.target {
            0 => None,
            r => Some(AiterTarget::from_raw("target", r)?),
        };
        if let Some(t) = target {
            return Self::for_aiter(a, format, gate_mode_in, t);
        }
        // The CPU and the CUDA fused_moe read the same layout; which memory the tensors live
        // in is independent of the target.
        match device {
            DeviceKind::Cpu | DeviceKind::Cuda => {}
            DeviceKind::Rocm => {
                backend::for_device(DeviceKind::Rocm, a.device_id)?;
            }
            _ => crate::bail!(
                unsupported,
                "device_type: prepare_moe produces layouts for the CPU and CUDA backends, got {}",
                device.name()
            ),
        }
        let act_dtype = if a.act_dtype != 0 {
            let act = ActDtype::from_raw("act_dtype", a.act_dtype)?;
            if !format.allowed_act_dtypes().contains(&act) {
                crate::bail!(
                    unsupported,
                    "act_dtype: {} cannot be used with weight_format {}",
                    act.label(),
                    format.label()
                );
            }
            Some(act)
        } else {
            None
        };
        let align = |v: i32, name: &str| count_or(v as i64, 0, name);
        Ok(PrepareTarget {
            format,
            target: None,
            gate_mode_in,
            hidden_align: align(a.hidden_align, "hidden_align")?,
            intermediate_align: align(a.intermediate_align, "intermediate_align")?,
            act_dtype,
        })
    }

    /// An AITER kernel path (docs/aiter.md): its weight format, its activation dtype, AITER's
    /// devices (0 or ROCM; nothing of this machine is probed: the layout is a function of
    /// the named path alone).
    fn for_aiter(
        a: PrepareTargetArgs,
        format: WeightFormat,
        gate_mode_in: GateMode,
        target: AiterTarget,
    ) -> Result<PrepareTarget> {
        // The weight format is checked against the path by `prepare::plan`.
        let path = target.path();
        if a.device_type != 0 && a.device_type != DeviceKind::Rocm as i32 {
            crate::bail!(
                invalid,
                "device_type: target {} is an AITER kernel path (ROCm): expected 0 or {} \
                 (ROCM), got {}",
                target.label(),
                DeviceKind::Rocm as i32,
                a.device_type
            );
        }
        if a.act_dtype != 0 {
            let act = ActDtype::from_raw("act_dtype", a.act_dtype)?;
            if act != path.act_dtype {
                crate::bail!(
                    invalid,
                    "act_dtype: target {} runs {} activations, got {}",
                    target.label(),
                    path.act_dtype.label(),
                    act.label()
                );
            }
        }
        let align = |v: i32, name: &str| count_or(v as i64, 0, name);
        Ok(PrepareTarget {
            format,
            target: Some(target),
            gate_mode_in,
            hidden_align: align(a.hidden_align, "hidden_align")?,
            intermediate_align: align(a.intermediate_align, "intermediate_align")?,
            act_dtype: Some(path.act_dtype),
        })
    }
}

/// The checkpoint tensors of `prepare_moe` (`prepare_moe_sizes` reads their descriptions
/// only: their data is never touched by planning).
#[derive(Debug, Clone)]
pub struct PrepareMoe {
    pub target: PrepareTarget,
    pub w13: Tensor,
    pub w2: Tensor,
    pub w13_scale: Option<Tensor>,
    pub w2_scale: Option<Tensor>,
    pub w13_bias: Option<Tensor>,
    pub w2_bias: Option<Tensor>,
}

/// Checkpoint weight dtypes `prepare_moe` takes for `format`: those a launch reads, and int8
/// holding one int4 value per byte for INT4_PER_CHANNEL (INT4_GROUP32's list has int8).
fn prep_weight_elems(format: WeightFormat) -> &'static [ElemType] {
    match format {
        WeightFormat::Int4PerChannel => &[ElemType::U32, ElemType::I32, ElemType::I8],
        f => crate::moe::check::weight_elems(f),
    }
}

/// The caller's output tensors of `prepare_moe`, in [`prepare::Part`] order.
pub type PrepareOutputs = [Option<Tensor>; 6];

/// An output tensor matching its planned shape and its input's dtype.
fn output(
    t: Option<Tensor>,
    name: &str,
    planned: Option<&Vec<usize>>,
    like: Option<&Tensor>,
) -> Result<Option<Tensor>> {
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

impl PrepareMoe {
    /// Check the checkpoint's dtypes and shapes and compute the outputs and the record.
    pub fn plan(&self) -> Result<prepare::PreparedShapes> {
        let format = self.target.format;
        let weight_types = prep_weight_elems(format);
        self.w13.expect_elem(weight_types)?;
        self.w2.expect_elem(weight_types)?;
        if self.w2.elem != self.w13.elem {
            crate::bail!(
                invalid,
                "w2: expected dtype {} (like w13), got {}",
                self.w13.elem.name(),
                self.w2.elem.name()
            );
        }
        let scale_types: &[ElemType] = if format.is_mx() {
            &[ElemType::E8m0, ElemType::U8]
        } else if format == WeightFormat::Int4Group32 {
            &[ElemType::Bf16]
        } else {
            &[ElemType::F32]
        };
        for s in [&self.w13_scale, &self.w2_scale].into_iter().flatten() {
            s.expect_elem(scale_types)?;
        }
        for b in [&self.w13_bias, &self.w2_bias].into_iter().flatten() {
            b.expect_elem(&[ElemType::F32])?;
        }
        let shape = |t: &Option<Tensor>| t.as_ref().map(|t| t.shape.clone());
        let spec = prepare::PrepareSpec {
            format,
            target: self.target.target,
            gate_mode_in: self.target.gate_mode_in,
            hidden_align: self.target.hidden_align,
            intermediate_align: self.target.intermediate_align,
            w13: self.w13.shape.clone(),
            w2: self.w2.shape.clone(),
            w13_scale: shape(&self.w13_scale),
            w2_scale: shape(&self.w2_scale),
            w13_bias: shape(&self.w13_bias),
            w2_bias: shape(&self.w2_bias),
            int4_unpacked: self.int4_unpacked()?,
        };
        prepare::plan(&spec)
    }

    /// int4 checkpoints: int8 weights hold one value per byte; INT4_GROUP32 uint8 weights two
    /// packed values (AITER's pack order), INT4_PER_CHANNEL uint32/int32 words eight.
    fn int4_unpacked(&self) -> Result<bool> {
        Ok(self.target.format.is_int4() && self.w13.elem == ElemType::I8)
    }

    /// The fragment of a whole preparation: every field of the record it writes.
    pub fn fragment(&self, shapes: &prepare::PreparedShapes) -> Fragment {
        let mut f = Fragment::of_layout(&shapes.layout);
        f.act_dtype = self.target.act_dtype;
        f
    }

    /// Check the outputs against the plan (shapes, dtypes, no overlap, one location) and
    /// describe the work and the record it produces.
    pub fn job(self, outputs: PrepareOutputs) -> Result<(PrepJob, Layout)> {
        let shapes = self.plan()?;
        let fragment = self.fragment(&shapes);
        let inputs = [
            Some(self.w13),
            Some(self.w2),
            self.w13_scale,
            self.w2_scale,
            self.w13_bias,
            self.w2_bias,
        ];
        let ins: Vec<&Tensor> = inputs.iter().flatten().collect();
        location(&ins)?;
        let planned = [
            Some(&shapes.w13),
            Some(&shapes.w2),
            shapes.w13_scale.as_ref(),
            shapes.w2_scale.as_ref(),
            shapes.w13_bias.as_ref(),
            shapes.w2_bias.as_ref(),
        ];
        let names = [
            "out_w13",
            "out_w2",
            "out_w13_scale",
            "out_w2_scale",
            "out_w13_bias",
            "out_w2_bias",
        ];
        let mut outs: [Option<Tensor>; 6] = Default::default();
        let words = shapes.spec.int4_unpacked && shapes.spec.format == WeightFormat::Int4PerChannel;
        for (i, o) in outputs.into_iter().enumerate() {
            if words && i < 2 {
                // int8-held values in, uint32 words out.
                if let Some(o) = &o {
                    o.expect_elem(crate::moe::check::weight_elems(shapes.spec.format))?;
                }
                outs[i] = output(o, names[i], planned[i], None)?;
                continue;
            }
            outs[i] = output(o, names[i], planned[i], inputs[i].as_ref())?;
        }
        for (oi, o) in outs.iter().enumerate() {
            let Some(o) = o else { continue };
            for i in inputs.iter().flatten() {
                no_overlap(o, i)?;
            }
            for o2 in outs[oi + 1..].iter().flatten() {
                no_overlap(o2, o)?;
            }
        }
        let all: Vec<&Tensor> = inputs.iter().chain(&outs).flatten().collect();
        let at = location(&all)?;
        if shapes.spec.int4_unpacked && at != Location::Host {
            crate::bail!(
                unsupported,
                "w13: int8-held int4 weights are packed on the host only; pass host tensors, or \
                 packed {} on the device, got {} tensors",
                if shapes.spec.format == WeightFormat::Int4PerChannel {
                    "uint32 words (AITER's a8w4 int4 order)"
                } else {
                    "uint8 weights (AITER's pack_int8_to_packed_int4 order)"
                },
                match at {
                    Location::Device(kind, _) => kind.name(),
                    Location::Host => "host",
                }
            );
        }
        if let (Some(t), Location::Device(..)) = (self.target.target, at) {
            // The device prep kernels write SEPARATED rows only (RowMap `block` 0).
            crate::bail!(
                unsupported,
                "prepare_moe: target {} is prepared from host memory only (the device prep \
                 kernels do not write its row order yet); pass host tensors",
                t.label()
            );
        }
        // Tensors: the six inputs then the six outputs, absent ones skipped.
        let mut tensors = Vec::new();
        let mut index = [[usize::MAX; 2]; 6];
        for (side, list) in [inputs, outs].into_iter().enumerate() {
            for (i, t) in list.into_iter().enumerate() {
                if let Some(t) = t {
                    index[i][side] = tensors.len();
                    tensors.push(t);
                }
            }
        }
        let mut ops = Vec::new();
        let unpacked = shapes.spec.int4_unpacked;
        for (part, step) in prepare::steps(&shapes) {
            let [src, dst] = index[part as usize];
            if src == usize::MAX || dst == usize::MAX {
                return Err(Error::internal(format!(
                    "prepare: no tensors for {}",
                    part.name()
                )));
            }
            let weights = matches!(part, prepare::Part::W13 | prepare::Part::W2);
            ops.push(if unpacked && weights {
                PrepOp::PackInt4 {
                    format: shapes.spec.format,
                    step,
                    src,
                    dst,
                }
            } else {
                PrepOp::Step { step, src, dst }
            });
        }
        let job = PrepJob {
            location: at,
            tensors,
            ops,
            fragment,
        };
        Ok((job, shapes.layout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;
    use crate::layout::{fingerprint, PreparedLayout};

    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

    /// A host tensor description; planning reads shapes only, never the data.
    fn t(name: &'static str, elem: ElemType, shape: &[usize]) -> Tensor {
        Tensor {
            name,
            // Distinct, far-apart addresses (never dereferenced), so no two overlap.
            ptr: (NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 40) as *mut u8,
            device: DeviceKind::Cpu,
            device_id: 0,
            elem,
            shape: shape.to_vec(),
        }
    }

    /// bf16 E=2, H=64, I=48 with biases, prepared for bf16 activations: the record and the
    /// fingerprint `prepare_moe` writes.
    fn prepared() -> (Layout, Option<ActDtype>, u64) {
        let target = PrepareTarget::new(PrepareTargetArgs {
            weight_format: WeightFormat::Bf16 as i32,
            gate_mode_in: GateMode::Interleave as i32,
            device_type: 0,
            device_id: 0,
            act_dtype: ActDtype::Bf16 as i32,
            hidden_align: 0,
            intermediate_align: 0,
            target: 0,
        })
        .unwrap();
        let req = PrepareMoe {
            target,
            w13: t("w13", ElemType::Bf16, &[2, 96, 64]),
            w2: t("w2", ElemType::Bf16, &[2, 64, 48]),
            w13_scale: None,
            w2_scale: None,
            w13_bias: Some(t("w13_bias", ElemType::F32, &[2, 96])),
            w2_bias: Some(t("w2_bias", ElemType::F32, &[2, 64])),
        };
        let shapes = req.plan().unwrap();
        let f = req.fragment(&shapes);
        (shapes.layout, f.act_dtype, fingerprint::encode(&f))
    }

    fn read(l: &Layout, act: Option<ActDtype>, fp: u64) -> Result<PreparedLayout> {
        let p = PreparedLayout::new(*l, act.map_or(0, |a| a as i32), 0, fp)?;
        p.check_fingerprint()?;
        Ok(p)
    }

    fn mismatch(r: Result<PreparedLayout>, field: &str) {
        let e = r.expect_err("a contradicting record must be refused");
        assert_eq!(e.status, Status::LayoutMismatch, "{}", e.message);
        assert!(
            e.message.starts_with(&format!("layout.{field}: ")),
            "message should name {field}: {}",
            e.message
        );
    }

    #[test]
    fn the_prepared_record_passes_and_a_zero_fingerprint_checks_nothing() {
        let (l, act, fp) = prepared();
        assert_ne!(fp, 0);
        assert_eq!(read(&l, act, fp).unwrap().act_dtype, Some(ActDtype::Bf16));
        let mut other = l;
        other.gate_mode = GateMode::Interleave;
        other.hidden_size = 60;
        assert!(read(&other, None, 0).is_ok());
    }

    #[test]
    fn each_enum_field_that_contradicts_the_fingerprint_is_named() {
        let (l, act, fp) = prepared();
        let mut x = l;
        x.weight_format = WeightFormat::Fp16;
        mismatch(read(&x, act, fp), "weight_format");
        let mut x = l;
        x.gate_mode = GateMode::InterleaveRows;
        mismatch(read(&x, act, fp), "gate_mode");
        let mut x = l;
        x.weight_layout = WeightLayout::Plain;
        mismatch(read(&x, act, fp), "weight_layout");
        let mut x = l;
        x.has_bias = false;
        mismatch(read(&x, act, fp), "flags");
        mismatch(read(&l, Some(ActDtype::Fp16), fp), "act_dtype");
        mismatch(read(&l, None, fp), "act_dtype");
    }

    #[test]
    fn a_scale_layout_that_contradicts_the_fingerprint_is_named() {
        let mut f = Fragment::of_layout(&prepared().0);
        f.weight_format = Some(WeightFormat::Mxfp4);
        f.scale_layout = Some(ScaleLayout::AiterE8m0);
        let mut l = prepared().0;
        l.weight_format = WeightFormat::Mxfp4;
        l.scale_layout = Some(ScaleLayout::Cdna4Swizzle);
        mismatch(read(&l, None, fingerprint::encode(&f)), "scale_layout");
    }

    #[test]
    fn each_size_that_contradicts_the_fingerprint_is_named() {
        let (l, act, fp) = prepared();
        let fields: [(&str, fn(&mut Layout)); 5] = [
            ("num_experts", |l| l.num_experts += 1),
            ("hidden_size", |l| l.hidden_size -= 1),
            ("intermediate_size", |l| l.intermediate_size -= 1),
            ("hidden_padded", |l| l.hidden_padded += 64),
            ("intermediate_padded", |l| l.intermediate_padded += 64),
        ];
        for (name, change) in fields {
            let mut x = l;
            change(&mut x);
            mismatch(read(&x, act, fp), name);
        }
    }

    #[test]
    fn a_launch_with_another_act_dtype_is_a_mismatch() {
        let (l, act, fp) = prepared();
        let p = read(&l, act, fp).unwrap();
        assert_eq!(p.default_act_dtype(true), ActDtype::Bf16);
        assert!(p.check_act_dtype(ActDtype::Bf16).is_ok());
        let e = p.check_act_dtype(ActDtype::Fp8PerToken).unwrap_err();
        assert_eq!(e.status, Status::LayoutMismatch);
        assert!(e.message.starts_with("layout.act_dtype: "), "{}", e.message);
    }

    #[test]
    fn an_int4_scale_layout_round_trips_through_the_fingerprint() {
        // AITER_INT4 = 4 needs a third scale_layout bit (bit 56): it must not spill into
        // act_dtype.
        let f = Fragment {
            weight_format: Some(WeightFormat::Int4Group32),
            scale_layout: Some(ScaleLayout::AiterInt4),
            ..Fragment::default()
        };
        let (back, _) = fingerprint::decode(fingerprint::encode(&f)).unwrap();
        assert_eq!(back.scale_layout, Some(ScaleLayout::AiterInt4));
        assert_eq!(back.act_dtype, None);
        assert_eq!(back.weight_format, Some(WeightFormat::Int4Group32));
    }

    #[test]
    fn foreign_fingerprints_are_invalid() {
        let (l, act, _) = prepared();
        for bad in [1u64, 2 << 60, (1 << 60) | (1 << 57)] {
            let e = read(&l, act, bad).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument, "{bad:#x}: {}", e.message);
        }
    }

    /// The primitives' fragments of a hand-made preparation (pad w13 with gate_up, pad w2,
    /// F1 (16, 16) shuffles of both) assemble into the fields prepare_moe's record has.
    #[test]
    fn primitive_fragments_assemble_into_the_record() {
        let (l, _, _) = prepared();
        let pad = |src: Tensor, dst: Tensor, gate_up: bool| {
            PadWeights {
                src,
                dst,
                gate_up,
                fill: 0.0,
            }
            .plan()
            .unwrap()
            .fragment
        };
        let shuffle = |shape: &[usize]| {
            ShuffleWeight {
                src: t("src", ElemType::Bf16, shape),
                dst: t("dst", ElemType::Bf16, shape),
                layout_n: 0,
                layout_k: 0,
                use_int4: false,
                is_guinterleave: false,
                gate_up: false,
                pad_k_to: 0,
            }
            .plan()
            .unwrap()
            .fragment
        };
        let [h, i, hp, ip] = [
            l.hidden_size,
            l.intermediate_size,
            l.hidden_padded,
            l.intermediate_padded,
        ];
        let w13 = pad(
            t("src", ElemType::Bf16, &[2, 2 * i, h]),
            t("dst", ElemType::Bf16, &[2, 2 * ip, hp]),
            true,
        );
        let w2 = pad(
            t("src", ElemType::Bf16, &[2, h, i]),
            t("dst", ElemType::Bf16, &[2, hp, ip]),
            false,
        );
        let f = w13
            .merge(w2)
            .unwrap()
            .merge(shuffle(&[2, 2 * ip, hp]))
            .unwrap()
            .merge(shuffle(&[2, hp, ip]))
            .unwrap();
        let want = Fragment {
            has_bias: None,
            ..Fragment::of_layout(&l)
        };
        assert_eq!(f, want);
        // The sealed fragments catch a hand edit of the assembled record.
        let fp = fingerprint::encode(&f);
        assert!(read(&l, None, fp).is_ok());
        let mut x = l;
        x.gate_mode = GateMode::Interleave;
        mismatch(read(&x, None, fp), "gate_mode");
        // Two calls that disagree cannot be assembled.
        let e = w13.merge(Fragment {
            hidden_padded: Some(hp + 64),
            ..Fragment::default()
        });
        assert_eq!(e.unwrap_err().status, Status::InvalidArgument);
    }
}
