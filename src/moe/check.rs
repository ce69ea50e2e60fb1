//! The launch check, in one place: the layout record on its own (what a reader of the
//! recorded layouts needs), and the caller's tensors against the record.
//!
//! Status rules: a tensor that disagrees with the layout record (shape, weight dtype, a scale
//! or bias present/absent against the record) and a record that describes bytes no reader
//! can index is LAYOUT_MISMATCH; tensors that disagree with each other, or a dtype fixed by the
//! API (fp32 biases, int32 ids), is INVALID_ARGUMENT; what the backend cannot run is
//! UNSUPPORTED.
//!
//! Accepted shapes (`H` = hidden_size, `Hp` = hidden_padded, `I` = intermediate_size, `Ip`
//! = intermediate_padded, `E` = num_experts; `/2` = packed fp4 bytes):
//! hidden_states `[M, H]` or `[M, Hp]` bf16/fp16 (padded columns ignored); output `[M, H]` or
//! `[M, Hp]` bf16/fp16 (padded columns written as zero); w13 `[E, 2·Ip, Hp(/2)]`; w2
//! `[E, Hp, Ip(/2)]`; biases fp32 `[E, 2·Ip]` (w13's row order) and `[E, Hp]`; scales per
//! [`expected_scale_shapes`]; topk_ids int32 / topk_weights fp32 `[M, k]`; expert_mask int32
//! `[E_global]` (E_global ≥ E, a trailing sentinel slot is just a 0); num_local_tokens int32 `[1]`.

use crate::backend::Limits;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::moe::{MoeConfig, MoeLaunch};
use crate::tensor::{format_shape, ElemType, Tensor};
use crate::types::{ActDtype, GateMode, ScaleLayout, WeightFormat, WeightLayout};

/// Rows of one F1 tile (AITER `shuffle_weight` layout (16, 16)).
pub const F1_ROWS: usize = 16;
/// Bytes of one F1 pack.
pub const F1_PACK_BYTES: usize = 16;
/// Rows of one gate/up block of the INTERLEAVE gate mode.
pub const INTERLEAVE_ROWS: usize = 16;
/// Elements of one MX scale block.
pub const MX_BLOCK: usize = 32;
/// Values of one INT4_GROUP32 scale group along K.
pub const INT4_GROUP: usize = 32;
/// Bytes of one F1 pack of INT4_GROUP32 weights: AITER shuffles the int8-held values in
/// 16-value packs, then packs every 8 values into 4 bytes.
pub const INT4_F1_PACK_BYTES: usize = 8;
/// INT4_PER_CHANNEL values per uint32 word (AITER `convert_int8_to_uint32_int4`).
pub const INT4_PER_WORD: usize = 8;

/// What the check learned about a launch, for the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    /// Rows of hidden_states / output.
    pub m: usize,
    pub topk: usize,
    /// Columns of hidden_states and of output (hidden_size or hidden_padded each).
    pub hidden_cols: usize,
    pub output_cols: usize,
    /// The weights' element type, uint8 resolved (w13 and w2 agree).
    pub weight_elem: ElemType,
}

/// Storage dtypes a weight of this format may have. uint8 stands for the format's bytes
/// (fp8 given as uint8 is read as e4m3fn; fp4x2 as uint8 is the packed bytes).
pub fn weight_elems(format: WeightFormat) -> &'static [ElemType] {
    use ElemType as T;
    match format {
        WeightFormat::Bf16 => &[T::Bf16],
        WeightFormat::Fp16 => &[T::F16],
        WeightFormat::Fp8PerTensor
        | WeightFormat::Fp8PerChannel
        | WeightFormat::Fp8Block128
        | WeightFormat::Mxfp8 => &[T::Fp8E4m3fn, T::Fp8E4m3fnuz, T::U8],
        WeightFormat::Mxfp4 => &[T::Fp4x2, T::U8],
        // Packed int4 bytes (AITER's pack returns int8; torch has no int4 DLPack dtype).
        WeightFormat::Int4Group32 => &[T::U8, T::I8],
        // AITER's uint32 words (int32 for frameworks without uint32).
        WeightFormat::Int4PerChannel => &[T::U32, T::I32],
    }
}

/// What a weight's bytes hold: uint8 stands for packed fp4 (MXFP4) or fp8 e4m3fn.
pub fn canonical_weight_elem(format: WeightFormat, elem: ElemType) -> ElemType {
    match (format, elem) {
        (WeightFormat::Int4Group32, _) => ElemType::U8,
        (WeightFormat::Int4PerChannel, _) => ElemType::U32,
        (WeightFormat::Mxfp4, ElemType::U8) => ElemType::Fp4x2,
        (_, ElemType::U8) => ElemType::Fp8E4m3fn,
        (_, e) => e,
    }
}

/// Logical values per storage element along K: 2 per byte for MXFP4 and INT4_GROUP32, 8 per
/// uint32 for INT4_PER_CHANNEL.
pub fn values_per_elem(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Int4PerChannel => INT4_PER_WORD,
        f if f.is_packed() => 2,
        _ => 1,
    }
}

/// Bytes of one weight storage element.
pub fn weight_elem_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Bf16 | WeightFormat::Fp16 => 2,
        WeightFormat::Int4PerChannel => 4,
        _ => 1,
    }
}

fn labels(acts: &[ActDtype]) -> String {
    let names: Vec<&str> = acts.iter().map(|a| a.label()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

fn not_prequantizable(act: ActDtype) -> Error {
    Error::invalid(format!(
        "hidden_scale: pre-quantized hidden_states need act_dtype {}, got {}",
        labels(ActDtype::PREQUANTIZABLE),
        act.label()
    ))
}

/// The rules of the launch options among themselves, for every backend (what
/// `moeplug_check_fused_moe` reports before any tensor is looked at): all INVALID_ARGUMENT.
pub fn check_config(c: &MoeConfig) -> Result<()> {
    if c.prequantized_input && !ActDtype::PREQUANTIZABLE.contains(&c.act_dtype) {
        return Err(not_prequantizable(c.act_dtype));
    }
    for (stage, (given, act)) in c
        .static_act_scale
        .iter()
        .zip([c.act_dtype, c.stage2_act_dtype])
        .enumerate()
    {
        if *given && act != ActDtype::Fp8PerTensor {
            return Err(Error::invalid(format!(
                "stage{n}_act_scale: a static scale needs the stage-{n} act dtype {}, got {}",
                ActDtype::Fp8PerTensor.label(),
                act.label(),
                n = stage + 1
            )));
        }
    }
    if !c.activation.is_gated() {
        if c.layout.gate_mode != GateMode::Separated {
            return Err(Error::invalid(format!(
                "activation none: w13 holds only the up projection, so layout.gate_mode must be \
                 separated, got {}",
                c.layout.gate_mode.label()
            )));
        }
        if let Some(l) = c.limit {
            return Err(Error::invalid(format!(
                "limit: activation none takes no limit, got {l}"
            )));
        }
    }
    Ok(())
}

/// Rows of `w13` per expert: gate and up halves, or only up without a gated activation.
pub fn w13_rows(c: &MoeConfig) -> usize {
    let ip = c.layout.intermediate_padded;
    if c.activation.is_gated() {
        2 * ip
    } else {
        ip
    }
}

/// The record on its own: sizes every recorded layout needs to be indexable.
pub fn check_record(l: &Layout) -> Result<()> {
    let f = l.weight_format;
    let per = values_per_elem(f);
    if let Some(s) = l.scale_layout {
        if !f.scale_layouts().contains(&s) {
            return Err(Error::mismatch(format!(
                "layout.scale_layout: {} is not a scale layout of weight_format {}",
                s.label(),
                f.label()
            )));
        }
    }
    // (field, value, what divides it, why)
    let mut needs: Vec<(&str, usize, usize, String)> = Vec::new();
    if f.is_mx() {
        for (field, v) in [
            ("hidden_padded", l.hidden_padded),
            ("intermediate_padded", l.intermediate_padded),
        ] {
            needs.push((
                field,
                v,
                MX_BLOCK,
                format!("weight_format {} has 1x32 scale blocks", f.label()),
            ));
        }
    }
    if f == WeightFormat::Int4Group32 {
        // shuffle_scale_for_int4 pairs adjacent groups; 1x32 groups otherwise.
        let (div, why) = match l.scale_layout {
            Some(ScaleLayout::AiterInt4) => (
                2 * INT4_GROUP,
                "scale_layout aiter_int4 pairs adjacent 32-value scale groups",
            ),
            _ => (
                INT4_GROUP,
                "weight_format int4_group32 has 1x32 scale groups",
            ),
        };
        for (field, v) in [
            ("hidden_padded", l.hidden_padded),
            ("intermediate_padded", l.intermediate_padded),
        ] {
            needs.push((field, v, div, why.to_string()));
        }
    }
    if f == WeightFormat::Int4PerChannel {
        for (field, v) in [
            ("hidden_padded", l.hidden_padded),
            ("intermediate_padded", l.intermediate_padded),
        ] {
            needs.push((
                field,
                v,
                INT4_PER_WORD,
                "weight_format int4_per_channel packs 8 values per uint32".into(),
            ));
        }
    }
    if l.gate_mode == GateMode::Interleave {
        needs.push((
            "intermediate_padded",
            l.intermediate_padded,
            INTERLEAVE_ROWS,
            "gate_mode interleave alternates 16-row gate/up blocks".into(),
        ));
    }
    if l.weight_layout == WeightLayout::Aiter16x16 {
        let pack = F1_PACK_BYTES / weight_elem_bytes(f) * per;
        let why = if f == WeightFormat::Int4Group32 {
            // F1 of the int8-held values: 16-value packs, tiles 32 values wide (AITER's BK).
            "weight_layout aiter_16x16 of int4_group32 shuffles the int8-held values in 16-row \
             tiles 32 values wide"
                .to_string()
        } else if f == WeightFormat::Int4PerChannel {
            // use_int4: F1 of the int8-held values in 32-value packs, one uint32 pack each.
            "weight_layout aiter_16x16 of int4_per_channel shuffles the int8-held values in \
             16-row tiles of 32-value packs (use_int4)"
                .to_string()
        } else {
            format!(
                "weight_layout aiter_16x16 reads 16-row tiles of 16-byte packs ({pack} {} values)",
                f.label()
            )
        };
        needs.push((
            "hidden_padded",
            l.hidden_padded,
            F1_ROWS.max(pack),
            why.clone(),
        ));
        needs.push((
            "intermediate_padded",
            l.intermediate_padded,
            pack.max(8),
            why,
        ));
    }
    for (field, v, div, why) in needs {
        if v % div != 0 {
            return Err(Error::mismatch(format!(
                "layout.{field}: expected a multiple of {div} ({why}), got {v}"
            )));
        }
    }
    Ok(())
}

/// A shape as the caller spelled it: typed fp4 tensors carry the logical last dimension.
fn caller_shape(t: &Tensor, storage: &[usize]) -> String {
    let mut s = storage.to_vec();
    if t.elem == ElemType::Fp4x2 {
        if let Some(last) = s.last_mut() {
            *last *= 2;
        }
    }
    format_shape(&s)
}

fn mismatch_shape(t: &Tensor, want: &[Vec<usize>], why: &str) -> Error {
    let mut wants: Vec<String> = want.iter().map(|w| caller_shape(t, w)).collect();
    wants.dedup();
    Error::mismatch(format!(
        "{}: expected shape {} from the layout record ({why}), got {}",
        t.name,
        wants.join(" or "),
        caller_shape(t, &t.shape)
    ))
}

fn expect_shape_of(t: &Tensor, want: &[Vec<usize>], why: &str) -> Result<()> {
    if want.contains(&t.shape) {
        Ok(())
    } else {
        Err(mismatch_shape(t, want, why))
    }
}

/// Accepted shapes of a scale tensor, why, and its allowed dtypes.
type ScaleExpectation = (Vec<Vec<usize>>, String, &'static [ElemType]);

/// Accepted shapes of a weight's scale tensor (`rows` × `cols` logical weight per expert),
/// with the explanation for messages; None when the format has no scale.
pub fn expected_scale_shapes(l: &Layout, rows: usize, cols: usize) -> Option<ScaleExpectation> {
    let e = l.num_experts;
    let f32_only: &[ElemType] = &[ElemType::F32];
    let e8m0: &[ElemType] = &[ElemType::E8m0, ElemType::U8];
    match l.weight_format {
        WeightFormat::Bf16 | WeightFormat::Fp16 => None,
        WeightFormat::Fp8PerTensor => Some((
            vec![vec![e], vec![e, 1]],
            format!("E={e}, one fp32 scale per expert"),
            f32_only,
        )),
        WeightFormat::Fp8PerChannel | WeightFormat::Int4PerChannel => Some((
            vec![vec![e, rows], vec![e, rows, 1]],
            format!("E={e}, one fp32 scale per row: {rows}"),
            f32_only,
        )),
        WeightFormat::Fp8Block128 => Some((
            vec![vec![e, rows.div_ceil(128), cols.div_ceil(128)]],
            format!("E={e}, ceil({rows}/128), ceil({cols}/128) blocks of 128x128"),
            f32_only,
        )),
        WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => {
            let k32 = cols / MX_BLOCK;
            let sn = k32.div_ceil(8) * 8;
            let (shapes, why) = match l.scale_layout.unwrap_or(ScaleLayout::Plain) {
                // (aiter_int4 is not an MX layout: check_record refuses it first.)
                ScaleLayout::Plain | ScaleLayout::AiterInt4 => (
                    vec![vec![e * rows, k32], vec![e, rows, k32]],
                    format!("scale_layout plain: E*{rows} rows, {cols}/32 columns"),
                ),
                ScaleLayout::AiterE8m0 => (
                    vec![vec![(e * rows).div_ceil(256) * 256, sn]],
                    format!(
                        "scale_layout aiter_e8m0: E*{rows} rows padded to 256, {cols}/32 columns padded to 8"
                    ),
                ),
                ScaleLayout::Cdna4Swizzle => (
                    vec![vec![e, rows.div_ceil(32), sn * 32]],
                    format!(
                        "scale_layout cdna4_swizzle: E={e}, ceil({rows}/32) row groups, {cols}/32 columns padded to 8, times 32"
                    ),
                ),
            };
            Some((shapes, why, e8m0))
        }
        WeightFormat::Int4Group32 => {
            let g = cols / INT4_GROUP;
            let (shapes, why) = match l.scale_layout.unwrap_or(ScaleLayout::Plain) {
                ScaleLayout::AiterInt4 => (
                    vec![vec![e, g / 2, rows, 2], vec![e * (g / 2) * rows * 2]],
                    format!(
                        "scale_layout aiter_int4: E={e}, {cols}/64 group pairs, {rows} rows, 2 \
                         (or flattened)"
                    ),
                ),
                _ => (
                    vec![vec![e, rows, g], vec![e * rows, g]],
                    format!("scale_layout plain: E={e}, {rows} rows, {cols}/32 groups"),
                ),
            };
            Some((shapes, why, &[ElemType::Bf16]))
        }
    }
}

/// The caller's tensors against the record and each other.
pub fn check_launch(launch: &MoeLaunch) -> Result<LaunchShape> {
    let l = &launch.config.layout;
    check_record(l)?;
    let f = l.weight_format;
    let (e, hp, ip) = (l.num_experts, l.hidden_padded, l.intermediate_padded);
    let per = values_per_elem(f);

    // Activations.
    let h = &launch.hidden_states;
    let c = &launch.config;
    // The options the tensors ask for obey the option rules, and are the configuration's.
    let asked = MoeConfig {
        prequantized_input: launch.hidden_scale.is_some(),
        static_act_scale: [
            launch.stage1_act_scale.is_some(),
            launch.stage2_act_scale.is_some(),
        ],
        ..*c
    };
    check_config(&asked)?;
    if asked != *c {
        return Err(Error::invalid(
            "hidden_scale / stage1_act_scale / stage2_act_scale: the tensors given disagree \
             with the launch configuration",
        ));
    }
    if !c.prequantized_input {
        h.expect_elem(&[ElemType::Bf16, ElemType::F16])?;
    }
    h.expect_ndim(2)?;
    let m = h.dim(0);
    let cols_why = format!("hidden_size={}, hidden_padded={hp}", l.hidden_size);
    if c.prequantized_input {
        // Logical columns; the dtype is checked with the weights' (their fp8 flavour).
        let cols = prequantized_cols(h, c.act_dtype);
        if cols != l.hidden_size && cols != hp {
            let want = if l.hidden_size == hp {
                format!("{hp}")
            } else {
                format!("{} or {hp}", l.hidden_size)
            };
            return Err(Error::mismatch(format!(
                "hidden_states: expected {want} columns (codes of {}) from the layout record \
                 ({cols_why}), got shape {}",
                c.act_dtype.label(),
                h.shape_str()
            )));
        }
    } else {
        expect_shape_of(h, &[vec![m, l.hidden_size], vec![m, hp]], &cols_why)?;
    }
    for (stage, t) in [&launch.stage1_act_scale, &launch.stage2_act_scale]
        .into_iter()
        .enumerate()
    {
        if let Some(t) = t {
            t.expect_elem(&[ElemType::F32])?;
            if t.numel() != 1 || t.ndim() > 1 {
                return Err(Error::invalid(format!(
                    "{}: expected shape [1] or [] (one fp32 scale for the stage-{} input), got {}",
                    t.name,
                    stage + 1,
                    t.shape_str()
                )));
            }
        }
    }
    let out = &launch.output;
    out.expect_elem(&[ElemType::Bf16, ElemType::F16])?;
    out.expect_ndim(2)?;
    if out.dim(0) != m {
        return Err(Error::invalid(format!(
            "output: expected {m} rows like hidden_states, got shape {}",
            out.shape_str()
        )));
    }
    expect_shape_of(out, &[vec![m, l.hidden_size], vec![m, hp]], &cols_why)?;
    let ids = &launch.topk_ids;
    ids.expect_elem(&[ElemType::I32])?;
    ids.expect_ndim(2)?;
    if ids.dim(0) != m || ids.dim(1) == 0 {
        return Err(Error::invalid(format!(
            "topk_ids: expected shape [{m}, k] with k >= 1 (M from hidden_states), got {}",
            ids.shape_str()
        )));
    }
    let topk = ids.dim(1);
    let limits = Limits::for_device(h.device);
    if m as u64 > limits.max_tokens || topk as u64 > limits.max_topk {
        return Err(Error::unsupported(format!(
            "topk_ids: shape [{m}, {topk}] exceeds what the {} backend indexes (at most {} \
             tokens and {} slots per token: caps max_tokens / max_topk); split the batch",
            h.device.name(),
            limits.max_tokens,
            limits.max_topk
        )));
    }
    launch.topk_weights.expect_elem(&[ElemType::F32])?;
    launch.topk_weights.expect_shape(&[m, topk])?;
    if let Some(mask) = &launch.expert_mask {
        mask.expect_elem(&[ElemType::I32])?;
        mask.expect_ndim(1)?;
        if mask.dim(0) < e {
            return Err(Error::mismatch(format!(
                "expert_mask: expected [E_global] with E_global >= {e} (layout.num_experts \
                 local experts), got {}",
                mask.shape_str()
            )));
        }
    }
    if let Some(n) = &launch.num_local_tokens {
        n.expect_elem(&[ElemType::I32])?;
        n.expect_shape(&[1])?;
        if m > i32::MAX as usize {
            return Err(Error::invalid(format!(
                "num_local_tokens: an int32 count cannot cover M = {m} rows of hidden_states \
                 (at most 2^31 - 1 with num_local_tokens)"
            )));
        }
    }

    // Weights.
    let elems = weight_elems(f);
    for w in [&launch.w13, &launch.w2] {
        if !elems.contains(&w.elem) {
            let names: Vec<&str> = elems.iter().map(|t| t.name()).collect();
            return Err(Error::mismatch(format!(
                "{}: expected dtype {} for layout.weight_format {}, got {}",
                w.name,
                names.join(" or "),
                f.label(),
                w.elem.name()
            )));
        }
    }
    let weight_elem = canonical_weight_elem(f, launch.w13.elem);
    if canonical_weight_elem(f, launch.w2.elem) != weight_elem {
        return Err(Error::invalid(format!(
            "w2: expected the element type of w13 ({}, or uint8 holding it), got {}",
            weight_elem.name(),
            launch.w2.elem.name()
        )));
    }
    if c.prequantized_input {
        check_prequantized(launch, weight_elem)?;
    }
    let (w13_rows, w13_rows_name) = if c.activation.is_gated() {
        (2 * ip, "2*intermediate_padded")
    } else {
        (ip, "intermediate_padded (activation none: up rows only)")
    };
    // uint8 fp4 is given in bytes, typed fp4 in values: messages follow the caller.
    for (w, rows, cols, what) in [
        (&launch.w13, w13_rows, hp, [w13_rows_name, "hidden_padded"]),
        (&launch.w2, hp, ip, ["hidden_padded", "intermediate_padded"]),
    ] {
        let bytes = per == 2 && w.elem != ElemType::Fp4x2;
        let (note, shown) = if f == WeightFormat::Int4Group32 {
            ("/2 (two int4 values per byte)", cols / 2)
        } else if f == WeightFormat::Int4PerChannel {
            ("/8 (eight int4 values per uint32)", cols / 8)
        } else if bytes {
            ("/2 (uint8: two fp4 values per byte)", cols / 2)
        } else {
            ("", cols)
        };
        expect_shape_of(
            w,
            &[vec![e, rows, cols / per]],
            &format!("E={e}, {}={rows}, {}{note}={shown}", what[0], what[1]),
        )?;
    }

    // Scales.
    for (scale, name, rows, cols) in [
        (&launch.w13_scale, "w13_scale", w13_rows, hp),
        (&launch.w2_scale, "w2_scale", hp, ip),
    ] {
        match (expected_scale_shapes(l, rows, cols), scale) {
            (None, None) => {}
            (None, Some(s)) => {
                return Err(Error::mismatch(format!(
                    "{}: expected NULL for layout.weight_format {} (no scales), got a tensor of shape {}",
                    s.name,
                    f.label(),
                    s.shape_str()
                )))
            }
            (Some((shapes, _, _)), None) => {
                return Err(Error::mismatch(format!(
                    "{name}: expected a tensor of shape {} for layout.weight_format {}, got NULL",
                    format_shape(&shapes[0]),
                    f.label()
                )))
            }
            (Some((shapes, why, dtypes)), Some(s)) => {
                if !dtypes.contains(&s.elem) {
                    let names: Vec<&str> = dtypes.iter().map(|t| t.name()).collect();
                    return Err(Error::mismatch(format!(
                        "{}: expected dtype {} for layout.weight_format {}, got {}",
                        s.name,
                        names.join(" or "),
                        f.label(),
                        s.elem.name()
                    )));
                }
                expect_shape_of(s, &shapes, &why)?;
            }
        }
    }

    // Biases: present exactly when the record says HAS_BIAS.
    for (bias, name, cols) in [
        (&launch.w13_bias, "w13_bias", w13_rows),
        (&launch.w2_bias, "w2_bias", hp),
    ] {
        match (l.has_bias, bias) {
            (false, None) => {}
            (false, Some(b)) => {
                return Err(Error::mismatch(format!(
                    "{}: expected NULL (the layout record has no HAS_BIAS flag), got a tensor of shape {}",
                    b.name,
                    b.shape_str()
                )))
            }
            (true, None) => {
                return Err(Error::mismatch(format!(
                    "{name}: expected a fp32 tensor of shape [{e}, {cols}] (the layout record has HAS_BIAS), got NULL"
                )))
            }
            (true, Some(b)) => {
                b.expect_elem(&[ElemType::F32])?;
                expect_shape_of(b, &[vec![e, cols]], &format!("E={e}, {cols} rows"))?;
            }
        }
    }

    // The output is written while everything else is read.
    for t in launch.inputs().into_iter().flatten() {
        if out.overlaps(t) {
            return Err(Error::invalid(format!(
                "output: overlaps {} (the output may not alias an input)",
                t.name
            )));
        }
    }

    Ok(LaunchShape {
        m,
        topk,
        hidden_cols: h.dim(1),
        output_cols: out.dim(1),
        weight_elem,
    })
}

/// Logical columns of pre-quantized `hidden_states` (a uint8 MXFP4 row holds two per byte).
fn prequantized_cols(h: &Tensor, act: ActDtype) -> usize {
    let cols = h.shape.get(1).copied().unwrap_or(0);
    if act == ActDtype::Mxfp4 {
        2 * cols
    } else {
        cols
    }
}

/// The element type of pre-quantized `hidden_states` codes for `act`: fp8 of the weights'
/// flavour (e4m3fnuz only with e4m3fnuz weights), or packed e2m1 for MXFP4.
pub fn prequantized_elem(act: ActDtype, weight_elem: ElemType) -> ElemType {
    match act {
        ActDtype::Mxfp4 => ElemType::Fp4x2,
        _ if weight_elem == ElemType::Fp8E4m3fnuz => ElemType::Fp8E4m3fnuz,
        _ => ElemType::Fp8E4m3fn,
    }
}

/// Pre-quantized hidden_states and hidden_scale (docs/layouts.md "Pre-quantized
/// activations"): codes `[M, C]` (C = hidden_size or hidden_padded; MXFP4 packed two per
/// byte), scales per row and group of the codes' columns.
fn check_prequantized(launch: &MoeLaunch, weight_elem: ElemType) -> Result<()> {
    let act = launch.config.act_dtype;
    let h = &launch.hidden_states;
    let code = prequantized_elem(act, weight_elem);
    if h.elem != code && h.elem != ElemType::U8 {
        return Err(Error::invalid(format!(
            "hidden_states: expected dtype {} (or uint8 holding it) for pre-quantized act_dtype \
             {} with {} weights, got {}",
            code.name(),
            act.label(),
            weight_elem.name(),
            h.elem.name()
        )));
    }
    let s = launch
        .hidden_scale
        .as_ref()
        .expect("prequantized_input means hidden_scale is given");
    let (m, cols) = (h.dim(0), prequantized_cols(h, act));
    let (dtypes, shapes, why): (&[ElemType], Vec<Vec<usize>>, String) = match act.scale_group() {
        Some(0) => (
            &[ElemType::F32],
            vec![vec![m], vec![m, 1]],
            "one fp32 scale per row".into(),
        ),
        Some(g) if act == ActDtype::Fp8Block128 => (
            &[ElemType::F32],
            vec![vec![m, cols.div_ceil(g)]],
            format!("one fp32 scale per 1x{g} group of {cols} columns"),
        ),
        Some(g) => (
            &[ElemType::E8m0, ElemType::U8],
            vec![vec![m, cols.div_ceil(g)]],
            format!("one e8m0 scale per 1x{g} block of {cols} columns, plain row-major"),
        ),
        None => return Err(not_prequantizable(act)),
    };
    if !dtypes.contains(&s.elem) {
        let names: Vec<&str> = dtypes.iter().map(|t| t.name()).collect();
        return Err(Error::invalid(format!(
            "hidden_scale: expected dtype {} for pre-quantized act_dtype {}, got {}",
            names.join(" or "),
            act.label(),
            s.elem.name()
        )));
    }
    if !shapes.contains(&s.shape) {
        let wants: Vec<String> = shapes.iter().map(|w| format_shape(w)).collect();
        return Err(Error::invalid(format!(
            "hidden_scale: expected shape {} for act_dtype {} ({why}), got {}",
            wants.join(" or "),
            act.label(),
            s.shape_str()
        )));
    }
    Ok(())
}
