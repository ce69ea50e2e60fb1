//! `moeplug demo`: a small gpt-oss-like MoE layer end to end, through the C ABI as an engine
//! would call it: MXFP4 quantization of a bf16 checkpoint stored row-interleaved (g0,u0,g1,…),
//! `prepare_moe` (pad to 256, re-order, shuffle, scale shuffle), then `fused_moe` (w4a16,
//! SWIGLU_OAI, biases) on the best backend that can run it, checked against a float64
//! reference computed here from the quantized checkpoint.

use std::ffi::CStr;
use std::time::Instant;

use half::bf16;
use moeplug::capi::types::*;
use moeplug::capi::*;
use moeplug::quant::{e8m0_to_f32, fp4x2_to_f32};

use crate::cuda::Cuda;

/// The layer: gpt-oss proportions, scaled down so the CPU runs it in well under a second.
/// 704 (a multiple of 32, like 2880) is not one of 256: preparation pads it to 768 and the
/// launch skips the pad.
const EXPERTS: usize = 32;
const TOPK: usize = 4;
const HIDDEN: usize = 704;
const INTER: usize = 704;
const TOKENS: usize = 48;
const LIMIT: f32 = 7.0;
const ALPHA: f32 = 1.702;

/// xorshift64*: deterministic inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// An owned host tensor description (shape kept alive with it).
struct Host {
    shape: Vec<i64>,
    t: moeplug_tensor,
}

impl Host {
    fn new<T>(data: &mut [T], shape: &[usize], code: u8, bits: u8) -> Box<Host> {
        let mut h = Box::new(Host {
            shape: shape.iter().map(|&d| d as i64).collect(),
            t: unsafe { std::mem::zeroed() },
        });
        h.t = moeplug_tensor::host(data.as_mut_ptr() as *mut libc::c_void, &h.shape, code, bits);
        h
    }
    fn ptr(&self) -> *const moeplug_tensor {
        &self.t
    }
}

fn check(what: &str, status: moeplug_status) -> Result<(), String> {
    if status == moeplug_status::MoeplugOk {
        return Ok(());
    }
    let msg = unsafe { CStr::from_ptr(moeplug_last_error()) }
        .to_string_lossy()
        .into_owned();
    Err(format!("{what} failed: {msg}"))
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// MXFP4-quantize a bf16 `[rows, k]` matrix with the library (RoundUp e8m0 scales).
fn quantize(x: &mut [bf16], rows: usize, k: usize) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut q = vec![0u8; rows * k / 2];
    let mut s = vec![0u8; rows * k / 32];
    let src = Host::new(x, &[rows, k], 4, 16);
    let dq = Host::new(&mut q, &[rows, k / 2], 1, 8);
    let ds = Host::new(&mut s, &[rows, k / 32], 14, 8);
    let args = moeplug_quantize_mx_args {
        struct_size: std::mem::size_of::<moeplug_quantize_mx_args>() as u32,
        src: src.ptr(),
        dst_q: dq.ptr(),
        dst_scale: ds.ptr(),
        format: moeplug_weight_format::Mxfp4 as i32,
        round_mode: 0,
        shuffle_scale: 0,
        out_fragment: std::ptr::null_mut(),
    };
    check("moeplug_quantize_mx", unsafe {
        moeplug_quantize_mx(&args, std::ptr::null_mut())
    })?;
    Ok((q, s))
}

/// Dequantized `[rows, k]` of packed MXFP4 with row-major e8m0 scales, in f64.
fn dequantize(q: &[u8], s: &[u8], rows: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0f64; rows * k];
    for r in 0..rows {
        for c in 0..k {
            let v = fp4x2_to_f32(q[r * k / 2 + c / 2])[c % 2];
            out[r * k + c] = v as f64 * e8m0_to_f32(s[r * k / 32 + c / 32]) as f64;
        }
    }
    out
}

fn swiglu(g: f64, u: f64) -> f64 {
    let l = LIMIT as f64;
    let g = g.min(l);
    let u = u.clamp(-l, l);
    g / (1.0 + (-(ALPHA as f64) * g).exp()) * (u + 1.0)
}

/// Where the layer runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Device {
    Cpu,
    Cuda(i32),
    Rocm(i32),
}

impl Device {
    /// "cpu", "cuda", "cuda:N", "rocm", "rocm:N".
    pub fn parse(text: &str) -> Result<Device, String> {
        let (kind, index) = text.split_once(':').unwrap_or((text, "0"));
        let id = || {
            index
                .parse::<i32>()
                .ok()
                .filter(|&i| i >= 0)
                .ok_or_else(|| format!("device '{text}': '{index}' is not a device index"))
        };
        match kind {
            "cpu" if !text.contains(':') => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(id()?)),
            "rocm" | "hip" => Ok(Device::Rocm(id()?)),
            _ => Err(format!("device '{text}': expected cpu, cuda:N or rocm:N")),
        }
    }

    pub fn name(self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Cuda(i) => format!("cuda:{i}"),
            Device::Rocm(i) => format!("rocm:{i}"),
        }
    }

    /// (moeplug_device_type, device_id).
    fn code(self) -> (i32, i32) {
        match self {
            Device::Cpu => (moeplug_device_type::Cpu as i32, 0),
            Device::Cuda(i) => (moeplug_device_type::Cuda as i32, i),
            Device::Rocm(i) => (moeplug_device_type::Rocm as i32, i),
        }
    }
}

/// Fail early, with the library's status and reason, when `device` cannot run the demo.
fn require(device: Device) -> Result<(), String> {
    let (device_type, device_id) = device.code();
    let mut caps: moeplug_caps = unsafe { std::mem::zeroed() };
    caps.struct_size = std::mem::size_of::<moeplug_caps>() as u32;
    let status = unsafe { moeplug_get_caps(device_type, device_id, &mut caps) };
    if status == moeplug_status::MoeplugOk {
        return Ok(());
    }
    let name = unsafe { CStr::from_ptr(moeplug_status_name(status as i32)) };
    let msg = unsafe { CStr::from_ptr(moeplug_last_error()) };
    Err(format!(
        "{}: {}: {}",
        device.name(),
        name.to_string_lossy(),
        msg.to_string_lossy()
    ))
}

pub fn run(device: Device) -> Result<(), String> {
    require(device)?;
    let (device_type, device_id) = device.code();
    println!("moeplug demo: gpt-oss-like MoE layer, MXFP4 weights, bf16 activations (w4a16)");
    println!("  E={EXPERTS} top-{TOPK} H={HIDDEN} I={INTER} M={TOKENS}, SWIGLU_OAI (alpha {ALPHA}, limit {LIMIT}), biases");
    println!("  checkpoint w13 rows interleaved g0,u0,g1,u1,... (INTERLEAVE_ROWS)\n");
    let mut rng = Rng(0x5EED_F6A7);
    let (e, h, i, m, k) = (EXPERTS, HIDDEN, INTER, TOKENS, TOPK);

    // 1. A bf16 checkpoint, quantized online to MXFP4 as engines do.
    let mut w13: Vec<bf16> = (0..e * 2 * i * h)
        .map(|_| bf16::from_f32(rng.uniform() * 0.08))
        .collect();
    let mut w2: Vec<bf16> = (0..e * h * i)
        .map(|_| bf16::from_f32(rng.uniform() * 0.08))
        .collect();
    let mut b13: Vec<f32> = (0..e * 2 * i).map(|_| rng.uniform() * 0.1).collect();
    let mut b2: Vec<f32> = (0..e * h).map(|_| rng.uniform() * 0.1).collect();
    let t = Instant::now();
    let (mut q13, mut s13) = quantize(&mut w13, e * 2 * i, h)?;
    let (mut q2, mut s2) = quantize(&mut w2, e * h, i)?;
    println!(
        "  quantize_mx   {:8.2} ms  bf16 -> MXFP4 + e8m0 (RoundUp), {:.1} MiB of fp4",
        ms(t),
        (q13.len() + q2.len()) as f64 / (1 << 20) as f64
    );

    // 2. Prepare for the target: pad 720 -> 768, GGUU rows, AITER 16x16 shuffle, e8m0 shuffle.
    let t = Instant::now();
    let in13 = Host::new(&mut q13, &[e, 2 * i, h / 2], 1, 8);
    let in2 = Host::new(&mut q2, &[e, h, i / 2], 1, 8);
    let ins13 = Host::new(&mut s13, &[e, 2 * i, h / 32], 14, 8);
    let ins2 = Host::new(&mut s2, &[e, h, i / 32], 14, 8);
    let inb13 = Host::new(&mut b13, &[e, 2 * i], 2, 32);
    let inb2 = Host::new(&mut b2, &[e, h], 2, 32);
    let mut layout: moeplug_layout = unsafe { std::mem::zeroed() };
    layout.struct_size = std::mem::size_of::<moeplug_layout>() as u32;
    let mut pargs: moeplug_prepare_moe_args = unsafe { std::mem::zeroed() };
    pargs.struct_size = std::mem::size_of::<moeplug_prepare_moe_args>() as u32;
    pargs.weight_format = moeplug_weight_format::Mxfp4 as i32;
    pargs.gate_mode_in = moeplug_gate_mode::InterleaveRows as i32;
    pargs.device_type = device_type;
    (pargs.w13, pargs.w2, pargs.w13_scale, pargs.w2_scale) =
        (in13.ptr(), in2.ptr(), ins13.ptr(), ins2.ptr());
    (pargs.w13_bias, pargs.w2_bias) = (inb13.ptr(), inb2.ptr());
    let mut sizes: moeplug_prepare_moe_sizes_out = unsafe { std::mem::zeroed() };
    sizes.struct_size = std::mem::size_of::<moeplug_prepare_moe_sizes_out>() as u32;
    check("moeplug_prepare_moe_sizes", unsafe {
        moeplug_prepare_moe_sizes(&pargs, &mut sizes)
    })?;
    let dims = |n: i32, s: [i64; 4]| {
        s[..n as usize]
            .iter()
            .map(|&d| d as usize)
            .collect::<Vec<_>>()
    };
    let mut p13 = vec![0u8; sizes.w13_bytes as usize];
    let mut p2 = vec![0u8; sizes.w2_bytes as usize];
    let mut ps13 = vec![0u8; sizes.w13_scale_bytes as usize];
    let mut ps2 = vec![0u8; sizes.w2_scale_bytes as usize];
    let mut pb13 = vec![0f32; sizes.w13_bias_bytes as usize / 4];
    let mut pb2 = vec![0f32; sizes.w2_bias_bytes as usize / 4];
    let o13 = Host::new(&mut p13, &dims(sizes.w13_ndim, sizes.w13_shape), 1, 8);
    let o2 = Host::new(&mut p2, &dims(sizes.w2_ndim, sizes.w2_shape), 1, 8);
    let os13 = Host::new(
        &mut ps13,
        &dims(sizes.w13_scale_ndim, sizes.w13_scale_shape),
        14,
        8,
    );
    let os2 = Host::new(
        &mut ps2,
        &dims(sizes.w2_scale_ndim, sizes.w2_scale_shape),
        14,
        8,
    );
    let ob13 = Host::new(
        &mut pb13,
        &dims(sizes.w13_bias_ndim, sizes.w13_bias_shape),
        2,
        32,
    );
    let ob2 = Host::new(
        &mut pb2,
        &dims(sizes.w2_bias_ndim, sizes.w2_bias_shape),
        2,
        32,
    );
    (
        pargs.out_w13,
        pargs.out_w2,
        pargs.out_w13_scale,
        pargs.out_w2_scale,
    ) = (o13.ptr(), o2.ptr(), os13.ptr(), os2.ptr());
    (pargs.out_w13_bias, pargs.out_w2_bias, pargs.out_layout) =
        (ob13.ptr(), ob2.ptr(), &mut layout);
    check("moeplug_prepare_moe", unsafe {
        moeplug_prepare_moe(&pargs, std::ptr::null_mut())
    })?;
    println!(
        "  prepare_moe   {:8.2} ms  -> layout: hidden {}->{}, intermediate {}->{}, gate_mode SEPARATED, weights AITER_16x16, scales AITER_E8M0",
        ms(t),
        layout.hidden_size,
        layout.hidden_padded,
        layout.intermediate_size,
        layout.intermediate_padded
    );

    // 3. Routing: softmax over the top-k of random logits.
    let mut x: Vec<bf16> = (0..m * h).map(|_| bf16::from_f32(rng.uniform())).collect();
    let mut ids = vec![0i32; m * k];
    let mut wts = vec![0f32; m * k];
    for t in 0..m {
        let mut logits: Vec<(f32, usize)> = (0..e).map(|j| (rng.uniform() * 3.0, j)).collect();
        logits.sort_by(|a, b| b.0.total_cmp(&a.0));
        let z: f32 = logits[..k].iter().map(|l| l.0.exp()).sum();
        for s in 0..k {
            ids[t * k + s] = logits[s].1 as i32;
            wts[t * k + s] = logits[s].0.exp() / z;
        }
    }

    // 4. fused_moe on the chosen device: host tensors for the CPU; for a GPU, device copies
    //    of the same tensors, the launch queued on the default stream.
    let mut out = vec![bf16::from_f32(f32::NAN); m * h];
    let hx = Host::new(&mut x, &[m, h], 4, 16);
    let hids = Host::new(&mut ids, &[m, k], 0, 32);
    let hw = Host::new(&mut wts, &[m, k], 2, 32);
    let hout = Host::new(&mut out, &[m, h], 4, 16);
    let mut fargs: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
    fargs.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
    fargs.layout = &layout;
    fargs.activation = moeplug_activation::SwigluOai as i32;
    fargs.limit = LIMIT;
    fargs.alpha = ALPHA;
    (
        fargs.hidden_states,
        fargs.topk_ids,
        fargs.topk_weights,
        fargs.output,
    ) = (hx.ptr(), hids.ptr(), hw.ptr(), hout.ptr());
    (fargs.w13, fargs.w2, fargs.w13_scale, fargs.w2_scale) =
        (o13.ptr(), o2.ptr(), os13.ptr(), os2.ptr());
    (fargs.w13_bias, fargs.w2_bias) = (ob13.ptr(), ob2.ptr());
    check(
        &format!("moeplug_check_fused_moe({})", device.name()),
        unsafe { moeplug_check_fused_moe(device_type, device_id, &fargs) },
    )?;
    let gpu = match device {
        Device::Cpu => None,
        Device::Cuda(id) => Some(Cuda::open(id).map_err(|e| format!("{}: {e}", device.name()))?),
        Device::Rocm(_) => {
            return Err(format!(
                "{}: the demo allocates device memory through CUDA only",
                device.name()
            ))
        }
    };
    let on_device = match &gpu {
        None => Vec::new(),
        Some(c) => {
            let d = vec![
                c.upload(&x, &[m, h], 4, 16)?,
                c.upload(&ids, &[m, k], 0, 32)?,
                c.upload(&wts, &[m, k], 2, 32)?,
                c.upload(&out, &[m, h], 4, 16)?,
                c.upload(&p13, &dims(sizes.w13_ndim, sizes.w13_shape), 1, 8)?,
                c.upload(&p2, &dims(sizes.w2_ndim, sizes.w2_shape), 1, 8)?,
                c.upload(
                    &ps13,
                    &dims(sizes.w13_scale_ndim, sizes.w13_scale_shape),
                    14,
                    8,
                )?,
                c.upload(
                    &ps2,
                    &dims(sizes.w2_scale_ndim, sizes.w2_scale_shape),
                    14,
                    8,
                )?,
                c.upload(
                    &pb13,
                    &dims(sizes.w13_bias_ndim, sizes.w13_bias_shape),
                    2,
                    32,
                )?,
                c.upload(&pb2, &dims(sizes.w2_bias_ndim, sizes.w2_bias_shape), 2, 32)?,
            ];
            (
                fargs.hidden_states,
                fargs.topk_ids,
                fargs.topk_weights,
                fargs.output,
            ) = (d[0].ptr(), d[1].ptr(), d[2].ptr(), d[3].ptr());
            (fargs.w13, fargs.w2, fargs.w13_scale, fargs.w2_scale) =
                (d[4].ptr(), d[5].ptr(), d[6].ptr(), d[7].ptr());
            (fargs.w13_bias, fargs.w2_bias) = (d[8].ptr(), d[9].ptr());
            d
        }
    };
    // The workspace the launch needs with the tensors it is given, on their device.
    let mut ws_bytes = 0usize;
    check("moeplug_fused_moe_workspace_size", unsafe {
        moeplug_fused_moe_workspace_size(&fargs, &mut ws_bytes)
    })?;
    let mut ws = vec![0u8; ws_bytes.max(1)];
    let hws = Host::new(&mut ws, &[ws_bytes], 1, 8);
    let dws = match &gpu {
        None => None,
        Some(c) => Some(c.upload(&ws[..ws_bytes], &[ws_bytes], 1, 8)?),
    };
    fargs.workspace = dws.as_ref().map_or(hws.ptr(), |d| d.ptr());
    let launch = || -> Result<f64, String> {
        let t = Instant::now();
        check("moeplug_fused_moe", unsafe { moeplug_fused_moe(&fargs) })?;
        if let Some(c) = &gpu {
            c.synchronize()?;
        }
        Ok(ms(t))
    };
    let first = launch()?;
    let again = launch()?;
    drop((hx, hids, hw, hout, hws));
    if !on_device.is_empty() {
        on_device[3].download(&mut out)?;
    }
    println!(
        "  fused_moe     {again:8.2} ms  on {} ({ws_bytes} workspace bytes; first call {first:.2} ms)",
        device.name()
    );
    drop((on_device, dws));

    // 5. float64 reference from the quantized checkpoint in its own (interleaved) order.
    let t = Instant::now();
    let w13f = dequantize(&q13, &s13, e * 2 * i, h);
    let w2f = dequantize(&q2, &s2, e * h, i);
    let mut err2 = 0f64;
    let mut ref2 = 0f64;
    for tk in 0..m {
        let mut acc = vec![0f64; h];
        for s in 0..k {
            let ex = ids[tk * k + s] as usize;
            let mut a = vec![0f64; i];
            for (j, aj) in a.iter_mut().enumerate() {
                let row = |r: usize| -> f64 {
                    let w = &w13f[(ex * 2 * i + r) * h..][..h];
                    let dot: f64 = (0..h).map(|c| x[tk * h + c].to_f64() * w[c]).sum();
                    dot + b13[ex * 2 * i + r] as f64
                };
                // gpt-oss order: row 2j is gate j, row 2j+1 is up j.
                let v = swiglu(row(2 * j), row(2 * j + 1));
                *aj = bf16::from_f64(v).to_f64(); // the stage-1 output is bf16, as in AITER
            }
            for c in 0..h {
                let w = &w2f[(ex * h + c) * i..][..i];
                let y: f64 = (0..i).map(|j| a[j] * w[j]).sum::<f64>() + b2[ex * h + c] as f64;
                acc[c] += wts[tk * k + s] as f64 * y;
            }
        }
        for c in 0..h {
            let d = out[tk * h + c].to_f64() - acc[c];
            err2 += d * d;
            ref2 += acc[c] * acc[c];
        }
    }
    let rel = (err2 / ref2).sqrt();
    println!(
        "  reference     {:8.2} ms  float64 loops over the dequantized checkpoint",
        ms(t)
    );
    let ok = rel <= 1e-2 && out.iter().all(|v| v.to_f32().is_finite());
    println!(
        "\n  relative L2 error vs float64: {rel:.3e} (bf16 output; limit 1e-2) -> {}",
        if ok { "OK" } else { "FAILED" }
    );
    if ok {
        Ok(())
    } else {
        Err("the result does not match the reference".into())
    }
}
