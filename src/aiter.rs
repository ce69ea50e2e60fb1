//! The AITER kernel paths moeplug can prepare weights for (`prepare_moe`'s `target`) and the
//! AITER `fused_moe` keyword values that go with a prepared record (docs/aiter.md). One table:
//! which layout each path reads ([`AiterTarget::path`]), and how a record is spelled in
//! AITER's keywords ([`fused_moe_args`]).

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::types::{
    ActDtype, Activation, AiterTarget, GateMode, ScaleLayout, WeightFormat, WeightLayout,
};

/// How a path's MX scales are shuffled (docs/layouts.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleShuffle {
    /// `e8m0_shuffle` / `shuffle_scale`: F3 of the stacked `[E·N, K/32]` rows, rows padded
    /// to 256, columns to 8 (0x00).
    E8m0Shuffle,
    /// `shuffle_scale_a16w4` (`is_guinterleave`): F4, no row padding, columns padded to 8 with
    /// 0x7F; with gate_up for an INTERLEAVE w13.
    ShuffleScaleA16w4,
    /// triton_kernels' CDNA4 MX scale layout (F5), `[E, N/32, ⌈K/32/8⌉·8·32]`, padding 0x00.
    Cdna4,
}

/// What one AITER path reads: the weight format and activation dtype it runs, the row order
/// of `w13` and of its bias, the byte layouts of the weights and of each scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathLayout {
    pub format: WeightFormat,
    pub act_dtype: ActDtype,
    pub gate_mode: GateMode,
    /// AITER's kernels take bias1 `[E, 2I]` gate half then up half whatever the gate mode
    /// (op_tests/test_moe_2stage.py); triton_kernels keeps the checkpoint's row interleave.
    pub bias_rows: GateMode,
    pub weight_layout: WeightLayout,
    pub scale_layout: ScaleLayout,
    pub w13_scale: ScaleShuffle,
    pub w2_scale: ScaleShuffle,
    /// The K dimension (storage bytes) every weight row must be a multiple of: 32 for
    /// `shuffle_weight` (16, 16), 64 for `shuffle_weight_a16w4` (KLane·KPack), 16 for plain.
    pub k_bytes: usize,
}

impl AiterTarget {
    /// The layout this path reads (docs/aiter.md, table "Targets").
    pub fn path(self) -> PathLayout {
        use ScaleShuffle::*;
        let interleave = |format, act_dtype, w2_scale| PathLayout {
            format,
            act_dtype,
            gate_mode: GateMode::Interleave,
            bias_rows: GateMode::Separated,
            weight_layout: WeightLayout::Aiter16x16,
            scale_layout: ScaleLayout::AiterE8m0,
            w13_scale: ShuffleScaleA16w4,
            w2_scale,
            k_bytes: 64,
        };
        match self {
            AiterTarget::A4w4 => PathLayout {
                format: WeightFormat::Mxfp4,
                act_dtype: ActDtype::Mxfp4,
                gate_mode: GateMode::Separated,
                bias_rows: GateMode::Separated,
                weight_layout: WeightLayout::Aiter16x16,
                scale_layout: ScaleLayout::AiterE8m0,
                w13_scale: E8m0Shuffle,
                w2_scale: E8m0Shuffle,
                k_bytes: 32,
            },
            AiterTarget::A8w4 => {
                interleave(WeightFormat::Mxfp4, ActDtype::Mxfp8, ShuffleScaleA16w4)
            }
            AiterTarget::Mxfp8 => interleave(WeightFormat::Mxfp8, ActDtype::Mxfp8, E8m0Shuffle),
            AiterTarget::A16w4Interleave => {
                interleave(WeightFormat::Mxfp4, ActDtype::Bf16, ShuffleScaleA16w4)
            }
            AiterTarget::TritonA16w4 => PathLayout {
                format: WeightFormat::Mxfp4,
                act_dtype: ActDtype::Bf16,
                gate_mode: GateMode::InterleaveRows,
                bias_rows: GateMode::InterleaveRows,
                weight_layout: WeightLayout::Plain,
                scale_layout: ScaleLayout::Cdna4Swizzle,
                w13_scale: Cdna4,
                w2_scale: Cdna4,
                k_bytes: 16,
            },
        }
    }
}

/// AITER's `fused_moe` keyword values for a record, as plain strings and integers
/// (docs/aiter.md, "Arguments"). Strings are the spellings of AITER's Python names:
/// `QuantType.<quant_type>`, `aiter.dtypes.<quant_dtype_a>`, `ActivationType.<activation>`,
/// `gate_mode=<gate_mode>` (a `GateMode` value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedMoeArgs {
    /// `gate_mode`: "separated" / "interleave"; "" where the record's row order is not one
    /// of AITER's gate modes (row by row: the Triton path, which takes no gate_mode).
    pub gate_mode: &'static str,
    /// `hidden_pad` / `intermediate_pad`: zero-filled trailing elements (logical values, not
    /// bytes), intermediate per half. AITER floors them to each kernel's tile itself
    /// (CK-tile: `//64*64`, `//128*128`), so the raw counts are what every path expects; a
    /// pre-doubled or pre-rounded value double-counts (vllm#46201).
    pub hidden_pad: i64,
    pub intermediate_pad: i64,
    pub quant_type: &'static str,
    /// `quant_type_a` (the activations' `QuantType`) and `quant_dtype_a` / `quant_dtype_a2`
    /// (stage-1 / stage-2 activation dtypes, `aiter.dtypes` names).
    pub quant_type_a: &'static str,
    pub quant_dtype_a: &'static str,
    pub quant_dtype_a2: &'static str,
    pub activation: &'static str,
    /// The scales are in triton_kernels' CDNA4 swizzle (the Triton a16w4 path's
    /// `swizzle_mx_scale`); 0 for AITER's own shuffles.
    pub scale_swizzled: bool,
    /// Set `w1.is_shuffled = w2.is_shuffled = True` (the weights are `shuffle_weight`ed).
    pub is_shuffled: bool,
}

fn quant_type(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::Bf16 | WeightFormat::Fp16 => "No",
        WeightFormat::Fp8PerTensor => "per_Tensor",
        // a8w4 int4 (Quark int4-fp8): per_Token with uint32-packed int4 weights.
        WeightFormat::Fp8PerChannel | WeightFormat::Int4PerChannel => "per_Token",
        WeightFormat::Fp8Block128 => "per_1x128",
        // a16wi4: AITER's per_1x32 with i4x2 weights.
        WeightFormat::Mxfp4 | WeightFormat::Mxfp8 | WeightFormat::Int4Group32 => "per_1x32",
    }
}

/// (QuantType of the activations, `aiter.dtypes` name) of an activation dtype.
fn act_spelling(act: ActDtype) -> (&'static str, &'static str) {
    match act {
        ActDtype::Bf16 => ("No", "bf16"),
        ActDtype::Fp16 => ("No", "fp16"),
        ActDtype::Fp8PerToken => ("per_Token", "fp8"),
        ActDtype::Fp8PerTensor => ("per_Tensor", "fp8"),
        ActDtype::Fp8Block128 => ("per_1x128", "fp8"),
        ActDtype::Mxfp4 => ("per_1x32", "fp4x2"),
        ActDtype::Mxfp8 => ("per_1x32", "fp8"),
    }
}

/// AITER's `ActivationType` member of a moeplug activation.
fn activation_spelling(a: Activation) -> &'static str {
    match a {
        Activation::Silu => "Silu",
        Activation::Gelu => "Gelu",
        Activation::SwigluOai => "Swiglu",
        Activation::GeluTanh => "GeluTanh",
        Activation::NoActivation => "No",
    }
}

/// The keyword values for `layout` prepared for `act_dtype` (None: the format's default with
/// bf16 hidden states) running `activation`.
pub fn fused_moe_args(
    layout: &Layout,
    act_dtype: Option<ActDtype>,
    activation: Activation,
) -> Result<FusedMoeArgs> {
    let act = act_dtype.unwrap_or_else(|| ActDtype::default_for(layout.weight_format, false));
    if !layout.weight_format.allowed_act_dtypes().contains(&act) {
        return Err(Error::mismatch(format!(
            "layout.act_dtype: {} cannot be used with weight_format {}",
            act.label(),
            layout.weight_format.label()
        )));
    }
    if layout.weight_format == WeightFormat::Int4PerChannel && act != ActDtype::Fp8PerToken {
        // fused_moe sets q_dtype_a = fp8 for uint32 weights; its int4 kernels quantize per token.
        return Err(Error::unsupported(format!(
            "layout.act_dtype: AITER's a8w4 int4 path (weight_format int4_per_channel) takes \
             fp8_per_token activations only, got {}",
            act.label()
        )));
    }
    let (quant_type_a, quant_dtype_a) = act_spelling(act);
    Ok(FusedMoeArgs {
        gate_mode: match layout.gate_mode {
            GateMode::Separated => "separated",
            GateMode::Interleave => "interleave",
            GateMode::InterleaveRows => "",
        },
        hidden_pad: layout.hidden_pad() as i64,
        intermediate_pad: layout.intermediate_pad() as i64,
        quant_type: quant_type(layout.weight_format),
        quant_type_a,
        quant_dtype_a,
        quant_dtype_a2: quant_dtype_a,
        activation: activation_spelling(activation),
        scale_swizzled: layout.scale_layout == Some(ScaleLayout::Cdna4Swizzle),
        is_shuffled: layout.weight_layout == WeightLayout::Aiter16x16,
    })
}
