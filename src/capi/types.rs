//! Every struct of the C ABI (the enums are in `crate::vocab`, re-exported here). Field order
//! is fixed once released: add at the end, never reorder. Enum-typed fields are `int32_t` so
//! that any value a caller passes is representable; the library validates them.
#![allow(non_camel_case_types)]

use libc::{c_char, c_void};

pub use crate::vocab::*;

// Frozen 1.0 sizes (64-bit targets) of every struct that starts with `struct_size`: the
// smallest `struct_size` each call accepts. Later versions append fields after these sizes and
// never change them (docs/abi.md, "Versioning").

/// `sizeof(moeplug_caps)` in ABI 1.0.
pub const MOEPLUG_CAPS_SIZE_V1_0: u32 = 112;
/// `sizeof(moeplug_layout)` in ABI 1.0.
pub const MOEPLUG_LAYOUT_SIZE_V1_0: u32 = 64;
/// `sizeof(moeplug_fused_moe_args)` in ABI 1.0.
pub const MOEPLUG_FUSED_MOE_ARGS_SIZE_V1_0: u32 = 160;
/// `sizeof(moeplug_shuffle_weight_args)` in ABI 1.0.
pub const MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_0: u32 = 56;
/// `sizeof(moeplug_shuffle_scale_args)` in ABI 1.0.
pub const MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_0: u32 = 40;
/// `sizeof(moeplug_pad_weights_args)` in ABI 1.0.
pub const MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_0: u32 = 40;
/// `sizeof(moeplug_swizzle_scale_args)` in ABI 1.0.
pub const MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_0: u32 = 32;
/// `sizeof(moeplug_quantize_mx_args)` in ABI 1.0.
pub const MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_0: u32 = 48;
/// `sizeof(moeplug_prepare_moe_args)` in ABI 1.0.
pub const MOEPLUG_PREPARE_MOE_ARGS_SIZE_V1_0: u32 = 136;
/// `sizeof(moeplug_prepare_moe_sizes_out)` in ABI 1.0.
pub const MOEPLUG_PREPARE_MOE_SIZES_OUT_SIZE_V1_0: u32 = 352;

// Sizes of the 1.1 structs as released in 1.1 (for the structs new in 1.1 -- the AITER
// arguments, the resolved config, the layout fragment -- the smallest `struct_size` each
// call accepts; the others are the argument structs with `out_fragment` appended).

/// `sizeof(moeplug_aiter_args_out)` in ABI 1.1, its first version (the smallest accepted).
pub const MOEPLUG_AITER_ARGS_OUT_SIZE_V1_1: u32 = 128;
/// `sizeof(moeplug_resolved_config)` in ABI 1.1, its first version (the smallest accepted).
pub const MOEPLUG_RESOLVED_CONFIG_SIZE_V1_1: u32 = 48;
/// `sizeof(moeplug_layout_fragment)` in ABI 1.1, where it first appeared.
pub const MOEPLUG_LAYOUT_FRAGMENT_SIZE_V1_1: u32 = 72;
/// `sizeof(moeplug_shuffle_weight_args)` in ABI 1.1.
pub const MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_1: u32 = 64;
/// `sizeof(moeplug_shuffle_scale_args)` in ABI 1.1.
pub const MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_1: u32 = 48;
/// `sizeof(moeplug_pad_weights_args)` in ABI 1.1.
pub const MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_1: u32 = 48;
/// `sizeof(moeplug_swizzle_scale_args)` in ABI 1.1.
pub const MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_1: u32 = 40;
/// `sizeof(moeplug_quantize_mx_args)` in ABI 1.1.
pub const MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_1: u32 = 56;

/// DLPack `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_device {
    /// A `moeplug_device_type` value.
    pub device_type: i32,
    pub device_id: i32,
}

/// DLPack `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_dtype {
    /// A `moeplug_dtype_code` value.
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// Byte for byte DLPack's `DLTensor`, so a `DLTensor*` may be passed as is. Borrowed for the
/// call. `strides == NULL` means compact row-major; other strides must equal compact ones.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_tensor {
    pub data: *mut c_void,
    pub device: moeplug_device,
    pub ndim: i32,
    pub dtype: moeplug_dtype,
    pub shape: *const i64,
    pub strides: *const i64,
    pub byte_offset: u64,
}

impl moeplug_tensor {
    /// A compact row-major host (CPU) tensor over `data` with DLPack dtype `(code, bits)`.
    /// `shape` is borrowed: it must outlive every use of the descriptor.
    pub fn host(data: *mut c_void, shape: &[i64], code: u8, bits: u8) -> moeplug_tensor {
        moeplug_tensor {
            data,
            device: moeplug_device {
                device_type: 1,
                device_id: 0,
            },
            ndim: shape.len() as i32,
            dtype: moeplug_dtype {
                code,
                bits,
                lanes: 1,
            },
            shape: shape.as_ptr(),
            strides: std::ptr::null(),
            byte_offset: 0,
        }
    }
}

/// The layout record: what preparation produced and what the launch checks. Plain data, safe
/// to store next to cached weights. Written by `moeplug_prepare_moe`; engines that prepare
/// with the primitives assemble it from their fragments (`moeplug_layout_from_fragments`,
/// 1.1) or fill it themselves. Pads are derived from the sizes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_layout {
    pub struct_size: u32,
    /// A `moeplug_weight_format` value.
    pub weight_format: i32,
    /// A `moeplug_gate_mode` value: the row order of the prepared `w13`.
    pub gate_mode: i32,
    /// A `moeplug_weight_layout` value.
    pub weight_layout: i32,
    /// A `moeplug_scale_layout` value (MX formats; 0 otherwise).
    pub scale_layout: i32,
    /// Experts held by the weights (local experts under expert parallelism).
    pub num_experts: i32,
    /// Logical hidden size H.
    pub hidden_size: i64,
    /// Logical intermediate size I (per half of w13).
    pub intermediate_size: i64,
    /// Physical hidden size (>= H; the tail is zero).
    pub hidden_padded: i64,
    /// Physical intermediate size per half (>= I; the tail is zero).
    pub intermediate_padded: i64,
    /// `moeplug_layout_flag` bits.
    pub flags: u32,
    /// Reserved: written as zero, ignored when read (1.0 headers left these 4 bytes as
    /// implicit tail padding, so a record filled by hand may hold anything here).
    pub reserved0: u32,
    /// 1.1: the `moeplug_act_dtype` the weights were prepared for (0 = any). A launch whose
    /// act_dtype is 0 uses it; a launch with another one is LAYOUT_MISMATCH.
    pub act_dtype: i32,
    /// Reserved: written as zero; must be zero when read.
    pub reserved1: u32,
    /// 1.1: what preparation produced, sealed by `moeplug_prepare_moe` or
    /// `moeplug_layout_from_fragments` (docs/abi.md §8); the launch refuses a record that
    /// contradicts it with LAYOUT_MISMATCH naming the field. 0 = none (a record filled by
    /// hand; 1.0 behaviour).
    pub prep_fingerprint: u64,
}

/// 1.1: what one preparation call established about the bytes it wrote (docs/abi.md §8,
/// "Layout fragments"). A primitive writes it through its `out_fragment`;
/// `moeplug_layout_from_fragments` assembles a sealed record from those of every call that
/// produced the weights. Every field is 0 where the call established nothing; a caller may
/// fill one itself for what no primitive can know (an fp8 weight format, biases, the
/// activation dtype, sizes it did not pad).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_layout_fragment {
    pub struct_size: u32,
    /// A `moeplug_weight_format` value, 0 = not established.
    pub weight_format: i32,
    /// A `moeplug_gate_mode` value: the row order of `w13`.
    pub gate_mode: i32,
    /// A `moeplug_weight_layout` value.
    pub weight_layout: i32,
    /// A `moeplug_scale_layout` value.
    pub scale_layout: i32,
    /// A `moeplug_act_dtype` value the weights were prepared for.
    pub act_dtype: i32,
    /// As in `moeplug_layout`; 0 = not established.
    pub num_experts: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub hidden_padded: i64,
    pub intermediate_padded: i64,
    /// A `moeplug_fragment_bias` value.
    pub has_bias: i32,
    /// Reserved: written as zero; must be zero when read.
    pub reserved0: u32,
}

/// What a device can do. The caller sets `struct_size`; the library fills the rest.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_caps {
    pub struct_size: u32,
    pub abi_version: u32,
    pub device_type: i32,
    pub device_id: i32,
    /// A `moeplug_backend` value.
    pub backend: i32,
    /// "sm_90", "gfx942", "x86_64", NUL-terminated.
    pub arch: [c_char; 32],
    /// Driver / runtime version, NUL-terminated.
    pub runtime_version: [c_char; 32],
    /// Bit `1 << v` for each supported `moeplug_weight_format` value v.
    pub weight_formats: u32,
    /// Bit `1 << v` for each supported `moeplug_act_dtype` value v.
    pub act_dtypes: u32,
    pub gate_modes: u32,
    pub activations: u32,
    pub weight_layouts: u32,
    pub scale_layouts: u32,
    /// `moeplug_feature` bits.
    pub features: u32,
    /// Not in the 1.0 header (written only when `struct_size` covers them): the most rows of
    /// hidden_states (M) and slots per token (k) one launch may have; larger launches are
    /// UNSUPPORTED. UINT64_MAX: only memory bounds it.
    pub max_tokens: u64,
    pub max_topk: u64,
}

/// AITER `shuffle_weight`: `src`, `dst` `[..., N, K]` (K in storage elements: bytes for fp4x2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_shuffle_weight_args {
    pub struct_size: u32,
    pub src: *const moeplug_tensor,
    pub dst: *const moeplug_tensor,
    /// Tile rows (0 -> 16).
    pub layout_n: i32,
    /// Tile K parameter (0 -> 16).
    pub layout_k: i32,
    /// Non-zero: int8 holding int4 values (32-element packs).
    pub use_int4: i32,
    /// Non-zero: AITER's a16w4 "gui" path (3-D `[E, N, K]`).
    pub is_guinterleave: i32,
    /// Non-zero with `is_guinterleave`: rows are [gate; up], interleaved in `layout_n` blocks.
    pub gate_up: i32,
    /// If > 0, K is zero-padded to a multiple of this first; `dst` has the padded K.
    pub pad_k_to: i64,
    /// 1.1: where to write what this call established (NULL = nowhere; the caller sets
    /// `struct_size`). Written on success only.
    pub out_fragment: *mut moeplug_layout_fragment,
}

/// AITER `shuffle_scale` / `e8m0_shuffle`: `src` `[m, n]` e8m0 (or fp32: copied through).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_shuffle_scale_args {
    pub struct_size: u32,
    pub src: *const moeplug_tensor,
    pub dst: *const moeplug_tensor,
    /// Experts stacked in `src` rows (required with `is_guinterleave`).
    pub num_experts: i32,
    pub is_guinterleave: i32,
    pub gate_up: i32,
    /// 1.1: where to write what this call established (NULL = nowhere; the caller sets
    /// `struct_size`). Written on success only.
    pub out_fragment: *mut moeplug_layout_fragment,
}

/// Zero padding `[E, N, K]` -> `[E, N', K']` (shapes from `src`/`dst`); also `[E, N]` biases.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_pad_weights_args {
    pub struct_size: u32,
    pub src: *const moeplug_tensor,
    pub dst: *const moeplug_tensor,
    /// Non-zero: rows are [gate; up] halves, padded separately (up rows start at N'/2).
    pub gate_up: i32,
    /// Value of the padding, converted to the element type (0 -> zero bytes).
    pub fill: f64,
    /// 1.1: where to write what this call established (NULL = nowhere; the caller sets
    /// `struct_size`). Written on success only.
    pub out_fragment: *mut moeplug_layout_fragment,
}

/// `[E, N, K/32]` e8m0 -> a swizzled scale layout.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_swizzle_scale_args {
    pub struct_size: u32,
    pub src: *const moeplug_tensor,
    pub dst: *const moeplug_tensor,
    /// A `moeplug_scale_layout` value (0 -> CDNA4_SWIZZLE).
    pub layout: i32,
    /// 1.1: where to write what this call established (NULL = nowhere; the caller sets
    /// `struct_size`). Written on success only.
    pub out_fragment: *mut moeplug_layout_fragment,
}

/// bf16/fp32 `[..., K]` -> MXFP4 (uint8/fp4 `[..., K/2]`) or MXFP8 (e4m3fn / e4m3fnuz, by the
/// dtype of `dst_q`) with e8m0 scales per 1x32 along K.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_quantize_mx_args {
    pub struct_size: u32,
    pub src: *const moeplug_tensor,
    pub dst_q: *const moeplug_tensor,
    /// `[rows, K/32]`, or the AITER shuffled shape when `shuffle_scale` is set.
    pub dst_scale: *const moeplug_tensor,
    /// MXFP4 or MXFP8 (a `moeplug_weight_format` value).
    pub format: i32,
    /// A `moeplug_round_mode` value (0 -> UP).
    pub round_mode: i32,
    /// Non-zero: write the scales in AITER's e8m0_shuffle layout.
    pub shuffle_scale: i32,
    /// 1.1: where to write what this call established (NULL = nowhere; the caller sets
    /// `struct_size`). Written on success only.
    pub out_fragment: *mut moeplug_layout_fragment,
}

/// Inputs and target of `moeplug_prepare_moe`. Checkpoint tensors are plain row-major:
/// `w13 [E, 2I, H]` in `gate_mode_in` order, `w2 [E, H, I]`, scales per the format, biases fp32.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_prepare_moe_args {
    pub struct_size: u32,
    /// A `moeplug_weight_format` value (required).
    pub weight_format: i32,
    /// Row order of the checkpoint `w13` (0 -> SEPARATED).
    pub gate_mode_in: i32,
    /// Target device type (0 -> CPU) and id: the kernel whose layout is produced.
    pub device_type: i32,
    pub device_id: i32,
    /// Activation dtype the launches will use (0 -> the format's default).
    pub act_dtype: i32,
    /// Alignment of the padded hidden / intermediate sizes (0 -> 256 for MXFP4/MXFP8,
    /// 128 for FP8_BLOCK128, 1 otherwise).
    pub hidden_align: i32,
    pub intermediate_align: i32,
    pub w13: *const moeplug_tensor,
    pub w13_scale: *const moeplug_tensor,
    pub w13_bias: *const moeplug_tensor,
    pub w2: *const moeplug_tensor,
    pub w2_scale: *const moeplug_tensor,
    pub w2_bias: *const moeplug_tensor,
    pub out_w13: *const moeplug_tensor,
    pub out_w13_scale: *const moeplug_tensor,
    pub out_w13_bias: *const moeplug_tensor,
    pub out_w2: *const moeplug_tensor,
    pub out_w2_scale: *const moeplug_tensor,
    pub out_w2_bias: *const moeplug_tensor,
    /// Written on success.
    pub out_layout: *mut moeplug_layout,
    /// 1.1: whose kernels the layout is for, a `moeplug_prep_target` value: 0 = moeplug's
    /// own (the 1.0 behaviour), else the AITER kernel path named (docs/aiter.md); never
    /// guessed from M, the arch or the environment.
    pub target: i32,
}

/// Shapes and bytes of each output of `moeplug_prepare_moe` (0-dim = absent). The
/// `reserved*` fields (implicit padding in 1.0 headers) are written as zero.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_prepare_moe_sizes_out {
    pub struct_size: u32,
    pub w13_ndim: i32,
    pub w13_shape: [i64; 4],
    pub w13_scale_ndim: i32,
    pub reserved0: u32,
    pub w13_scale_shape: [i64; 4],
    pub w13_bias_ndim: i32,
    pub reserved1: u32,
    pub w13_bias_shape: [i64; 4],
    pub w2_ndim: i32,
    pub reserved2: u32,
    pub w2_shape: [i64; 4],
    pub w2_scale_ndim: i32,
    pub reserved3: u32,
    pub w2_scale_shape: [i64; 4],
    pub w2_bias_ndim: i32,
    pub reserved4: u32,
    pub w2_bias_shape: [i64; 4],
    pub w13_bytes: u64,
    pub w13_scale_bytes: u64,
    pub w13_bias_bytes: u64,
    pub w2_bytes: u64,
    pub w2_scale_bytes: u64,
    pub w2_bias_bytes: u64,
    /// The layout record the preparation will write. Its `struct_size` is the bytes of it
    /// filled: `MOEPLUG_LAYOUT_SIZE_V1_0` for a caller of the 1.0 size of this struct.
    pub layout: moeplug_layout,
}

/// AITER `fused_moe` keyword values for a layout record (`moeplug_aiter_args`, ABI 1.1).
/// Strings are NUL-terminated spellings of AITER's Python names (docs/aiter.md).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_aiter_args_out {
    pub struct_size: u32,
    /// 1: set `is_shuffled = True` on w1 and w2 (`shuffle_weight` layout).
    pub is_shuffled: i32,
    /// 1: the scales are in triton_kernels' CDNA4 swizzle (the Triton a16w4 path).
    pub scale_swizzled: i32,
    /// Reserved: written as zero.
    pub reserved0: u32,
    /// `hidden_pad`: zero-filled trailing elements of H (values, not bytes).
    pub hidden_pad: i64,
    /// `intermediate_pad`: zero-filled trailing elements per half of I (not doubled, not
    /// rounded: AITER rounds to each kernel's tile itself).
    pub intermediate_pad: i64,
    /// `gate_mode` ("separated", "interleave"; "" for a row order AITER has no gate mode for).
    pub gate_mode: [c_char; 16],
    /// `quant_type`: a `QuantType` member name ("No", "per_Token", "per_1x32", ...).
    pub quant_type: [c_char; 16],
    /// `quant_type_a`: the activations' `QuantType` member name.
    pub quant_type_a: [c_char; 16],
    /// `quant_dtype_a` / `quant_dtype_a2`: `aiter.dtypes` names ("bf16", "fp8", "fp4x2").
    pub quant_dtype_a: [c_char; 16],
    pub quant_dtype_a2: [c_char; 16],
    /// `activation`: an `ActivationType` member name ("Silu", "Gelu", "Swiglu").
    pub activation: [c_char; 16],
}

/// What a launch of a configuration will use, resolved once without M
/// (`moeplug_resolve_config`, ABI 1.1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_resolved_config {
    pub struct_size: u32,
    /// The `moeplug_backend` that answered.
    pub backend: i32,
    /// `moeplug_act_dtype` of the stage-1 and the stage-2 GEMM inputs (never DEFAULT).
    pub act_dtype: i32,
    pub act_dtype_stage2: i32,
    /// `moeplug_activation` (never DEFAULT), with its resolved parameters: `alpha`, and
    /// `limit` (0 = no clamp).
    pub activation: i32,
    pub alpha: f32,
    pub limit: f32,
    /// Reserved: written as zero.
    pub reserved0: u32,
    /// The record's layouts the kernels read (`moeplug_weight_format`, `moeplug_gate_mode`,
    /// `moeplug_weight_layout`, `moeplug_scale_layout`).
    pub weight_format: i32,
    pub gate_mode: i32,
    pub weight_layout: i32,
    pub scale_layout: i32,
}

/// Everything a fused MoE launch needs. Optional tensors are NULL.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moeplug_fused_moe_args {
    pub struct_size: u32,
    /// The record written by preparation (required).
    pub layout: *const moeplug_layout,
    /// A `moeplug_activation` value (0 -> SILU).
    pub activation: i32,
    pub alpha: f32,
    pub limit: f32,
    /// A `moeplug_act_dtype` value (0 -> the format's default).
    pub act_dtype: i32,
    /// `moeplug_moe_flag` bits.
    pub flags: u32,
    /// `[M, H]` bf16/fp16, or pre-quantized with `hidden_scale`.
    pub hidden_states: *const moeplug_tensor,
    pub hidden_scale: *const moeplug_tensor,
    pub w13: *const moeplug_tensor,
    pub w13_scale: *const moeplug_tensor,
    /// `[E, 2I]` fp32.
    pub w13_bias: *const moeplug_tensor,
    pub w2: *const moeplug_tensor,
    pub w2_scale: *const moeplug_tensor,
    /// `[E, H]` fp32.
    pub w2_bias: *const moeplug_tensor,
    /// `[M, k]` fp32.
    pub topk_weights: *const moeplug_tensor,
    /// `[M, k]` int32 global expert ids.
    pub topk_ids: *const moeplug_tensor,
    /// `[E_global]` or `[E_global + 1]` int32 0/1 (expert parallelism).
    pub expert_mask: *const moeplug_tensor,
    /// `[1]` int32: only the first n rows are real; output rows >= n are zero.
    pub num_local_tokens: *const moeplug_tensor,
    /// `[M, H]` bf16/fp16, caller-allocated.
    pub output: *const moeplug_tensor,
    /// `[bytes]` uint8, at least `moeplug_fused_moe_workspace_size`.
    pub workspace: *const moeplug_tensor,
    /// `cudaStream_t` / `hipStream_t`; NULL = the default stream.
    pub stream: *mut c_void,
    /// 1.1: static stage-1 activation scale (vLLM's `a1_scale`): a fp32 tensor of shape `[1]`
    /// or `[]` on the launch's device, finite and > 0; the stage-1 input is quantized as
    /// fp8(x / scale) and no amax is computed. Only with act_dtype FP8_PER_TENSOR. NULL =
    /// dynamic (amax over the stage input).
    pub stage1_act_scale: *const moeplug_tensor,
    /// 1.1: the same for the stage-2 input (vLLM's `a2_scale`); needs the stage-2 act dtype
    /// FP8_PER_TENSOR.
    pub stage2_act_scale: *const moeplug_tensor,
    /// 1.1: a `moeplug_act_dtype` value for the stage-2 input (0 -> the stage-1 act_dtype);
    /// one of the weight format's act dtypes (feature STAGE2_ACT_DTYPE when it differs).
    pub stage2_act_dtype: i32,
    /// Reserved: must be zero.
    pub reserved0: u32,
}
