//! The CPU fused MoE: AITER's two-stage math (docs/layouts.md §7) over the recorded weight layouts,
//! f32 accumulation, all cores.
//!
//! Plan of a launch: route (moe_sorting) → quantize the stage-1 input per act_dtype → stage 1
//! (per expert × 16-row block of w13: per 256-column chunk, dequantize the 16-row tile once
//! into per-thread scratch and dot every token routed to the expert against it) →
//! activation, cast to the output dtype, quantize per act_dtype → stage 2 (the same over
//! w2) into a per-slot buffer → weighted sum per token. AVX2 (checked at run time) runs the
//! decoders and the dot 8 lanes wide with the same results as the portable code.
//! Padded rows and columns are never computed.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::threads;
use super::weights::{to_pack_order, Scale, WeightMatrix};
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
    // Below this many values a thread start costs more than the work.
    if buf.len() < 1 << 15 {
        for (r, row) in buf.chunks_mut(width).enumerate() {
            f(r, row);
        }
        return;
    }
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

/// Columns of a weight tile decoded at once: 16 rows × 256 f32 = 16 KiB, which stays in L1
/// while every routed token of the expert is run against it.
const TILE_COLS: usize = 256;
/// Tile rows per pass over a token's activations (register blocking: 4 rows × 16 lanes,
/// each activation vector loaded once for 4 rows).
const ROW_BLOCK: usize = 4;
/// f32 accumulator lanes per row (two 8-wide vectors: independent add chains).
const LANES: usize = 16;

/// Per-thread scratch of the stage GEMMs, allocated once per thread and stage.
struct Scratch {
    /// A dequantized weight tile, `[BLOCK_ROWS][TILE_COLS]`.
    tile: Vec<f32>,
    /// Row sums `[token][BLOCK_ROWS]` of the current work item.
    acc: Vec<f32>,
}

impl Scratch {
    fn new(max_tokens: usize) -> Scratch {
        Scratch {
            tile: vec![0f32; BLOCK_ROWS * TILE_COLS],
            acc: vec![0f32; max_tokens * BLOCK_ROWS],
        }
    }
}

/// One stage's GEMM: a stacked weight against activation rows stored in the weight's column
/// order (fp4 pack order for MXFP4), row stride `ld` = `w.k_extent(used)`, zero beyond `used`.
struct Gemm<'a> {
    w: &'a WeightMatrix<'a>,
    used: usize,
    act: &'a [f32],
    ld: usize,
}

impl Gemm<'_> {
    /// `scratch.acc[t * BLOCK_ROWS + r]` = row `n0 + r` of expert `e` · activation row
    /// `act_rows[t]`, for r < `rows`. Per 256-column chunk: dequantize the 16-row tile once,
    /// then run every token against it.
    fn block(&self, e: usize, n0: usize, rows: usize, act_rows: &[usize], s: &mut Scratch) {
        let acc = &mut s.acc[..act_rows.len() * BLOCK_ROWS];
        acc.fill(0.0);
        let kend = self.w.k_extent(self.used);
        #[cfg(target_arch = "x86_64")]
        let avx2 = std::is_x86_feature_detected!("avx2");
        for k0 in (0..kend).step_by(TILE_COLS) {
            let width = (kend - k0).min(TILE_COLS);
            let x = Acts {
                act: self.act,
                rows: act_rows,
                ld: self.ld,
                k0,
                width,
            };
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU supports AVX2 (checked above), the only precondition of
                // these `target_feature` functions.
                unsafe {
                    dequant_tile_avx2(self.w, e, n0, rows, &x, self.used, &mut s.tile);
                    tile_times_acts_avx2(&s.tile, rows, &x, acc);
                }
                continue;
            }
            self.w
                .dequant_tile::<false>(e, n0, rows, k0, width, self.used, &mut s.tile, TILE_COLS);
            tile_times_acts(&s.tile, rows, &x, acc);
        }
    }
}

/// [`WeightMatrix::dequant_tile`] compiled for AVX2: the decoders run 8 values per
/// instruction, about twice the SSE2 baseline.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequant_tile_avx2(
    w: &WeightMatrix,
    e: usize,
    n0: usize,
    rows: usize,
    x: &Acts,
    used: usize,
    tile: &mut [f32],
) {
    w.dequant_tile::<true>(e, n0, rows, x.k0, x.width, used, tile, TILE_COLS);
}

/// Columns `k0..k0 + width` of some activation rows (row stride `ld`).
struct Acts<'a> {
    act: &'a [f32],
    rows: &'a [usize],
    ld: usize,
    k0: usize,
    width: usize,
}

/// [`tile_times_acts`] with the 4-row dot in AVX2 ([`dot_rows_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_times_acts_avx2(tile: &[f32], rows: usize, x: &Acts, acc: &mut [f32]) {
    tile_times_acts_with(tile, rows, x, acc, |w, xt| dot_rows_avx2(w, xt))
}

/// `acc[t * BLOCK_ROWS + r] +=` tile row r · activation row t, 4 tile rows per pass.
fn tile_times_acts(tile: &[f32], rows: usize, x: &Acts, acc: &mut [f32]) {
    tile_times_acts_with(tile, rows, x, acc, dot_rows)
}

#[inline(always)]
fn tile_times_acts_with(
    tile: &[f32],
    rows: usize,
    x: &Acts,
    acc: &mut [f32],
    dot_rows: impl Fn(&[f32], &[f32]) -> [f32; ROW_BLOCK],
) {
    for (t, &row) in x.rows.iter().enumerate() {
        let xt = &x.act[row * x.ld + x.k0..][..x.width];
        let out = &mut acc[t * BLOCK_ROWS..][..rows];
        let mut r = 0;
        while r + ROW_BLOCK <= rows {
            let sums = dot_rows(&tile[r * TILE_COLS..], xt);
            for (o, v) in out[r..r + ROW_BLOCK].iter_mut().zip(sums) {
                *o += v;
            }
            r += ROW_BLOCK;
        }
        for (o, w) in out[r..]
            .iter_mut()
            .zip(tile[r * TILE_COLS..].chunks(TILE_COLS))
        {
            *o += dot(&w[..x.width], xt);
        }
    }
}

/// Tile rows `0..ROW_BLOCK` (stride `TILE_COLS`) · `x`: each 16-column piece of `x` is used
/// for 4 rows; 16 f32 lanes per row keep the additions independent, so the loop vectorizes
/// without reassociating (the sum order is fixed: lanes, a pairwise lane reduction, then the
/// tail).
#[inline(always)]
fn dot_rows(tile: &[f32], x: &[f32]) -> [f32; ROW_BLOCK] {
    let n = x.len();
    let ws: [&[f32]; ROW_BLOCK] = std::array::from_fn(|r| &tile[r * TILE_COLS..][..n]);
    let mut acc = [[0f32; LANES]; ROW_BLOCK];
    let body = n / LANES * LANES;
    for (c, xv) in x[..body].chunks_exact(LANES).enumerate() {
        let xv: &[f32; LANES] = xv.try_into().unwrap();
        for (a, w) in acc.iter_mut().zip(&ws) {
            let wv: &[f32; LANES] = w[c * LANES..][..LANES].try_into().unwrap();
            for l in 0..LANES {
                a[l] += wv[l] * xv[l];
            }
        }
    }
    let mut out = [0f32; ROW_BLOCK];
    for ((o, a), w) in out.iter_mut().zip(&acc).zip(&ws) {
        *o = reduce_lanes(*a) + tail_dot(&w[body..], &x[body..]);
    }
    out
}

/// [`dot_rows`] with AVX2 intrinsics: the same lanes, products and sum order (bit-identical
/// results), written out because LLVM's SLP vectorizer turns the portable loop into
/// 4-wide vectors across the rows instead of 8-wide vectors along them (2-3x slower).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_rows_avx2(tile: &[f32], x: &[f32]) -> [f32; ROW_BLOCK] {
    use std::arch::x86_64::{__m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps};
    use std::arch::x86_64::{_mm256_setzero_ps, _mm256_storeu_ps};
    let n = x.len();
    let ws: [&[f32]; ROW_BLOCK] = std::array::from_fn(|r| &tile[r * TILE_COLS..][..n]);
    let zero = _mm256_setzero_ps();
    let mut acc: [[__m256; 2]; ROW_BLOCK] = [[zero; 2]; ROW_BLOCK];
    let body = n / LANES * LANES;
    for k in (0..body).step_by(LANES) {
        // SAFETY: k + 16 <= body <= n, the length of x and of every ws[r]; unaligned loads.
        let (x0, x1) = (
            _mm256_loadu_ps(x.as_ptr().add(k)),
            _mm256_loadu_ps(x.as_ptr().add(k + 8)),
        );
        for (a, w) in acc.iter_mut().zip(&ws) {
            let p = w.as_ptr().add(k);
            a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(_mm256_loadu_ps(p), x0));
            a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(_mm256_loadu_ps(p.add(8)), x1));
        }
    }
    let mut out = [0f32; ROW_BLOCK];
    for ((o, a), w) in out.iter_mut().zip(&acc).zip(&ws) {
        let mut lanes = [0f32; LANES];
        // SAFETY: lanes holds 16 f32: two 8-lane stores at offsets 0 and 8.
        _mm256_storeu_ps(lanes.as_mut_ptr(), a[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a[1]);
        *o = reduce_lanes(lanes) + tail_dot(&w[body..], &x[body..]);
    }
    out
}

/// `acc[l] += w[l] * x[l]` (a rounded product, then the sum: Rust never fuses them).
#[inline(always)]
fn mul_add_lanes(acc: &mut [f32; LANES], w: &[f32; LANES], x: &[f32; LANES]) {
    for l in 0..LANES {
        acc[l] += w[l] * x[l];
    }
}

/// One row · `x`, the same summation order as [`dot_rows`].
#[inline(always)]
fn dot(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (cw, cx) = (w.chunks_exact(LANES), x.chunks_exact(LANES));
    let (rw, rx) = (cw.remainder(), cx.remainder());
    for (a, b) in cw.zip(cx) {
        mul_add_lanes(&mut acc, a.try_into().unwrap(), b.try_into().unwrap());
    }
    reduce_lanes(acc) + tail_dot(rw, rx)
}

#[inline(always)]
fn reduce_lanes(mut a: [f32; LANES]) -> f32 {
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            a[l] += a[l + half];
        }
        half /= 2;
    }
    a[0]
}

#[inline(always)]
fn tail_dot(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).fold(0.0, |s, (a, b)| s + a * b)
}

/// The rows of a stage input in the column order of `w` (see `WeightMatrix::fp4_order`):
/// returns the buffer to read and its row stride.
fn in_weight_order(buf: Vec<f32>, width: usize, w: &WeightMatrix) -> (Vec<f32>, usize) {
    if !w.fp4_order() || width == 0 {
        return (buf, width);
    }
    let ld = w.k_extent(width);
    let mut out = vec![0f32; buf.len() / width * ld];
    parallel_rows(&mut out, ld, |r, row| {
        to_pack_order(&buf[r * width..(r + 1) * width], row)
    });
    (out, ld)
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
    let tokens_of: Vec<Vec<usize>> = slots_of
        .iter()
        .map(|slots| slots.iter().map(|&slot| slot / topk).collect())
        .collect();
    let max_tokens = slots_of.iter().map(Vec::len).max().unwrap_or(0);
    let (x, ld) = in_weight_order(x, h, &w13);
    let mut gu = vec![0f32; m * topk * 2 * i];
    {
        let out = Shared::new(&mut gu);
        let gemm = Gemm {
            w: &w13,
            used: h,
            act: &x,
            ld,
        };
        let blocks = (2 * ip).div_ceil(BLOCK_ROWS);
        parallel_items(
            active.len() * blocks,
            || Scratch::new(max_tokens),
            |scratch, item| {
                let e = active[item / blocks];
                let p0 = (item % blocks) * BLOCK_ROWS;
                let rows = BLOCK_ROWS.min(2 * ip - p0);
                if (p0..p0 + rows).all(|p| gate_up_of(l.gate_mode, p, ip).1 >= i) {
                    return; // only padded rows
                }
                gemm.block(e, p0, rows, &tokens_of[e], scratch);
                for r in 0..rows {
                    let p = p0 + r;
                    let (half, j) = gate_up_of(l.gate_mode, p, ip);
                    if j >= i {
                        continue; // padded row
                    }
                    for (t, &slot) in slots_of[e].iter().enumerate() {
                        let mut acc = scratch.acc[t * BLOCK_ROWS + r];
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
    let (a2, ld) = in_weight_order(a2, i, &w2);
    let mut y = vec![0f32; m * topk * h];
    {
        let out = Shared::new(&mut y);
        let gemm = Gemm {
            w: &w2,
            used: i,
            act: &a2,
            ld,
        };
        let blocks = h.div_ceil(BLOCK_ROWS);
        parallel_items(
            active.len() * blocks,
            || Scratch::new(max_tokens),
            |scratch, item| {
                let e = active[item / blocks];
                let n0 = (item % blocks) * BLOCK_ROWS;
                let rows = BLOCK_ROWS.min(h - n0);
                gemm.block(e, n0, rows, &slots_of[e], scratch);
                for r in 0..rows {
                    let n = n0 + r;
                    let bias = b2.map(|b| b[e * hp + n]).unwrap_or(0.0);
                    for (t, &slot) in slots_of[e].iter().enumerate() {
                        out.set(slot * h + n, scratch.acc[t * BLOCK_ROWS + r] + bias);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 dot gives the same bits as the portable one (the fallback path of CPUs
    /// without AVX2), including a tail that is not a multiple of 16.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn dot_rows_paths_agree() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let tile: Vec<f32> = (0..BLOCK_ROWS * TILE_COLS)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1.37e-3)
            .collect();
        let x: Vec<f32> = (0..TILE_COLS)
            .map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 2.1e-3)
            .collect();
        for n in [TILE_COLS, 100, 15, 0] {
            // SAFETY: AVX2 checked above.
            let fast = unsafe { dot_rows_avx2(&tile, &x[..n]) };
            let portable = dot_rows(&tile, &x[..n]);
            assert_eq!(
                fast.map(f32::to_bits),
                portable.map(f32::to_bits),
                "n = {n}"
            );
        }
    }
}
