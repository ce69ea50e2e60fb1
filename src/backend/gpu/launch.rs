//! What a GPU launch reads: the tensors checked against the layout record and the kernel's
//! rules, the workspace plan, the compile-time configuration and the kernel parameters.

use crate::backend::{check_against_caps, Caps};
use crate::error::{Error, Result, Status};
use crate::moe::check::{check_launch, check_record, LaunchShape};
use crate::moe::MoeLaunch;
use crate::tensor::Tensor;
use crate::types::{ActDtype, Activation};

use super::heuristics;
use super::spec::{Family, FamilySet, KernelSpec, FEWEST_STAGE2_COLUMNS};
/// Threads of the GEMM and reduce kernels, and of the route kernel.
pub const THREADS: u32 = 256;
pub const ROUTE_THREADS: u32 = 1024;
/// The route kernel keeps per-expert counters in shared memory (48 KiB without opt-in).
pub const MAX_LOCAL_EXPERTS: usize = 2048;
pub const MAX_GLOBAL_EXPERTS: usize = 4096;

/// `struct Params` of kernels/moe_common.cuh, field for field (checked against the source by
/// `tests::kernel_params_match_the_kernel_source`); 8-byte fields first, then 4-byte.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelParams {
    pub x: u64,
    pub w13: u64,
    pub w13_scale: u64,
    pub w13_bias: u64,
    pub w2: u64,
    pub w2_scale: u64,
    pub w2_bias: u64,
    pub topk_weights: u64,
    pub topk_ids: u64,
    pub expert_mask: u64,
    pub num_local_tokens: u64,
    pub out: u64,
    pub total_tiles: u64,
    pub tile_expert: u64,
    pub sorted_rows: u64,
    pub pair_local: u64,
    pub inter: u64,
    pub y: u64,
    /// Two u32 maxima (FP8_PER_TENSOR of stage 1 and 2), zeroed by the route kernel.
    pub amax: u64,
    /// Quantized stage inputs: codes (one byte per element) and f32 scales per group.
    pub xq: u64,
    pub xs: u64,
    pub aq: u64,
    pub as_: u64,
    /// Static FP8_PER_TENSOR scales (device f32, 0 = from the amax) and the caller's
    /// hidden_scale of pre-quantized hidden_states (0 = none).
    pub act_scale1: u64,
    pub act_scale2: u64,
    pub x_scale: u64,
    /// Fused combine: i32 arrival counters per (token, stage-2 column block).
    pub combine: u64,
    pub m: i32,
    pub topk: i32,
    pub e: i32,
    pub e_global: i32,
    pub h: i32,
    pub hp: i32,
    pub i: i32,
    pub ip: i32,
    pub x_cols: i32,
    pub out_cols: i32,
    pub max_tiles: i32,
    /// Scale groups per row of the stage-1 / stage-2 input.
    pub ng1: i32,
    pub alpha: f32,
    pub limit: f32,
    pub has_limit: i32,
    pub ng2: i32,
    /// Scales per row of hidden_scale (pre-quantized input).
    pub x_scale_cols: i32,
    /// Stage-2 column blocks (the stage-2 grid's y).
    pub ncb2: i32,
}

/// Workspace regions, in order.
const REGIONS: usize = 11;

/// Sizes of one launch and where each workspace region starts.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The kernels that run the launch up to stage 1 (the family's tile height sizes the sort).
    pub spec: KernelSpec,
    /// The kernels of stage 2 and the reduction: `spec` itself unless the stage-2 act dtype
    /// differs ([`KernelSpec::stage2`]).
    pub spec2: KernelSpec,
    pub m: usize,
    pub topk: usize,
    pub e_global: usize,
    pub x_cols: usize,
    pub out_cols: usize,
    pub max_tiles: usize,
    /// Scale groups per row of each stage input (quantized activations).
    pub groups: [usize; 2],
    /// Stage-2 grid: column blocks (y), and the fused combine's zero blocks appended to the
    /// tiles along x (0 without the fused combine).
    pub stage2_column_blocks: usize,
    pub combine_zero_blocks: usize,
    /// Byte offsets: counters (total_tiles, 2 amax), tile_expert, sorted_rows, pair_local,
    /// inter, y, stage-1 codes, stage-1 scales, stage-2 codes, stage-2 scales, combine
    /// arrival counters.
    pub offsets: [usize; REGIONS],
    pub workspace_bytes: usize,
    pub route_shared_bytes: usize,
}

fn align256(n: usize) -> usize {
    n.div_ceil(256) * 256
}

fn align_check(t: &Tensor, bytes: usize) -> Result<()> {
    if (t.ptr as usize) % bytes != 0 {
        return Err(Error::invalid(format!(
            "{}: device address {:p} is not aligned to {bytes} bytes",
            t.name, t.ptr
        )));
    }
    Ok(())
}

/// Scale groups per row of `cols` elements for an activation dtype (1 for 16-bit: unused).
pub fn scale_groups(act: ActDtype, cols: usize) -> usize {
    match act {
        ActDtype::Fp8Block128 => cols.div_ceil(128),
        ActDtype::Mxfp4 | ActDtype::Mxfp8 => cols.div_ceil(32),
        _ => 1,
    }
}

/// The whole launch check of the CUDA backend: the configuration against `caps` and the
/// record (as every backend), the tensors against the record by [`crate::moe::check`] (the
/// CPU backend's check: same status and message for the same bad launch), then what only
/// the GPU needs. Returns the workspace plan.
pub fn validate(caps: &Caps, launch: &MoeLaunch) -> Result<Plan> {
    validate_among(caps, launch, FamilySet::all())
}

/// [`validate`] on a device whose self-test accepted only the families `accepted`: the
/// heuristics pick among them.
pub fn validate_among(caps: &Caps, launch: &MoeLaunch, accepted: FamilySet) -> Result<Plan> {
    check_against_caps(caps, &launch.config)?;
    check_record(&launch.config.layout)?;
    let shape = check_launch(launch)?;
    let spec = heuristics::spec_for(&caps.arch, launch, &shape, accepted)?;
    plan(launch, &shape, spec)
}

/// GPU-only rules (expert-count limits of the route kernel, device address alignment, index
/// ranges) and the workspace plan of `family`, for a launch that passed [`check_launch`]. The
/// workspace size is the same for every family (the sort regions are sized for the smallest
/// tile), so a size queried once fits whichever family a launch gets.
pub fn plan(launch: &MoeLaunch, shape: &LaunchShape, spec: KernelSpec) -> Result<Plan> {
    let c = &launch.config;
    let l = &c.layout;
    let (e, h, i) = (l.num_experts, l.hidden_size, l.intermediate_size);
    let (m, topk) = (shape.m, shape.topk);
    let e_global = launch
        .expert_mask
        .as_ref()
        .map(|mask| mask.dim(0))
        .unwrap_or(e);
    if e > MAX_LOCAL_EXPERTS || e_global > MAX_GLOBAL_EXPERTS {
        return Err(Error::unsupported(format!(
            "layout.num_experts / expert_mask: the CUDA backend routes at most \
             {MAX_LOCAL_EXPERTS} local / {MAX_GLOBAL_EXPERTS} global experts, got {e} / {e_global}"
        )));
    }
    let x = &launch.hidden_states;
    let out = &launch.output;
    for t in [x, out, &launch.w13, &launch.w2] {
        align_check(t, t.elem.size())?;
    }
    let four_byte = [
        Some(&launch.topk_ids),
        Some(&launch.topk_weights),
        launch.w13_bias.as_ref(),
        launch.w2_bias.as_ref(),
        launch.expert_mask.as_ref(),
        launch.num_local_tokens.as_ref(),
    ];
    for t in four_byte.into_iter().flatten() {
        align_check(t, 4)?;
    }
    let scales = [
        &launch.w13_scale,
        &launch.w2_scale,
        &launch.hidden_scale,
        &launch.stage1_act_scale,
        &launch.stage2_act_scale,
    ];
    for s in scales.into_iter().flatten() {
        align_check(s, s.elem.size())?;
    }

    let pairs = m * topk;
    let tiles_of = |rows: usize| pairs.div_ceil(rows) + e.min(pairs);
    let max_tiles = tiles_of(spec.tile_rows());
    // Sized for every family's tiles, so one workspace size fits whichever the device picks.
    let (most_tiles, most_rows) = Family::ALL
        .iter()
        .map(|f| {
            let (fewest, most) = f.tile_rows_range();
            let rows = (tiles_of(fewest) * fewest).max(tiles_of(most) * most);
            (tiles_of(fewest), rows)
        })
        .fold((0, 0), |(t, r), (ft, fr)| (t.max(ft), r.max(fr)));
    let acts = [c.act_dtype, c.stage2_act_dtype];
    let groups = [scale_groups(acts[0], h), scale_groups(acts[1], i)];
    let q = |stage: usize, n: usize| if acts[stage].is_quantized() { n } else { 0 };
    let sizes: [usize; REGIONS] = [
        16,
        most_tiles * 4,
        most_rows * 4,
        pairs * 4,
        pairs * i * 2,
        pairs * h * 4,
        q(0, m * h),
        q(0, m * groups[0] * 4),
        q(1, pairs * i),
        q(1, pairs * groups[1] * 4),
        m * h.div_ceil(FEWEST_STAGE2_COLUMNS) * 4,
    ];
    let mut offsets = [0usize; REGIONS];
    let mut at = 0usize;
    for (o, s) in offsets.iter_mut().zip(sizes) {
        *o = at;
        at = at.saturating_add(align256(s));
    }
    if most_rows > i32::MAX as usize || at > isize::MAX as usize || pairs > i32::MAX as usize {
        return Err(Error::invalid(format!(
            "hidden_states: {m} tokens x topk {topk} is too large for one CUDA launch"
        )));
    }
    let mask_ints = if launch.expert_mask.is_some() {
        e_global
    } else {
        0
    };
    let stage2_column_blocks = spec.stage2_column_blocks(h);
    // Each zero block takes THREADS tokens at a time (moe_common.cuh combine_zero_block).
    let combine_zero_blocks = if spec.fused_combine {
        m.div_ceil(THREADS as usize)
    } else {
        0
    };
    Ok(Plan {
        spec2: spec.stage2(),
        spec,
        m,
        topk,
        e_global,
        x_cols: shape.hidden_cols,
        out_cols: shape.output_cols,
        max_tiles,
        groups,
        stage2_column_blocks,
        combine_zero_blocks,
        offsets,
        workspace_bytes: at,
        route_shared_bytes: 4 * (2 * e + 1 + ROUTE_THREADS as usize + mask_ints),
    })
}

/// The workspace tensor, checked against the plan.
pub fn workspace_ptr(launch: &MoeLaunch, plan: &Plan) -> Result<u64> {
    let have = launch.workspace.as_ref().map(|w| w.nbytes()).unwrap_or(0);
    if have < plan.workspace_bytes {
        return Err(Error::new(
            Status::BufferTooSmall,
            format!(
                "workspace: needs {} bytes (moeplug_fused_moe_workspace_size), got {have}",
                plan.workspace_bytes
            ),
        ));
    }
    let w = launch.workspace.as_ref().expect("checked above");
    align_check(w, 16)?;
    Ok(w.ptr as u64)
}

/// The wgmma family's stage-1 and stage-2 weights as its TMA reads them (`spec.wgmma_tma`).
pub fn tma_weights(launch: &MoeLaunch, spec: &KernelSpec) -> [super::tma::WeightTensor; 2] {
    let l = &launch.config.layout;
    let shapes = super::tma::StageShapes {
        experts: l.num_experts,
        hidden: l.hidden_size,
        hidden_padded: l.hidden_padded,
        intermediate: l.intermediate_size,
        intermediate_padded: l.intermediate_padded,
        elem_bytes: launch.w13.elem.size(),
        gate_mode: l.gate_mode,
    };
    let addresses = [launch.w13.ptr as u64, launch.w2.ptr as u64];
    super::tma::stage_weights(&shapes, addresses, spec.wgmma_box_rows())
}

/// Kernel parameters for a validated launch.
pub fn params(launch: &MoeLaunch, plan: &Plan, ws: u64) -> KernelParams {
    let c = &launch.config;
    let l = &c.layout;
    let p = |t: &Option<Tensor>| t.as_ref().map(|t| t.ptr as u64).unwrap_or(0);
    let o = plan.offsets;
    let (alpha, limit, has_limit) = match (c.activation, c.limit) {
        (_, Some(lim)) => (c.alpha, lim, 1),
        (Activation::SwigluOai, None) => (c.alpha, 7.0, 1),
        (_, None) => (c.alpha, 0.0, 0),
    };
    KernelParams {
        x: launch.hidden_states.ptr as u64,
        w13: launch.w13.ptr as u64,
        w13_scale: p(&launch.w13_scale),
        w13_bias: p(&launch.w13_bias),
        w2: launch.w2.ptr as u64,
        w2_scale: p(&launch.w2_scale),
        w2_bias: p(&launch.w2_bias),
        topk_weights: launch.topk_weights.ptr as u64,
        topk_ids: launch.topk_ids.ptr as u64,
        expert_mask: p(&launch.expert_mask),
        num_local_tokens: p(&launch.num_local_tokens),
        out: launch.output.ptr as u64,
        total_tiles: ws + o[0] as u64,
        tile_expert: ws + o[1] as u64,
        sorted_rows: ws + o[2] as u64,
        pair_local: ws + o[3] as u64,
        inter: ws + o[4] as u64,
        y: ws + o[5] as u64,
        amax: ws + o[0] as u64 + 4,
        xq: ws + o[6] as u64,
        xs: ws + o[7] as u64,
        aq: ws + o[8] as u64,
        as_: ws + o[9] as u64,
        act_scale1: p(&launch.stage1_act_scale),
        act_scale2: p(&launch.stage2_act_scale),
        x_scale: p(&launch.hidden_scale),
        combine: ws + o[10] as u64,
        m: plan.m as i32,
        topk: plan.topk as i32,
        e: l.num_experts as i32,
        e_global: plan.e_global as i32,
        h: l.hidden_size as i32,
        hp: l.hidden_padded as i32,
        i: l.intermediate_size as i32,
        ip: l.intermediate_padded as i32,
        x_cols: plan.x_cols as i32,
        out_cols: plan.out_cols as i32,
        max_tiles: plan.max_tiles as i32,
        ng1: plan.groups[0] as i32,
        alpha,
        limit,
        has_limit,
        ng2: plan.groups[1] as i32,
        x_scale_cols: launch
            .hidden_scale
            .as_ref()
            .map(|s| s.numel() / plan.m.max(1))
            .unwrap_or(0) as i32,
        ncb2: plan.stage2_column_blocks as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::mirror::assert_mirrors;

    #[test]
    fn kernel_params_match_the_kernel_source() {
        let src = super::super::cache::KERNEL_HEADERS
            .iter()
            .find(|(n, _)| *n == "moe_common.cuh")
            .expect("moe_common.cuh")
            .1;
        assert_mirrors!(KernelParams, src, "Params",
            x => "x", w13 => "w13", w13_scale => "w13_scale", w13_bias => "w13_bias",
            w2 => "w2", w2_scale => "w2_scale", w2_bias => "w2_bias",
            topk_weights => "topk_weights", topk_ids => "topk_ids",
            expert_mask => "expert_mask", num_local_tokens => "num_local_tokens", out => "out",
            total_tiles => "total_tiles", tile_expert => "tile_expert",
            sorted_rows => "sorted_rows", pair_local => "pair_local", inter => "inter", y => "y",
            amax => "amax", xq => "xq", xs => "xs", aq => "aq", as_ => "as",
            act_scale1 => "act_scale1", act_scale2 => "act_scale2", x_scale => "x_scale",
            combine => "combine", m => "M",
            topk => "topk", e => "E", e_global => "E_global", h => "H", hp => "Hp", i => "I",
            ip => "Ip", x_cols => "x_cols", out_cols => "out_cols", max_tiles => "max_tiles",
            ng1 => "ng1", alpha => "alpha", limit => "limit", has_limit => "has_limit",
            ng2 => "ng2", x_scale_cols => "x_scale_cols", ncb2 => "ncb2",
        );
    }
}
