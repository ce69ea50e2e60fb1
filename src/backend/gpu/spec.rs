//! The typed description of one compiled fused-MoE kernel configuration: which GEMM family
//! and which format / layout / dtype / option choices it is specialised for. It renders the
//! `-D` options of the NVRTC/hipRTC compile (so it is also the kernel-cache key) and the
//! prelude that gives the kernels every ABI enum value by name.

use super::launch;
use crate::moe::MoeLaunch;
use crate::tensor::{ElemType, Tensor};
use crate::types::{ActDtype, Activation, GateMode, ScaleLayout, WeightFormat, WeightLayout};

/// A GEMM family of kernels/fused_moe.cu (`FAMILY_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// fp32 FMA tiles: any device, any configuration (moe_gemm_fp32.cuh).
    Fp32 = 0,
    /// mma.sync, 32 sorted rows x 128 weight rows per block: CUDA sm_80+ (moe_gemm_tile32.cuh).
    Tile32 = 1,
    /// Swap-AB weight streaming for few tokens per expert: CUDA sm_80+ (moe_gemm_stream.cuh).
    Stream = 2,
    /// Warpgroup MMA on 128-row tiles for many tokens per expert: CUDA sm_90a
    /// (moe_gemm_wgmma.cuh).
    Wgmma = 3,
    /// AMD matrix cores (MFMA, wave64), 32 sorted rows x 128 weight rows per block: HIP
    /// gfx942 / gfx950 (moe_gemm_mfma.cuh). Compiled in CI, never run by the project: the
    /// self-test before first use decides whether a device may select it.
    Mfma = 4,
}

impl Family {
    pub const ALL: [Family; 5] = [
        Family::Fp32,
        Family::Tile32,
        Family::Stream,
        Family::Wgmma,
        Family::Mfma,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Fp32 => "fp32",
            Family::Tile32 => "tile32",
            Family::Stream => "stream",
            Family::Wgmma => "wgmma",
            Family::Mfma => "mfma",
        }
    }

    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The rows (token, slot pairs) per sorted tile a spec of the family may have, fewest
    /// and most (workspace sizing; a spec's own is [`KernelSpec::tile_rows`]).
    pub fn tile_rows_range(self) -> (usize, usize) {
        match self {
            Family::Stream => (16, 32),
            Family::Fp32 | Family::Tile32 | Family::Mfma => (32, 32),
            Family::Wgmma => (64, 128),
        }
    }
}

impl Family {
    /// Whether the family's stage 2 can end with the top-k combine (`FUSED_COMBINE`,
    /// kernels/moe_common.cuh: arrival counters, the last block of a token sums its slots).
    /// Not wgmma (its kernel is being rewritten) nor MFMA (the combine's loads are CUDA PTX).
    pub fn fuses_combine(self) -> bool {
        match self {
            Family::Fp32 | Family::Tile32 | Family::Stream => true,
            Family::Wgmma | Family::Mfma => false,
        }
    }

    /// The family that runs a launch when the device's self-test refused this one: it can run
    /// every launch this family can (on the same device). Exhaustive, so a new family answers.
    pub fn fallback(self) -> Option<Family> {
        match self {
            Family::Stream | Family::Wgmma => Some(Family::Tile32),
            Family::Tile32 | Family::Mfma => Some(Family::Fp32),
            Family::Fp32 => None,
        }
    }
}

/// A set of families (bit `1 << family`): those a device's self-test accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilySet(u32);

impl FamilySet {
    pub const NONE: FamilySet = FamilySet(0);
    pub fn all() -> FamilySet {
        Family::ALL.into_iter().collect()
    }
    pub fn contains(self, f: Family) -> bool {
        self.0 & (1 << f as u32) != 0
    }
    pub fn insert(&mut self, f: Family) {
        self.0 |= 1 << f as u32;
    }
}

impl FromIterator<Family> for FamilySet {
    fn from_iter<I: IntoIterator<Item = Family>>(iter: I) -> FamilySet {
        let mut s = FamilySet::NONE;
        for f in iter {
            s.insert(f);
        }
        s
    }
}

/// How the stream family asks for weight bytes beyond its register loads (one step ahead,
/// ~32 KiB in flight per SM) without registers: an L2 prefetch. Measured on the H200
/// (bench/NOTES.md, session 7): 2 steps moved decode by -4 to +5 %, `Tile` gained nothing, so
/// bytes in flight are not what binds the family; off by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamPrefetch {
    /// None: the register loads alone.
    Off,
    /// Every warp asks the L2 (`prefetch.global.L2`) for the weight lines of its step this
    /// many of its steps beyond the one its registers load (sm_80+).
    Steps(u32),
    /// At its start the block asks the L2 for every weight byte it will read
    /// (`cp.async.bulk.prefetch.L2`, sm_90+).
    Tile,
}

impl StreamPrefetch {
    /// The farthest `Steps` distance the experiment takes: 8 steps are 16 KiB of a warp's
    /// weights in flight, 8x what its registers hold.
    pub const MAX_STEPS: u32 = 8;

    /// This prefetch as CUDA `sm` runs it: the bulk prefetch needs sm_90, below it none.
    pub fn on(self, sm: u32) -> StreamPrefetch {
        match self {
            StreamPrefetch::Tile if sm < 90 => StreamPrefetch::Off,
            p => p,
        }
    }

    /// `MOEPLUG_STREAM_PREFETCH`'s spelling: "0" (off), "1" to "8" (steps), "tile".
    pub fn parse(v: &str) -> Option<StreamPrefetch> {
        match v.trim() {
            "tile" => Some(StreamPrefetch::Tile),
            "0" => Some(StreamPrefetch::Off),
            n => n
                .parse()
                .ok()
                .filter(|n| (1..=Self::MAX_STEPS).contains(n))
                .map(StreamPrefetch::Steps),
        }
    }
}

/// Programmatic dependent launch (sm_90, `PDL`, kernels/moe_common.cuh `pdl_enter`): every
/// kernel of a launch may start while the previous one of the stream finishes and waits for its
/// results (`griddepcontrol.wait`), then lets the next one start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pdl {
    /// Plain launches.
    Off = 0,
    /// Every kernel waits before its first access.
    Wait = 1,
    /// As `Wait`, but a wgmma stage whose predecessor is not the route kernel starts the weight
    /// copies of its ring's first stages before it waits. Not the stream family: its blocks'
    /// weights asked of the L2 before the wait measured 3-34 % slower on the H200
    /// (bench/NOTES.md, session 17; bench/patches/stream-pdl-early-prefetch.patch).
    Early = 2,
}

impl Pdl {
    /// `MOEPLUG_PDL`'s spelling: "0" (off), "wait", "1" or "early".
    pub fn parse(v: &str) -> Option<Pdl> {
        match v.trim() {
            "0" => Some(Pdl::Off),
            "wait" => Some(Pdl::Wait),
            "1" | "early" => Some(Pdl::Early),
            _ => None,
        }
    }

    pub fn on(self) -> bool {
        self != Pdl::Off
    }

    /// This mode as `family` has it: the stream family waits where early reads are asked for.
    pub fn for_family(self, family: Family) -> Pdl {
        match (self, family) {
            (Pdl::Early, Family::Stream) => Pdl::Wait,
            (pdl, _) => pdl,
        }
    }
}

/// Everything the compiled kernel is specialised for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    pub family: Family,
    pub weight_format: WeightFormat,
    pub weight_layout: WeightLayout,
    pub scale_layout: Option<ScaleLayout>,
    pub gate_mode: GateMode,
    pub activation: Activation,
    /// The act dtype of the stages this configuration's kernels run: both, unless
    /// `stage2_act_dtype` differs (then stage 1; [`KernelSpec::stage2`] is stage 2's).
    pub act_dtype: ActDtype,
    /// The stage-2 input's act dtype: it decides how the stage-1 epilogue stores the
    /// intermediate ([`KernelSpec::inter_f16`]).
    pub stage2_act_dtype: ActDtype,
    /// hidden_states / output are fp16 (else bf16).
    pub in_f16: bool,
    pub out_f16: bool,
    pub has_bias: bool,
    pub router_weight_on_input: bool,
    pub has_mask: bool,
    /// fp8 weights (and fp8 activations) are e4m3fnuz.
    pub fp8_fnuz: bool,
    /// Stream family: warps (of 8) splitting K in stage 1 and stage 2 (`SW_KW1`, `SW_KW2`);
    /// the block holds 8 / kw row groups. Unused by the other families.
    pub split_k: [u32; 2],
    /// Stream family: sorted rows per tile (`BM`, 16 or 32: two or four 8-token column tiles
    /// against each weight step). Unused by the others.
    pub stream_bm: u32,
    /// Stream family: weight prefetch into the L2 ahead of the register loads
    /// (`SW_PF`, `SW_PF_TILE`). Unused by the others.
    pub stream_prefetch: StreamPrefetch,
    /// Stream family: weight steps in flight while a warp computes one (`SW_AHEAD`, 1 or 2;
    /// 2 holds a third register set, 16-bit weights in 16-row tiles only:
    /// heuristics::stream_ahead_max). Unused by the others.
    pub stream_ahead: u32,
    /// Stream family, MXFP4: the K loop reads its activation packs from a per-thread ring in
    /// dynamic shared memory, copied there by cp.async one step ahead (`SW_XSHARED`;
    /// [`Self::dynamic_shared_bytes`]). Unused by the others.
    pub stream_x_shared: bool,
    /// Stream family with a bias: each row group asks for its bias lines (L1 and L2) before
    /// its K walk, for the epilogue (`SW_PF_BIAS`). Unused by the others.
    pub stream_bias_prefetch: bool,
    /// Stream and wgmma families, sm_90: programmatic dependent launch ([`Pdl`]).
    pub pdl: Pdl,
    /// Wgmma family: weight rows per warpgroup MMA (`WG_N`, 128 or 256; with `wgmma_rs` the
    /// MMA's N, the tile's sorted rows, 64 or 128) and sorted rows per tile (`BM`, 64 or 128).
    /// Unused by the others.
    pub wgmma_n: u32,
    pub wgmma_bm: u32,
    /// Wgmma family: blocks resident per SM (`WG_MIN_BLOCKS`, 1 or 2): the ring shrinks to fit.
    pub wgmma_blocks: u32,
    /// Wgmma family: weight tiles by TMA from a tensor map the launch passes (`WG_TMA`).
    pub wgmma_tma: bool,
    /// Wgmma family: a producer warpgroup fills the ring while two consumer warpgroups
    /// multiply, persistent over the tiles (`WG_WS`).
    pub wgmma_ws: bool,
    /// Wgmma family, MXFP4 weights: decoded in registers and fed as the register operand of
    /// wgmma (the weights on the MMA's 64-row side, the sorted rows on N), so that only the
    /// activations pass through shared memory (`WG_RS`).
    pub wgmma_rs: bool,
    /// Wgmma family: the order of the (tile, column block) work (`WG_GROUP`): 0 takes every
    /// tile of a column block before the next column block; g > 0 takes every column block of
    /// g consecutive tiles before the next g tiles, so a tile's activation rows are read again
    /// while they are in the L2.
    pub wgmma_group: u32,
    /// Wgmma family, warp-specialised on 64-row tiles: both MMA warpgroups take the same
    /// `wgmma_n` weight rows and split K (`WG_KSPLIT`), so a block covers half the rows and a
    /// launch has twice the work items (an opt-in: [`heuristics::wgmma_ksplit`]).
    pub wgmma_ksplit: bool,
    /// Wgmma family, MXFP4 on the warp-specialised kernel: warpgroups beside the two MMA
    /// warpgroups that only decode the packs (`WG_DECODERS`, 0 or 2), so that a step's decode
    /// is shared by 16 warps, not 8 (an opt-in: `MOEPLUG_WGMMA_DECODERS=2`).
    pub wgmma_decoders: u32,
    /// Wgmma family, the MXFP4 tile kernel: each thread's pack and scale word by cp.async two
    /// steps ahead into slots after the ring, instead of into registers one step ahead
    /// (`WG_PACK_COPIES`; an opt-in until measured: `MOEPLUG_WGMMA_PACK_COPIES=1`).
    pub wgmma_pack_copies: bool,
    /// Wgmma family, the swap-AB kernel on AITER 16x16 weights: the producer copies each
    /// 16-row group's packs of a step with one bulk copy (`WG_BULK_PACKS`; an opt-in,
    /// measured no faster: `MOEPLUG_WGMMA_BULK_PACKS=1`).
    pub wgmma_bulk_packs: bool,
    /// The top-k combine runs at the end of stage 2 instead of as `moe_reduce`
    /// (`FUSED_COMBINE`; [`Family::fuses_combine`] families on CUDA only).
    pub fused_combine: bool,
    /// Stage 2's quantized input without `moe_quant2` (`FUSED_QUANT2`): the wgmma stage-1
    /// epilogue writes it (fp8 1x128), or each stream stage-2 block quantizes its tile's rows
    /// into shared memory (fp8 per token or 1x128).
    pub fused_quant2: bool,
    /// Activations quantized per row or group: blocks 1 .. M of the route kernel quantize the
    /// hidden_states rows, and `moe_quant1` is not launched (`QUANT1_IN_ROUTE`).
    pub route_quant1: bool,
    /// Stage 2's partial rows in the output's 16-bit type instead of fp32 (`PARTIALS_16`):
    /// half the bytes stage 2 writes and `moe_reduce` reads. The wgmma family's (prefill,
    /// where they are M k H values); not with the fused combine.
    pub partials_16: bool,
}

impl KernelSpec {
    pub fn for_launch(launch: &MoeLaunch, family: Family) -> KernelSpec {
        let c = &launch.config;
        let l = &c.layout;
        let f16 = |t: &Tensor| t.elem == ElemType::F16;
        KernelSpec {
            family,
            weight_format: l.weight_format,
            weight_layout: l.weight_layout,
            scale_layout: l.scale_layout,
            gate_mode: l.gate_mode,
            activation: c.activation,
            act_dtype: c.act_dtype,
            stage2_act_dtype: c.stage2_act_dtype,
            in_f16: f16(&launch.hidden_states),
            out_f16: f16(&launch.output),
            has_bias: l.has_bias,
            router_weight_on_input: c.router_weight_on_input,
            has_mask: launch.expert_mask.is_some(),
            fp8_fnuz: launch.w13.elem == ElemType::Fp8E4m3fnuz,
            split_k: [8, 8],
            stream_bm: 16,
            stream_prefetch: StreamPrefetch::Off,
            stream_ahead: 1,
            stream_x_shared: false,
            stream_bias_prefetch: false,
            pdl: Pdl::Off,
            wgmma_n: 128,
            wgmma_bm: 128,
            wgmma_blocks: 1,
            wgmma_tma: false,
            wgmma_ws: false,
            wgmma_rs: false,
            wgmma_group: 0,
            wgmma_ksplit: false,
            wgmma_decoders: 0,
            wgmma_pack_copies: false,
            wgmma_bulk_packs: false,
            fused_combine: false,
            fused_quant2: false,
            route_quant1: false,
            partials_16: family == Family::Wgmma,
        }
    }

    /// Threads of a stage-1 / stage-2 block (the warp-specialised wgmma kernel adds a
    /// producer warpgroup, and any decoding warpgroups, to the two that multiply).
    pub fn gemm_threads(&self) -> u32 {
        if self.family == Family::Wgmma && self.wgmma_ws {
            384 + 128 * self.wgmma_decoders
        } else {
            256
        }
    }

    /// Whether stage 1 and 2 are persistent: one block per SM loops over the work.
    pub fn persistent(&self) -> bool {
        self.family == Family::Wgmma && self.wgmma_ws
    }

    /// Whether stage 2 reads its input in another act dtype than stage 1 (feature
    /// STAGE2_ACT_DTYPE): then stage 2 runs from a second module, [`KernelSpec::stage2`].
    pub fn separate_stage2(&self) -> bool {
        self.stage2_act_dtype != self.act_dtype
    }

    /// The configuration whose kernels run stage 2 (its quantization and GEMM) and the
    /// reduction: this one compiled for the stage-2 act dtype (itself when it is the same).
    /// Both modules store and read the intermediate alike (`inter_f16` depends on the stage-2
    /// act dtype only), and share the family, so the sort of stage 1's module fits.
    pub fn stage2(&self) -> KernelSpec {
        if !self.separate_stage2() {
            return self.clone();
        }
        let a = self.stage2_act_dtype;
        KernelSpec {
            act_dtype: a,
            route_quant1: false, // its route kernel never runs
            // Its stage-1 kernels never run: a 16-bit act dtype takes the input dtype a
            // launch of that act dtype alone would have, so the module is one of those.
            in_f16: if a.is_quantized() {
                self.in_f16
            } else {
                a == ActDtype::Fp16
            },
            ..self.clone()
        }
    }

    /// The 16-bit type the stage-1 epilogue stores the intermediate in (fp16, else bf16): the
    /// stage-2 act dtype when that is 16-bit (the value the CPU backend rounds to), else the
    /// output dtype (what the CPU backend quantizes from).
    pub fn inter_f16(&self) -> bool {
        if self.stage2_act_dtype.is_quantized() {
            self.out_f16
        } else {
            self.stage2_act_dtype == ActDtype::Fp16
        }
    }

    /// Rows (token, slot pairs) per sorted tile: the route pads each expert to this (`BM`).
    pub fn tile_rows(&self) -> usize {
        match self.family {
            Family::Wgmma => self.wgmma_bm as usize,
            Family::Stream => self.stream_bm as usize,
            f => f.tile_rows_range().0,
        }
    }

    /// Wgmma family: weight rows of a block (the two warpgroups share them on 128-row tiles
    /// and take `wgmma_n` each on 64-row tiles, or share them there too when they split K;
    /// with `wgmma_rs` 64 each, so 128 either way; 256 on the swap-AB kernel).
    pub fn wgmma_block_rows(&self) -> usize {
        let n = self.wgmma_n as usize;
        if self.wgmma_swap() {
            256
        } else if self.wgmma_bm == 128 || self.wgmma_ksplit {
            n
        } else {
            2 * n
        }
    }

    /// Wgmma family: weight rows of one TMA box, one warpgroup's MMA rows (a block takes one
    /// box per stage on 128-row tiles, two on 64-row tiles).
    pub fn wgmma_box_rows(&self) -> usize {
        self.wgmma_n as usize
    }

    /// Wgmma family: bytes of one ring stage, the tile's activation rows and (unless the
    /// weights are the register operand) the block's weight rows, 128 bytes each.
    fn wgmma_stage_bytes(&self) -> usize {
        if self.wgmma_swap() {
            // a step is 128 K: two 128-byte activation rows, 64 bytes of packs and a word of
            // scales per weight row
            return self.wgmma_bm as usize * 256 + self.wgmma_block_rows() * (64 + 4);
        }
        let weights = if self.wgmma_rs {
            0
        } else if self.wgmma_decodes_packs() {
            // a step's 64 codes per row, packed; their two scales per row, in 1 KiB
            self.wgmma_block_rows() * 32 + 1024
        } else {
            self.wgmma_block_rows() * 128
        };
        self.wgmma_bm as usize * 128 + weights
    }

    /// Wgmma family, MXFP4 warp-specialised (`WG_MX4_WS`): the ring carries the packed codes,
    /// which the consumers decode into one of three bf16 weight tiles after it.
    fn wgmma_decodes_packs(&self) -> bool {
        self.wgmma_ws && self.weight_format == WeightFormat::Mxfp4 && !self.wgmma_rs
    }

    /// Wgmma family, MXFP4 on the swap-AB kernel (`WG_SWAP`: register-operand weights on the
    /// warp-specialised kernel, moe_gemm_wgmma_swap.cuh).
    pub fn wgmma_swap(&self) -> bool {
        self.wgmma_rs && self.wgmma_ws
    }

    /// Wgmma family: the decoded weight tiles after the ring (`WG_DEC_TILES` x `WG_B_BYTES`).
    fn wgmma_decoded_bytes(&self) -> usize {
        if self.wgmma_decodes_packs() {
            3 * self.wgmma_block_rows() * 128
        } else {
            0
        }
    }

    /// Wgmma family, [`KernelSpec::wgmma_pack_copies`]: each thread's pack and scale word of a
    /// step, copied two steps ahead into one of three slots after the ring (`WG_MX_SLOTS` x
    /// `WG_MX_SLOT_BYTES`: 256 threads x 20 bytes).
    fn wgmma_pack_slot_bytes(&self) -> usize {
        if self.wgmma_pack_copies {
            3 * 256 * 20
        } else {
            0
        }
    }

    /// Wgmma family: the dynamic shared memory after the ring (decoded tiles, pack slots).
    fn wgmma_after_ring_bytes(&self) -> usize {
        self.wgmma_decoded_bytes() + self.wgmma_pack_slot_bytes()
    }

    /// Wgmma family: stages of its cp.async ring, as many as the SM's 227 KiB of shared
    /// memory holds for `wgmma_blocks` blocks (at most 5; 6 warp-specialised, the swap-AB
    /// kernel included; 8 for the cp.async kernel with register weights, whose 16 KiB stages
    /// are the only copies in flight; an even count where the warpgroups split K, each owning
    /// every other stage).
    fn wgmma_stages(&self) -> usize {
        let per_block = 227 * 1024 / self.wgmma_blocks.max(1) as usize
            - 1024
            - self.wgmma_ksplit_bytes()
            - self.wgmma_after_ring_bytes();
        let most = if self.wgmma_rs && !self.wgmma_ws {
            8
        } else if self.wgmma_ws {
            6
        } else {
            5
        };
        let stages = (per_block / self.wgmma_stage_bytes()).min(most);
        if self.wgmma_ksplit {
            stages & !1
        } else {
            stages
        }
    }

    /// Wgmma family: the static buffer through which `WG_KSPLIT`'s second warpgroup hands its
    /// sums to the first (128 threads x `wgmma_n / 2` floats).
    fn wgmma_ksplit_bytes(&self) -> usize {
        if self.wgmma_ksplit {
            128 * self.wgmma_n as usize / 2 * 4
        } else {
            0
        }
    }

    /// Dynamic shared memory of each GEMM block: the wgmma family's ring, plus 1 KiB to align
    /// the base; with `stream_x_shared`, the stream family's activation ring (two steps of
    /// four 16-byte packs per thread and 8-token column tile, `SW_XRING_BYTES`); the other
    /// families' shared memory is static, under the 48 KiB default.
    pub fn dynamic_shared_bytes(&self) -> usize {
        match self.family {
            Family::Wgmma => {
                self.wgmma_stages() * self.wgmma_stage_bytes()
                    + self.wgmma_after_ring_bytes()
                    + 1024
            }
            Family::Stream if self.stream_x_shared => {
                2 * self.tile_rows() / 8 * 4 * launch::THREADS as usize * 16
            }
            _ => 0,
        }
    }

    /// The NVRTC architecture for `arch` ("sm_90"): the wgmma family needs the sm_90a target.
    pub fn compile_arch(&self, arch: &str) -> String {
        match self.family {
            Family::Wgmma => format!("{arch}a"),
            _ => arch.to_string(),
        }
    }

    /// Stage-2 column blocks over `hidden_size` columns: the stage-2 grid's y, and the arrival
    /// counters per token of the fused combine.
    pub fn stage2_column_blocks(&self, hidden_size: usize) -> usize {
        hidden_size.div_ceil(self.block_columns().1)
    }

    /// Output columns one block of stage 1 / stage 2 covers. A block of stage 1 holds the gate
    /// and up rows of its columns; without a gated activation (NONE) it covers as many columns
    /// as a stage-2 block (the families map a non-gated stage 1 as stage 2).
    pub fn block_columns(&self) -> (usize, usize) {
        let (gated, down) = self.gated_block_columns();
        if self.activation.is_gated() {
            (gated, down)
        } else {
            let rows = match self.family {
                Family::Stream => 32 * (8 / self.split_k[0].clamp(1, 8) as usize),
                _ => down,
            };
            (rows, down)
        }
    }

    /// Output columns of a gated stage-1 block and of a stage-2 block.
    fn gated_block_columns(&self) -> (usize, usize) {
        match self.family {
            Family::Fp32 => (64, 64),
            Family::Tile32 | Family::Mfma => (64, 128),
            Family::Wgmma => (self.wgmma_block_rows() / 2, self.wgmma_block_rows()),
            Family::Stream => {
                let groups = |kw: u32| 8 / kw.clamp(1, 8) as usize;
                (16 * groups(self.split_k[0]), 32 * groups(self.split_k[1]))
            }
        }
    }

    /// The `-D` options (names from [`abi_prelude`] where the value is an ABI enum).
    pub fn defines(&self) -> Vec<String> {
        let slayout = self.scale_layout.map(|s| s as i32).unwrap_or(0);
        let act_q = if self.act_dtype.is_quantized() {
            self.act_dtype as i32
        } else {
            0
        };
        let b = |v: bool| v as i32;
        let mut d = vec![
            format!("FAMILY={}", self.family as i32),
            format!("BM={}", self.tile_rows()),
            format!("WFMT={}", self.weight_format as i32),
            format!("WLAYOUT={}", self.weight_layout as i32),
            format!("SLAYOUT={slayout}"),
            format!("GATE={}", self.gate_mode as i32),
            format!("ACT={}", self.activation as i32),
            format!("ACT_F16={}", b(self.act_dtype == ActDtype::Fp16)),
            format!("ACT_Q={act_q}"),
            format!("INTER_F16={}", b(self.inter_f16())),
            format!("IN_F16={}", b(self.in_f16)),
            format!("OUT_F16={}", b(self.out_f16)),
            format!("HAS_BIAS={}", b(self.has_bias)),
            format!("RWOI={}", b(self.router_weight_on_input)),
            format!("HAS_MASK={}", b(self.has_mask)),
            format!("FP8_FNUZ={}", b(self.fp8_fnuz)),
            format!("FUSED_COMBINE={}", b(self.fused_combine)),
            format!("QUANT1_IN_ROUTE={}", b(self.route_quant1)),
            format!("PARTIALS_16={}", b(self.partials_16)),
        ];
        if self.family == Family::Stream {
            d.push(format!("SW_KW1={}", self.split_k[0]));
            d.push(format!("SW_KW2={}", self.split_k[1]));
            let (steps, tile) = match self.stream_prefetch {
                StreamPrefetch::Off => (0, false),
                StreamPrefetch::Steps(n) => (n, false),
                StreamPrefetch::Tile => (0, true),
            };
            d.push(format!("SW_PF={steps}"));
            d.push(format!("SW_PF_TILE={}", b(tile)));
            d.push(format!("SW_AHEAD={}", self.stream_ahead));
            d.push(format!("SW_XSHARED={}", b(self.stream_x_shared)));
            d.push(format!("SW_PF_BIAS={}", b(self.stream_bias_prefetch)));
            d.push(format!("FUSED_QUANT2={}", b(self.fused_quant2)));
        }
        if matches!(self.family, Family::Stream | Family::Wgmma) {
            d.push(format!("PDL={}", self.pdl as u32));
        }
        if self.family == Family::Wgmma {
            d.push(format!("WG_N={}", self.wgmma_n));
            d.push(format!("WG_STAGES={}", self.wgmma_stages()));
            d.push(format!("WG_SMEM_BYTES={}", self.dynamic_shared_bytes()));
            d.push(format!("WG_MIN_BLOCKS={}", self.wgmma_blocks));
            d.push(format!("WG_TMA={}", b(self.wgmma_tma)));
            d.push(format!("WG_WS={}", b(self.wgmma_ws)));
            d.push(format!("WG_RS={}", b(self.wgmma_rs)));
            d.push(format!("WG_GROUP={}", self.wgmma_group));
            d.push(format!("WG_KSPLIT={}", b(self.wgmma_ksplit)));
            d.push(format!("WG_DECODERS={}", self.wgmma_decoders));
            d.push(format!("WG_PACK_COPIES={}", b(self.wgmma_pack_copies)));
            d.push(format!("WG_BULK_PACKS={}", b(self.wgmma_bulk_packs)));
            d.push(format!("FUSED_QUANT2={}", b(self.fused_quant2)));
        }
        d
    }
}

/// The narrowest stage-2 column block of any spec (the stream family with K split 8 ways): the
/// fused combine's counters are sized with it, so one workspace size fits every family.
pub const FEWEST_STAGE2_COLUMNS: usize = 32;

/// `#define` lines naming every ABI enum value and every family, prepended to the kernel
/// source: the kernels compare `WFMT == WF_MXFP4`, never a bare integer, and the values come
/// from the one Rust definition of each enum.
pub fn abi_prelude() -> String {
    fn block<T: Copy>(
        out: &mut String,
        prefix: &str,
        all: &[T],
        f: impl Fn(T) -> (&'static str, i32),
    ) {
        for &v in all {
            let (label, value) = f(v);
            out.push_str(&format!(
                "#define {prefix}_{} {value}\n",
                label.to_uppercase()
            ));
        }
    }
    let mut s = String::from("// generated by src/backend/gpu/spec.rs (abi_prelude)\n");
    block(&mut s, "WF", WeightFormat::ALL, |v| (v.label(), v as i32));
    block(&mut s, "AD", ActDtype::ALL, |v| (v.label(), v as i32));
    block(&mut s, "GM", GateMode::ALL, |v| (v.label(), v as i32));
    block(&mut s, "AF", Activation::ALL, |v| (v.label(), v as i32));
    block(&mut s, "WL", WeightLayout::ALL, |v| (v.label(), v as i32));
    block(&mut s, "SL", ScaleLayout::ALL, |v| (v.label(), v as i32));
    block(&mut s, "FAMILY", &Family::ALL, |v| (v.name(), v as i32));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_prefetch_spellings() {
        use StreamPrefetch as P;
        for (v, want) in [
            ("0", Some(P::Off)),
            ("1", Some(P::Steps(1))),
            (" 8 ", Some(P::Steps(8))),
            ("tile", Some(P::Tile)),
            ("9", None),
            ("-1", None),
            ("Tile", None),
            ("", None),
        ] {
            assert_eq!(P::parse(v), want, "{v:?}");
        }
    }

    #[test]
    fn prelude_names_every_value_the_kernels_use() {
        let p = abi_prelude();
        for line in [
            "#define WF_MXFP4 6",
            "#define AD_FP8_BLOCK128 5",
            "#define GM_INTERLEAVE_ROWS 3",
            "#define AF_SWIGLU_OAI 3",
            "#define WL_AITER_16X16 2",
            "#define SL_CDNA4_SWIZZLE 3",
            "#define FAMILY_STREAM 2",
            "#define FAMILY_MFMA 4",
        ] {
            assert!(p.contains(line), "{line} missing from\n{p}");
        }
        // Every name a kernel source compares against is defined by the prelude.
        let defined: Vec<&str> = p
            .lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        for (file, src) in super::super::cache::KERNEL_HEADERS
            .iter()
            .chain([("fused_moe.cu", super::super::cache::FUSED_MOE_SOURCE)].iter())
        {
            for word in src.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                let prefixed = ["WF_", "AD_", "GM_", "AF_", "WL_", "SL_", "FAMILY_"]
                    .iter()
                    .any(|p| word.starts_with(p));
                if prefixed
                    && word
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    assert!(
                        defined.contains(&word),
                        "{file} uses {word}, not in the prelude"
                    );
                }
            }
        }
    }

    #[test]
    fn no_spec_has_a_narrower_stage2_block_than_the_workspace_assumes() {
        let specs = super::super::compile_check::specs_where(|_| true);
        assert!(specs
            .iter()
            .all(|s| s.block_columns().1 >= FEWEST_STAGE2_COLUMNS));
        assert!(specs
            .iter()
            .any(|s| s.block_columns().1 == FEWEST_STAGE2_COLUMNS));
        let s = &specs[0];
        assert_eq!(s.stage2_column_blocks(1), 1);
        let cols = s.block_columns().1;
        assert_eq!(s.stage2_column_blocks(cols), 1);
        assert_eq!(s.stage2_column_blocks(cols + 1), 2);
    }

    #[test]
    fn family_names_round_trip() {
        for f in Family::ALL {
            assert_eq!(Family::from_name(f.name()), Some(f));
        }
        assert_eq!(Family::from_name("tile64"), None);
    }

    #[test]
    fn every_fallback_chain_ends_at_fp32_without_a_cycle() {
        for f in Family::ALL {
            let mut at = f;
            for _ in 0..Family::ALL.len() {
                match at.fallback() {
                    Some(next) => at = next,
                    None => break,
                }
            }
            assert_eq!(at, Family::Fp32, "{f:?}");
        }
        let s: FamilySet = [Family::Stream, Family::Fp32].into_iter().collect();
        assert!(s.contains(Family::Stream) && s.contains(Family::Fp32));
        assert!(!s.contains(Family::Tile32));
        assert!(Family::ALL
            .into_iter()
            .all(|f| FamilySet::all().contains(f)));
        assert!(!FamilySet::NONE.contains(Family::Fp32));
    }
}
