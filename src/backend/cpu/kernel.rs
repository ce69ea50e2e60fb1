//! The CPU fused MoE: AITER's two-stage math (LAYOUTS.md §7) over the recorded weight layouts,
//! f32 accumulation, all cores.
//!
//! Plan of a launch: route (moe_sorting) → quantize the stage-1 input per act_dtype → stage 1
//! (per expert × 16-row block of w13: dequantize each weight row once, dot it with every token
//! routed to the expert) → activation, cast to the output dtype, quantize per act_dtype →
//! stage 2 (per expert × 16-row block of w2) into a per-slot buffer → weighted sum per token.
//! Padded rows and columns are never computed.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::threads;
use super::weights::{Scale, WeightMatrix};
use crate::error::{Error, Result};
use crate::moe::act::GatedAct;
use crate::moe::actquant::{self, Fp8Kind, MxElem};
use crate::moe::check::LaunchShape;
use crate::moe::sort::{moe_sorting, Routing};
use crate::moe::MoeLaunch;
use crate::tensor::{ElemType, Tensor};
use crate::types::{ActDtype, GateMode, WeightFormat};

/// Rows of weights one work item handles.
const BLOCK_ROWS: usize = 16;

/// A buffer that worker threads write at disjoint indices.
struct Shared {
    ptr: *mut f32,
    len: usize,
}
// SAFETY: every index is written by exactly one work item (the item that owns that
// (slot, column) pair), and nothing reads the buffer until the scope has joined.
unsafe impl Sync for Shared {}

impl Shared {
    fn new(buf: &mut [f32]) -> Shared {
        Shared {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }
    #[inline]
    fn set(&self, i: usize, v: f32) {
        assert!(i < self.len);
        // SAFETY: in bounds (checked) and written by one work item only (see the Sync impl).
        unsafe { *self.ptr.add(i) = v }
    }
}

/// Run `work(scratch, item)` for items 0..n on all cores; each thread allocates its scratch
/// once.
fn parallel_items<S>(
    n: usize,
    scratch: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, usize) + Sync,
) {
    let workers = threads().min(n);
    if workers <= 1 {
        let mut s = scratch();
        (0..n).for_each(|i| work(&mut s, i));
        return;
    }
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let mut s = scratch();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    work(&mut s, i);
                }
            });
        }
    });
}

/// Apply `f` to every `width`-long row of `buf`, rows split over all cores.
fn parallel_rows(buf: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if width == 0 || buf.is_empty() {
        return;
    }
    let rows = buf.len() / width;
    let per = rows.div_ceil(threads().max(1)).max(1);
    std::thread::scope(|scope| {
        for (c, chunk) in buf.chunks_mut(per * width).enumerate() {
            let f = &f;
            scope.spawn(move || {
                for (r, row) in chunk.chunks_mut(width).enumerate() {
                    f(c * per + r, row);
                }
            });
        }
    });
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // Eight independent accumulators so the loop vectorizes without reassociation flags.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Quantize the rows of a stage input as `act` says (writes the dequantized values back).
/// All-zero rows (slots nobody routed to) stay zero and never raise a per-tensor amax.
fn quantize_rows(buf: &mut [f32], width: usize, act: ActDtype, fp8: Fp8Kind) {
    match act {
        ActDtype::Bf16 => parallel_rows(buf, width, |_, r| {
            r.iter_mut().for_each(|x| *x = actquant::round_bf16(*x))
        }),
        ActDtype::Fp16 => parallel_rows(buf, width, |_, r| {
            r.iter_mut().for_each(|x| *x = actquant::round_f16(*x))
        }),
        ActDtype::Fp8PerToken => parallel_rows(buf, width, |_, r| actquant::fp8_quant_row(r, fp8)),
        ActDtype::Fp8PerTensor => {
            let scale = actquant::fp8_scale_for(actquant::amax_of(buf), fp8);
            parallel_rows(buf, width, |_, r| {
                actquant::fp8_quant_with_scale(r, scale, fp8)
            })
        }
        ActDtype::Fp8Block128 => {
            parallel_rows(buf, width, |_, r| actquant::fp8_quant_row_block128(r, fp8))
        }
        ActDtype::Mxfp4 => parallel_rows(buf, width, |_, r| actquant::mx_quant_row(r, MxElem::Fp4)),
        ActDtype::Mxfp8 => parallel_rows(buf, width, |_, r| {
            actquant::mx_quant_row(r, MxElem::Fp8(fp8))
        }),
    }
}

/// # Safety
/// Host tensor named by the caller (see [`Tensor::host_slice`]).
unsafe fn f32s(t: &Option<Tensor>) -> Result<Option<&[f32]>> {
    match t {
        Some(t) => Ok(Some(t.host_slice::<f32>()?)),
        None => Ok(None),
    }
}

fn scale_of<'a>(
    format: WeightFormat,
    t: &'a Option<Tensor>,
    layout: &crate::layout::Layout,
) -> Result<Scale<'a>> {
    // SAFETY: host tensors of the launch, checked for shape by check_launch.
    unsafe {
        Ok(match format {
            WeightFormat::Bf16 | WeightFormat::Fp16 => Scale::None,
            WeightFormat::Fp8PerTensor => Scale::PerTensor(f32s(t)?.unwrap_or(&[])),
            WeightFormat::Fp8PerChannel => Scale::PerChannel(f32s(t)?.unwrap_or(&[])),
            WeightFormat::Fp8Block128 => Scale::Block128(f32s(t)?.unwrap_or(&[])),
            WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => Scale::Mx(
                t.as_ref().map(|t| t.host_bytes()).unwrap_or(&[]),
                layout
                    .scale_layout
                    .unwrap_or(crate::types::ScaleLayout::Plain),
            ),
        })
    }
}

/// Stage-1 output row p of w13 (in its stored row order) → (0 gate | 1 up, index j).
fn gate_up_of(mode: GateMode, p: usize, ip: usize) -> (usize, usize) {
    let logical = match mode {
        GateMode::Separated => p,
        GateMode::Interleave => {
            crate::prep::maps::interleave16_source_row(p, ip, crate::moe::check::INTERLEAVE_ROWS)
        }
        GateMode::InterleaveRows => return (p % 2, p / 2),
    };
    (logical / ip, logical % ip)
}

fn read_f16ish(bits: u16, elem: ElemType) -> f32 {
    match elem {
        ElemType::F16 => half::f16::from_bits(bits).to_f32(),
        _ => f32::from_bits((bits as u32) << 16),
    }
}

fn write_f16ish(x: f32, elem: ElemType) -> u16 {
    match elem {
        ElemType::F16 => half::f16::from_f32(x).to_bits(),
        _ => half::bf16::from_f32(x).to_bits(),
    }
}

/// The launch; `shape` comes from `check_launch`.
pub fn fused_moe(launch: &MoeLaunch, shape: &LaunchShape) -> Result<()> {
    let c = &launch.config;
    let l = &c.layout;
    let (m, topk) = (shape.m, shape.topk);
    let (e_local, h, hp, i, ip) = (
        l.num_experts,
        l.hidden_size,
        l.hidden_padded,
        l.intermediate_size,
        l.intermediate_padded,
    );
    // SAFETY (all host reads below): check_launch validated shapes and dtypes; the caller
    // promised the memory for the duration of the call; the backend serves host memory only.
    let hidden: &[u16] = unsafe { launch.hidden_states.host_slice()? };
    let ids: &[i32] = unsafe { launch.topk_ids.host_slice()? };
    let weights: &[f32] = unsafe { launch.topk_weights.host_slice()? };
    let mask: Option<&[i32]> = match &launch.expert_mask {
        Some(t) => Some(unsafe { t.host_slice()? }),
        None => None,
    };
    if let Some(mask) = mask {
        if let Some(pos) = mask.iter().position(|&v| v != 0 && v != 1) {
            return Err(Error::invalid(format!(
                "expert_mask: expected 0/1 values, got {} at index {pos}",
                mask[pos]
            )));
        }
        let on = mask.iter().filter(|&&v| v == 1).count();
        if on != e_local {
            return Err(Error::mismatch(format!(
                "expert_mask: expected {e_local} experts switched on (layout.num_experts local \
                 experts), got {on}"
            )));
        }
    }
    // Clamped to [0, M] rather than rejected: a GPU backend reads this value on the device
    // and cannot report it, and every backend must agree.
    let num_tokens = match &launch.num_local_tokens {
        Some(t) => (unsafe { t.host_slice::<i32>()? }[0]).clamp(0, m as i32) as usize,
        None => m,
    };
    let b13 = unsafe { f32s(&launch.w13_bias)? };
    let b2 = unsafe { f32s(&launch.w2_bias)? };
    let fp8 = if shape.weight_elem == ElemType::Fp8E4m3fnuz {
        Fp8Kind::E4m3fnuz
    } else {
        Fp8Kind::E4m3fn
    };
    let w13 = WeightMatrix::new(
        l,
        unsafe { launch.w13.host_bytes() },
        2 * ip,
        hp,
        shape.weight_elem,
        scale_of(l.weight_format, &launch.w13_scale, l)?,
    );
    let w2 = WeightMatrix::new(
        l,
        unsafe { launch.w2.host_bytes() },
        hp,
        ip,
        shape.weight_elem,
        scale_of(l.weight_format, &launch.w2_scale, l)?,
    );

    // Routing: the slots (t·topk + s) of each local expert.
    let sorted = moe_sorting(
        &Routing {
            topk_ids: ids,
            topk_weights: weights,
            m,
            topk,
            num_experts: mask.map(|mk| mk.len()).unwrap_or(e_local),
            expert_mask: mask,
            num_tokens,
        },
        1,
    );
    let mut slots_of: Vec<Vec<usize>> = vec![Vec::new(); e_local];
    let mut routed = vec![false; m * topk];
    for (j, &id) in sorted.sorted_token_ids[..sorted.num_valid_ids[0] as usize]
        .iter()
        .enumerate()
    {
        let (t, s) = ((id & 0xFF_FFFF) as usize, (id >> 24) as usize);
        let e = sorted.sorted_expert_ids[j];
        if t < m && s < topk && e >= 0 && (e as usize) < e_local {
            slots_of[e as usize].push(t * topk + s);
            routed[t * topk + s] = true;
        }
    }
    let active: Vec<usize> = (0..e_local).filter(|&e| !slots_of[e].is_empty()).collect();

    // Stage-1 input.
    let mut x = vec![0f32; num_tokens * h];
    let in_elem = launch.hidden_states.elem;
    parallel_rows(&mut x, h, |t, row| {
        let src = &hidden[t * shape.hidden_cols..t * shape.hidden_cols + h];
        for (d, &b) in row.iter_mut().zip(src) {
            *d = read_f16ish(b, in_elem);
        }
    });
    quantize_rows(&mut x, h, c.act_dtype, fp8);

    // Stage 1: gate/up pre-activations per slot, [slot][gate|up][I].
    let mut gu = vec![0f32; m * topk * 2 * i];
    {
        let out = Shared::new(&mut gu);
        let blocks = (2 * ip).div_ceil(BLOCK_ROWS);
        parallel_items(
            active.len() * blocks,
            || vec![0f32; h],
            |row, item| {
                let e = active[item / blocks];
                let p0 = (item % blocks) * BLOCK_ROWS;
                for p in p0..(p0 + BLOCK_ROWS).min(2 * ip) {
                    let (half, j) = gate_up_of(l.gate_mode, p, ip);
                    if j >= i {
                        continue; // padded row
                    }
                    w13.dequant_row(e, p, h, row);
                    for &slot in &slots_of[e] {
                        let t = slot / topk;
                        let mut acc = dot(&x[t * h..(t + 1) * h], row);
                        if c.router_weight_on_input {
                            acc *= weights[slot];
                        }
                        if let Some(b) = b13 {
                            acc += b[e * 2 * ip + p];
                        }
                        out.set((slot * 2 + half) * i + j, acc);
                    }
                }
            },
        );
    }

    // Activation, cast to the output dtype (as the reference does), stage-2 quantization.
    let act = GatedAct {
        activation: c.activation,
        alpha: c.alpha,
        limit: c.limit,
    };
    let out_elem = launch.output.elem;
    let mut a2 = vec![0f32; m * topk * i];
    parallel_rows(&mut a2, i, |slot, row| {
        if !routed[slot] {
            return;
        }
        let (g, u) = gu[slot * 2 * i..(slot + 1) * 2 * i].split_at(i);
        for ((d, &g), &u) in row.iter_mut().zip(g).zip(u) {
            *d = read_f16ish(write_f16ish(act.apply(g, u), out_elem), out_elem);
        }
    });
    drop(gu);
    quantize_rows(&mut a2, i, c.act_dtype, fp8);

    // Stage 2: per-slot down projections, [slot][H].
    let mut y = vec![0f32; m * topk * h];
    {
        let out = Shared::new(&mut y);
        let blocks = h.div_ceil(BLOCK_ROWS);
        parallel_items(
            active.len() * blocks,
            || vec![0f32; i],
            |row, item| {
                let e = active[item / blocks];
                let n0 = (item % blocks) * BLOCK_ROWS;
                for n in n0..(n0 + BLOCK_ROWS).min(h) {
                    w2.dequant_row(e, n, i, row);
                    let bias = b2.map(|b| b[e * hp + n]).unwrap_or(0.0);
                    for &slot in &slots_of[e] {
                        out.set(slot * h + n, dot(&a2[slot * i..(slot + 1) * i], row) + bias);
                    }
                }
            },
        );
    }

    // Weighted sum per token; padded columns and unrouted rows are zero.
    // SAFETY: the output is host memory of [m, output_cols] 16-bit values, checked not to
    // overlap any input.
    let output: &mut [u16] = unsafe { launch.output.host_slice_mut()? };
    let cols = shape.output_cols;
    let mut sums = vec![0f32; m * cols];
    parallel_rows(&mut sums, cols, |t, row| {
        for s in 0..topk {
            let slot = t * topk + s;
            if !routed[slot] {
                continue;
            }
            let w = if c.router_weight_on_input {
                1.0
            } else {
                weights[slot]
            };
            for (d, &v) in row[..h].iter_mut().zip(&y[slot * h..(slot + 1) * h]) {
                *d += w * v;
            }
        }
    });
    for (o, &v) in output.iter_mut().zip(&sums) {
        *o = write_f16ish(v, out_elem);
    }
    Ok(())
}
