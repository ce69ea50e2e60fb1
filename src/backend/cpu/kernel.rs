//! The CPU fused MoE: AITER's two-stage math (docs/layouts.md §7) over the recorded weight layouts,
//! f32 accumulation, all cores.
//!
//! Plan of a launch, per chunk of tokens (scratch bounded by `SCRATCH_BUDGET`, not by M):
//! group the chunk's slots by expert (plain indices: no packed limit on M or k) → quantize the stage-1 input per act_dtype → stage 1
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
use crate::moe::MoeLaunch;
use crate::runtime::threads::run_jobs;
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

/// Run `work(scratch, item)` for items 0..n on all cores, one preallocated scratch per
/// worker (`scratches.len()` workers at most).
fn parallel_items<S: Send>(n: usize, scratches: &mut [S], work: impl Fn(&mut S, usize) + Sync) {
    let workers = scratches.len().min(n);
    if workers <= 1 {
        if let Some(s) = scratches.first_mut() {
            (0..n).for_each(|i| work(s, i));
        }
        return;
    }
    // Items come from a shared counter: a worker the OS refuses leaves its items to the rest
    // (its job runs on the calling thread, after the others have started).
    let next = AtomicUsize::new(0);
    let (next, work) = (&next, &work);
    std::thread::scope(|scope| {
        let jobs = scratches[..workers].iter_mut().map(|s| {
            move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                work(s, i);
            }
        });
        run_jobs(scope, jobs);
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
    let f = &f;
    std::thread::scope(|scope| {
        let jobs = buf.chunks_mut(per * width).enumerate().map(|(c, chunk)| {
            move || {
                for (r, row) in chunk.chunks_mut(width).enumerate() {
                    f(c * per + r, row);
                }
            }
        });
        run_jobs(scope, jobs);
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
    fn new(max_tokens: usize) -> Result<Scratch> {
        Ok(Scratch {
            tile: zeroed(BLOCK_ROWS * TILE_COLS)?,
            acc: zeroed(max_tokens * BLOCK_ROWS)?,
        })
    }
}

/// A zeroed host buffer; a failed allocation is OUT_OF_MEMORY, never an abort.
fn zeroed<T: Copy + Default>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(Error::out_of_memory(format!(
            "cannot allocate {} bytes of CPU scratch",
            n.saturating_mul(std::mem::size_of::<T>())
        )));
    }
    v.resize(n, T::default());
    Ok(v)
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
/// `src` itself, or its rows reordered into `dst`; returns the buffer to read and its stride.
fn in_weight_order<'a>(
    src: &'a [f32],
    width: usize,
    w: &WeightMatrix,
    dst: &'a mut [f32],
) -> (&'a [f32], usize) {
    if !w.fp4_order() || width == 0 {
        return (src, width);
    }
    let ld = w.k_extent(width);
    let dst = &mut dst[..src.len() / width * ld];
    parallel_rows(dst, ld, |r, row| {
        to_pack_order(&src[r * width..(r + 1) * width], row)
    });
    (dst, ld)
}

/// Quantize the rows of a stage input as `act` says (writes the dequantized values back).
/// All-zero rows (slots nobody routed to) stay zero and never raise a per-tensor amax.
/// `tensor_scale`: the FP8_PER_TENSOR scale of the whole stage input (static, or from the
/// amax over the launch: the launch is tiled).
fn quantize_rows(buf: &mut [f32], width: usize, act: ActDtype, fp8: Fp8Kind, tensor_scale: f32) {
    match act {
        ActDtype::Bf16 => parallel_rows(buf, width, |_, r| {
            r.iter_mut().for_each(|x| *x = actquant::round_bf16(*x))
        }),
        ActDtype::Fp16 => parallel_rows(buf, width, |_, r| {
            r.iter_mut().for_each(|x| *x = actquant::round_f16(*x))
        }),
        ActDtype::Fp8PerToken => parallel_rows(buf, width, |_, r| actquant::fp8_quant_row(r, fp8)),
        ActDtype::Fp8PerTensor => parallel_rows(buf, width, |_, r| {
            actquant::fp8_quant_with_scale(r, tensor_scale, fp8)
        }),
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
            WeightFormat::Fp8PerChannel | WeightFormat::Int4PerChannel => {
                Scale::PerChannel(f32s(t)?.unwrap_or(&[]))
            }
            WeightFormat::Fp8Block128 => Scale::Block128(f32s(t)?.unwrap_or(&[])),
            WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => Scale::Mx(
                t.as_ref().map(|t| t.host_bytes()).unwrap_or(&[]),
                layout
                    .scale_layout
                    .unwrap_or(crate::types::ScaleLayout::Plain),
            ),
            WeightFormat::Int4Group32 => Scale::Int4Group(
                t.as_ref().map(|t| t.host_bytes()).unwrap_or(&[]),
                layout
                    .scale_layout
                    .unwrap_or(crate::types::ScaleLayout::Plain),
            ),
        })
    }
}

/// Stage-1 output row p of w13 (in its stored row order) → (0 gate | 1 up, index j). A
/// non-gated w13 holds only up rows.
fn gate_up_of(gated: bool, mode: GateMode, p: usize, ip: usize) -> (usize, usize) {
    if !gated {
        return (1, p);
    }
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

/// Scratch bytes one launch may hold. The launch runs in chunks of tokens sized to fit, so
/// memory does not grow with M (each chunk re-reads the weights: at this size a chunk holds
/// hundreds of tokens per expert for typical shapes).
const SCRATCH_BUDGET: usize = 128 << 20;

/// What every chunk of a launch reads.
struct Launch<'a> {
    c: &'a crate::moe::MoeConfig,
    shape: &'a LaunchShape,
    m: usize,
    topk: usize,
    h: usize,
    hp: usize,
    i: usize,
    ip: usize,
    e_local: usize,
    hidden: Hidden<'a>,
    in_elem: ElemType,
    /// Rows of w13 per expert (2·Ip gated, Ip for activation NONE).
    w13_rows: usize,
    out_elem: ElemType,
    ids: &'a [i32],
    weights: &'a [f32],
    /// Local id of each global expert id, -1 when masked off.
    local: Vec<i32>,
    num_tokens: usize,
    b13: Option<&'a [f32]>,
    b2: Option<&'a [f32]>,
    fp8: Fp8Kind,
    w13: WeightMatrix<'a>,
    w2: WeightMatrix<'a>,
}

/// The caller's hidden_states: 16-bit values, or codes and scales of a pre-quantized input
/// (row strides in bytes).
enum Hidden<'a> {
    Values(&'a [u16]),
    Quantized {
        codes: &'a [u8],
        scales: &'a [u8],
        code_stride: usize,
        scale_stride: usize,
    },
}

/// The buffers of one chunk of `tokens` tokens, allocated once per launch.
struct Chunk {
    tokens: usize,
    /// Offsets into `slots` of each local expert's slots, `[e_local + 1]`.
    start: Vec<usize>,
    /// Chunk-local slots `(t − t0)·topk + s` grouped by expert, in (token, slot) order.
    slots: Vec<usize>,
    /// The chunk-local token of each entry of `slots`.
    slot_tokens: Vec<usize>,
    routed: Vec<bool>,
    active: Vec<usize>,
    x: Vec<f32>,
    x_order: Vec<f32>,
    gu: Vec<f32>,
    a2: Vec<f32>,
    a2_order: Vec<f32>,
    y: Vec<f32>,
    sums: Vec<f32>,
    scratch: Vec<Scratch>,
}

impl Launch<'_> {
    /// f32 values a chunk holds per token (every buffer of [`Chunk`] that scales with it).
    fn floats_per_token(&self, workers: usize) -> usize {
        let (h, i, k) = (self.h, self.i, self.topk);
        let (ldh, ldi) = (self.w13.k_extent(h), self.w2.k_extent(i));
        // x, x_order, sums; per slot gu, a2, a2_order, y, the slot lists and the workers'
        // accumulator rows.
        h + ldh + self.shape.output_cols + k * (3 * i + ldi + h + 5 + BLOCK_ROWS * workers)
    }

    fn chunk(&self, workers: usize, budget: usize) -> Result<Chunk> {
        let per = self.floats_per_token(workers).max(1) * 4;
        let tokens = (budget / per).clamp(1, self.m.max(1));
        let pairs = tokens * self.topk;
        let mut scratch = Vec::new();
        if scratch.try_reserve_exact(workers).is_err() {
            return Err(Error::out_of_memory("cannot allocate CPU worker scratch"));
        }
        for _ in 0..workers {
            scratch.push(Scratch::new(pairs)?);
        }
        Ok(Chunk {
            tokens,
            start: zeroed(self.e_local + 1)?,
            slots: zeroed(pairs)?,
            slot_tokens: zeroed(pairs)?,
            routed: zeroed(pairs)?,
            active: zeroed(self.e_local)?,
            x: zeroed(tokens * self.h)?,
            x_order: zeroed(tokens * self.w13.k_extent(self.h))?,
            gu: zeroed(pairs * 2 * self.i)?,
            a2: zeroed(pairs * self.i)?,
            a2_order: zeroed(pairs * self.w2.k_extent(self.i))?,
            y: zeroed(pairs * self.h)?,
            sums: zeroed(tokens * self.shape.output_cols)?,
            scratch,
        })
    }

    /// The local expert of (token t, slot s), if it is routed and t is counted.
    fn expert_of(&self, t: usize, s: usize) -> Option<usize> {
        if t >= self.num_tokens {
            return None;
        }
        let id = self.ids[t * self.topk + s];
        if id < 0 || id as usize >= self.local.len() {
            return None;
        }
        let l = self.local[id as usize];
        (l >= 0).then_some(l as usize)
    }

    /// Group the slots of tokens `t0..t0 + n` by local expert (a counting sort: the
    /// (token, slot) order within an expert is kept).
    fn route(&self, t0: usize, n: usize, ch: &mut Chunk) {
        let topk = self.topk;
        ch.start.fill(0);
        ch.routed[..n * topk].fill(false);
        for q in 0..n * topk {
            if let Some(e) = self.expert_of(t0 + q / topk, q % topk) {
                ch.start[e + 1] += 1;
            }
        }
        for e in 0..self.e_local {
            ch.start[e + 1] += ch.start[e];
        }
        let mut fill = ch.start[..self.e_local].to_vec();
        for q in 0..n * topk {
            if let Some(e) = self.expert_of(t0 + q / topk, q % topk) {
                ch.slots[fill[e]] = q;
                ch.slot_tokens[fill[e]] = q / topk;
                fill[e] += 1;
                ch.routed[q] = true;
            }
        }
        ch.active.clear();
        ch.active
            .extend((0..self.e_local).filter(|&e| ch.start[e + 1] > ch.start[e]));
    }

    /// The stage-1 input rows of tokens `t0..t0 + n` (counted tokens only) into `ch.x`;
    /// returns how many rows that is.
    fn read_x(&self, t0: usize, n: usize, ch: &mut Chunk) -> usize {
        let rows = self.num_tokens.min(t0 + n).saturating_sub(t0);
        let (h, cols) = (self.h, self.shape.hidden_cols);
        let act = self.c.act_dtype;
        parallel_rows(&mut ch.x[..rows * h], h, |r, row| {
            let t = t0 + r;
            match self.hidden {
                Hidden::Values(v) => {
                    for (d, &b) in row.iter_mut().zip(&v[t * cols..t * cols + h]) {
                        *d = read_f16ish(b, self.in_elem);
                    }
                }
                Hidden::Quantized {
                    codes,
                    scales,
                    code_stride,
                    scale_stride,
                } => actquant::dequantize_row(
                    &codes[t * code_stride..(t + 1) * code_stride],
                    &scales[t * scale_stride..(t + 1) * scale_stride],
                    act,
                    self.fp8,
                    row,
                ),
            }
        });
        rows
    }

    /// Routing, stage 1 and the activation of tokens `t0..t0 + n`: `ch.a2` holds the stage-2
    /// input of every slot (zero where unrouted), before stage-2 quantization.
    /// `x_scale`: the FP8_PER_TENSOR scale of the stage-1 input. A pre-quantized input is
    /// read as the GEMM's values already.
    fn stage1(&self, t0: usize, n: usize, x_scale: f32, ch: &mut Chunk) {
        let (topk, i, ip) = (self.topk, self.i, self.ip);
        let c = self.c;
        self.route(t0, n, ch);
        let rows = self.read_x(t0, n, ch);
        if !c.prequantized_input {
            quantize_rows(
                &mut ch.x[..rows * self.h],
                self.h,
                c.act_dtype,
                self.fp8,
                x_scale,
            );
        }
        let (x, ld) = in_weight_order(&ch.x[..rows * self.h], self.h, &self.w13, &mut ch.x_order);
        {
            let out = Shared::new(&mut ch.gu[..n * topk * 2 * i]);
            let gemm = Gemm {
                w: &self.w13,
                used: self.h,
                act: x,
                ld,
            };
            let w13_rows = self.w13_rows;
            let gated = c.activation.is_gated();
            let blocks = w13_rows.div_ceil(BLOCK_ROWS);
            let (active, start) = (&ch.active, &ch.start);
            let (slots, slot_tokens) = (&ch.slots, &ch.slot_tokens);
            let gate_mode = c.layout.gate_mode;
            parallel_items(active.len() * blocks, &mut ch.scratch, |scratch, item| {
                let e = active[item / blocks];
                let p0 = (item % blocks) * BLOCK_ROWS;
                let rows = BLOCK_ROWS.min(w13_rows - p0);
                if (p0..p0 + rows).all(|p| gate_up_of(gated, gate_mode, p, ip).1 >= i) {
                    return; // only padded rows
                }
                let (lo, hi) = (start[e], start[e + 1]);
                gemm.block(e, p0, rows, &slot_tokens[lo..hi], scratch);
                for r in 0..rows {
                    let p = p0 + r;
                    let (half, j) = gate_up_of(gated, gate_mode, p, ip);
                    if j >= i {
                        continue; // padded row
                    }
                    for (t, &slot) in slots[lo..hi].iter().enumerate() {
                        let mut acc = scratch.acc[t * BLOCK_ROWS + r];
                        if c.router_weight_on_input {
                            acc *= self.weights[t0 * topk + slot];
                        }
                        if let Some(b) = self.b13 {
                            acc += b[e * w13_rows + p];
                        }
                        out.set((slot * 2 + half) * i + j, acc);
                    }
                }
            });
        }
        // Activation, cast to the output dtype (as the reference does).
        let act = GatedAct {
            activation: c.activation,
            alpha: c.alpha,
            limit: c.limit,
        };
        let (gu, routed, out_elem) = (&ch.gu, &ch.routed, self.out_elem);
        parallel_rows(&mut ch.a2[..n * topk * i], i, |slot, row| {
            if !routed[slot] {
                row.fill(0.0);
                return;
            }
            let (g, u) = gu[slot * 2 * i..(slot + 1) * 2 * i].split_at(i);
            for ((d, &g), &u) in row.iter_mut().zip(g).zip(u) {
                *d = read_f16ish(write_f16ish(act.apply(g, u), out_elem), out_elem);
            }
        });
    }

    /// Stage-2 quantization, stage 2 and the weighted sum of tokens `t0..t0 + n` into
    /// `ch.sums` (`[n, output_cols]`; padded columns and unrouted rows zero).
    /// `a2_scale`: the FP8_PER_TENSOR scale of the stage-2 input.
    fn stage2(&self, n: usize, a2_scale: f32, ch: &mut Chunk, t0: usize) {
        let (topk, h, i, hp) = (self.topk, self.h, self.i, self.hp);
        let c = self.c;
        let pairs = n * topk;
        quantize_rows(
            &mut ch.a2[..pairs * i],
            i,
            c.stage2_act_dtype,
            self.fp8,
            a2_scale,
        );
        let (a2, ld) = in_weight_order(&ch.a2[..pairs * i], i, &self.w2, &mut ch.a2_order);
        {
            let out = Shared::new(&mut ch.y[..pairs * h]);
            let gemm = Gemm {
                w: &self.w2,
                used: i,
                act: a2,
                ld,
            };
            let blocks = h.div_ceil(BLOCK_ROWS);
            let (active, start, slots) = (&ch.active, &ch.start, &ch.slots);
            parallel_items(active.len() * blocks, &mut ch.scratch, |scratch, item| {
                let e = active[item / blocks];
                let n0 = (item % blocks) * BLOCK_ROWS;
                let rows = BLOCK_ROWS.min(h - n0);
                let (lo, hi) = (start[e], start[e + 1]);
                gemm.block(e, n0, rows, &slots[lo..hi], scratch);
                for r in 0..rows {
                    let nn = n0 + r;
                    let bias = self.b2.map(|b| b[e * hp + nn]).unwrap_or(0.0);
                    for (t, &slot) in slots[lo..hi].iter().enumerate() {
                        out.set(slot * h + nn, scratch.acc[t * BLOCK_ROWS + r] + bias);
                    }
                }
            });
        }
        let cols = self.shape.output_cols;
        let (y, routed) = (&ch.y, &ch.routed);
        let sums = &mut ch.sums[..n * cols];
        sums.fill(0.0);
        parallel_rows(sums, cols, |t, row| {
            for s in 0..topk {
                let slot = t * topk + s;
                if !routed[slot] {
                    continue;
                }
                let w = if c.router_weight_on_input {
                    1.0
                } else {
                    self.weights[t0 * topk + slot]
                };
                for (d, &v) in row[..h].iter_mut().zip(&y[slot * h..(slot + 1) * h]) {
                    *d += w * v;
                }
            }
        });
    }
}

/// The launch; `shape` comes from `check_launch`. All scratch is allocated before the output
/// is touched, so a failed allocation (OUT_OF_MEMORY) leaves the output as it was.
pub fn fused_moe(launch: &MoeLaunch, shape: &LaunchShape) -> Result<()> {
    fused_moe_within(launch, shape, SCRATCH_BUDGET)
}

/// [`fused_moe`] with chunks sized to `budget` bytes of scratch.
fn fused_moe_within(launch: &MoeLaunch, shape: &LaunchShape, budget: usize) -> Result<()> {
    let c = &launch.config;
    let l = &c.layout;
    let (m, topk) = (shape.m, shape.topk);
    let e_local = l.num_experts;
    // SAFETY (all host reads below): check_launch validated shapes and dtypes; the caller
    // promised the memory for the duration of the call; the backend serves host memory only.
    let hidden = if c.prequantized_input {
        let scale = launch
            .hidden_scale
            .as_ref()
            .expect("prequantized_input: hidden_scale checked present");
        // SAFETY: as above; shapes checked by check_launch (codes [M, C], scales [M, groups]).
        unsafe {
            Hidden::Quantized {
                codes: launch.hidden_states.host_bytes(),
                scales: scale.host_bytes(),
                code_stride: launch.hidden_states.nbytes() / m.max(1),
                scale_stride: scale.nbytes() / m.max(1),
            }
        }
    } else {
        Hidden::Values(unsafe { launch.hidden_states.host_slice()? })
    };
    let static_scales = [&launch.stage1_act_scale, &launch.stage2_act_scale].map(|t| {
        // SAFETY: as above: a [1] / [] f32 host tensor (check_launch).
        t.as_ref()
            .map(|t| unsafe { t.host_slice::<f32>() }.map(|v| v[0]))
    });
    let mut static_scale = [None; 2];
    for (stage, (s, name)) in static_scales
        .into_iter()
        .zip(["stage1_act_scale", "stage2_act_scale"])
        .enumerate()
    {
        if let Some(s) = s {
            let s = s?;
            if !(s.is_finite() && s > 0.0) {
                return Err(Error::invalid(format!(
                    "{name}: expected a finite scale > 0 for the stage-{} input, got {s}",
                    stage + 1
                )));
            }
            static_scale[stage] = Some(s);
        }
    }
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
        Some(t) => (unsafe { t.host_slice::<i32>()? }[0]).max(0) as usize,
        None => m,
    }
    .min(m);
    // Local id of each global expert: cumsum(mask) − 1, or the id itself without a mask.
    let mut local: Vec<i32> = zeroed(mask.map_or(e_local, |mk| mk.len()))?;
    let mut next = 0;
    for (e, l) in local.iter_mut().enumerate() {
        *l = if mask.map_or(true, |mk| mk[e] != 0) {
            next += 1;
            next - 1
        } else {
            -1
        };
    }
    let fp8 = if shape.weight_elem == ElemType::Fp8E4m3fnuz {
        Fp8Kind::E4m3fnuz
    } else {
        Fp8Kind::E4m3fn
    };
    let run = Launch {
        c,
        shape,
        m,
        topk,
        h: l.hidden_size,
        hp: l.hidden_padded,
        i: l.intermediate_size,
        ip: l.intermediate_padded,
        e_local,
        hidden,
        in_elem: launch.hidden_states.elem,
        w13_rows: crate::moe::check::w13_rows(c),
        out_elem: launch.output.elem,
        ids,
        weights,
        local,
        num_tokens,
        b13: unsafe { f32s(&launch.w13_bias)? },
        b2: unsafe { f32s(&launch.w2_bias)? },
        fp8,
        w13: WeightMatrix::new(
            l,
            unsafe { launch.w13.host_bytes() },
            crate::moe::check::w13_rows(c),
            l.hidden_padded,
            shape.weight_elem,
            scale_of(l.weight_format, &launch.w13_scale, l)?,
        ),
        w2: WeightMatrix::new(
            l,
            unsafe { launch.w2.host_bytes() },
            l.hidden_padded,
            l.intermediate_padded,
            shape.weight_elem,
            scale_of(l.weight_format, &launch.w2_scale, l)?,
        ),
    };
    // SAFETY: the output is host memory of [m, output_cols] 16-bit values, checked not to
    // overlap any input.
    let output: &mut [u16] = unsafe { launch.output.host_slice_mut()? };
    let mut ch = run.chunk(threads(), budget)?;
    let chunks = || {
        (0..m)
            .step_by(ch.tokens.max(1))
            .map(|t0| (t0, ch.tokens.min(m - t0)))
    };
    let chunk_list: Vec<(usize, usize)> = chunks().collect();

    // A dynamic FP8_PER_TENSOR scale is amax / fp8 max over the whole stage input: a first
    // pass finds it (stage 2's needs stage 1 of every chunk). A static scale needs none.
    let per_tensor = [c.act_dtype, c.stage2_act_dtype].map(|a| a == ActDtype::Fp8PerTensor);
    let dynamic = [0, 1].map(|s| per_tensor[s] && static_scale[s].is_none());
    let mut x_scale = static_scale[0].unwrap_or(1.0);
    if dynamic[0] {
        let mut amax = 0f32;
        for &(t0, n) in &chunk_list {
            let rows = run.read_x(t0, n, &mut ch);
            amax = amax.max(actquant::amax_of(&ch.x[..rows * run.h]));
        }
        x_scale = actquant::fp8_scale_for(amax, fp8);
    }
    let mut a2_scale = static_scale[1].unwrap_or(1.0);
    if dynamic[1] {
        let mut amax = 0f32;
        for &(t0, n) in &chunk_list {
            run.stage1(t0, n, x_scale, &mut ch);
            amax = amax.max(actquant::amax_of(&ch.a2[..n * topk * run.i]));
        }
        a2_scale = actquant::fp8_scale_for(amax, fp8);
    }
    let cols = shape.output_cols;
    for &(t0, n) in &chunk_list {
        run.stage1(t0, n, x_scale, &mut ch);
        run.stage2(n, a2_scale, &mut ch, t0);
        for (o, &v) in output[t0 * cols..(t0 + n) * cols].iter_mut().zip(&ch.sums) {
            *o = write_f16ish(v, run.out_elem);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of one token give the bits of one chunk for the whole launch: per-token and
    /// per-tensor fp8 activations (whose amax spans every chunk), num_local_tokens inside a
    /// chunk, out-of-range ids.
    #[test]
    fn tiling_over_tokens_changes_no_bit() {
        use crate::layout::Layout;
        use crate::moe::{check::check_launch, MoeConfig};
        use crate::tensor::DeviceKind;
        use crate::types::Activation;
        let (m, k, e, h, i) = (37usize, 3usize, 2usize, 32usize, 32usize);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        let mut w13: Vec<u8> = (0..e * 2 * i * h)
            .map(|_| (next() % 0x38) as u8 | (next() as u8 & 0x80))
            .collect();
        let mut w2: Vec<u8> = (0..e * h * i)
            .map(|_| (next() % 0x38) as u8 | (next() as u8 & 0x80))
            .collect();
        let mut scale: Vec<f32> = vec![0.05, 0.08];
        let mut x: Vec<u16> = (0..m * h)
            .map(|_| half::bf16::from_f32((next() % 200) as f32 / 50.0 - 2.0).to_bits())
            .collect();
        let mut ids: Vec<i32> = (0..m * k).map(|_| (next() % 3) as i32).collect();
        let mut wts: Vec<f32> = (0..m * k).map(|_| (next() % 100) as f32 / 100.0).collect();
        let mut nlt = vec![30i32];
        let t = |name, ptr: *mut u8, elem, shape: &[usize]| Tensor {
            name,
            ptr,
            device: DeviceKind::Cpu,
            device_id: 0,
            elem,
            shape: shape.to_vec(),
        };
        for (act, with_nlt) in [
            (ActDtype::Fp8PerTensor, false),
            (ActDtype::Fp8PerToken, true),
        ] {
            let layout = Layout::new(
                3,
                1,
                1,
                0,
                e as i64,
                [h as i64, i as i64, h as i64, i as i64],
                0,
            )
            .unwrap();
            let mut run = |budget: usize| {
                let mut out = vec![0u16; m * h];
                let launch = MoeLaunch {
                    config: MoeConfig {
                        layout,
                        activation: Activation::Silu,
                        alpha: 1.702,
                        limit: None,
                        act_dtype: act,
                        stage2_act_dtype: act,
                        prequantized_input: false,
                        static_act_scale: [false; 2],
                        router_weight_on_input: false,
                        has_expert_mask: false,
                        has_num_local_tokens: with_nlt,
                    },
                    hidden_states: t(
                        "hidden_states",
                        x.as_mut_ptr() as _,
                        ElemType::Bf16,
                        &[m, h],
                    ),
                    hidden_scale: None,
                    w13: t("w13", w13.as_mut_ptr(), ElemType::Fp8E4m3fn, &[e, 2 * i, h]),
                    w13_scale: Some(t("w13_scale", scale.as_mut_ptr() as _, ElemType::F32, &[e])),
                    w13_bias: None,
                    w2: t("w2", w2.as_mut_ptr(), ElemType::Fp8E4m3fn, &[e, h, i]),
                    w2_scale: Some(t("w2_scale", scale.as_mut_ptr() as _, ElemType::F32, &[e])),
                    w2_bias: None,
                    topk_weights: t(
                        "topk_weights",
                        wts.as_mut_ptr() as _,
                        ElemType::F32,
                        &[m, k],
                    ),
                    topk_ids: t("topk_ids", ids.as_mut_ptr() as _, ElemType::I32, &[m, k]),
                    expert_mask: None,
                    num_local_tokens: with_nlt.then(|| {
                        t(
                            "num_local_tokens",
                            nlt.as_mut_ptr() as _,
                            ElemType::I32,
                            &[1],
                        )
                    }),
                    output: t("output", out.as_mut_ptr() as _, ElemType::Bf16, &[m, h]),
                    workspace: None,
                    stream: 0,
                    stage1_act_scale: None,
                    stage2_act_scale: None,
                };
                let shape = check_launch(&launch).unwrap();
                fused_moe_within(&launch, &shape, budget).unwrap();
                out
            };
            let whole = run(SCRATCH_BUDGET);
            assert!(whole.iter().any(|&v| v != 0), "{act:?}: all zero");
            assert_eq!(run(1), whole, "{act:?}: one token per chunk");
            assert_eq!(run(7 * 4 * 1000), whole, "{act:?}: a few tokens per chunk");
        }
    }

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
