//! Which GEMM family runs a launch: the one place that maps (arch, M, E, top-k, H, I,
//! format, act dtype, layout) to a [`Family`]. Deterministic: the same launch on the same
//! device always gets the same kernels (no timing, no environment, unless the diagnostic
//! override below is set).

use once_cell::sync::Lazy;

use super::spec::{Family, FamilySet, KernelSpec, Pdl, StreamPrefetch};
use crate::error::{Error, Result};
use crate::moe::check::{w13_rows, LaunchShape};
use crate::moe::MoeLaunch;
use crate::types::{ActDtype, GateMode, ScaleLayout, WeightFormat, WeightLayout};

/// Average (token, slot) pairs per local expert up to which the stream family runs, for
/// quantized and for 16-bit weights: it reads each weight byte once per 16-pair tile, so up to
/// two tiles per expert it moves the fewest bytes, and quantized weights gain more (the tile
/// family decodes them once per 32 rows); above that the tile family's larger blocks reuse
/// weights and activations better. Measured on the H200 (bench/NOTES.md): gpt-oss bf16 at 32
/// pairs per expert is 8 % faster on tile32, MXFP4 and fp8 2.4-2.8x faster on stream.
pub const STREAM_MAX_PAIRS_PER_EXPERT: [usize; 2] = [32, 16];

/// Average pairs per local expert from which the wgmma family runs (where it covers the
/// configuration; ahead of the stream family). Measured on the H200 (bench/NOTES.md): at 32
/// pairs DeepSeek-V3 fp8 takes 5.6 ms on wgmma against 9.3 on stream and gpt-oss bf16 3.1
/// against 3.5 on tile32; at 16 pairs stream is 1.3-1.6x faster.
pub const WGMMA_MIN_PAIRS_PER_EXPERT: usize = 32;
/// 16-bit weights from 4 pairs, on 64-row tiles there ([`default_tile_rows`]): gpt-oss bf16
/// at M = 128 (4 pairs) took 1546 us on wgmma against 1607 on stream, Qwen3 bf16 at M = 128
/// (8 pairs) 306 against 340 (bench/NOTES.md, session 16). On 128-row tiles the crossover
/// had been 16 pairs (session 11).
pub const WGMMA_MIN_PAIRS_PER_EXPERT_16BIT: usize = 4;
/// MXFP4 weights from 16 pairs: gpt-oss at M = 512 (16 pairs) took 999 us on wgmma against
/// 1146 on stream, at M = 256 (8 pairs) 977 against 791 (H100, bench/NOTES.md, session 30).
pub const WGMMA_MIN_PAIRS_PER_EXPERT_MXFP4: usize = 16;
/// fp8 block-128 weights from 4 pairs, on 64-row tiles: DeepSeek-V3 at M = 128 (4 pairs)
/// took 2591 us on wgmma against 2879 on stream, Qwen3-30B-A3B at M = 128 (8 pairs) 196
/// against 224 (bench/NOTES.md, session 16). On 128-row tiles the crossover had been 16
/// pairs (session 9).
pub const WGMMA_MIN_PAIRS_PER_EXPERT_FP8_BLOCK: usize = 4;

/// `MOEPLUG_WGMMA_N=128|256`, `MOEPLUG_WGMMA_BM=64|128|auto`, `MOEPLUG_WGMMA_BLOCKS=1|2`:
/// diagnostic overrides of the wgmma family's block shape and blocks per SM (benchmarks). The
/// defaults: the tile height of [`default_tile_rows`] (`auto` asks for the L2 rule on every
/// format), one block per SM, and 256 weight rows where the warp-specialised kernel takes them
/// (16-bit operands: 5-10 % faster than 128 on Qwen3 and gpt-oss bf16 at M = 1024 / 4096,
/// bench/NOTES.md session 11; 64-row tiles take them for every format), else 128. MXFP4 runs
/// the swap-AB kernel; with `MOEPLUG_WGMMA_SWAP=0` two blocks per SM of the shared-memory tile
/// kernel, and with `MOEPLUG_WGMMA_BLOCKS=1` too the warp-specialised kernel (the consumers
/// decode the packs the producer copies): 1.32x / 1.38x the tile kernel's time at gpt-oss
/// M = 1024 / 4096 on the H100 (bench/NOTES.md, session 22).
static WGMMA_N_PREFERENCE: Lazy<Option<u32>> = Lazy::new(|| env_choice("MOEPLUG_WGMMA_N"));
static WGMMA_BM_PREFERENCE: Lazy<Option<TileRows>> = Lazy::new(|| {
    let v = std::env::var("MOEPLUG_WGMMA_BM").ok()?;
    match v.trim() {
        "auto" => Some(TileRows::ByL2Bytes),
        v => v.parse().ok().map(TileRows::Fixed),
    }
});
static WGMMA_BLOCKS_PREFERENCE: Lazy<Option<u32>> =
    Lazy::new(|| env_choice("MOEPLUG_WGMMA_BLOCKS"));

/// A choice of the wgmma family's sorted rows per tile.
#[derive(Debug, Clone, Copy, PartialEq)]
enum TileRows {
    Fixed(u32),
    /// 64 or 128, whichever reads fewer bytes through the L2 ([`wgmma_l2_bytes`]).
    ByL2Bytes,
    /// 128 from this many pairs per expert, else 64.
    ByPairs(usize),
}

/// `MOEPLUG_WGMMA_TMA=0|1`: weight tiles by TMA (the default where it covers the
/// configuration) or by per-thread cp.async (benchmarks).
static WGMMA_TMA_PREFERENCE: Lazy<Option<u32>> = Lazy::new(|| env_choice("MOEPLUG_WGMMA_TMA"));
/// `MOEPLUG_WGMMA_WS=0|1`: the warp-specialised persistent kernel (the default where it
/// covers the configuration) or one block per tile (benchmarks).
static WGMMA_WS_PREFERENCE: Lazy<Option<u32>> = Lazy::new(|| env_choice("MOEPLUG_WGMMA_WS"));
/// `MOEPLUG_WGMMA_PERSISTENT=0|1`: the warp-specialised kernel from a block per work item
/// (handed out by the hardware in order) or from one block per SM walking a fixed stride of
/// them, instead of [`persistent_grid`]'s rule (benchmarks).
static WGMMA_PERSISTENT_PREFERENCE: Lazy<Option<u32>> =
    Lazy::new(|| env_choice("MOEPLUG_WGMMA_PERSISTENT"));

/// Stage-1 K steps (128-byte rows of K) from which the warp-specialised wgmma kernel runs from
/// a block per work item rather than persistent. Measured on the H200
/// (bench/NOTES.md, session 19, both stages switched together): a block per item took 0.89x /
/// 0.97x the time on gpt-oss bf16 (45 steps) at M = 4096 / 1024 and 0.97x / 0.98x on DeepSeek
/// fp8 (56 steps), 32-128 pairs per expert; on Qwen3 (16 fp8 or 32 bf16 steps) 1.05-1.08x,
/// except bf16 at M = 4096 (0.98x). A long item hides the launch of the next block, and the
/// in-order hand-out keeps an expert's tiles reading its weight tiles together (DRAM read
/// 1.9x stage 1's weights on DeepSeek M = 4096 persistent); a short item needs the
/// persistent loop's overlap of its epilogue with the next item's copies. At decode (H100,
/// session 24) the same split: a block per item took 0.976-0.990x on gpt-oss bf16 and
/// 0.980-0.988x on DeepSeek fp8 at M = 8-256, 1.003-1.077x on Qwen3 bf16 / fp8.
pub const WGMMA_ITEM_GRID_MIN_K_STEPS: usize = 40;

/// Whether `spec`'s GEMM stages launch one block per SM that loops over the work (else one
/// block per work item: the kernel's loop then runs once).
pub fn persistent_grid(spec: &KernelSpec, launch: &MoeLaunch) -> bool {
    if !spec.persistent() {
        return false;
    }
    if let Some(v) = *WGMMA_PERSISTENT_PREFERENCE {
        return v != 0;
    }
    // The swap-AB kernel: persistent measured 0.98x / 0.97x a block per item at gpt-oss
    // M = 1024 / 4096 (H100, bench/NOTES.md, session 24): its items' epilogues and first
    // copies then overlap the next item's.
    if spec.wgmma_swap() {
        return true;
    }
    let l = &launch.config.layout;
    let k_step = if spec.act_dtype.is_quantized() {
        128
    } else {
        64
    };
    l.hidden_size.div_ceil(k_step) < WGMMA_ITEM_GRID_MIN_K_STEPS
}

/// `MOEPLUG_WGMMA_KSPLIT=1`: the warp-specialised kernel's warpgroups split K over the same
/// weight rows ([`KernelSpec::wgmma_ksplit`]) where the spec allows it (an opt-in). A wave model
/// (a stage takes ceil(items / 132) item times; halving a block's rows doubles its items)
/// predicted 0.85-0.90x at Qwen3 bf16 M = 8, where ncu had the stages at 72 / 68 % of the DRAM
/// rate alone; on the H100 it measured 0.99x there, 0.99x at gpt-oss bf16 M = 32-512, and
/// 1.02x / 1.06x at gpt-oss M = 4 / 1024 (bench/NOTES.md, session 20): in a launch the next
/// stage's early weight copies (PDL) fill the short last wave that ncu sees alone.
static WGMMA_KSPLIT_PREFERENCE: Lazy<bool> =
    Lazy::new(|| std::env::var("MOEPLUG_WGMMA_KSPLIT").is_ok_and(|v| v.trim() == "1"));

/// Whether `spec` runs with its warpgroups splitting K: asked for, and covered.
pub fn wgmma_ksplit(spec: &KernelSpec) -> bool {
    let split = KernelSpec {
        wgmma_ksplit: true,
        ..spec.clone()
    };
    *WGMMA_KSPLIT_PREFERENCE && wgmma_spec_unsupported(90, &split).is_none()
}

/// `MOEPLUG_WGMMA_RS=0|1` (with `MOEPLUG_WGMMA_SWAP=0`): MXFP4 weights decoded into a
/// shared-memory weight tile or fed as the register operand of wgmma on the cp.async tile
/// kernel (opt-in: measured 1-3.5 % slower on gpt-oss at M = 256-4096, and on 64-row tiles
/// 10 % faster at M <= 1024 but 47 % slower at 4096, while the stream family stays ahead at
/// M <= 1024; bench/NOTES.md session 12; on the H100 against today's tile kernel 1.54x /
/// 1.46x its time at M = 1024 / 4096, session 22).
static WGMMA_RS_PREFERENCE: Lazy<Option<u32>> = Lazy::new(|| env_choice("MOEPLUG_WGMMA_RS"));
/// `MOEPLUG_WGMMA_DECODERS=2`: MXFP4's warp-specialised kernel (`MOEPLUG_WGMMA_SWAP=0
/// MOEPLUG_WGMMA_BLOCKS=1`) with two warpgroups that only decode beside the two that multiply
/// ([`KernelSpec::wgmma_decoders`]), an opt-in: 1.35x / 1.36x the tile kernel's time at
/// gpt-oss M = 1024 / 4096 on the H100, no better than without them (bench/NOTES.md, session
/// 22).
static WGMMA_DECODERS_PREFERENCE: Lazy<Option<u32>> =
    Lazy::new(|| env_choice("MOEPLUG_WGMMA_DECODERS"));
/// `MOEPLUG_WGMMA_SWAP=0|1`: MXFP4 on the swap-AB kernel (register-operand weights on the
/// warp-specialised kernel: 256 weight rows per block, 128 codes per step;
/// moe_gemm_wgmma_swap.cuh; the default) or on the shared-memory tile kernel (0). Measured on
/// the H100 (bench/NOTES.md, session 24) at gpt-oss M = 1024 / 4096: 0.77x / 0.99x the tile
/// kernel's time, on the tile heights of [`default_tile_rows`].
static WGMMA_SWAP_PREFERENCE: Lazy<bool> =
    Lazy::new(|| std::env::var("MOEPLUG_WGMMA_SWAP").map_or(true, |v| v.trim() != "0"));
/// `MOEPLUG_WGMMA_BULK_PACKS=1`: the swap-AB kernel's producer copies each 16-row group's
/// packs of a step with one bulk copy ([`KernelSpec::wgmma_bulk_packs`], AITER 16x16 weights).
/// An opt-in: measured at gpt-oss M = 1024 / 2048 / 4096 (bench/NOTES.md, session 25) 1.03 /
/// 0.99-1.01 / 0.99-1.01 the default's time, though the producer's step is 273 -> 223
/// instructions in the SASS.
static WGMMA_BULK_PACKS_PREFERENCE: Lazy<bool> =
    Lazy::new(|| std::env::var("MOEPLUG_WGMMA_BULK_PACKS").is_ok_and(|v| v.trim() == "1"));
/// `MOEPLUG_WGMMA_PACK_COPIES=1`: the MXFP4 tile kernel copies each thread's pack and scale
/// word two steps ahead by cp.async ([`KernelSpec::wgmma_pack_copies`]); an opt-in until
/// measured (built after call 27's ncu had the step waiting on global memory, session 22).
static WGMMA_PACK_COPIES_PREFERENCE: Lazy<bool> =
    Lazy::new(|| std::env::var("MOEPLUG_WGMMA_PACK_COPIES").is_ok_and(|v| v.trim() == "1"));
/// `MOEPLUG_WGMMA_GROUP=g` (0-1024): the wgmma family takes every column block of g
/// consecutive sorted tiles before the next g ([`KernelSpec::wgmma_group`]); 0 takes every
/// tile of a column block first. The default, 8, measured 2-7 % faster than 0 at M = 1024 /
/// 4096 on every case it runs (bench/NOTES.md, session 11).
pub const WGMMA_GROUP_DEFAULT: u32 = 8;
static WGMMA_GROUP_PREFERENCE: Lazy<u32> = Lazy::new(|| {
    env_choice("MOEPLUG_WGMMA_GROUP")
        .filter(|g| *g <= 1024)
        .unwrap_or(WGMMA_GROUP_DEFAULT)
});

fn env_choice(name: &str) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `MOEPLUG_GPU_FAMILY=fp32|tile32|stream|wgmma|mfma`: a diagnostic preference (benchmarks and tests
/// run every family on the same shapes); a family that cannot run a launch is never forced.
static PREFERENCE: Lazy<Option<Family>> = Lazy::new(|| {
    std::env::var("MOEPLUG_GPU_FAMILY")
        .ok()
        .and_then(|v| Family::from_name(v.trim()))
});

/// `MOEPLUG_STREAM_SPLIT_K=KW` or `KW1,KW2` (each 1, 2, 4 or 8; 0 keeps that stage's
/// choice): a diagnostic override of the stream family's K split, both stages or each.
static SPLIT_K_PREFERENCE: Lazy<Option<[Option<u32>; 2]>> = Lazy::new(|| {
    std::env::var("MOEPLUG_STREAM_SPLIT_K")
        .ok()
        .and_then(|v| parse_split_k(&v))
});

fn parse_split_k(v: &str) -> Option<[Option<u32>; 2]> {
    let one = |s: &str| -> Option<Option<u32>> {
        match s.trim().parse().ok()? {
            0 => Some(None),
            kw @ (1 | 2 | 4 | 8) => Some(Some(kw)),
            _ => None,
        }
    };
    match v.split_once(',') {
        Some((a, b)) => Some([one(a)?, one(b)?]),
        None => one(v).map(|kw| [kw, kw]),
    }
}

/// `MOEPLUG_STREAM_BM=16|32`: the stream family's sorted rows per tile (benchmarks). 16, the
/// default, was the only height measured on the H200; 32 reads an expert's weights once for
/// up to 32 pairs instead of once per 16 (the Qwen3 M=256 points, 16 pairs per expert on
/// average, bench/NOTES.md), at twice the accumulators per warp.
static STREAM_BM_PREFERENCE: Lazy<Option<u32>> =
    Lazy::new(|| env_choice("MOEPLUG_STREAM_BM").filter(|bm| STREAM_TILE_ROWS.contains(bm)));
/// The stream family's tile heights (`BM`).
pub const STREAM_TILE_ROWS: [u32; 2] = [16, 32];

/// `MOEPLUG_STREAM_PREFETCH=0|1..8|tile`: the stream family's L2 prefetch of its weights
/// (benchmarks; [`StreamPrefetch::parse`]). Off, the default, is what the H200 has measured;
/// `tile` applies on sm_90+ only.
static STREAM_PREFETCH_PREFERENCE: Lazy<Option<StreamPrefetch>> = Lazy::new(|| {
    std::env::var("MOEPLUG_STREAM_PREFETCH")
        .ok()
        .and_then(|v| StreamPrefetch::parse(&v))
});

/// `MOEPLUG_STREAM_AHEAD=1|2`: the stream family's weight steps in flight per warp (an A/B
/// switch; 2 applies where [`stream_ahead_max`] allows it).
static STREAM_AHEAD_PREFERENCE: Lazy<Option<u32>> =
    Lazy::new(|| env_choice("MOEPLUG_STREAM_AHEAD").filter(|n| (1..=2).contains(n)));
/// The stream family's weight steps in flight per warp where the heuristics choose (capped by
/// [`stream_ahead_max`]). Two measured 1.8 % less time at gpt-oss bf16 M = 1 and no change
/// elsewhere (H100, bench/NOTES.md, session 27).
const STREAM_AHEAD_DEFAULT: u32 = 2;

/// The most weight steps a stream warp can hold in flight for this configuration: two (a
/// third register set) for 16-bit weights in 16-row tiles, whose step is a few MMAs, so
/// that the warp waits on its loads; MXFP4 and fp8 sit at the two-block register cap with
/// one (`SW_AHEAD`, kernels/moe_gemm_stream.cuh).
pub fn stream_ahead_max(spec: &KernelSpec) -> u32 {
    let sixteen_bit = matches!(spec.weight_format, WeightFormat::Bf16 | WeightFormat::Fp16);
    if sixteen_bit && spec.stream_bm == 16 {
        2
    } else {
        1
    }
}

/// The stream family's sorted rows per tile: the preference or the default.
fn stream_bm() -> u32 {
    STREAM_BM_PREFERENCE.unwrap_or(STREAM_TILE_ROWS[0])
}

/// The weight steps in flight per warp that this stream configuration runs: the preference or
/// the default, within [`stream_ahead_max`].
fn stream_ahead(spec: &KernelSpec) -> u32 {
    STREAM_AHEAD_PREFERENCE
        .unwrap_or(STREAM_AHEAD_DEFAULT)
        .min(stream_ahead_max(spec))
}

/// `MOEPLUG_STREAM_X_SHARED=0|1`: whether the stream family's MXFP4 K loop reads its
/// activation packs from a shared-memory ring filled by cp.async one step ahead (`SW_XSHARED`,
/// an A/B switch; where [`stream_x_shared_unsupported`] allows it).
static STREAM_X_SHARED_PREFERENCE: Lazy<Option<bool>> =
    Lazy::new(|| env_choice("MOEPLUG_STREAM_X_SHARED").map(|v| v != 0));
/// Off until measured against the packs loaded from the L1 / L2 in each step.
const STREAM_X_SHARED_DEFAULT: bool = false;

/// `MOEPLUG_STREAM_PREFETCH_BIAS=0|1`: whether each stream row group asks for its bias lines
/// into the L1 and L2 before its K walk (`SW_PF_BIAS`, an A/B switch; where there is a bias):
/// the epilogue's first bias use waited on HBM (ncu, gpt-oss MXFP4 M = 256 stage 1: 6.5 % of
/// the warp samples, bench/NOTES.md, session 30).
static STREAM_PREFETCH_BIAS_PREFERENCE: Lazy<Option<bool>> =
    Lazy::new(|| env_choice("MOEPLUG_STREAM_PREFETCH_BIAS").map(|v| v != 0));
/// Off until measured.
const STREAM_PREFETCH_BIAS_DEFAULT: bool = false;

/// Why this stream configuration cannot take its activation packs through shared memory, or
/// None. The ring (64 KiB per block, [`KernelSpec::dynamic_shared_bytes`]) fits two blocks
/// per SM (the stream family's occupancy) on sm_90's 228 KiB only.
fn stream_x_shared_unsupported(sm: u32, spec: &KernelSpec) -> Option<&'static str> {
    if spec.weight_format != WeightFormat::Mxfp4 || spec.act_dtype.is_quantized() {
        return Some("activation packs in shared memory: MXFP4 weights, 16-bit activations");
    }
    if spec.stream_bm != 16 || sm < 90 {
        return Some(
            "activation packs in shared memory: 16-row tiles on sm_90 (two blocks per SM)",
        );
    }
    None
}

/// Whether this stream launch takes its activation packs through shared memory (`want`: the
/// preference or the default): where both stages' modules support it (a separate stage-2 act
/// dtype is checked too).
fn stream_x_shared(want: bool, sm: Option<u32>, spec: &KernelSpec) -> bool {
    let on = KernelSpec {
        stream_x_shared: true,
        ..spec.clone()
    };
    want && sm.is_some_and(|sm| stream_spec_unsupported(sm, &on).is_none())
}

/// Where the stream family with two 16-bit weight steps in flight beats the wgmma family at
/// decode: both GEMMs' K at least this long (each warp's K walk long against its block's fixed
/// cost) and at most [`STREAM_LONG_K_MAX_PAIRS`] pairs per expert (one 16-row tile for most
/// experts). Measured on the H100 (bench/NOTES.md, session 27, one round): gpt-oss bf16 (K 2880
/// and 2880) 0.954x / 0.963x / 0.973x wgmma's time at M = 8 / 64 / 256 (1, 2, 8 pairs per
/// expert); Qwen3 bf16 (K 2048 and 768) 1.027x / 1.038x / 1.206x at M = 8 / 64 / 256 (2, 4, 16).
/// The kit then put gpt-oss bf16 at 0.98 / 1.00 / 1.00x the peer's time there (session 28).
pub const STREAM_LONG_K_MIN: usize = 2048;
/// See [`STREAM_LONG_K_MIN`]: the most pairs per expert measured to win.
pub const STREAM_LONG_K_MAX_PAIRS: usize = 8;

/// `MOEPLUG_PDL=0|wait|early` ([`Pdl::parse`]; "1" is early, the default): programmatic
/// dependent launch of the stream and wgmma families on sm_90 (an A/B switch; the stream family
/// waits where early is asked for, [`Pdl::for_family`]). On the H200, waiting at each kernel's
/// start measured 2-8 % less time at M = 1 and no loss at M = 8 and 64 (bench/NOTES.md,
/// session 8); the wgmma family's early weight copies 0-4 % less than waiting (session 17).
static PDL_PREFERENCE: Lazy<Pdl> = Lazy::new(|| {
    std::env::var("MOEPLUG_PDL")
        .ok()
        .and_then(|v| Pdl::parse(&v))
        .unwrap_or(Pdl::Early)
});

/// Whether an on-by-default setting is on: anything but `0` (or unset).
fn env_on_unless_zero(name: &str) -> bool {
    !std::env::var(name).is_ok_and(|v| v.trim() == "0")
}

/// `MOEPLUG_FUSED_QUANT2` (default on, `0` off): stage 2's input is quantized without
/// `moe_quant2`, by the wgmma family's stage-1 epilogue (fp8 1x128) or by each stream stage-2
/// block for its own tile rows (fp8 per token or 1x128, I <= [`STREAM_QUANT2_MAX_I`]).
/// Measured 0.5-5 % faster on every fp8 point with the route's fold (bench/NOTES.md, session 19).
static FUSED_QUANT2_PREFERENCE: Lazy<bool> =
    Lazy::new(|| env_on_unless_zero("MOEPLUG_FUSED_QUANT2"));

/// `MOEPLUG_ROUTE_QUANT1` (default on, `0` off): the route kernel's extra blocks quantize
/// stage 1's activations, without `moe_quant1` ([`route_quant1_unsupported`]). Measured 2-19 %
/// faster at M <= 256 on the fp8 cases (bench/NOTES.md, session 19).
static ROUTE_QUANT1_PREFERENCE: Lazy<bool> =
    Lazy::new(|| env_on_unless_zero("MOEPLUG_ROUTE_QUANT1"));

/// Why the route kernel cannot quantize stage 1's activations for this configuration
/// (`QUANT1_IN_ROUTE`), or None: the families of decode and prefill (stream, wgmma), with
/// activations quantized per row or group (per tensor waits for `moe_amax1`'s global amax).
pub fn route_quant1_unsupported(spec: &KernelSpec) -> Option<&'static str> {
    if !matches!(spec.family, Family::Stream | Family::Wgmma) {
        Some("the stream and wgmma families only")
    } else if !spec.act_dtype.is_quantized() || spec.act_dtype == ActDtype::Fp8PerTensor {
        Some("activations quantized per row or group only")
    } else {
        None
    }
}

/// The largest intermediate_size whose tile rows a stream stage-2 block quantizes itself
/// (`SW_Q2_MAX_I`, kernels/moe_gemm_stream.cuh: 16 KiB of shared memory).
pub const STREAM_QUANT2_MAX_I: usize = 1024;

/// Why a stream stage-2 block cannot quantize its own tile rows (`FUSED_QUANT2`) for this
/// configuration, or None (the launch's intermediate_size must also be at most
/// [`STREAM_QUANT2_MAX_I`]).
pub fn stream_quant2_unsupported(spec: &KernelSpec) -> Option<&'static str> {
    let act = matches!(
        spec.act_dtype,
        ActDtype::Fp8Block128 | ActDtype::Fp8PerToken
    );
    if !act || spec.separate_stage2() || spec.stream_bm != 16 {
        Some("a stream block quantizes fp8 per-token or 1x128 activations of 16-row tiles only")
    } else {
        None
    }
}

/// `MOEPLUG_FUSED_COMBINE=0|1`: a diagnostic switch of the fused top-k combine (A/B on a
/// device); 1, like unset, fuses it where the family covers it, 0 launches `moe_reduce`.
static FUSED_COMBINE_PREFERENCE: Lazy<Option<bool>> = Lazy::new(|| {
    match std::env::var("MOEPLUG_FUSED_COMBINE")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("0") => Some(false),
        Some("1") => Some(true),
        _ => None,
    }
});

/// Whether `family` on `arch` ends stage 2 with the top-k combine (same bits as `moe_reduce`,
/// one launch fewer): only with `MOEPLUG_FUSED_COMBINE=1` where it can (CUDA,
/// [`Family::fuses_combine`]). Measured on the H200 (bench/NOTES.md, session 4) it was 3-12 %
/// slower than the separate reduce at every decode point: the counters, fences and L2 reads at
/// the end of every stage-2 block cost more than the launch.
pub fn fused_combine(arch: &str, family: Family) -> bool {
    sm_version(arch).is_some() && family.fuses_combine() && *FUSED_COMBINE_PREFERENCE == Some(true)
}

/// "sm_90" -> 90.
pub fn sm_version(arch: &str) -> Option<u32> {
    arch.strip_prefix("sm_").and_then(|v| v.parse().ok())
}

/// The AMD archs the MFMA family is written and compiled for: CDNA3 (MI300) and CDNA4 (MI355).
/// Others (gfx90a's MFMA has no fp8, RDNA has no MFMA and runs wave32) get the fp32 family.
pub const MFMA_ARCHS: [&str; 2] = ["gfx942", "gfx950"];

/// Whether the MFMA family can run on the HIP arch `arch` ("gfx942", or a full target id such
/// as "gfx942:sramecc+:xnack-"). It covers every format, layout and dtype pairing, so the arch
/// is the only condition.
pub fn mfma_arch(arch: &str) -> bool {
    super::hip::parse_gcn_arch(arch).is_some_and(|p| MFMA_ARCHS.contains(&p))
}

/// Every family `choose` may give a launch on the HIP arch `arch`, preferred first: what the
/// self-test before first use has to try on that device (docs/hip.md).
pub fn hip_families(arch: &str) -> Vec<Family> {
    if mfma_arch(arch) {
        vec![Family::Mfma, Family::Fp32]
    } else {
        vec![Family::Fp32]
    }
}

/// The family for a launch on the HIP arch `arch`: MFMA where it runs and covers the launch,
/// else fp32; the diagnostic preference may only ask for fp32.
fn choose_hip(arch: &str, launch: &MoeLaunch) -> Family {
    let covered = mfma_spec_unsupported(&KernelSpec::for_launch(launch, Family::Mfma)).is_none();
    if *PREFERENCE == Some(Family::Fp32) || !mfma_arch(arch) || !covered {
        Family::Fp32
    } else {
        Family::Mfma
    }
}

/// Why the MFMA family cannot be compiled for this configuration, or None: int4 weights
/// (only the fp32 family decodes them) and the launch options it does not implement.
pub fn mfma_spec_unsupported(spec: &KernelSpec) -> Option<&'static str> {
    if spec.weight_format.is_int4() {
        return Some("int4 weights are decoded by the fp32 family only");
    }
    options_unsupported(spec)
}

/// Why a family cannot run the 1.1 launch options of this configuration, or None: the
/// activation NONE (a non-gated w13: stage 1 mapped as stage 2 is one weight row per output
/// column) and a separate stage-2 act dtype (stage 2 from a second module, whose intermediate
/// both modules read alike: INTER_F16). fp32, tile32 and stream implement both (and are
/// checked on a GPU by tests/gpu/test_launch_fields.py); wgmma and mfma do not yet.
pub fn options_unsupported(spec: &KernelSpec) -> Option<&'static str> {
    match spec.family {
        Family::Fp32 | Family::Tile32 | Family::Stream => None,
        Family::Wgmma | Family::Mfma => {
            if !spec.activation.is_gated() {
                Some("activation NONE (a non-gated w13) not covered")
            } else if spec.separate_stage2() {
                Some("a stage-2 act dtype other than act_dtype not covered")
            } else {
                None
            }
        }
    }
}

/// Weight values per 16-byte pack (the stream family's K granule).
fn pack_values(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Bf16 | WeightFormat::Fp16 => 8,
        WeightFormat::Mxfp4 => 32,
        _ => 16,
    }
}

/// `griddepcontrol` (programmatic dependent launch) is sm_90+.
pub const PDL_MIN_SM: u32 = 90;

/// Why the stream family cannot be compiled for this configuration on `sm`, or None.
pub fn stream_spec_unsupported(sm: u32, spec: &KernelSpec) -> Option<&'static str> {
    use ActDtype as A;
    use WeightFormat as W;
    if sm < 80 {
        return Some("needs sm_80 (mma.sync)");
    }
    if spec.stream_prefetch.on(sm) != spec.stream_prefetch {
        return Some("the bulk L2 prefetch needs sm_90");
    }
    if !(1..=stream_ahead_max(spec)).contains(&spec.stream_ahead) {
        return Some("two weight steps in flight: 16-bit weights in 16-row tiles only");
    }
    if spec.pdl.on() && sm < PDL_MIN_SM {
        return Some("programmatic dependent launch needs sm_90");
    }
    if let Some(why) = stream_x_shared_unsupported(sm, spec).filter(|_| spec.stream_x_shared) {
        return Some(why);
    }
    if spec.stream_bias_prefetch && !spec.has_bias {
        return Some("the bias prefetch needs a bias");
    }
    if spec.pdl != spec.pdl.for_family(Family::Stream) {
        return Some("no early weight reads before the wait (Pdl::Early)");
    }
    if let Some(why) = stream_quant2_unsupported(spec).filter(|_| spec.fused_quant2) {
        return Some(why);
    }
    // Stage 2 of a separate stage-2 act dtype is a module of its own: both must be covered.
    if spec.separate_stage2() {
        if let Some(why) = stream_spec_unsupported(sm, &spec.stage2()) {
            return Some(why);
        }
    }
    if spec.weight_layout != WeightLayout::Aiter16x16 {
        return Some("reads the AITER 16x16 weight layout only");
    }
    if !matches!(spec.gate_mode, GateMode::Separated | GateMode::Interleave) {
        return Some("gate modes SEPARATED and INTERLEAVE only");
    }
    let act16 = |a: ActDtype, f16: bool| spec.act_dtype == a && spec.in_f16 == f16;
    let format_ok = match spec.weight_format {
        W::Bf16 => act16(A::Bf16, false),
        // The other MX scale layouts' addressing costs the registers of the decode (spills).
        W::Mxfp4 => act16(A::Bf16, false) && spec.scale_layout == Some(ScaleLayout::AiterE8m0),
        W::Fp16 => act16(A::Fp16, true),
        W::Fp8PerTensor | W::Fp8PerChannel | W::Fp8Block128 => {
            if sm < 89 {
                return Some("fp8 MMA needs sm_89");
            }
            !spec.fp8_fnuz
                && matches!(
                    spec.act_dtype,
                    A::Fp8PerToken | A::Fp8PerTensor | A::Fp8Block128
                )
        }
        W::Mxfp8 => false,
        W::Int4Group32 | W::Int4PerChannel => false,
    };
    if !format_ok {
        return Some("format / activation dtype pairing not covered");
    }
    None
}

/// Why the stream family cannot run this launch (configuration, then sizes and alignment),
/// or None if it can.
pub fn stream_unsupported(sm: u32, spec: &KernelSpec, launch: &MoeLaunch) -> Option<&'static str> {
    if let Some(why) = stream_spec_unsupported(sm, spec) {
        return Some(why);
    }
    let l = &launch.config.layout;
    let v = pack_values(spec.weight_format);
    if l.hidden_size % v != 0 || l.intermediate_size % v != 0 || l.intermediate_padded % 16 != 0 {
        return Some("hidden / intermediate sizes not multiples of the 16-byte pack");
    }
    if !spec.act_dtype.is_quantized() {
        let x = &launch.hidden_states;
        let row_bytes = x.dim(1) * 2;
        if row_bytes % 16 != 0 || (x.ptr as usize) % 16 != 0 {
            return Some("hidden_states rows are not 16-byte aligned");
        }
    }
    None
}

/// Why the wgmma family cannot be compiled for this configuration on `sm`, or None.
pub fn wgmma_spec_unsupported(sm: u32, spec: &KernelSpec) -> Option<&'static str> {
    use ActDtype as A;
    use WeightFormat as W;
    if sm != 90 {
        return Some("needs sm_90a (wgmma)");
    }
    if let Some(why) = options_unsupported(spec) {
        return Some(why);
    }
    if !matches!(spec.gate_mode, GateMode::Separated | GateMode::Interleave) {
        return Some("gate modes SEPARATED and INTERLEAVE only");
    }
    if spec.fp8_fnuz {
        return Some("the fp8 wgmma takes OCP e4m3fn");
    }
    if spec.fused_quant2
        && (spec.act_dtype != A::Fp8Block128
            || (spec.wgmma_bm, spec.wgmma_n) != (64, 128)
            || spec.wgmma_rs)
    {
        return Some("stage 1 quantizes stage 2's fp8 1x128 input on 64-row tiles, N 128, only");
    }
    let act16 = |a: ActDtype, f16: bool| spec.act_dtype == a && spec.in_f16 == f16;
    let format_ok = match spec.weight_format {
        W::Bf16 => act16(A::Bf16, false),
        W::Fp16 => act16(A::Fp16, true),
        W::Fp8PerTensor | W::Fp8PerChannel => {
            matches!(spec.act_dtype, A::Fp8PerToken | A::Fp8PerTensor)
        }
        W::Fp8Block128 => spec.act_dtype == A::Fp8Block128,
        // One 32-code pack per thread per step fills exactly a 128 x 128 block; as the
        // register operand, the block's 128 weight rows meet 64 or 128 sorted rows (the MMA's
        // N, `wgmma_n`).
        W::Mxfp4 => {
            let shape = if spec.wgmma_rs {
                spec.wgmma_n == spec.wgmma_bm && spec.wgmma_blocks == 1
            } else {
                spec.wgmma_bm == 128 && spec.wgmma_n == 128
            };
            act16(A::Bf16, false) && shape
        }
        W::Mxfp8 | W::Int4Group32 | W::Int4PerChannel => false,
    };
    if !format_ok {
        return Some("format / activation dtype pairing not covered");
    }
    if !matches!(spec.wgmma_bm, 64 | 128)
        || !(matches!(spec.wgmma_n, 128 | 256) || spec.wgmma_rs)
        || !matches!(spec.wgmma_blocks, 1 | 2)
    {
        return Some(
            "64 or 128 rows per tile, 128 or 256 weight rows per warpgroup, 1 or 2 blocks",
        );
    }
    // Two blocks per SM halve the registers and the ring: 16-bit 128 x 128 blocks only.
    if spec.wgmma_blocks == 2
        && (spec.act_dtype.is_quantized() || spec.wgmma_n != 128 || spec.wgmma_bm != 128)
    {
        return Some("two blocks per SM only for 16-bit operands on 128 x 128 blocks");
    }
    // fp8 partial sums (two-level accumulation) need the registers of a second accumulator;
    // 64-row tiles already give each warpgroup its own weight rows.
    if spec.wgmma_n == 256 && (spec.act_dtype.is_quantized() || spec.wgmma_bm == 64) {
        return Some("256 weight rows per warpgroup only for 16-bit operands on 128-row tiles");
    }
    // The tensor map describes AITER's 16-row groups; MXFP4 is decoded through registers.
    if spec.wgmma_tma
        && (spec.weight_layout != WeightLayout::Aiter16x16
            || spec.weight_format == WeightFormat::Mxfp4)
    {
        return Some("TMA weight tiles: AITER 16x16 weights (not MXFP4)");
    }
    // The producer warpgroup copies activations and starts the TMA of the weights, or copies
    // MXFP4's packs for the consumers to decode.
    let mxfp4 = spec.weight_format == WeightFormat::Mxfp4;
    if spec.wgmma_ws && (!(spec.wgmma_tma || mxfp4) || spec.wgmma_blocks != 1) {
        return Some(
            "the warp-specialised kernel takes TMA weight tiles or MXFP4 packs, one block per SM",
        );
    }
    // Each thread decodes the packs of its weight rows into its A fragments.
    if spec.wgmma_rs && (spec.weight_format != WeightFormat::Mxfp4 || spec.wgmma_tma) {
        return Some("register-operand weights: MXFP4 only, without TMA");
    }
    // The decoders share the packs the warp-specialised producer copies for the decoded tile.
    if spec.wgmma_decoders != 0
        && (spec.wgmma_decoders != 2 || !(spec.wgmma_ws && mxfp4) || spec.wgmma_rs)
    {
        return Some("decoding warpgroups: two, MXFP4 on the warp-specialised kernel only");
    }
    if spec.wgmma_pack_copies && (!mxfp4 || spec.wgmma_ws || spec.wgmma_rs) {
        return Some("pack copies: the MXFP4 tile kernel only");
    }
    // A 16-row group's step is one run of bytes in AITER's 16 x 16 layout only.
    if spec.wgmma_bulk_packs
        && (!spec.wgmma_swap() || spec.weight_layout != WeightLayout::Aiter16x16)
    {
        return Some("bulk pack copies: the swap-AB kernel on AITER 16x16 weights only");
    }
    // Stage 1's fused quantization needs a block's 128 output columns (one 1x128 group).
    if spec.wgmma_ksplit
        && (!spec.wgmma_ws || (spec.wgmma_bm, spec.wgmma_n) != (64, 128) || spec.fused_quant2)
    {
        return Some(
            "warpgroups splitting K: the warp-specialised kernel on 64-row tiles, N 128, \
             without the fused stage-2 quantization",
        );
    }
    None
}

/// Why the wgmma family cannot run this launch (configuration, then sizes and alignment),
/// or None if it can.
pub fn wgmma_unsupported(sm: u32, spec: &KernelSpec, launch: &MoeLaunch) -> Option<&'static str> {
    if let Some(why) = wgmma_spec_unsupported(sm, spec) {
        return Some(why);
    }
    let l = &launch.config.layout;
    // 16-byte copies: a copy never straddles the last real column, weight rows are whole
    // copies, and AITER 16-row groups of the up half start on a group. (The epilogues'
    // column-pair stores, store_gated2 / store_down2, rely on the even sizes this implies.)
    let v = match spec.weight_format {
        WeightFormat::Mxfp4 => 32,
        _ if spec.act_dtype.is_quantized() => 16,
        _ => 8,
    };
    let sizes = [
        l.hidden_size,
        l.intermediate_size,
        l.hidden_padded,
        l.intermediate_padded,
    ];
    if sizes.iter().any(|s| s % v != 0) || l.intermediate_padded % 16 != 0 {
        return Some("hidden / intermediate sizes not multiples of the 16-byte copy");
    }
    // Each 64-column half of a stage-1 block must sit in one 128-row scale block.
    if spec.weight_format == WeightFormat::Fp8Block128 && l.intermediate_padded % 64 != 0 {
        return Some("intermediate_padded not a multiple of 64 for block-128 scales");
    }
    if !spec.act_dtype.is_quantized() {
        let x = &launch.hidden_states;
        if (x.dim(1) * 2) % 16 != 0 || (x.ptr as usize) % 16 != 0 {
            return Some("hidden_states rows are not 16-byte aligned");
        }
    }
    // Weight tiles come in 16-byte copies (cp.async or TMA).
    if [&launch.w13, &launch.w2]
        .iter()
        .any(|w| (w.ptr as usize) % 16 != 0)
    {
        return Some("w13 / w2 are not 16-byte aligned");
    }
    None
}

/// Whether `choose` can return `family` for some launch of this configuration on CUDA `sm`.
pub fn selectable(sm: u32, spec: &KernelSpec) -> bool {
    // Only the fp32 family decodes int4 (load_w in moe_common.cuh).
    let int4 = spec.weight_format.is_int4();
    if spec.fused_combine && (!spec.family.fuses_combine() || spec.partials_16) {
        return false;
    }
    if spec.route_quant1 && route_quant1_unsupported(spec).is_some() {
        return false;
    }
    if spec.fused_quant2 && !matches!(spec.family, Family::Stream | Family::Wgmma) {
        return false; // the wgmma stage-1 epilogue's or the stream stage-2 prologue's
    }
    if spec.pdl.on() && !matches!(spec.family, Family::Stream | Family::Wgmma) {
        return false; // the other families' stages do not wait (kernels/fused_moe.cu)
    }
    match spec.family {
        Family::Fp32 => sm < 80 || int4,
        Family::Tile32 => sm >= 80 && !int4,
        Family::Stream => stream_spec_unsupported(sm, spec).is_none(),
        Family::Wgmma => wgmma_spec_unsupported(sm, spec).is_none(),
        Family::Mfma => false, // AMD only
    }
}

/// The kernel configuration for this launch on `arch` among the families the device's
/// self-test `accepted`: its family and, for the stream family, the K split of each stage.
pub fn spec_for(
    arch: &str,
    launch: &MoeLaunch,
    shape: &LaunchShape,
    accepted: FamilySet,
) -> Result<KernelSpec> {
    let family = choose_accepted(arch, launch, shape, accepted)?;
    let mut spec = KernelSpec::for_launch(launch, family);
    spec.fused_combine = fused_combine(arch, family);
    if family == Family::Stream {
        let l = &launch.config.layout;
        spec.stream_bm = stream_bm();
        let steps = |k: usize| k.div_ceil(4 * pack_values(spec.weight_format));
        let tiles = expected_tiles(shape.m, shape.topk, l.num_experts, spec.stream_bm as usize);
        spec.split_k = [
            stream_split_k(
                steps(l.hidden_size),
                tiles * l.intermediate_size.div_ceil(16) as f64,
                spec.weight_format,
            ),
            stream_split_k(
                steps(l.intermediate_size),
                tiles * l.hidden_size.div_ceil(32) as f64,
                spec.weight_format,
            ),
        ];
        if let Some(kws) = *SPLIT_K_PREFERENCE {
            for (chosen, kw) in spec.split_k.iter_mut().zip(kws) {
                *chosen = kw.unwrap_or(*chosen);
            }
        }
        spec.fused_quant2 = *FUSED_QUANT2_PREFERENCE
            && l.intermediate_size <= STREAM_QUANT2_MAX_I
            && stream_quant2_unsupported(&spec).is_none();
        let prefetch = STREAM_PREFETCH_PREFERENCE.unwrap_or(StreamPrefetch::Off);
        let sm = sm_version(arch);
        spec.stream_prefetch = sm.map_or(prefetch, |sm| prefetch.on(sm));
        spec.stream_ahead = stream_ahead(&spec);
        let want = STREAM_X_SHARED_PREFERENCE.unwrap_or(STREAM_X_SHARED_DEFAULT);
        spec.stream_x_shared = stream_x_shared(want, sm, &spec);
        spec.stream_bias_prefetch = STREAM_PREFETCH_BIAS_PREFERENCE
            .unwrap_or(STREAM_PREFETCH_BIAS_DEFAULT)
            && spec.has_bias;
    }
    if matches!(family, Family::Stream | Family::Wgmma)
        && sm_version(arch).is_some_and(|sm| sm >= PDL_MIN_SM)
    {
        spec.pdl = PDL_PREFERENCE.for_family(family);
    }
    spec.route_quant1 = *ROUTE_QUANT1_PREFERENCE && route_quant1_unsupported(&spec).is_none();
    if family == Family::Wgmma {
        let experts = launch.config.layout.num_experts;
        spec = wgmma_shape_for(spec, *WGMMA_BM_PREFERENCE, shape.m, shape.topk, experts);
        let quant2 = KernelSpec {
            fused_quant2: true,
            ..spec.clone()
        };
        if *FUSED_QUANT2_PREFERENCE && wgmma_spec_unsupported(90, &quant2).is_none() {
            spec = quant2;
        }
        spec.wgmma_ksplit = wgmma_ksplit(&spec);
    }
    Ok(spec)
}

/// The wgmma family's shape ([`wgmma_shape`]) for a launch of `m` tokens, top-`topk` over
/// `experts`, on the tile height `rows` asks for (128 by default).
fn wgmma_shape_for(
    spec: KernelSpec,
    rows: Option<TileRows>,
    m: usize,
    topk: usize,
    experts: usize,
) -> KernelSpec {
    match rows {
        Some(TileRows::Fixed(bm)) => wgmma_shape(spec, Some(bm)),
        Some(TileRows::ByPairs(least)) => {
            let rows = if m * topk >= least * experts.max(1) {
                128
            } else {
                64
            };
            wgmma_shape(spec, Some(rows))
        }
        Some(TileRows::ByL2Bytes) => {
            let bytes = |s: &KernelSpec| wgmma_l2_bytes(s, m, topk, experts);
            let tall = wgmma_shape(spec.clone(), Some(128));
            let short = wgmma_shape(spec, Some(64));
            if short.wgmma_bm == 64 && bytes(&short) < bytes(&tall) {
                short
            } else {
                tall
            }
        }
        None => {
            let rows = default_tile_rows(spec.weight_format);
            wgmma_shape_for(spec, Some(rows), m, topk, experts)
        }
    }
}

/// The wgmma family's tile height by weight format, measured on the H200 (bench/NOTES.md,
/// session 16, 64 against 128 rows at M = 256-4096):
/// - fp8 block-128: 64 rows everywhere. Its 64 x 256 blocks took 0.72-0.76x the 128 x 128
///   blocks' time at 16-32 pairs per expert and 0.94-0.97x at 128-256 pairs, where the
///   128-row tiles are full and read fewer bytes: the byte count does not bind this kernel.
/// - everything else: the L2 rule ([`wgmma_l2_bytes`]). On bf16 it picks 64 rows up to 32
///   pairs per expert (0.90-0.92x) and 128 from 64 pairs, where 64-row tiles measured 1.00x
///   (Qwen3) to 1.14x (Qwen3 at 256 pairs).
/// - MXFP4 (the swap-AB kernel): 128 rows from 64 pairs per expert. Against the tile kernel
///   (H100, gpt-oss, bench/NOTES.md session 24), 64-row tiles took 0.76x / 0.77x / 1.06x /
///   1.16x its time at M = 512 / 1024 / 2048 / 4096 (16-128 pairs per expert), 128-row tiles
///   1.01x / 1.02x / 0.98x / 0.99x (with their MMAs serialized by ptxas, since fixed): a
///   64-row tile decodes each weight once per 64 pairs. (The tile kernel,
///   `MOEPLUG_WGMMA_SWAP=0`, fills 128-row tiles only.)
fn default_tile_rows(format: WeightFormat) -> TileRows {
    match format {
        WeightFormat::Fp8Block128 => TileRows::Fixed(64),
        WeightFormat::Mxfp4 if *WGMMA_SWAP_PREFERENCE => TileRows::ByPairs(64),
        _ => TileRows::ByL2Bytes,
    }
}

/// The wgmma family's block shape, TMA, warp specialisation, register-operand weights and
/// work order for `spec`, on tiles of `rows` sorted rows where given (else 128). Each step (the
/// tile height and the diagnostic shape, then TMA, then warp
/// specialisation, then 256 weight rows where the warp-specialised kernel takes them, then
/// MXFP4 weights as the register operand where asked) is taken only where the family covers
/// the result.
fn wgmma_shape(mut spec: KernelSpec, rows: Option<u32>) -> KernelSpec {
    let steps: [&dyn Fn(&mut KernelSpec); 9] = [
        &|s| {
            s.wgmma_n = WGMMA_N_PREFERENCE.unwrap_or(s.wgmma_n);
            s.wgmma_bm = rows.unwrap_or(s.wgmma_bm);
            // MXFP4's decode is latency-bound on one block's 8 warps: two blocks per SM took
            // gpt-oss 1898 / 2926 us against 2756 / 4182 at M = 1024 / 4096 (session 13).
            let mxfp4 = s.weight_format == WeightFormat::Mxfp4;
            let blocks = if mxfp4 { 2 } else { s.wgmma_blocks };
            s.wgmma_blocks = WGMMA_BLOCKS_PREFERENCE.unwrap_or(blocks);
        },
        &|s| s.wgmma_tma = WGMMA_TMA_PREFERENCE.map_or(true, |v| v == 1),
        &|s| s.wgmma_ws = WGMMA_WS_PREFERENCE.map_or(true, |v| v == 1),
        &|s| {
            if WGMMA_N_PREFERENCE.is_none() && s.wgmma_ws {
                s.wgmma_n = 256;
            }
        },
        // A step that changes nothing unless asked: it must not undo the shape above.
        &|s| {
            if *WGMMA_RS_PREFERENCE == Some(1) {
                s.wgmma_rs = true;
                s.wgmma_blocks = WGMMA_BLOCKS_PREFERENCE.unwrap_or(1);
                // The MMA's N is the tile's rows: 128 unless asked.
                s.wgmma_bm = rows.unwrap_or(128);
                s.wgmma_n = s.wgmma_bm;
            }
        },
        &|s| {
            if *WGMMA_SWAP_PREFERENCE && s.weight_format == WeightFormat::Mxfp4 {
                s.wgmma_rs = true;
                s.wgmma_ws = true;
                s.wgmma_tma = false;
                s.wgmma_blocks = 1;
                s.wgmma_bm = rows.unwrap_or(64);
                s.wgmma_n = s.wgmma_bm;
            }
        },
        &|s| s.wgmma_decoders = WGMMA_DECODERS_PREFERENCE.unwrap_or(0),
        &|s| s.wgmma_pack_copies = *WGMMA_PACK_COPIES_PREFERENCE,
        &|s| s.wgmma_bulk_packs = *WGMMA_BULK_PACKS_PREFERENCE,
    ];
    for step in steps {
        let mut next = spec.clone();
        step(&mut next);
        if wgmma_spec_unsupported(90, &next).is_none() {
            spec = next;
        }
    }
    spec.wgmma_group = *WGMMA_GROUP_PREFERENCE;
    spec
}

/// [`choose`]'s family if the self-test accepted it, else the first accepted family down its
/// fallback chain ([`Family::fallback`]); UNSUPPORTED when the chain has none.
pub fn choose_accepted(
    arch: &str,
    launch: &MoeLaunch,
    shape: &LaunchShape,
    accepted: FamilySet,
) -> Result<Family> {
    let first = choose(arch, launch, shape);
    let mut family = Some(first);
    while let Some(f) = family {
        if accepted.contains(f) {
            return Ok(f);
        }
        family = f.fallback();
    }
    Err(Error::unsupported(format!(
        "no kernel family that passed this device's self-test before first use can run this \
         launch ({} and its fallbacks were refused; `moeplug info` says why)",
        first.name()
    )))
}

/// Stream blocks resident at once on an H100/H200-class GPU: 132 SMs x 2 (the kernel's
/// `SW_MIN_BLOCKS`). The split below counts waves of this many blocks.
const STREAM_RESIDENT_BLOCKS: f64 = 132.0 * 2.0;
/// What a stream block costs besides its K steps (finding its tile and rows, the first loads,
/// the reduction of the warps' partial sums and the epilogue), in K steps of a 16-bit or fp8
/// warp; fitted with [`StreamSteps`] to the H200's per-stage K-split A/B (bench/NOTES.md,
/// session 10; `bench/splitk_fit.py`): the fit picks the measured best split, or one within
/// 1.2 % of it, at 37 of 38 (case, M, stage) points of the kit at M = 1-256.
const STREAM_BLOCK_COST_STEPS: f64 = 4.0;

/// How a stream stage's K steps cost, by weight format (fitted on the H200 with the block
/// cost above).
struct StreamSteps {
    /// A K step's cost against a 16-bit or fp8 step: MXFP4's e2m1 decode makes its steps
    /// issue-bound.
    cost: f64,
    /// The longest K walk per warp that still paid off: longer walks leave too few warps in
    /// flight per SM.
    max_walk: f64,
    /// Whether a narrower split must still fill every resident block slot: issue-bound warps
    /// run slower with fewer warps per SM (gpt-oss MXFP4 at M = 1, stage 2: split 4 on 180
    /// blocks was 3.2 % slower than 8 on 360), while load-bound ones gain from one short wave
    /// (Qwen3 at M = 1: split 4 on 192 blocks 3-5 % faster than 8 on 384).
    fill_slots: bool,
}

fn stream_steps(format: WeightFormat) -> StreamSteps {
    let step = |cost, max_walk, fill_slots| StreamSteps {
        cost,
        max_walk,
        fill_slots,
    };
    match format {
        WeightFormat::Mxfp4 => step(3.0, 12.0, true),
        WeightFormat::Bf16 | WeightFormat::Fp16 => step(1.0, 32.0, false),
        _ => step(1.0, 64.0, false),
    }
}

/// Warps (of 8) that split K in a stream stage of `steps` 4-pack steps whose 32-row groups
/// number `row_groups` over the launch (expected; `expected_tiles`). Fewer warps per K means
/// fewer, longer blocks: each block's fixed cost is paid fewer times, but the last wave may
/// leave SMs idle. The split minimises waves x (steps per warp x step cost + block cost)
/// among the walks the format allows (8 warps always qualify).
pub fn stream_split_k(steps: usize, row_groups: f64, format: WeightFormat) -> u32 {
    let f = stream_steps(format);
    let blocks = |kw: u32| row_groups * kw as f64 / 8.0;
    let walk = |kw: u32| steps as f64 / kw as f64;
    let cost = |kw: u32| {
        (blocks(kw) / STREAM_RESIDENT_BLOCKS).ceil().max(1.0)
            * (walk(kw) * f.cost + STREAM_BLOCK_COST_STEPS)
    };
    let mut best = 8;
    for kw in [4, 2, 1] {
        let allowed =
            walk(kw) <= f.max_walk && (!f.fill_slots || blocks(kw) >= STREAM_RESIDENT_BLOCKS);
        if allowed && cost(kw) < cost(best) - 1e-9 {
            best = kw;
        }
    }
    best
}

/// Sorted tiles of `bm` rows with tokens that a launch of `m` tokens, top-`topk` over
/// `experts` experts, is expected to have under uniform routing: each expert's pair count
/// is Binomial(m, topk / experts) and takes ceil(count / bm) tiles. Summed over the counts
/// within 10 standard deviations (and 16) of the mode, weighted from the mode outward by the
/// pmf's ratios and normalised, so that no weight underflows however large m is.
pub fn expected_tiles(m: usize, topk: usize, experts: usize, bm: usize) -> f64 {
    let experts = experts.max(1) as f64;
    let p = (topk as f64 / experts).min(1.0);
    if m == 0 || p == 0.0 {
        return 1.0;
    }
    if p >= 1.0 {
        return (experts * m.div_ceil(bm) as f64).max(1.0);
    }
    let mean = m as f64 * p;
    let mode = (((m + 1) as f64 * p).floor() as usize).min(m);
    let span = (10.0 * (mean * (1.0 - p)).sqrt() + 16.0) as usize;
    let odds = p / (1.0 - p);
    let tiles = |j: usize| j.div_ceil(bm) as f64;
    // P(j) / P(mode), up from the mode and down from it.
    let (mut mass, mut sum) = (1.0, tiles(mode));
    let mut w = 1.0;
    for j in mode + 1..=m.min(mode + span) {
        w *= (m - j + 1) as f64 / j as f64 * odds;
        mass += w;
        sum += w * tiles(j);
    }
    w = 1.0;
    for j in (mode.saturating_sub(span)..mode).rev() {
        w *= (j + 1) as f64 / (m - j) as f64 / odds;
        mass += w;
        sum += w * tiles(j);
    }
    (experts * sum / mass).max(1.0)
}

/// Bytes the wgmma family's blocks read through the L2 over a launch's GEMM, relative: each
/// block reads its `bm` sorted rows and `w` weight rows every K step for bm x w outputs, over
/// the rows the experts' tiles pad to. What a 64-row tile trades: fewer padded rows (a 128-row
/// tile at 32 pairs per expert is a quarter full) against more bytes per output (64 + 256
/// rows for 64 x 256 outputs, 128 + 256 for 128 x 256). Where the blocks bind on the L2
/// (session 11: tag lookups at 54-91 %) the fewer bytes win; where the MMA binds, the fewer
/// padded rows: the bytes' side is the stricter, so it decides.
fn wgmma_l2_bytes(spec: &KernelSpec, m: usize, topk: usize, experts: usize) -> f64 {
    let bm = spec.wgmma_bm as usize;
    let w = spec.wgmma_block_rows() as f64;
    let rows = bm as f64 * expected_tiles(m, topk, experts, bm);
    rows * (bm as f64 + w) / (bm as f64 * w)
}

/// Work units (a sorted tile's 256 weight rows) in each stage of a wgmma launch on 64-row
/// tiles from which its decode can beat the stream family: about one wave of the H100 / H200's
/// 132 SMs. Measured (bench/NOTES.md, session 16): 96 units lost (gpt-oss bf16 and Qwen3 bf16
/// at M = 2: 1.045x and 1.027x stream's time), 128 won (DeepSeek-V3 fp8 at M = 1: 0.979x).
pub const WGMMA_DECODE_MIN_UNITS: f64 = 120.0;
/// Weight bytes a launch reads from which the wgmma family's decode can beat the stream
/// family: 192 MiB take ~47 us at 4.3 TB/s, against wgmma's 6-10 us more fixed cost (Qwen3 at
/// M = 1: 38.3 against 32.5 us bf16, 43.7 against 34.0 fp8). Measured with plain wgmma
/// launches (bench/NOTES.md, session 16): Qwen3 bf16 at M = 8 (~490 MB) 0.949x stream's time,
/// at M = 4 (~275 MB) 1.013x; Qwen3 fp8 at M = 8 (~245 MB) 0.988x, at M = 4 (~140 MB) 1.091x.
/// The wgmma family's PDL with early weight copies then took 2-4 % off its decode launches of
/// 100-300 us (session 17), which puts those two ties at ~0.95-0.98x: the threshold sits
/// between the 140 MB that lost by 9 % and the 245 MB that now win.
pub const WGMMA_DECODE_MIN_WEIGHT_BYTES: f64 = (192u64 << 20) as f64;

/// Whether the wgmma family (on 64-row TMA tiles) streams a decode launch's weights faster
/// than the stream family though its tiles are mostly padding: where each stage fills about
/// one wave of blocks and the weights read dwarf its fixed cost. Below 4 pairs per expert the
/// experts with a pair are about the 64-row tiles ([`expected_tiles`]).
fn wgmma_streams_decode_faster(launch: &MoeLaunch, shape: &LaunchShape) -> bool {
    let l = &launch.config.layout;
    let experts = l.num_experts.max(1);
    let active = expected_tiles(shape.m, shape.topk, experts, 64);
    // a 64-row tile's block: two warpgroups of 128 weight rows
    let units = |rows: usize| active * rows.div_ceil(256) as f64;
    let bytes_per_expert = (launch.w13.nbytes() + launch.w2.nbytes()) as f64 / experts as f64;
    units(w13_rows(&launch.config)).min(units(l.hidden_padded)) >= WGMMA_DECODE_MIN_UNITS
        && active * bytes_per_expert >= WGMMA_DECODE_MIN_WEIGHT_BYTES
}

/// The family for this launch on `arch`.
pub fn choose(arch: &str, launch: &MoeLaunch, shape: &LaunchShape) -> Family {
    if launch.config.layout.weight_format.is_int4() {
        return Family::Fp32; // the only family that decodes int4, on every vendor
    }
    let Some(sm) = sm_version(arch) else {
        return choose_hip(arch, launch);
    };
    if sm < 80 {
        return Family::Fp32;
    }
    let spec = KernelSpec {
        stream_bm: stream_bm(),
        ..KernelSpec::for_launch(launch, Family::Stream)
    };
    let stream_ok = stream_unsupported(sm, &spec, launch).is_none();
    let wgmma_ok =
        wgmma_unsupported(sm, &KernelSpec::for_launch(launch, Family::Wgmma), launch).is_none();
    match *PREFERENCE {
        Some(Family::Stream) if stream_ok => return Family::Stream,
        Some(Family::Wgmma) if wgmma_ok => return Family::Wgmma,
        Some(f @ (Family::Tile32 | Family::Fp32)) => return f,
        _ => {}
    }
    let l = &launch.config.layout;
    let experts = l.num_experts.max(1);
    let pairs_per_expert = (shape.m * shape.topk).div_ceil(experts);
    let sixteen_bit = matches!(l.weight_format, WeightFormat::Bf16 | WeightFormat::Fp16);
    let wgmma_min = match l.weight_format {
        WeightFormat::Mxfp4 => WGMMA_MIN_PAIRS_PER_EXPERT_MXFP4,
        WeightFormat::Fp8Block128 => WGMMA_MIN_PAIRS_PER_EXPERT_FP8_BLOCK,
        _ if sixteen_bit => WGMMA_MIN_PAIRS_PER_EXPERT_16BIT,
        _ => WGMMA_MIN_PAIRS_PER_EXPERT,
    };
    // The decode rule only where the minimum above is 4 pairs (64-row tiles measured there);
    // evaluated only when the pair count does not already decide.
    let streams_faster = || {
        (sixteen_bit || l.weight_format == WeightFormat::Fp8Block128)
            && wgmma_streams_decode_faster(launch, shape)
    };
    let long_k_stream = stream_ok
        && sixteen_bit
        && stream_ahead(&spec) == 2
        && l.hidden_size.min(l.intermediate_size) >= STREAM_LONG_K_MIN
        && pairs_per_expert <= STREAM_LONG_K_MAX_PAIRS;
    if long_k_stream {
        Family::Stream
    } else if wgmma_ok && (pairs_per_expert >= wgmma_min || streams_faster()) {
        Family::Wgmma
    } else if stream_ok && pairs_per_expert <= STREAM_MAX_PAIRS_PER_EXPERT[sixteen_bit as usize] {
        Family::Stream
    } else {
        Family::Tile32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgmma_defaults_are_what_the_h200_measured_fastest() {
        // Without the diagnostic variables (CI sets none): 16-bit weights on the
        // warp-specialised TMA kernel with 128 x 256 blocks, fp8 on it with 128 x 128, MXFP4 on
        // the shared-memory tile with two blocks per SM (the register operand is an opt-in),
        // grouped by 8.
        let base = KernelSpec {
            family: Family::Wgmma,
            ..crate::backend::gpu::default_spec()
        };
        let bf16 = wgmma_shape(base.clone(), None);
        assert_eq!(
            (
                bf16.wgmma_bm,
                bf16.wgmma_n,
                bf16.wgmma_tma,
                bf16.wgmma_ws,
                bf16.wgmma_rs
            ),
            (128, 256, true, true, false)
        );
        assert_eq!(bf16.wgmma_group, WGMMA_GROUP_DEFAULT);
        let fp8 = wgmma_shape(
            KernelSpec {
                weight_format: WeightFormat::Fp8Block128,
                act_dtype: ActDtype::Fp8Block128,
                stage2_act_dtype: ActDtype::Fp8Block128,
                ..base.clone()
            },
            None,
        );
        assert_eq!((fp8.wgmma_n, fp8.wgmma_ws), (128, true));
        let mx = wgmma_shape(
            KernelSpec {
                weight_format: WeightFormat::Mxfp4,
                scale_layout: Some(ScaleLayout::AiterE8m0),
                ..base
            },
            None,
        );
        assert_eq!(
            (
                mx.wgmma_bm,
                mx.wgmma_n,
                mx.wgmma_blocks,
                mx.wgmma_tma,
                mx.wgmma_rs,
                mx.wgmma_ws,
                mx.wgmma_swap()
            ),
            // the swap-AB kernel, on 64-row tiles unless the launch's pairs ask for 128
            (64, 64, 1, false, true, true, true)
        );
    }

    /// The wgmma family's default spec for bf16, fp8 block-128 and MXFP4 weights.
    fn wgmma_format_specs() -> [KernelSpec; 3] {
        let base = KernelSpec {
            family: Family::Wgmma,
            ..crate::backend::gpu::default_spec()
        };
        let fp8 = KernelSpec {
            weight_format: WeightFormat::Fp8Block128,
            act_dtype: ActDtype::Fp8Block128,
            stage2_act_dtype: ActDtype::Fp8Block128,
            ..base.clone()
        };
        let mx = KernelSpec {
            weight_format: WeightFormat::Mxfp4,
            scale_layout: Some(ScaleLayout::AiterE8m0),
            ..base.clone()
        };
        [base, fp8, mx]
    }

    #[test]
    fn auto_tile_height_takes_64_rows_where_they_read_fewer_l2_bytes() {
        // MOEPLUG_WGMMA_BM=auto on the kit's cases (experts, top-k, format): 64-row tiles
        // (64 x 256 blocks) where 128-row tiles are mostly padding, 128 where they fill.
        let [base, fp8, mx] = wgmma_format_specs();
        let rows = |spec: &KernelSpec, m: usize, topk: usize, experts: usize| {
            let s = wgmma_shape_for(spec.clone(), Some(TileRows::ByL2Bytes), m, topk, experts);
            assert!(wgmma_spec_unsupported(90, &s).is_none(), "{s:?}");
            (s.wgmma_bm, s.wgmma_block_rows(), s.wgmma_ws)
        };
        // DeepSeek-V3 fp8 (256 experts, top 8): 32 pairs per expert at M = 1024, 64 at 2048
        // (a 64-row tile, sometimes two), 128 +- 11 at 4096 (128-row tiles pad less per byte)
        assert_eq!(rows(&fp8, 1024, 8, 256), (64, 256, true));
        assert_eq!(rows(&fp8, 2048, 8, 256), (64, 256, true));
        assert_eq!(rows(&fp8, 4096, 8, 256), (128, 128, true));
        // Qwen3 bf16 (128 experts, top 8): 64-row tiles only at 16 and 32 pairs; at 64 the
        // 128 x 256 block reads fewer bytes despite its half-empty tiles
        assert_eq!(rows(&base, 256, 8, 128), (64, 256, true));
        assert_eq!(rows(&base, 512, 8, 128), (64, 256, true));
        assert_eq!(rows(&base, 1024, 8, 128), (128, 256, true));
        assert_eq!(rows(&base, 4096, 8, 128), (128, 256, true));
        // MXFP4 (the swap-AB kernel, 256 weight rows either way): 64-row tiles where they
        // read fewer bytes, as for bf16
        assert_eq!(rows(&mx, 1024, 4, 128), (64, 256, true));
        // and a fixed preference is taken as given
        let s = wgmma_shape_for(fp8.clone(), Some(TileRows::Fixed(64)), 4096, 8, 256);
        assert_eq!((s.wgmma_bm, s.wgmma_ws), (64, true));
    }

    #[test]
    fn default_tile_height_is_64_rows_for_fp8_blocks_and_the_l2_rule_elsewhere() {
        let [base, fp8, mx] = wgmma_format_specs();
        let rows = |spec: &KernelSpec, m: usize, topk: usize, experts: usize| {
            let s = wgmma_shape_for(spec.clone(), None, m, topk, experts);
            assert!(wgmma_spec_unsupported(90, &s).is_none(), "{s:?}");
            (s.wgmma_bm, s.wgmma_block_rows())
        };
        // fp8 block-128: 64 x 256 blocks from DeepSeek-V3's 4 pairs per expert to Qwen3's 256
        for (m, topk, experts) in [(128, 8, 256), (4096, 8, 256), (4096, 8, 128)] {
            assert_eq!(rows(&fp8, m, topk, experts), (64, 256));
        }
        // bf16: 64 rows up to 32 pairs per expert, 128 from 64 (Qwen3: 128 experts, top 8)
        assert_eq!(rows(&base, 64, 8, 128), (64, 256));
        assert_eq!(rows(&base, 512, 8, 128), (64, 256));
        assert_eq!(rows(&base, 1024, 8, 128), (128, 256));
        // MXFP4 (the swap-AB kernel): 64 rows below 64 pairs per expert (gpt-oss: 128 experts,
        // top 4), 128 from 64
        assert_eq!(rows(&mx, 1024, 4, 128), (64, 256));
        assert_eq!(rows(&mx, 2048, 4, 128), (128, 256));
        assert_eq!(rows(&mx, 4096, 4, 128), (128, 256));
    }

    /// The shape of [`model_launch`]'s launch `l`: `m` tokens, `topk` experts each, hidden
    /// size `h` in and out.
    fn model_shape(l: &MoeLaunch, m: usize, topk: usize, h: usize) -> LaunchShape {
        LaunchShape {
            m,
            topk,
            hidden_cols: h,
            output_cols: h,
            weight_elem: l.w13.elem,
        }
    }

    /// A launch of `m` tokens over the kit's MoE shapes (never dereferenced: the heuristics
    /// read types, shapes and alignment).
    fn model_launch(
        format: WeightFormat,
        experts: usize,
        h: usize,
        i: usize,
        m: usize,
    ) -> MoeLaunch {
        use crate::layout::Layout;
        use crate::moe::MoeConfig;
        use crate::tensor::{DeviceKind, ElemType, Tensor};
        use crate::types::Activation;
        let (w, act) = match format {
            WeightFormat::Bf16 => (ElemType::Bf16, ActDtype::Bf16),
            _ => (ElemType::Fp8E4m3fn, ActDtype::Fp8Block128),
        };
        let t = |name, elem, shape: &[usize]| Tensor {
            name,
            ptr: std::ptr::null_mut(),
            device: DeviceKind::Cuda,
            device_id: 0,
            elem,
            shape: shape.to_vec(),
        };
        let scales = |name, rows: usize, cols: usize| {
            (format == WeightFormat::Fp8Block128)
                .then(|| t(name, ElemType::F32, &[experts, rows / 128, cols / 128]))
        };
        MoeLaunch {
            config: MoeConfig {
                layout: Layout {
                    weight_format: format,
                    gate_mode: GateMode::Separated,
                    weight_layout: WeightLayout::Aiter16x16,
                    scale_layout: None,
                    num_experts: experts,
                    hidden_size: h,
                    intermediate_size: i,
                    hidden_padded: h,
                    intermediate_padded: i,
                    has_bias: false,
                },
                activation: Activation::Silu,
                alpha: Activation::Silu.resolve_alpha(0.0),
                limit: None,
                act_dtype: act,
                stage2_act_dtype: act,
                prequantized_input: false,
                static_act_scale: [false; 2],
                router_weight_on_input: false,
                has_expert_mask: false,
                has_num_local_tokens: false,
            },
            hidden_states: t("hidden_states", ElemType::Bf16, &[m, h]),
            hidden_scale: None,
            w13: t("w13", w, &[experts, 2 * i, h]),
            w13_scale: scales("w13_scale", 2 * i, h),
            w13_bias: None,
            w2: t("w2", w, &[experts, h, i]),
            w2_scale: scales("w2_scale", h, i),
            w2_bias: None,
            topk_weights: t("topk_weights", ElemType::F32, &[m, 8]),
            topk_ids: t("topk_ids", ElemType::I32, &[m, 8]),
            expert_mask: None,
            num_local_tokens: None,
            output: t("output", ElemType::Bf16, &[m, h]),
            workspace: None,
            stream: 0,
            stage1_act_scale: None,
            stage2_act_scale: None,
        }
    }

    #[test]
    fn decode_runs_wgmma_where_its_blocks_fill_a_wave_and_the_weights_dwarf_its_fixed_cost() {
        // (format, experts, hidden, intermediate, top-k, M): the family measured faster
        // (bench/NOTES.md, session 16)
        let bf16 = WeightFormat::Bf16;
        let fp8 = WeightFormat::Fp8Block128;
        let cases = [
            // Qwen3-30B-A3B: small experts, bf16 and fp8 on wgmma from M = 8 (bf16 ties at 4)
            (bf16, 128, 2048, 768, 8, 2, Family::Stream),
            (bf16, 128, 2048, 768, 8, 8, Family::Wgmma),
            (fp8, 128, 2048, 768, 8, 4, Family::Stream),
            (fp8, 128, 2048, 768, 8, 8, Family::Wgmma),
            (fp8, 128, 2048, 768, 8, 16, Family::Wgmma),
            // gpt-oss-120b bf16 runs the stream family to 8 pairs per expert since two weight
            // steps are in flight (the long-K rule, the test below)
            // DeepSeek-V3 fp8: 8 experts of 44 MB fill a wave at M = 1
            (fp8, 256, 7168, 2048, 8, 1, Family::Wgmma),
        ];
        for (format, experts, h, i, topk, m, want) in cases {
            let l = model_launch(format, experts, h, i, m);
            let shape = model_shape(&l, m, topk, h);
            assert_eq!(
                choose("sm_90", &l, &shape),
                want,
                "{format:?} E={experts} H={h} M={m}"
            );
            // where the wgmma family does not run, stream keeps decode
            assert_eq!(choose("sm_89", &l, &shape), Family::Stream);
        }
    }

    #[test]
    fn sixteen_bit_decode_with_long_k_streams_up_to_eight_pairs_per_expert() {
        // (hidden, intermediate, top-k, M): the family measured faster (bench/NOTES.md,
        // session 27, H100, two weight steps in flight)
        let cases = [
            // gpt-oss-120b bf16: 1 (M = 1, 8), 2 and 8 pairs per expert stream; 16 take wgmma
            (2880, 2880, 4, 1, Family::Stream),
            (2880, 2880, 4, 8, Family::Stream),
            (2880, 2880, 4, 64, Family::Stream),
            (2880, 2880, 4, 256, Family::Stream),
            (2880, 2880, 4, 512, Family::Wgmma),
            // Qwen3-30B-A3B bf16: stage 2's K of 768 is short, wgmma from M = 8
            (2048, 768, 8, 8, Family::Wgmma),
            (2048, 768, 8, 64, Family::Wgmma),
        ];
        for (h, i, topk, m, want) in cases {
            let l = model_launch(WeightFormat::Bf16, 128, h, i, m);
            let shape = model_shape(&l, m, topk, h);
            assert_eq!(choose("sm_90", &l, &shape), want, "H={h} I={i} M={m}");
        }
    }

    #[test]
    fn wgmma_runs_a_block_per_work_item_where_items_are_long_and_experts_have_several_tiles() {
        // (format, experts, hidden, intermediate, top-k, M, persistent): bench/NOTES.md,
        // session 19 (a block per item measured faster on gpt-oss bf16 and DeepSeek fp8 at
        // M = 1024 / 4096, slower on Qwen3)
        let bf16 = WeightFormat::Bf16;
        let fp8 = WeightFormat::Fp8Block128;
        let cases = [
            (bf16, 128, 2880, 2880, 4, 1024, false), // gpt-oss: 45 steps, 32 pairs per expert
            (bf16, 128, 2880, 2880, 4, 4096, false),
            (bf16, 128, 2880, 2880, 4, 8, false), // and at decode (session 24)
            (fp8, 256, 7168, 2048, 8, 1024, false), // DeepSeek: 56 fp8 steps
            (fp8, 256, 7168, 2048, 8, 4096, false),
            (fp8, 256, 7168, 2048, 8, 64, false),
            (bf16, 128, 2048, 768, 8, 4096, true), // Qwen3: 32 bf16 steps
            (fp8, 128, 2048, 768, 8, 4096, true),  // 16 fp8 steps
        ];
        for (format, experts, h, i, _topk, m, want) in cases {
            let l = model_launch(format, experts, h, i, m);
            let spec = KernelSpec::for_launch(&l, Family::Wgmma);
            let spec = wgmma_shape(spec, None);
            assert!(
                spec.wgmma_ws,
                "{format:?} H={h}: the warp-specialised kernel"
            );
            assert_eq!(persistent_grid(&spec, &l), want, "{format:?} H={h} M={m}");
            // the other kernels of the family are never persistent
            let plain = KernelSpec {
                wgmma_ws: false,
                ..spec
            };
            assert!(!persistent_grid(&plain, &l));
        }
    }

    #[test]
    fn stage_two_input_is_quantized_without_moe_quant2_by_wgmma_stage_one_or_stream_stage_two() {
        let fused = KernelSpec {
            family: Family::Wgmma,
            weight_format: WeightFormat::Fp8Block128,
            act_dtype: ActDtype::Fp8Block128,
            stage2_act_dtype: ActDtype::Fp8Block128,
            wgmma_bm: 64,
            wgmma_n: 128,
            wgmma_tma: true,
            wgmma_ws: true,
            fused_quant2: true,
            ..crate::backend::gpu::default_spec()
        };
        assert_eq!(wgmma_spec_unsupported(90, &fused), None);
        assert!(fused.defines().contains(&"FUSED_QUANT2=1".to_string()));
        let why = "stage 1 quantizes stage 2's fp8 1x128 input on 64-row tiles, N 128, only";
        let per_token = KernelSpec {
            weight_format: WeightFormat::Fp8PerChannel,
            act_dtype: ActDtype::Fp8PerToken,
            stage2_act_dtype: ActDtype::Fp8PerToken,
            ..fused.clone()
        };
        let tall = KernelSpec {
            wgmma_bm: 128,
            ..fused.clone()
        };
        for refused in [per_token, tall] {
            assert_eq!(wgmma_spec_unsupported(90, &refused), Some(why));
        }
        // the stream family quantizes in its stage-2 blocks (16-row tiles); tile32 cannot
        let stream = KernelSpec {
            family: Family::Stream,
            stream_bm: 16,
            ..fused.clone()
        };
        assert_eq!(stream_quant2_unsupported(&stream), None);
        assert!(stream.defines().contains(&"FUSED_QUANT2=1".to_string()));
        let tall = KernelSpec {
            stream_bm: 32,
            ..stream.clone()
        };
        assert_eq!(
            stream_spec_unsupported(90, &tall),
            Some(
                "a stream block quantizes fp8 per-token or 1x128 activations of 16-row tiles only"
            )
        );
        assert!(!selectable(
            90,
            &KernelSpec {
                family: Family::Tile32,
                ..stream
            }
        ));
    }

    #[test]
    fn the_route_kernel_quantizes_per_row_or_group_activations_of_stream_and_wgmma() {
        let spec = |family, act| KernelSpec {
            family,
            weight_format: WeightFormat::Fp8PerChannel,
            act_dtype: act,
            stage2_act_dtype: act,
            route_quant1: true,
            ..crate::backend::gpu::default_spec()
        };
        for family in [Family::Stream, Family::Wgmma] {
            for act in [ActDtype::Fp8PerToken, ActDtype::Fp8Block128] {
                assert_eq!(route_quant1_unsupported(&spec(family, act)), None);
            }
            for act in [ActDtype::Fp8PerTensor, ActDtype::Bf16] {
                assert_eq!(
                    route_quant1_unsupported(&spec(family, act)),
                    Some("activations quantized per row or group only")
                );
            }
        }
        let tile32 = spec(Family::Tile32, ActDtype::Fp8PerToken);
        assert_eq!(
            route_quant1_unsupported(&tile32),
            Some("the stream and wgmma families only")
        );
        assert!(!selectable(90, &tile32));
        let stream = spec(Family::Stream, ActDtype::Fp8PerToken);
        assert!(stream.defines().contains(&"QUANT1_IN_ROUTE=1".to_string()));
        // the stage-2 module never routes
        let separate = KernelSpec {
            stage2_act_dtype: ActDtype::Fp8PerTensor,
            ..stream
        };
        assert!(!separate.stage2().route_quant1);
    }

    #[test]
    fn register_operand_weights_are_mxfp4_on_tiles_as_tall_as_the_mma_is_wide() {
        let mx = KernelSpec {
            family: Family::Wgmma,
            weight_format: WeightFormat::Mxfp4,
            scale_layout: Some(ScaleLayout::AiterE8m0),
            wgmma_rs: true,
            ..crate::backend::gpu::default_spec()
        };
        let why = |s: &KernelSpec| wgmma_spec_unsupported(90, s);
        for rows in [64, 128] {
            let s = KernelSpec {
                wgmma_bm: rows,
                wgmma_n: rows,
                ..mx.clone()
            };
            assert_eq!(why(&s), None, "{rows}-row tiles");
        }
        let refused = [
            (
                "64-row tiles, N 128",
                KernelSpec {
                    wgmma_bm: 64,
                    ..mx.clone()
                },
            ),
            (
                "two blocks",
                KernelSpec {
                    wgmma_blocks: 2,
                    ..mx.clone()
                },
            ),
            (
                "TMA",
                KernelSpec {
                    wgmma_tma: true,
                    ..mx.clone()
                },
            ),
            (
                "bf16 weights",
                KernelSpec {
                    weight_format: WeightFormat::Bf16,
                    scale_layout: None,
                    ..mx.clone()
                },
            ),
        ];
        for (what, s) in refused {
            assert!(why(&s).is_some(), "{what} accepted");
        }
        // The shared-memory tile: 128 x 128 blocks, one or two per SM; warp-specialised (the
        // packs copied by cp.async, no TMA) with one.
        let tile = KernelSpec {
            wgmma_rs: false,
            ..mx.clone()
        };
        let ws = KernelSpec {
            wgmma_ws: true,
            ..tile.clone()
        };
        assert_eq!(why(&ws), None);
        // The swap-AB kernel: register-operand weights on the warp-specialised kernel, N the
        // tile's rows.
        for rows in [64, 128] {
            let swap = KernelSpec {
                wgmma_rs: true,
                wgmma_bm: rows,
                wgmma_n: rows,
                ..ws.clone()
            };
            assert_eq!(why(&swap), None, "{rows}-row swap");
            assert!(swap.wgmma_swap() && swap.wgmma_block_rows() == 256);
        }
        for refused in [
            KernelSpec {
                wgmma_blocks: 2,
                ..ws.clone()
            },
            KernelSpec {
                wgmma_rs: true,
                wgmma_bm: 64,
                wgmma_n: 128,
                ..ws.clone()
            },
            KernelSpec {
                weight_format: WeightFormat::Bf16,
                scale_layout: None,
                ..ws.clone()
            },
        ] {
            assert!(why(&refused).is_some(), "{refused:?} accepted");
        }
        assert_eq!(why(&tile), None);
        assert_eq!(
            why(&KernelSpec {
                wgmma_blocks: 2,
                ..tile.clone()
            }),
            None
        );
        // Two decoding warpgroups: on the warp-specialised MXFP4 kernel, and only two.
        let decoders = "decoding warpgroups: two, MXFP4 on the warp-specialised kernel only";
        assert_eq!(
            why(&KernelSpec {
                wgmma_decoders: 2,
                ..ws.clone()
            }),
            None
        );
        for refused in [
            KernelSpec {
                wgmma_decoders: 2,
                ..tile.clone()
            },
            KernelSpec {
                wgmma_decoders: 1,
                ..ws.clone()
            },
            KernelSpec {
                wgmma_decoders: 4,
                ..ws.clone()
            },
        ] {
            assert_eq!(why(&refused), Some(decoders), "{refused:?}");
        }
        // The pack copies: the tile kernel's, one or two blocks per SM.
        for blocks in [1, 2] {
            let copies = KernelSpec {
                wgmma_pack_copies: true,
                wgmma_blocks: blocks,
                ..tile.clone()
            };
            assert_eq!(why(&copies), None, "{blocks} blocks");
        }
        for refused in [ws.clone(), mx.clone()] {
            let s = KernelSpec {
                wgmma_pack_copies: true,
                ..refused
            };
            assert_eq!(
                why(&s),
                Some("pack copies: the MXFP4 tile kernel only"),
                "{s:?}"
            );
        }
        assert!(why(&KernelSpec {
            wgmma_bm: 64,
            wgmma_n: 64,
            ..tile
        })
        .is_some());
    }

    #[test]
    fn split_k_picks_what_the_h200_measured_fastest() {
        use WeightFormat as W;
        // (format, H, I, E, top-k, M) -> [stage 1, stage 2], the best split of the per-stage
        // A/B (bench/NOTES.md, session 10) where the fit agrees with it.
        let pick = |f: W, h: usize, i: usize, e: usize, k: usize, m: usize| {
            let steps = |c: usize| c.div_ceil(4 * pack_values(f));
            let tiles = expected_tiles(m, k, e, 16);
            [
                stream_split_k(steps(h), tiles * i.div_ceil(16) as f64, f),
                stream_split_k(steps(i), tiles * h.div_ceil(32) as f64, f),
            ]
        };
        assert_eq!(pick(W::Bf16, 2048, 768, 128, 8, 1), [4, 4]); // Qwen3-30B-A3B
        assert_eq!(pick(W::Bf16, 2048, 768, 128, 8, 256), [2, 1]);
        assert_eq!(pick(W::Fp8Block128, 2048, 768, 128, 8, 8)[0], 4);
        assert_eq!(pick(W::Fp8Block128, 2048, 768, 128, 8, 64), [1, 1]);
        assert_eq!(pick(W::Fp8Block128, 7168, 2048, 256, 8, 1), [2, 1]); // DeepSeek-V3
        assert_eq!(pick(W::Fp8Block128, 7168, 2048, 256, 8, 64), [2, 1]);
        assert_eq!(pick(W::Mxfp4, 2880, 2880, 128, 4, 8), [2, 4]); // gpt-oss-120b
        assert_eq!(pick(W::Bf16, 2880, 2880, 128, 4, 1), [8, 4]);
        // MXFP4's issue-bound steps keep K split wider than fp8's at the same shape.
        assert_eq!(pick(W::Mxfp4, 2880, 2880, 128, 4, 1), [8, 8]);
        assert!(pick(W::Fp8Block128, 2880, 2880, 128, 4, 1)[0] < 8);
    }

    #[test]
    fn expected_tiles_counts_touched_experts_and_second_tiles() {
        assert_eq!(expected_tiles(1, 8, 128, 16), 8.0);
        // 8 tokens x 8 of 128 experts: 128 (1 - (120/128)^8) = 51.6 distinct experts
        assert!((expected_tiles(8, 8, 128, 16) - 51.62).abs() < 0.01);
        // 16 pairs per expert on average: about half the experts need a second tile
        let t = expected_tiles(256, 8, 128, 16);
        assert!((170.0..200.0).contains(&t), "{t}");
        // far beyond the stream range (P(0) underflows): 65,536 pairs +- 250 per expert,
        // ceil(n / 16) is 4096 or 4097 about equally often
        let t = expected_tiles(1 << 20, 8, 128, 16) / 128.0;
        assert!((t - 4096.5).abs() < 0.05, "{t}");
        assert_eq!(expected_tiles(0, 8, 128, 16), 1.0);
        assert_eq!(expected_tiles(5, 8, 4, 16), 4.0);
        let t = expected_tiles(64, (1 << 18) - 1, 1 << 18, 16);
        assert!((t - 4.0 * (1 << 18) as f64).abs() < 1.0, "{t}"); // P(0) underflows
                                                                  // 128 pairs +- 11 per expert (DeepSeek-V3 at M = 4096) in 128-row tiles: one tile, a
                                                                  // second for the half of the experts over 128
        let t = expected_tiles(4096, 8, 256, 128) / 256.0;
        assert!((1.45..1.52).contains(&t), "{t}");
    }

    #[test]
    fn the_bulk_prefetch_is_selectable_on_sm_90_only() {
        use super::super::compile_check::selectable_specs;
        let tile = |s: &KernelSpec| s.stream_prefetch == StreamPrefetch::Tile;
        let on90: Vec<KernelSpec> = selectable_specs(90).into_iter().filter(tile).collect();
        assert!(!on90.is_empty());
        for sm in [80, 89] {
            assert!(!selectable_specs(sm).iter().any(tile), "sm_{sm}");
            assert_eq!(
                stream_spec_unsupported(sm, &on90[0]),
                Some("the bulk L2 prefetch needs sm_90")
            );
        }
        assert!(selectable_specs(90)
            .iter()
            .any(|s| matches!(s.stream_prefetch, StreamPrefetch::Steps(_))));
    }

    #[test]
    fn two_weight_steps_in_flight_are_selectable_for_16_bit_weights_in_16_row_tiles_only() {
        use super::super::compile_check::selectable_specs;
        let specs = selectable_specs(90);
        let ahead: Vec<&KernelSpec> = specs.iter().filter(|s| s.stream_ahead == 2).collect();
        assert!(ahead.iter().any(|s| s.weight_format == WeightFormat::Bf16));
        assert!(ahead.iter().any(|s| s.weight_format == WeightFormat::Fp16));
        assert!(ahead
            .iter()
            .all(|s| s.family == Family::Stream && s.stream_bm == 16));
        assert!(ahead[0].defines().contains(&"SW_AHEAD=2".to_string()));
        let refused = Some("two weight steps in flight: 16-bit weights in 16-row tiles only");
        let tall = KernelSpec {
            stream_bm: 32,
            ..ahead[0].clone()
        };
        assert_eq!(stream_spec_unsupported(90, &tall), refused);
        let stream_mx = specs
            .iter()
            .find(|s| s.family == Family::Stream && s.weight_format == WeightFormat::Mxfp4)
            .expect("an MXFP4 stream configuration");
        let mx = KernelSpec {
            stream_ahead: 2,
            ..stream_mx.clone()
        };
        assert_eq!(stream_spec_unsupported(90, &mx), refused);
    }

    #[test]
    fn stream_x_shared_is_mxfp4_on_sm_90_in_a_64_kib_ring() {
        use super::super::compile_check::selectable_specs;
        let on90 = selectable_specs(90);
        let staged: Vec<&KernelSpec> = on90.iter().filter(|s| s.stream_x_shared).collect();
        assert!(!staged.is_empty(), "a staged stream configuration on sm_90");
        for s in &staged {
            assert_eq!(
                (s.family, s.weight_format),
                (Family::Stream, WeightFormat::Mxfp4)
            );
            assert!(s.stream_bm == 16 && !s.act_dtype.is_quantized(), "{s:?}");
            assert!(s.defines().contains(&"SW_XSHARED=1".to_string()));
        }
        assert!(selectable_specs(80).iter().all(|s| !s.stream_x_shared));
        let off = KernelSpec {
            stream_x_shared: false,
            ..staged[0].clone()
        };
        // Two steps x two 8-token column tiles x four 16-byte packs x 256 threads.
        assert_eq!(staged[0].dynamic_shared_bytes(), 64 * 1024);
        assert_eq!(off.dynamic_shared_bytes(), 0);
        assert!(stream_x_shared(true, Some(90), &off));
        assert!(!stream_x_shared(false, Some(90), &off));
        assert!(!stream_x_shared(true, Some(89), &off));
        let fp8 = on90
            .iter()
            .find(|s| s.family == Family::Stream && s.act_dtype.is_quantized())
            .expect("an fp8 stream configuration");
        assert!(!stream_x_shared(true, Some(90), fp8));
        let staged_fp8 = KernelSpec {
            stream_x_shared: true,
            ..fp8.clone()
        };
        assert!(stream_spec_unsupported(90, &staged_fp8).is_some());
    }

    #[test]
    fn the_bias_prefetch_is_selectable_for_stream_configurations_with_a_bias_only() {
        use super::super::compile_check::selectable_specs;
        for sm in [80, 90] {
            let specs = selectable_specs(sm);
            let on: Vec<&KernelSpec> = specs.iter().filter(|s| s.stream_bias_prefetch).collect();
            assert!(!on.is_empty(), "sm_{sm}");
            assert!(on.iter().all(|s| s.family == Family::Stream && s.has_bias));
            assert!(on[0].defines().contains(&"SW_PF_BIAS=1".to_string()));
            let no_bias = KernelSpec {
                has_bias: false,
                ..on[0].clone()
            };
            assert_eq!(
                stream_spec_unsupported(sm, &no_bias),
                Some("the bias prefetch needs a bias")
            );
        }
    }

    #[test]
    fn programmatic_dependent_launch_is_selectable_on_sm_90_stream_and_wgmma_only() {
        use super::super::compile_check::selectable_specs;
        let on90 = selectable_specs(90);
        let pdl: Vec<&KernelSpec> = on90.iter().filter(|s| s.pdl.on()).collect();
        assert!(pdl
            .iter()
            .all(|s| matches!(s.family, Family::Stream | Family::Wgmma)));
        // each family's default (early / wait) and MOEPLUG_PDL's others
        let modes = [
            (Family::Stream, Pdl::Wait, "PDL=1"),
            (Family::Stream, Pdl::Off, "PDL=0"),
            (Family::Wgmma, Pdl::Early, "PDL=2"),
            (Family::Wgmma, Pdl::Wait, "PDL=1"),
            (Family::Wgmma, Pdl::Off, "PDL=0"),
        ];
        for (family, mode, define) in modes {
            let n = on90
                .iter()
                .filter(|s| s.family == family && s.pdl == mode)
                .inspect(|s| assert!(s.defines().contains(&define.to_string())))
                .count();
            assert!(n > 0, "{family:?} {mode:?}");
        }
        assert!(!on90
            .iter()
            .any(|s| s.family == Family::Stream && s.pdl == Pdl::Early));
        assert!(on90
            .iter()
            .filter(|s| !matches!(s.family, Family::Stream | Family::Wgmma))
            .all(|s| !s.defines().iter().any(|d| d.starts_with("PDL="))));
        let mut tile32 = pdl[0].clone();
        tile32.family = Family::Tile32;
        assert!(!selectable(90, &tile32));
        for sm in [80, 89] {
            assert!(!selectable_specs(sm).iter().any(|s| s.pdl.on()), "sm_{sm}");
            let stream = pdl.iter().find(|s| s.family == Family::Stream).unwrap();
            assert_eq!(
                stream_spec_unsupported(sm, stream),
                Some("programmatic dependent launch needs sm_90")
            );
        }
    }

    #[test]
    fn pdl_preference_spellings() {
        assert_eq!(Pdl::parse("0"), Some(Pdl::Off));
        assert_eq!(Pdl::parse(" wait"), Some(Pdl::Wait));
        assert_eq!(Pdl::parse("1"), Some(Pdl::Early));
        assert_eq!(Pdl::parse("early"), Some(Pdl::Early));
        assert_eq!(Pdl::parse("2"), None);
    }

    #[test]
    fn mfma_runs_on_cdna3_and_cdna4_only() {
        for arch in [
            "gfx942",
            "gfx950",
            "gfx942:sramecc+:xnack-",
            "gfx950:xnack-",
        ] {
            assert!(mfma_arch(arch), "{arch}");
        }
        for arch in ["gfx90a", "gfx908", "gfx1100", "gfx9420", "sm_90", "gfx", ""] {
            assert!(!mfma_arch(arch), "{arch}");
        }
        assert_eq!(hip_families("gfx950"), [Family::Mfma, Family::Fp32]);
        assert_eq!(hip_families("gfx942:sramecc+:xnack-")[0], Family::Mfma);
        assert_eq!(hip_families("gfx1100"), [Family::Fp32]);
        // Never a CUDA family, on any sm.
        let spec = super::super::compile_check::specs_where(|s| s.family == Family::Mfma);
        assert!(!spec.is_empty());
        for sm in [70, 80, 89, 90, 100] {
            assert!(spec.iter().all(|s| !selectable(sm, s)), "sm_{sm}");
        }
    }

    #[test]
    fn split_k_override_names_both_stages_or_each() {
        assert_eq!(parse_split_k("4"), Some([Some(4), Some(4)]));
        assert_eq!(parse_split_k(" 2,0"), Some([Some(2), None]));
        assert_eq!(parse_split_k("0,8"), Some([None, Some(8)]));
        for bad in ["3", "4,", "16,2", "x", "2,4,8"] {
            assert_eq!(parse_split_k(bad), None, "{bad}");
        }
    }

    #[test]
    fn arch_strings() {
        assert_eq!(sm_version("sm_90"), Some(90));
        assert_eq!(sm_version("sm_100"), Some(100));
        assert_eq!(sm_version("gfx942"), None);
    }
}
