//! Weight preparation on the device (API.md §4, `kernels/prep.cu`): runs the plain-data
//! [`Step`]s of `crate::prep::steps` and the MX quantizer on the caller's stream. Nothing is
//! allocated, nothing synchronized, no device memory is read by the host: every call is a
//! few kernel launches, capturable in a graph. Validation happens before, in the same code
//! as for host tensors (`crate::prep::request`); this module only executes.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex};

use once_cell::sync::Lazy;

use super::driver::Handle;
use super::{GpuBackend, Vendor};
use crate::error::{Error, Result};
use crate::prep::request::{PrepJob, PrepOp};
use crate::prep::steps::{RowMap, Step, Writer};
use crate::quant::MxDtype;
use crate::tensor::{ElemType, Tensor};
use crate::types::RoundMode;

/// Threads per block of every prep kernel (`PREP_THREADS` in prep.cu).
const THREADS: u32 = 256;
/// Grid size cap: the kernels loop over the rest (grid-stride).
const MAX_BLOCKS: u64 = 1 << 16;

/// Mirrors `StepParams` in kernels/prep.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StepParams {
    dst: u64,
    src: u64,
    units: u64,
    src_row_bytes: u64,
    a: u64,
    b: u64,
    c: u64,
    map: RowMap,
}

/// Mirrors `QuantParams` in kernels/prep.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct QuantParams {
    src: u64,
    q: u64,
    scale: u64,
    blocks: u64,
    ks: u64,
    sn: u64,
    src_type: u32,
    dtype: u32,
    mode: u32,
    pad0: u32,
}

#[derive(Clone, Copy)]
struct PrepKernels {
    rows: Handle,
    tile: Handle,
    f3: Handle,
    quant: Handle,
    f3_pad: Handle,
}
// Function handles are process-wide driver objects, usable from any thread.
unsafe impl Send for PrepKernels {}

static KERNELS: Lazy<Mutex<HashMap<(Vendor, i32), PrepKernels>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

/// A device's backend and its prep kernels (compiled once per process and device).
fn open(vendor: Vendor, device_id: i32) -> Result<(Arc<GpuBackend>, PrepKernels)> {
    // Opens (and self-tests) the device exactly as fused_moe does.
    super::backend(vendor, device_id)?;
    let dev = super::DEVICES
        .lock()
        .map_err(|_| Error::internal("device table poisoned"))?
        .get(&(vendor, device_id))
        .cloned()
        .ok_or_else(|| Error::internal("device opened but not in the device table"))?;
    let k = kernels_of(&dev)?;
    Ok((dev, k))
}

/// The prep kernels of a device being opened or open (compiled once per process and device).
fn kernels_of(dev: &GpuBackend) -> Result<PrepKernels> {
    let (vendor, device_id) = (dev.api.vendor, dev.device_id);
    let mut map = KERNELS
        .lock()
        .map_err(|_| Error::internal("prep kernel table poisoned"))?;
    if let Some(k) = map.get(&(vendor, device_id)) {
        return Ok(*k);
    }
    let compiled =
        super::cache::compile_source(dev.api, &dev.arch, "prep", super::cache::PREP_SOURCE, &[])?;
    super::record_compile(&compiled);
    let api = dev.api;
    let ctx = dev.enter()?;
    let module = api.load_module(&compiled.binary, "prep")?;
    let get = |name: &CStr| api.function(module, name);
    let k = PrepKernels {
        rows: get(c"prep_rows")?,
        tile: get(c"prep_tile")?,
        f3: get(c"prep_f3")?,
        quant: get(c"prep_quant_mx")?,
        f3_pad: get(c"prep_f3_pad")?,
    };
    drop(ctx);
    map.insert((vendor, device_id), k);
    Ok(k)
}

fn launch<P>(
    dev: &GpuBackend,
    f: Handle,
    units: u64,
    stream: Handle,
    p: &P,
    what: &str,
) -> Result<()> {
    if units == 0 {
        return Ok(());
    }
    let blocks = units.div_ceil(THREADS as u64).min(MAX_BLOCKS) as u32;
    let mut arg = p as *const P as *mut c_void;
    // SAFETY: one by-value struct parameter matching the kernel's; the context is current.
    let rc = unsafe {
        (dev.api.cuLaunchKernel)(
            f,
            blocks,
            1,
            1,
            THREADS,
            1,
            1,
            0,
            stream,
            &mut arg,
            std::ptr::null_mut(),
        )
    };
    dev.api.check(rc, &format!("cuLaunchKernel({what})"))
}

fn launch_step(
    dev: &GpuBackend,
    k: &PrepKernels,
    stream: Handle,
    step: &Step,
    src: u64,
    dst: u64,
) -> Result<()> {
    if step.dst_bytes == 0 {
        return Ok(());
    }
    let d = step.dst_bytes as u64;
    let (f, units, a, b, c, what) = match step.writer {
        Writer::Rows {
            row_bytes,
            fill,
            fill_len,
        } => {
            let rb = row_bytes as u64;
            (
                k.rows,
                d / rb * rb.div_ceil(16),
                rb,
                fill_len as u64,
                u64::from_le_bytes(fill),
                "prep_rows",
            )
        }
        Writer::Tile {
            row_bytes,
            tile_rows,
            pack,
        } => (
            k.tile,
            d / pack as u64,
            row_bytes as u64,
            tile_rows as u64,
            pack as u64,
            "prep_tile",
        ),
        Writer::F3 {
            sn,
            col_pad,
            row_pad,
        } => (
            k.f3,
            d / 4,
            sn as u64,
            col_pad as u64,
            row_pad as u64,
            "prep_f3",
        ),
    };
    let p = StepParams {
        dst,
        src,
        units,
        src_row_bytes: step.src_row_bytes as u64,
        a,
        b,
        c,
        map: step.map,
    };
    launch(dev, f, units, stream, &p, what)
}

/// Run `steps` (each: step, source address, destination address) on one device's stream.
pub fn run_steps(
    vendor: Vendor,
    device_id: i32,
    stream: *mut c_void,
    steps: &[(Step, u64, u64)],
) -> Result<()> {
    let (dev, _) = open(vendor, device_id)?;
    run_steps_on(&dev, stream, steps)
}

/// [`run_steps`] on a device's backend directly (the self-test, while the device opens).
pub(super) fn run_steps_on(
    dev: &GpuBackend,
    stream: *mut c_void,
    steps: &[(Step, u64, u64)],
) -> Result<()> {
    let k = kernels_of(dev)?;
    let _ctx = dev.enter()?;
    for (step, src, dst) in steps {
        launch_step(dev, &k, stream as Handle, step, *src, *dst)?;
    }
    Ok(())
}

/// Run a checked job (`crate::prep::request`) on one device's stream: each step as one
/// kernel, the quantizer as one or two.
pub fn run_job(vendor: Vendor, device_id: i32, stream: *mut c_void, job: &PrepJob) -> Result<()> {
    let t = &job.tensors;
    check_tensors(vendor, device_id, t)?;
    for op in &job.ops {
        match *op {
            PrepOp::Step { step, src, dst } => run_steps(
                vendor,
                device_id,
                stream,
                &[(step, t[src].ptr as u64, t[dst].ptr as u64)],
            )?,
            // prepare_moe refuses int4 device tensors before a job is built.
            PrepOp::PackInt4 { .. } => {
                return Err(Error::unsupported(
                    "packing int8-held int4 weights runs on the host only",
                ))
            }
            PrepOp::QuantizeMx(q) => {
                // The kernel's source-type codes (QuantParams.src_type in prep.cu).
                let src_type = match t[q.src].elem {
                    ElemType::F32 => 0,
                    ElemType::Bf16 => 1,
                    _ => 2,
                };
                let ks = q.k / 32;
                let sn = if q.shuffled {
                    crate::prep::scale::f3_shape(q.rows, ks)[1]
                } else {
                    0
                };
                quantize_mx(
                    vendor,
                    device_id,
                    stream,
                    &t[q.src],
                    src_type,
                    &t[q.q],
                    &t[q.scale],
                    ks,
                    sn,
                    q.mode,
                    q.dtype,
                )?
            }
        }
    }
    Ok(())
}

/// Every tensor of a prep call is memory of the device (`pointer`: one query each), before
/// the first kernel of the call.
fn check_tensors(vendor: Vendor, device_id: i32, tensors: &[Tensor]) -> Result<()> {
    let (dev, _) = open(vendor, device_id)?;
    if !dev.check_pointers {
        return Ok(());
    }
    let _ctx = dev.enter()?;
    super::pointer::check_tensors(dev.api, device_id, tensors)
}

/// One step with tensors (see [`run_steps`]).
pub fn run_step(
    vendor: Vendor,
    device_id: i32,
    stream: *mut c_void,
    step: &Step,
    src: &Tensor,
    dst: &Tensor,
) -> Result<()> {
    run_steps(
        vendor,
        device_id,
        stream,
        &[(*step, src.ptr as u64, dst.ptr as u64)],
    )
}

/// MX quantization of `blocks` 32-element blocks (`ks` per row) from `src` (elem 0 f32,
/// 1 bf16, 2 f16) into `q` and `scale`; `sn` > 0 writes the scales F3-shuffled with `sn`
/// columns (padding 0x00), else row-major `[rows, ks]`.
#[allow(clippy::too_many_arguments)]
pub fn quantize_mx(
    vendor: Vendor,
    device_id: i32,
    stream: *mut c_void,
    src: &Tensor,
    src_type: u32,
    q: &Tensor,
    scale: &Tensor,
    ks: usize,
    sn: usize,
    mode: RoundMode,
    dtype: MxDtype,
) -> Result<()> {
    let (dev, k) = open(vendor, device_id)?;
    let _ctx = dev.enter()?;
    let blocks = (src.numel() / 32) as u64;
    let p = QuantParams {
        src: src.ptr as u64,
        q: q.ptr as u64,
        scale: scale.ptr as u64,
        blocks,
        ks: ks as u64,
        sn: sn as u64,
        src_type,
        dtype: match dtype {
            MxDtype::Fp4E2m1 => 0,
            MxDtype::Fp8E4m3 => 1,
            MxDtype::Fp8E4m3Fnuz => 2,
        },
        mode: mode as u32,
        pad0: 0,
    };
    let stream = stream as Handle;
    launch(&dev, k.quant, blocks, stream, &p, "prep_quant_mx")?;
    if sn > 0 {
        // prep_f3_pad reads `blocks` as the scale's rows.
        let rows = if ks == 0 { 0 } else { blocks / ks as u64 };
        let pad = QuantParams { blocks: rows, ..p };
        let total = rows.div_ceil(256) * 256 * sn as u64;
        launch(&dev, k.f3_pad, total, stream, &pad, "prep_f3_pad")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_match_the_kernel_source() {
        use crate::backend::gpu::mirror::assert_mirrors;
        use crate::prep::steps::RowMap;
        let src = super::super::cache::PREP_SOURCE;
        assert_mirrors!(RowMap, src, "RowMap",
            group_rows => "group_rows", groups => "groups", src_group_rows => "src_group_rows",
            half_out => "half_out", half_in => "half_in", mode => "mode", block => "block");
        assert_mirrors!(StepParams, src, "StepParams",
            dst => "dst", src => "src", units => "units", src_row_bytes => "src_row_bytes",
            a => "a", b => "b", c => "c", map => "map");
        assert_mirrors!(QuantParams, src, "QuantParams",
            src => "src", q => "q", scale => "scale", blocks => "blocks", ks => "ks", sn => "sn",
            src_type => "src_type", dtype => "dtype", mode => "mode", pad0 => "pad0");
    }
}
