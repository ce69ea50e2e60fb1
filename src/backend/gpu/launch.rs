//! What a GPU launch reads: the tensors checked against the layout record and the kernel's
//! rules, the workspace plan, the compile-time configuration and the kernel parameters.

use crate::error::{Error, Result, Status};
use crate::moe::{MoeConfig, MoeLaunch};
use crate::tensor::{ElemType, Tensor};
use crate::types::{Activation, GateMode, ScaleLayout, WeightFormat, WeightLayout};

/// Rows per sorted tile (`BM` in kernels/fused_moe.cu).
pub const TILE_M: usize = 32;
/// Output columns per block (`BN`).
pub const TILE_N: usize = 64;
/// Threads of the GEMM and reduce kernels, and of the route kernel.
pub const THREADS: u32 = 256;
pub const ROUTE_THREADS: u32 = 1024;
/// The route kernel keeps per-expert counters in shared memory (48 KiB without opt-in).
pub const MAX_LOCAL_EXPERTS: usize = 2048;
pub const MAX_GLOBAL_EXPERTS: usize = 4096;

/// Mirrors `struct Params` in kernels/fused_moe.cu (8-byte fields first, then 4-byte).
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
    pub pad0: i32,
    pub alpha: f32,
    pub limit: f32,
    pub has_limit: i32,
    pub pad1: i32,
}

/// Sizes of one launch and where each workspace region starts.
#[derive(Debug, Clone)]
pub struct Plan {
    pub m: usize,
    pub topk: usize,
    pub e_global: usize,
    pub x_cols: usize,
    pub out_cols: usize,
    pub max_tiles: usize,
    /// Byte offsets: total_tiles, tile_expert, sorted_rows, pair_local, inter, y; then total.
    pub offsets: [usize; 6],
    pub workspace_bytes: usize,
    pub route_shared_bytes: usize,
}

fn align256(n: usize) -> usize {
    n.div_ceil(256) * 256
}

fn mismatch(msg: String) -> Error {
    Error::mismatch(msg)
}

/// Bytes of `rows × cols` storage for `format`'s weights (`cols` logical).
fn storage_cols(format: WeightFormat, cols: usize) -> usize {
    if format == WeightFormat::Mxfp4 {
        cols / 2
    } else {
        cols
    }
}

fn weight_elems(format: WeightFormat) -> &'static [ElemType] {
    match format {
        WeightFormat::Bf16 => &[ElemType::Bf16],
        WeightFormat::Fp16 => &[ElemType::F16],
        WeightFormat::Mxfp4 => &[ElemType::Fp4x2, ElemType::U8],
        _ => &[ElemType::Fp8E4m3fn, ElemType::Fp8E4m3fnuz],
    }
}

/// Check a weight matrix `[E, rows, cols]` and its scale against the layout and the kernel.
fn check_weight(
    c: &MoeConfig,
    w: &Tensor,
    scale: Option<&Tensor>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let l = &c.layout;
    let f = l.weight_format;
    w.expect_elem(weight_elems(f))
        .map_err(|e| mismatch(format!("{} (weight_format {})", e.message, f.label())))?;
    let want = [l.num_experts, rows, storage_cols(f, cols)];
    if w.shape != want {
        return Err(mismatch(format!(
            "{}: expected shape {} for layout {} (E {}, H {} padded {}, I {} padded {}), got {}",
            w.name,
            crate::tensor::format_shape(&want),
            f.label(),
            l.num_experts,
            l.hidden_size,
            l.hidden_padded,
            l.intermediate_size,
            l.intermediate_padded,
            w.shape_str()
        )));
    }
    if l.weight_layout == WeightLayout::Aiter16x16 {
        // F1 (16,16): 16-row tiles, K a multiple of 32 storage elements (bf16) / 32 bytes.
        let kst = storage_cols(f, cols);
        if rows % 16 != 0 || kst % 32 != 0 {
            return Err(mismatch(format!(
                "{}: weight_layout aiter_16x16 needs rows % 16 == 0 and stored K % 32 == 0, got [{rows}, {kst}]",
                w.name
            )));
        }
    }
    let sname = if w.name == "w13" {
        "w13_scale"
    } else {
        "w2_scale"
    };
    let e = l.num_experts;
    let want_scale: Option<(usize, &[ElemType])> = match f {
        WeightFormat::Bf16 | WeightFormat::Fp16 => None,
        WeightFormat::Fp8PerTensor => Some((e, &[ElemType::F32])),
        WeightFormat::Fp8PerChannel => Some((e * rows, &[ElemType::F32])),
        WeightFormat::Fp8Block128 => Some((
            e * rows.div_ceil(128) * cols.div_ceil(128),
            &[ElemType::F32],
        )),
        WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => {
            if cols % 32 != 0 {
                return Err(mismatch(format!(
                    "{}: MX formats need K % 32 == 0, got K {cols}",
                    w.name
                )));
            }
            let (r, k) = (e * rows, cols / 32);
            let n = match l.scale_layout {
                Some(ScaleLayout::AiterE8m0) => r.div_ceil(256) * 256 * k.div_ceil(8) * 8,
                _ => r * k,
            };
            Some((n, &[ElemType::E8m0, ElemType::U8]))
        }
    };
    match (want_scale, scale) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(mismatch(format!(
            "{sname}: must be NULL for weight_format {}",
            f.label()
        ))),
        (Some(_), None) => Err(mismatch(format!(
            "{sname}: required for weight_format {}",
            f.label()
        ))),
        (Some((n, elems)), Some(s)) => {
            s.expect_elem(elems).map_err(|e| mismatch(e.message))?;
            if s.numel() != n {
                return Err(mismatch(format!(
                    "{sname}: expected {n} elements for weight_format {} scale_layout {}, got shape {}",
                    f.label(),
                    l.scale_layout.map(|s| s.label()).unwrap_or("none"),
                    s.shape_str()
                )));
            }
            Ok(())
        }
    }
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

/// Validate the launch for the GPU kernels and plan its workspace.
pub fn plan(launch: &MoeLaunch) -> Result<Plan> {
    let c = &launch.config;
    let l = &c.layout;
    let (e, h, hp, i, ip) = (
        l.num_experts,
        l.hidden_size,
        l.hidden_padded,
        l.intermediate_size,
        l.intermediate_padded,
    );
    let x = &launch.hidden_states;
    x.expect_ndim(2)?;
    x.expect_elem(&[ElemType::Bf16, ElemType::F16])?;
    let (m, x_cols) = (x.dim(0), x.dim(1));
    if x_cols != h && x_cols != hp {
        return Err(mismatch(format!(
            "hidden_states: expected {h} (hidden_size) or {hp} (hidden_padded) columns, got shape {}",
            x.shape_str()
        )));
    }
    if launch.hidden_scale.is_some() {
        return Err(Error::unsupported(
            "hidden_scale: pre-quantized activations are not supported by the CUDA backend yet",
        ));
    }
    let ids = &launch.topk_ids;
    ids.expect_ndim(2)?;
    ids.expect_elem(&[ElemType::I32])?;
    let topk = ids.dim(1);
    if ids.dim(0) != m || topk == 0 || topk > 255 {
        return Err(Error::invalid(format!(
            "topk_ids: expected shape [{m}, k] with 1 <= k <= 255, got {}",
            ids.shape_str()
        )));
    }
    launch.topk_weights.expect_elem(&[ElemType::F32])?;
    launch.topk_weights.expect_shape(&[m, topk])?;
    let out = &launch.output;
    out.expect_ndim(2)?;
    out.expect_elem(&[ElemType::Bf16, ElemType::F16])?;
    if out.dim(0) != m || (out.dim(1) != h && out.dim(1) != hp) {
        return Err(Error::invalid(format!(
            "output: expected shape [{m}, {h}] (or [{m}, {hp}] with padding), got {}",
            out.shape_str()
        )));
    }
    if out.overlaps(x) {
        return Err(Error::invalid("output: overlaps hidden_states"));
    }
    if l.gate_mode == GateMode::Interleave && ip % 16 != 0 {
        return Err(mismatch(format!(
            "gate_mode interleave needs intermediate_padded % 16 == 0, got {ip}"
        )));
    }
    check_weight(c, &launch.w13, launch.w13_scale.as_ref(), 2 * ip, hp)?;
    check_weight(c, &launch.w2, launch.w2_scale.as_ref(), hp, ip)?;
    match (l.has_bias, &launch.w13_bias, &launch.w2_bias) {
        (false, None, None) => {}
        (true, Some(b13), Some(b2)) => {
            for (b, cols) in [(b13, 2 * ip), (b2, hp)] {
                b.expect_elem(&[ElemType::F32])?;
                b.expect_shape(&[e, cols])
                    .map_err(|err| mismatch(err.message))?;
                align_check(b, 4)?;
            }
        }
        (true, _, _) => {
            return Err(mismatch(
                "w13_bias/w2_bias: the layout has HAS_BIAS but a bias tensor is NULL".into(),
            ))
        }
        (false, _, _) => {
            return Err(mismatch(
                "w13_bias/w2_bias: given, but the layout record has no HAS_BIAS flag".into(),
            ))
        }
    }
    let e_global = match &launch.expert_mask {
        None => e,
        Some(mask) => {
            mask.expect_ndim(1)?;
            mask.expect_elem(&[ElemType::I32])?;
            if mask.dim(0) < e {
                return Err(Error::invalid(format!(
                    "expert_mask: expected at least num_experts {e} entries, got shape {}",
                    mask.shape_str()
                )));
            }
            align_check(mask, 4)?;
            mask.dim(0)
        }
    };
    if e > MAX_LOCAL_EXPERTS || e_global > MAX_GLOBAL_EXPERTS {
        return Err(Error::unsupported(format!(
            "the CUDA backend routes at most {MAX_LOCAL_EXPERTS} local / {MAX_GLOBAL_EXPERTS} global experts, got {e} / {e_global}"
        )));
    }
    if let Some(n) = &launch.num_local_tokens {
        n.expect_elem(&[ElemType::I32])?;
        if n.numel() != 1 {
            return Err(Error::invalid(format!(
                "num_local_tokens: expected 1 element, got shape {}",
                n.shape_str()
            )));
        }
        align_check(n, 4)?;
    }
    for t in [x, out, &launch.w13, &launch.w2] {
        align_check(t, if t.elem.size() == 2 { 2 } else { 1 })?;
    }
    for t in [ids, &launch.topk_weights] {
        align_check(t, 4)?;
    }
    for s in [&launch.w13_scale, &launch.w2_scale].into_iter().flatten() {
        align_check(s, s.elem.size())?;
    }

    let pairs = m * topk;
    let max_tiles = pairs.div_ceil(TILE_M) + e.min(pairs);
    let sizes = [
        4,
        max_tiles * 4,
        max_tiles * TILE_M * 4,
        pairs * 4,
        pairs * i * 2,
        pairs * h * 4,
    ];
    let mut offsets = [0usize; 6];
    let mut at = 0;
    for (o, s) in offsets.iter_mut().zip(sizes) {
        *o = at;
        at += align256(s);
    }
    if max_tiles > i32::MAX as usize || at > isize::MAX as usize || pairs > i32::MAX as usize {
        return Err(Error::invalid(format!(
            "hidden_states: {m} tokens x topk {topk} is too large for one launch"
        )));
    }
    let mask_ints = if launch.expert_mask.is_some() {
        e_global
    } else {
        0
    };
    Ok(Plan {
        m,
        topk,
        e_global,
        x_cols,
        out_cols: out.dim(1),
        max_tiles,
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

/// Compile-time defines of the kernel for this configuration (part of the cache key).
pub fn defines(launch: &MoeLaunch) -> Vec<String> {
    let c = &launch.config;
    let l = &c.layout;
    let f16 = |t: &Tensor| (t.elem == ElemType::F16) as i32;
    let slayout = match l.scale_layout {
        None => 0,
        Some(ScaleLayout::Plain) => 1,
        Some(_) => 2,
    };
    let fnuz = launch.w13.elem == ElemType::Fp8E4m3fnuz;
    vec![
        format!("WFMT={}", l.weight_format as i32),
        format!("WLAYOUT={}", l.weight_layout as i32),
        format!("SLAYOUT={slayout}"),
        format!("GATE={}", l.gate_mode as i32),
        format!("ACT={}", c.activation as i32),
        format!(
            "ACT_F16={}",
            (c.act_dtype == crate::types::ActDtype::Fp16) as i32
        ),
        format!("IN_F16={}", f16(&launch.hidden_states)),
        format!("OUT_F16={}", f16(&launch.output)),
        format!("HAS_BIAS={}", l.has_bias as i32),
        format!("RWOI={}", c.router_weight_on_input as i32),
        format!("HAS_MASK={}", launch.expert_mask.is_some() as i32),
        format!("FP8_FNUZ={}", fnuz as i32),
    ]
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
        pad0: 0,
        alpha,
        limit,
        has_limit,
        pad1: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_params_layout_matches_the_c_struct() {
        // 18 pointers, 12 ints, 2 floats, 2 ints: no implicit padding anywhere.
        assert_eq!(std::mem::size_of::<KernelParams>(), 18 * 8 + 16 * 4);
        assert_eq!(std::mem::offset_of!(KernelParams, m), 18 * 8);
        assert_eq!(std::mem::offset_of!(KernelParams, alpha), 18 * 8 + 12 * 4);
    }
}
