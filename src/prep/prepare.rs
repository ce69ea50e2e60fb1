//! `prepare_moe`: checkpoint MoE weights → the layout a target's kernels read, in one pass
//! per tensor (pad + gate/up re-order + shuffle fused through row sources).
//!
//! Target here: the CPU backend, which reads AITER's SEPARATED-standard pairing
//! (docs/layouts.md §9): `w13` rows `[gate(I_pad); up(I_pad)]`, weights F1 (16, 16), MX scales F3
//! (`e8m0_shuffle`, 2-D `[⌈E·N/256⌉·256, ⌈K/32/8⌉·8]`), fp32 scales and biases plain.
//! Every padded element (weights, scales, biases) is zero; F3 padding bytes are 0x00.
//!
//! [`plan`] checks shapes and returns the output shapes and the layout record; [`steps`]
//! describes each output as one [`Step`], which [`prepare_host`] runs over caller buffers
//! and the GPU backend on the device. All are pure functions over host byte slices (fp32 as
//! native little-endian bytes), usable from Rust tests as well as from the C surface.

use super::int4;
use super::scale::{f3_shape, F3_PAD, F4_PAD};
use super::steps::{run_host, RowMap, Step, Writer};
use crate::aiter::{PathLayout, ScaleShuffle};
use crate::error::{Error, Result};
use crate::layout::{Layout, MAX_NUM_EXPERTS, MAX_SIZE};
use crate::moe::check::{INT4_GROUP, INT4_PER_WORD};
use crate::tensor::format_shape;
use crate::types::{AiterTarget, GateMode, ScaleLayout, WeightFormat, WeightLayout};

/// Inputs of a preparation, by shape (storage elements: the last dimension of packed fp4
/// counts bytes). Scales and biases are `None` when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareSpec {
    pub format: WeightFormat,
    /// The AITER kernel path laid out for (docs/aiter.md); None: moeplug's own kernels.
    pub target: Option<AiterTarget>,
    /// Row order of the checkpoint `w13`.
    pub gate_mode_in: GateMode,
    /// Alignment of the padded sizes; 0 → [`WeightFormat::default_alignment`]. The value used
    /// is the least common multiple with what the F1 layout needs (see [`plan`]).
    pub hidden_align: usize,
    pub intermediate_align: usize,
    /// `[E, 2I, H]` (fp4: `[E, 2I, H/2]` bytes).
    pub w13: Vec<usize>,
    /// `[E, H, I]` (fp4: `[E, H, I/2]`).
    pub w2: Vec<usize>,
    pub w13_scale: Option<Vec<usize>>,
    pub w2_scale: Option<Vec<usize>>,
    /// fp32 `[E, 2I]`.
    pub w13_bias: Option<Vec<usize>>,
    /// fp32 `[E, H]`.
    pub w2_bias: Option<Vec<usize>>,
    /// int4 weights given one value per int8 (`[E, 2I, H]`, `[E, H, I]`), packed by the
    /// preparation; false: already packed (INT4_GROUP32: `[E, 2I, H/2]`, `[E, H, I/2]` bytes;
    /// INT4_PER_CHANNEL: `[E, 2I, H/8]`, `[E, H, I/8]` uint32 words).
    pub int4_unpacked: bool,
}

/// How the scales of a format look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleKind {
    /// bf16 / fp16: no scales.
    None,
    /// e8m0 per 1×32 along K: `[E, N, K/32]` or `[E·N, K/32]`; output F3-shuffled.
    Mx,
    /// fp32 per expert: `[E]` or `[E, 1]`; copied.
    PerTensor,
    /// fp32 per output row: `[E, N]` or `[E, N, 1]`; re-ordered and padded.
    PerChannel,
    /// fp32 per 128×128 block: `[E, N/128, ⌈K/128⌉]`; re-ordered and padded.
    Block128,
    /// bf16 per 1×32 group along K: `[E, N, K/32]` or `[E·N, K/32]`; output AITER's
    /// `shuffle_scale_for_int4` `[E, K/64, N, 2]` (re-ordered and padded).
    Int4Group,
}

impl ScaleKind {
    pub fn of(format: WeightFormat) -> ScaleKind {
        match format {
            WeightFormat::Bf16 | WeightFormat::Fp16 => ScaleKind::None,
            WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => ScaleKind::Mx,
            WeightFormat::Fp8PerTensor => ScaleKind::PerTensor,
            WeightFormat::Fp8PerChannel | WeightFormat::Int4PerChannel => ScaleKind::PerChannel,
            WeightFormat::Fp8Block128 => ScaleKind::Block128,
            WeightFormat::Int4Group32 => ScaleKind::Int4Group,
        }
    }
    /// Bytes of one scale element.
    pub fn elem_size(self) -> usize {
        match self {
            ScaleKind::Mx => 1,
            ScaleKind::Int4Group => super::int4::SCALE_BYTES,
            _ => 4,
        }
    }
}

/// Bytes of one storage element of the weights of `format` (fp4x2: one byte = 2 values;
/// int4 per channel: one uint32 = 8 values).
pub fn weight_elem_size(format: WeightFormat) -> usize {
    crate::moe::check::weight_elem_bytes(format)
}

/// Logical values per storage element along K of the prepared weights (2 for packed fp4 and
/// int4 group32, 8 for int4 per channel).
fn values_per_elem(format: WeightFormat) -> usize {
    crate::moe::check::values_per_elem(format)
}

/// Logical values per storage element along K of the checkpoint weights.
fn values_per_input_elem(spec: &PrepareSpec) -> usize {
    if spec.format.is_int4() && spec.int4_unpacked {
        1
    } else {
        values_per_elem(spec.format)
    }
}

/// The outcome of [`plan`]: output shapes (storage elements) and the layout record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedShapes {
    pub layout: Layout,
    pub w13: Vec<usize>,
    pub w2: Vec<usize>,
    pub w13_scale: Option<Vec<usize>>,
    pub w2_scale: Option<Vec<usize>>,
    pub w13_bias: Option<Vec<usize>>,
    pub w2_bias: Option<Vec<usize>>,
    /// Bytes of one weight storage element and one scale element.
    pub weight_elem_size: usize,
    pub scale_kind: ScaleKind,
    /// The checkpoint's shapes, as given.
    pub spec: PrepareSpec,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl PreparedShapes {
    pub fn w13_bytes(&self) -> usize {
        numel(&self.w13) * self.weight_elem_size
    }
    pub fn w2_bytes(&self) -> usize {
        numel(&self.w2) * self.weight_elem_size
    }
    pub fn w13_scale_bytes(&self) -> usize {
        self.w13_scale
            .as_ref()
            .map_or(0, |s| numel(s) * self.scale_kind.elem_size())
    }
    pub fn w2_scale_bytes(&self) -> usize {
        self.w2_scale
            .as_ref()
            .map_or(0, |s| numel(s) * self.scale_kind.elem_size())
    }
    pub fn w13_bias_bytes(&self) -> usize {
        self.w13_bias.as_ref().map_or(0, |s| numel(s) * 4)
    }
    pub fn w2_bias_bytes(&self) -> usize {
        self.w2_bias.as_ref().map_or(0, |s| numel(s) * 4)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

fn shape_err(name: &str, want: &[&[usize]], got: &[usize]) -> Error {
    let wants: Vec<String> = want.iter().map(|w| format_shape(w)).collect();
    Error::invalid(format!(
        "{name}: expected shape {}, got {}",
        wants.join(" or "),
        format_shape(got)
    ))
}

/// Shape of a prepared MX scale of `rows` (all experts: `e` × rows per expert) × `k_pad/32`
/// columns, of a weight whose logical K is `k`. F4 pads columns to 8 with 0x7F after
/// moeplug's zero columns of the padded K; where both would be needed the bytes are AITER's
/// function of neither input, so that is refused.
fn mx_scale_shape(
    shuffle: ScaleShuffle,
    e: usize,
    rows: usize,
    k: usize,
    k_pad: usize,
    align_field: &str,
) -> Result<Vec<usize>> {
    let cols = k_pad / 32;
    let cols8 = cols.div_ceil(8) * 8;
    Ok(match shuffle {
        ScaleShuffle::E8m0Shuffle => f3_shape(e * rows, cols).to_vec(),
        ScaleShuffle::ShuffleScaleA16w4 => {
            if k != k_pad && cols != cols8 {
                crate::bail!(
                    invalid,
                    "{align_field}: {k} padded to {k_pad} leaves {cols} scale columns; \
                     shuffle_scale_a16w4 would add 0x7F columns after the zero ones of the \
                     padding: use an alignment that is a multiple of 256"
                );
            }
            vec![e * rows, cols8]
        }
        ScaleShuffle::Cdna4 => vec![e, rows / 32, cols8 * 32],
    })
}

/// Check the checkpoint shapes against the format and compute what preparation produces.
///
/// Sizes: E, H, I are read from `w2 [E, H, I]` and `w13 [E, 2I, H]`. The padded sizes are
/// H and I rounded up to `lcm(align, layout minimum)`, where align is the field or the
/// format's default (256 MX, 128 FP8_BLOCK128, 1 else) and the layout minimum is what F1
/// (16, 16) needs of a K dimension (32 storage elements: 64 values for packed fp4), and 128
/// for FP8_BLOCK128 scales.
pub fn plan(spec: &PrepareSpec) -> Result<PreparedShapes> {
    let format = spec.format;
    let kind = ScaleKind::of(format);
    let vpe = values_per_elem(format);
    let vpe_in = values_per_input_elem(spec);
    let (w13, w2) = (&spec.w13, &spec.w2);
    if w13.len() != 3 {
        crate::bail!(
            invalid,
            "w13: expected 3 dimensions [E, 2I, H], got shape {}",
            format_shape(w13)
        );
    }
    if w2.len() != 3 {
        crate::bail!(
            invalid,
            "w2: expected 3 dimensions [E, H, I], got shape {}",
            format_shape(w2)
        );
    }
    let (e, h) = (w2[0], w2[1]);
    let i = w2[2] * vpe_in;
    if e == 0 || h == 0 || i == 0 {
        crate::bail!(
            invalid,
            "w2: expected non-zero dimensions [E, H, I], got shape {}",
            format_shape(w2)
        );
    }
    // What a layout record can hold; beyond it no size below can overflow.
    if e > MAX_NUM_EXPERTS || h > MAX_SIZE || i > MAX_SIZE {
        crate::bail!(
            invalid,
            "w2: expected E <= 2^20 and H, I <= 2^31 (what a layout record holds), got shape {} \
             (E = {e}, H = {h}, I = {i})",
            format_shape(w2)
        );
    }
    let w13_want = [e, 2 * i, h / vpe_in];
    if w13[..] != w13_want || h % vpe_in != 0 {
        return Err(shape_err("w13", &[&w13_want], w13));
    }
    if format == WeightFormat::Int4PerChannel && (h % INT4_PER_WORD != 0 || i % INT4_PER_WORD != 0)
    {
        crate::bail!(
            invalid,
            "w13: int4_per_channel needs H and I multiples of 8 (eight values per uint32 word), \
             got H = {h}, I = {i}"
        );
    }
    if spec.gate_mode_in == GateMode::Interleave && i % 16 != 0 {
        crate::bail!(
            invalid,
            "w13: gate_mode_in interleave needs I a multiple of 16 (16-row blocks), got I = {i}"
        );
    }

    // Padded sizes.
    let path = spec.target.map(AiterTarget::path);
    if let Some(p) = path {
        if p.format != format {
            crate::bail!(
                invalid,
                "weight_format: target {} reads weight_format {}, got {}",
                spec.target.map_or("", |t| t.label()),
                p.format.label(),
                format.label()
            );
        }
    }
    // What the written layout needs of a K dimension (storage bytes × values per byte).
    let mut layout_min = path.map_or(32, |p| p.k_bytes).max(32 / vpe) * vpe;
    if format == WeightFormat::Int4PerChannel {
        // AITER shuffles the int8-held values (use_int4: 32-value tiles), then packs words.
        layout_min = int4::PER_CHANNEL_K_ALIGN;
    }
    if kind == ScaleKind::Block128 {
        layout_min = lcm(layout_min, 128);
    }
    let align = |field: usize, name: &str| -> Result<usize> {
        let a = if field == 0 {
            format.default_alignment() as usize
        } else {
            field
        };
        if a > 1 << 20 {
            crate::bail!(invalid, "{name}: expected at most 2^20, got {a}");
        }
        Ok(lcm(a, layout_min))
    };
    let h_align = align(spec.hidden_align, "hidden_align")?;
    let i_align = align(spec.intermediate_align, "intermediate_align")?;
    let h_pad = h.div_ceil(h_align) * h_align;
    let i_pad = i.div_ceil(i_align) * i_align;

    // Scales.
    let (w13_scale, w2_scale) = match kind {
        ScaleKind::None => {
            for (name, s) in [("w13_scale", &spec.w13_scale), ("w2_scale", &spec.w2_scale)] {
                if s.is_some() {
                    crate::bail!(
                        invalid,
                        "{name}: must be NULL for weight_format {} (no scales)",
                        format.label()
                    );
                }
            }
            (None, None)
        }
        _ => {
            let need = |name: &str, s: &Option<Vec<usize>>| -> Result<Vec<usize>> {
                s.clone().ok_or_else(|| {
                    Error::invalid(format!(
                        "{name}: required for weight_format {}",
                        format.label()
                    ))
                })
            };
            let s13 = need("w13_scale", &spec.w13_scale)?;
            let s2 = need("w2_scale", &spec.w2_scale)?;
            match kind {
                ScaleKind::Int4Group => {
                    if h % INT4_GROUP != 0 || i % INT4_GROUP != 0 {
                        crate::bail!(
                            invalid,
                            "w13: int4_group32 needs H and I multiples of 32 (one bf16 scale per \
                             32 values), got H = {h}, I = {i}"
                        );
                    }
                    let check = |name: &str, s: &[usize], n: usize, k: usize| -> Result<()> {
                        let a = [e, n, k / INT4_GROUP];
                        let b = [e * n, k / INT4_GROUP];
                        if s != a && s != b {
                            return Err(shape_err(name, &[&a, &b], s));
                        }
                        Ok(())
                    };
                    check("w13_scale", &s13, 2 * i, h)?;
                    check("w2_scale", &s2, h, i)?;
                    (
                        Some(int4::scale_shape(e, 2 * i_pad, int4::groups(h_pad))),
                        Some(int4::scale_shape(e, h_pad, int4::groups(i_pad))),
                    )
                }
                ScaleKind::Mx => {
                    if h % 32 != 0 || i % 32 != 0 {
                        crate::bail!(
                            invalid,
                            "w13: MX formats need H and I multiples of 32, got H = {h}, I = {i}"
                        );
                    }
                    let check = |name: &str, s: &[usize], n: usize, k: usize| -> Result<()> {
                        let a = [e, n, k / 32];
                        let b = [e * n, k / 32];
                        if s != a && s != b {
                            return Err(shape_err(name, &[&a, &b], s));
                        }
                        Ok(())
                    };
                    check("w13_scale", &s13, 2 * i, h)?;
                    check("w2_scale", &s2, h, i)?;
                    let (s13, s2) = path.map_or(
                        (ScaleShuffle::E8m0Shuffle, ScaleShuffle::E8m0Shuffle),
                        |p| (p.w13_scale, p.w2_scale),
                    );
                    (
                        Some(mx_scale_shape(s13, e, 2 * i_pad, h, h_pad, "hidden_align")?),
                        Some(mx_scale_shape(
                            s2,
                            e,
                            h_pad,
                            i,
                            i_pad,
                            "intermediate_align",
                        )?),
                    )
                }
                ScaleKind::PerTensor => {
                    for (name, s) in [("w13_scale", &s13), ("w2_scale", &s2)] {
                        if s[..] != [e] && s[..] != [e, 1] {
                            return Err(shape_err(name, &[&[e], &[e, 1]], s));
                        }
                    }
                    (Some(s13), Some(s2))
                }
                ScaleKind::PerChannel => {
                    let check = |name: &str, s: &[usize], n: usize, n_pad: usize| {
                        if s == [e, n] {
                            Ok(vec![e, n_pad])
                        } else if s == [e, n, 1] {
                            Ok(vec![e, n_pad, 1])
                        } else {
                            Err(shape_err(name, &[&[e, n], &[e, n, 1]], s))
                        }
                    };
                    (
                        Some(check("w13_scale", &s13, 2 * i, 2 * i_pad)?),
                        Some(check("w2_scale", &s2, h, h_pad)?),
                    )
                }
                ScaleKind::Block128 => {
                    if i % 128 != 0 {
                        crate::bail!(
                            invalid,
                            "w13_scale: fp8_block128 needs I a multiple of 128 so that no \
                             128-row block mixes gate and up rows, got I = {i}"
                        );
                    }
                    if spec.gate_mode_in != GateMode::Separated {
                        crate::bail!(
                            invalid,
                            "gate_mode_in: fp8_block128 scales can only be re-ordered from \
                             separated rows (a 128-row block of {} rows mixes gate and up), got {}",
                            spec.gate_mode_in.label(),
                            spec.gate_mode_in.label()
                        );
                    }
                    let a13 = [e, 2 * i / 128, h.div_ceil(128)];
                    if s13 != a13 {
                        return Err(shape_err("w13_scale", &[&a13], &s13));
                    }
                    let a2 = [e, h.div_ceil(128), i / 128];
                    if s2 != a2 {
                        return Err(shape_err("w2_scale", &[&a2], &s2));
                    }
                    (
                        Some(vec![e, 2 * i_pad / 128, h_pad / 128]),
                        Some(vec![e, h_pad / 128, i_pad / 128]),
                    )
                }
                ScaleKind::None => unreachable!(),
            }
        }
    };

    // Biases.
    let w13_bias = match &spec.w13_bias {
        None => None,
        Some(s) if s[..] == [e, 2 * i] => Some(vec![e, 2 * i_pad]),
        Some(s) => return Err(shape_err("w13_bias", &[&[e, 2 * i]], s)),
    };
    let w2_bias = match &spec.w2_bias {
        None => None,
        Some(s) if s[..] == [e, h] => Some(vec![e, h_pad]),
        Some(s) => return Err(shape_err("w2_bias", &[&[e, h]], s)),
    };

    if h_pad > MAX_SIZE || i_pad > MAX_SIZE {
        crate::bail!(
            invalid,
            "hidden_align/intermediate_align: H = {h} padded to {h_pad}, I = {i} padded to \
             {i_pad}: a layout record holds at most 2^31"
        );
    }
    let layout = Layout {
        weight_format: format,
        gate_mode: path.map_or(GateMode::Separated, |p| p.gate_mode),
        weight_layout: path.map_or(WeightLayout::Aiter16x16, |p| p.weight_layout),
        scale_layout: match kind {
            ScaleKind::Mx => Some(path.map_or(ScaleLayout::AiterE8m0, |p| p.scale_layout)),
            ScaleKind::Int4Group => Some(ScaleLayout::AiterInt4),
            _ => None,
        },
        num_experts: e,
        hidden_size: h,
        intermediate_size: i,
        hidden_padded: h_pad,
        intermediate_padded: i_pad,
        has_bias: w13_bias.is_some() || w2_bias.is_some(),
    };
    let shapes = PreparedShapes {
        layout,
        w13: vec![e, 2 * i_pad, h_pad / vpe],
        w2: vec![e, h_pad, i_pad / vpe],
        w13_scale,
        w2_scale,
        w13_bias,
        w2_bias,
        weight_elem_size: weight_elem_size(format),
        scale_kind: kind,
        spec: spec.clone(),
    };
    // Every output must be addressable: its byte count fits the address space.
    let scale_size = kind.elem_size();
    let outputs = [
        ("out_w13", Some(&shapes.w13), shapes.weight_elem_size),
        ("out_w2", Some(&shapes.w2), shapes.weight_elem_size),
        ("out_w13_scale", shapes.w13_scale.as_ref(), scale_size),
        ("out_w2_scale", shapes.w2_scale.as_ref(), scale_size),
        ("out_w13_bias", shapes.w13_bias.as_ref(), 4),
        ("out_w2_bias", shapes.w2_bias.as_ref(), 4),
    ];
    for (name, shape, size) in outputs {
        let Some(shape) = shape else { continue };
        let bytes = shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= isize::MAX as usize);
        if bytes.is_none() {
            crate::bail!(
                invalid,
                "{name}: the prepared shape {} of {size}-byte elements overflows the address space",
                format_shape(shape)
            );
        }
    }
    Ok(shapes)
}

/// Host buffers of a preparation's inputs (raw bytes, fp32 little-endian).
#[derive(Debug, Clone, Copy)]
pub struct PrepareInputs<'a> {
    pub w13: &'a [u8],
    pub w2: &'a [u8],
    pub w13_scale: Option<&'a [u8]>,
    pub w2_scale: Option<&'a [u8]>,
    pub w13_bias: Option<&'a [u8]>,
    pub w2_bias: Option<&'a [u8]>,
}

/// Caller buffers for the outputs, of the sizes [`PreparedShapes`] reports.
#[derive(Debug)]
pub struct PrepareOutputs<'a> {
    pub w13: &'a mut [u8],
    pub w2: &'a mut [u8],
    pub w13_scale: Option<&'a mut [u8]>,
    pub w2_scale: Option<&'a mut [u8]>,
    pub w13_bias: Option<&'a mut [u8]>,
    pub w2_bias: Option<&'a mut [u8]>,
}

fn check_len(name: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        crate::bail!(
            invalid,
            "{name}: expected {want} bytes of {what}, got {got}"
        );
    }
    Ok(())
}

fn pair<'a, 'b>(
    name: &str,
    src: Option<&'a [u8]>,
    dst: Option<&'b mut [u8]>,
    present: bool,
) -> Result<Option<(&'a [u8], &'b mut [u8])>> {
    match (present, src, dst) {
        (false, None, None) => Ok(None),
        (true, Some(s), Some(d)) => Ok(Some((s, d))),
        (false, _, _) => Err(Error::invalid(format!(
            "{name}: given, but the plan has no such tensor"
        ))),
        (true, None, _) => Err(Error::invalid(format!("{name}: input required"))),
        (true, _, None) => Err(Error::invalid(format!("out_{name}: required"))),
    }
}

/// Fill `out` from `inp` as planned by [`plan`]: every buffer must have the length its
/// [`steps`] step reads or writes.
pub fn prepare_host(
    shapes: &PreparedShapes,
    inp: PrepareInputs<'_>,
    out: PrepareOutputs<'_>,
) -> Result<()> {
    // int8-held int4: packed first, then prepared like packed input.
    let packed;
    let inp = if shapes.spec.int4_unpacked {
        let f = shapes.spec.format;
        packed = [
            pack_int4_input(f, "w13", inp.w13)?,
            pack_int4_input(f, "w2", inp.w2)?,
        ];
        PrepareInputs {
            w13: &packed[0],
            w2: &packed[1],
            ..inp
        }
    } else {
        inp
    };
    let steps = steps(shapes);
    let check = |part: Part, output: bool, got: usize| -> Result<()> {
        let (_, step) = steps
            .iter()
            .find(|(p, _)| *p == part)
            .ok_or_else(|| Error::internal(format!("prepare: no step for {part:?}")))?;
        match output {
            false => check_len(part.name(), "input", got, step.src_bytes()),
            true => check_len(
                &format!("out_{}", part.name()),
                "output",
                got,
                step.dst_bytes,
            ),
        }
    };
    check(Part::W13, false, inp.w13.len())?;
    check(Part::W2, false, inp.w2.len())?;
    check(Part::W13, true, out.w13.len())?;
    check(Part::W2, true, out.w2.len())?;
    let present = |part: Part| steps.iter().any(|(p, _)| *p == part);
    let given = |part: Part, src, dst| pair(part.name(), src, dst, present(part));
    let mut io = [
        Some((inp.w13, out.w13)),
        Some((inp.w2, out.w2)),
        given(Part::W13Scale, inp.w13_scale, out.w13_scale)?,
        given(Part::W2Scale, inp.w2_scale, out.w2_scale)?,
        given(Part::W13Bias, inp.w13_bias, out.w13_bias)?,
        given(Part::W2Bias, inp.w2_bias, out.w2_bias)?,
    ];
    for (part, _) in &steps {
        if let Some((s, d)) = &io[*part as usize] {
            check(*part, false, s.len())?;
            check(*part, true, d.len())?;
        }
    }
    // One step per output (weights: pad + re-order + F1 (16, 16) in one pass).
    for (part, step) in &steps {
        let (src, dst) = io[*part as usize]
            .take()
            .ok_or_else(|| Error::internal(format!("prepare: no buffers for {part:?}")))?;
        run_host(step, src, dst);
    }
    Ok(())
}

/// The int8-held int4 values of `name` packed as `format` stores them (INT4_GROUP32: AITER
/// `pack_int8_to_packed_int4`; INT4_PER_CHANNEL: the a8w4 uint32 words), after checking that
/// each lies in [-8, 7].
pub fn pack_int4_input(format: WeightFormat, name: &str, src: &[u8]) -> Result<Vec<u8>> {
    if let Some((at, v)) = int4::first_out_of_range(src) {
        crate::bail!(
            invalid,
            "{name}: int8-held int4 values must lie in [-8, 7], got {v} at flat index {at}"
        );
    }
    if src.len() % 8 != 0 {
        crate::bail!(
            invalid,
            "{name}: int8-held int4 values come in runs of 8 along K, got {} values",
            src.len()
        );
    }
    let mut out = Vec::new();
    if out.try_reserve_exact(src.len() / 2).is_err() {
        return Err(Error::out_of_memory(format!(
            "{name}: cannot allocate {} bytes to pack int4 values",
            src.len() / 2
        )));
    }
    out.resize(src.len() / 2, 0);
    if format == WeightFormat::Int4PerChannel {
        int4::pack_int8_to_a8w4_words(src, &mut out);
    } else {
        int4::pack_int8_to_packed_int4(src, &mut out);
    }
    Ok(out)
}

/// Which input/output pair a preparation [`Step`] reads and writes (the value indexes the
/// six tensors in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    W13 = 0,
    W2 = 1,
    W13Scale = 2,
    W2Scale = 3,
    W13Bias = 4,
    W2Bias = 5,
}

impl Part {
    /// The tensor's name in messages (`out_` + name for the output).
    pub fn name(self) -> &'static str {
        match self {
            Part::W13 => "w13",
            Part::W2 => "w2",
            Part::W13Scale => "w13_scale",
            Part::W2Scale => "w2_scale",
            Part::W13Bias => "w13_bias",
            Part::W2Bias => "w2_bias",
        }
    }
}

/// The preparation as data: one [`Step`] per output, run by [`prepare_host`] and by the
/// device. Absent tensors have no step.
pub fn steps(shapes: &PreparedShapes) -> Vec<(Part, Step)> {
    let l = &shapes.layout;
    let (e, h, i, h_pad, i_pad) = (
        l.num_experts,
        l.hidden_size,
        l.intermediate_size,
        l.hidden_padded,
        l.intermediate_padded,
    );
    let es = shapes.weight_elem_size;
    let vpe = values_per_elem(l.weight_format);
    let mode = shapes.spec.gate_mode_in;
    let path: Option<PathLayout> = shapes.spec.target.map(AiterTarget::path);
    let gate_up = RowMap::gate_up_to(e, i, i_pad, mode, l.gate_mode);
    let bias_rows =
        RowMap::gate_up_to(e, i, i_pad, mode, path.map_or(l.gate_mode, |p| p.bias_rows));
    let w2_rows = RowMap::plain(e, h_pad, h, h);
    let tile = |row_bytes: usize| match (l.weight_layout, l.weight_format) {
        (WeightLayout::Aiter16x16, WeightFormat::Int4Group32) => int4::weight_writer(row_bytes),
        (WeightLayout::Aiter16x16, _) => Writer::Tile {
            row_bytes,
            tile_rows: 16,
            pack: 16,
        },
        (WeightLayout::Plain, _) => Writer::rows(row_bytes, &[0]),
    };
    let zeros = Writer::rows(4, &[0; 4]);
    let mut out = vec![
        (
            Part::W13,
            Step {
                writer: tile(h_pad / vpe * es),
                map: gate_up,
                src_row_bytes: h / vpe * es,
                dst_bytes: shapes.w13_bytes(),
            },
        ),
        (
            Part::W2,
            Step {
                writer: tile(i_pad / vpe * es),
                map: w2_rows,
                src_row_bytes: i / vpe * es,
                dst_bytes: shapes.w2_bytes(),
            },
        ),
    ];
    let (d13, d2) = (shapes.w13_scale_bytes(), shapes.w2_scale_bytes());
    let scales = match shapes.scale_kind {
        ScaleKind::None => None,
        ScaleKind::Mx => {
            // F4 and CDNA4 shapes have no padding rows; F4's own padding columns are 0x7F
            // (mx_scale_shape allows them only where K itself is not padded).
            let (p13, p2) = path.map_or((F3_PAD, F3_PAD), |p| {
                let pad = |s: ScaleShuffle, k: usize, k_pad: usize| match s {
                    ScaleShuffle::ShuffleScaleA16w4 if k == k_pad && (k_pad / 32) % 8 != 0 => {
                        F4_PAD
                    }
                    _ => F3_PAD,
                };
                (pad(p.w13_scale, h, h_pad), pad(p.w2_scale, i, i_pad))
            });
            let f3 = |sn: usize, col_pad: u8| Writer::F3 {
                sn,
                col_pad,
                row_pad: F3_PAD,
            };
            let (sn13, sn2) = ((h_pad / 32).div_ceil(8) * 8, (i_pad / 32).div_ceil(8) * 8);
            Some((
                Step {
                    writer: f3(sn13, p13),
                    map: gate_up,
                    src_row_bytes: h / 32,
                    dst_bytes: d13,
                },
                Step {
                    writer: f3(sn2, p2),
                    map: w2_rows,
                    src_row_bytes: i / 32,
                    dst_bytes: d2,
                },
            ))
        }
        ScaleKind::Int4Group => Some((
            int4::scale_step(gate_up, int4::groups(h), int4::groups(h_pad)),
            int4::scale_step(w2_rows, int4::groups(i), int4::groups(i_pad)),
        )),
        ScaleKind::PerTensor => Some((Step::copy(d13), Step::copy(d2))),
        ScaleKind::PerChannel => Some((
            Step {
                writer: zeros,
                map: gate_up,
                src_row_bytes: 4,
                dst_bytes: d13,
            },
            Step {
                writer: zeros,
                map: w2_rows,
                src_row_bytes: 4,
                dst_bytes: d2,
            },
        )),
        ScaleKind::Block128 => Some((
            Step {
                writer: Writer::rows(h_pad / 128 * 4, &[0; 4]),
                map: RowMap::gate_up(e, i / 128, i_pad / 128, GateMode::Separated),
                src_row_bytes: h.div_ceil(128) * 4,
                dst_bytes: d13,
            },
            Step {
                writer: Writer::rows(i_pad / 128 * 4, &[0; 4]),
                map: RowMap::plain(e, h_pad / 128, h.div_ceil(128), h.div_ceil(128)),
                src_row_bytes: i / 128 * 4,
                dst_bytes: d2,
            },
        )),
    };
    if let Some((s13, s2)) = scales {
        out.push((Part::W13Scale, s13));
        out.push((Part::W2Scale, s2));
    }
    if shapes.w13_bias.is_some() {
        out.push((
            Part::W13Bias,
            Step {
                writer: zeros,
                map: bias_rows,
                src_row_bytes: 4,
                dst_bytes: shapes.w13_bias_bytes(),
            },
        ));
    }
    if shapes.w2_bias.is_some() {
        out.push((
            Part::W2Bias,
            Step {
                writer: Writer::rows(h_pad * 4, &[0; 4]),
                map: RowMap::plain(e, 1, 1, 1),
                src_row_bytes: h * 4,
                dst_bytes: shapes.w2_bias_bytes(),
            },
        ));
    }
    out
}

/// Owned outputs of [`prepare_vecs`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreparedBuffers {
    pub w13: Vec<u8>,
    pub w2: Vec<u8>,
    pub w13_scale: Option<Vec<u8>>,
    pub w2_scale: Option<Vec<u8>>,
    pub w13_bias: Option<Vec<u8>>,
    pub w2_bias: Option<Vec<u8>>,
}

/// [`plan`] + [`prepare_host`] into freshly allocated buffers (tests, demos).
pub fn prepare_vecs(
    spec: &PrepareSpec,
    inp: PrepareInputs<'_>,
) -> Result<(PreparedShapes, PreparedBuffers)> {
    let shapes = plan(spec)?;
    let alloc = |n: usize, present: bool| present.then(|| vec![0u8; n]);
    let mut b = PreparedBuffers {
        w13: vec![0; shapes.w13_bytes()],
        w2: vec![0; shapes.w2_bytes()],
        w13_scale: alloc(shapes.w13_scale_bytes(), shapes.w13_scale.is_some()),
        w2_scale: alloc(shapes.w2_scale_bytes(), shapes.w2_scale.is_some()),
        w13_bias: alloc(shapes.w13_bias_bytes(), shapes.w13_bias.is_some()),
        w2_bias: alloc(shapes.w2_bias_bytes(), shapes.w2_bias.is_some()),
    };
    prepare_host(
        &shapes,
        inp,
        PrepareOutputs {
            w13: &mut b.w13,
            w2: &mut b.w2,
            w13_scale: b.w13_scale.as_deref_mut(),
            w2_scale: b.w2_scale.as_deref_mut(),
            w13_bias: b.w13_bias.as_deref_mut(),
            w2_bias: b.w2_bias.as_deref_mut(),
        },
    )?;
    Ok((shapes, b))
}

/// View fp32 values as their native bytes (inputs of [`prepare_host`]).
pub fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
