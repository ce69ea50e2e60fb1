//! The vocabulary of the ABI: every enum, status code and flag bit, spelled as the C header
//! spells it (cbindgen reads this file). This is the one definition of each value: the core's
//! typed enums (`types`, `error::Status`, `tensor::DeviceKind`) take their discriminants from
//! here, and the compiler checks that they name every value. Values are fixed once released:
//! add, never renumber.
#![allow(non_camel_case_types)]

/// Status of every call; 0 is success. Values never change.
/// cbindgen:prefix-with-name=false
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum moeplug_status {
    MoeplugOk = 0,
    /// An argument is NULL, out of range, of the wrong shape or dtype; the message names it.
    MoeplugInvalidArgument = 1,
    /// Valid, but this build or backend does not do it (the message says what and why).
    MoeplugUnsupported = 2,
    /// The weights and the layout record, or the record and the kernel, disagree.
    MoeplugLayoutMismatch = 3,
    /// The device's driver or runtime could not be loaded or used.
    MoeplugBackendUnavailable = 4,
    /// A driver call failed.
    MoeplugDeviceError = 5,
    /// A kernel failed to compile at run time.
    MoeplugCompileError = 6,
    MoeplugOutOfMemory = 7,
    /// A caller-provided buffer (e.g. the workspace) is smaller than required.
    MoeplugBufferTooSmall = 8,
    /// A bug in moeplug (a caught panic); please report it with the message.
    MoeplugInternal = 9,
}

/// DLPack device types (`DLDeviceType`).
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_device_type {
    Cpu = 1,
    Cuda = 2,
    CudaHost = 3,
    Rocm = 10,
    RocmHost = 11,
    CudaManaged = 13,
}

/// DLPack dtype codes (`DLDataTypeCode`) that moeplug reads.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_dtype_code {
    Int = 0,
    Uint = 1,
    Float = 2,
    Bfloat = 4,
    Float8E4m3fn = 10,
    Float8E4m3fnuz = 11,
    Float8E8m0fnu = 14,
    Float4E2m1fn = 17,
}

/// How MoE weights are stored.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_weight_format {
    Default = 0,
    Bf16 = 1,
    Fp16 = 2,
    /// fp8 weights with one fp32 scale per expert (`[E]` or `[E, 1]`).
    Fp8PerTensor = 3,
    /// fp8 weights with one fp32 scale per output row (`[E, N]` or `[E, N, 1]`).
    Fp8PerChannel = 4,
    /// fp8 weights with fp32 scales per 128x128 block (`[E, N/128, K/128]`).
    Fp8Block128 = 5,
    /// packed e2m1 with e8m0 scales per 1x32 along K.
    Mxfp4 = 6,
    /// fp8 (e4m3fn or e4m3fnuz) with e8m0 scales per 1x32 along K.
    Mxfp8 = 7,
    /// Signed int4 (-8..7) packed two per byte in AITER's order (`pack_int8_to_packed_int4`:
    /// values v0..v7 -> bytes (v4<<4)|v0 .. (v7<<4)|v3), with bf16 scales per 1x32 group
    /// along K (Kimi-K2 a16wi4). ABI 1.1.
    Int4Group32 = 8,
    /// Signed int4 (-8..7) packed eight per uint32 in AITER's a8w4 order
    /// (`rearrange_4bit_elements(convert_int8_to_uint32_int4(..))`: nibble i, lowest first,
    /// holds value [0, 2, 4, 6, 1, 3, 5, 7][i] of each run of 8 along K), with one fp32 scale per
    /// output row (`[E, N]` or `[E, N, 1]`; Quark int4-fp8, AITER per_Token a8w4). ABI 1.1.
    Int4PerChannel = 9,
}

/// Activation dtype the GEMMs consume (AITER's quant_dtype_a). DEFAULT is fixed per weight
/// format: BF16/FP16 weights -> the input's; FP8_BLOCK128 -> FP8_BLOCK128; other FP8 ->
/// FP8_PER_TOKEN; MXFP4 -> BF16 (a16w4); MXFP8 -> MXFP8; INT4_GROUP32 -> BF16 (a16wi4); INT4_PER_CHANNEL -> FP8_PER_TOKEN (a8w4). Never chosen from M or environment.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_act_dtype {
    Default = 0,
    Bf16 = 1,
    Fp16 = 2,
    Fp8PerToken = 3,
    Fp8PerTensor = 4,
    /// fp8 with one scale per 1x128 group of K.
    Fp8Block128 = 5,
    Mxfp4 = 6,
    Mxfp8 = 7,
}

/// Row order of `w13`.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_gate_mode {
    Default = 0,
    /// All gate rows, then all up rows (GGUU).
    Separated = 1,
    /// 16-row blocks g,u,g,u (AITER's INTERLEAVE).
    Interleave = 2,
    /// Row by row g0,u0,g1,u1 (gpt-oss checkpoints, triton_kernels).
    InterleaveRows = 3,
}

/// The gated activation. `alpha` 0 -> 1.702; `limit` 0 -> none for SILU/GELU, 7.0 for SWIGLU_OAI.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_activation {
    Default = 0,
    /// silu(g) * u (with limit L: g = min(g, L), u = clamp(u, -L, L) first).
    Silu = 1,
    /// exact erf gelu(g) * u.
    Gelu = 2,
    /// g' = min(g, L), u' = clamp(u, -L, L), g' * sigmoid(alpha * g') * (u' + 1).
    SwigluOai = 3,
    /// gelu(g) * u with gelu's tanh approximation (AITER ActivationType.GeluTanh; Gemma);
    /// the limit clamps as for SILU/GELU. 1.1.
    GeluTanh = 4,
    /// No activation and no gate (AITER ActivationType.No): `w13` holds only the up
    /// projection (`[E, Ip, Hp]`, gate_mode SEPARATED, biases `[E, Ip]`) and the intermediate
    /// is the up output itself; alpha is unused and limit must be 0. 1.1.
    None = 5,
}

/// Physical order of weight bytes.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_weight_layout {
    Default = 0,
    /// Row-major `[E, N, K]`.
    Plain = 1,
    /// AITER `shuffle_weight` layout (16, 16). INT4_GROUP32: `shuffle_weight` (16, 16) of the
    /// int8-held values, then `pack_int8_to_packed_int4` (AITER's a16wi4 weights).
    /// INT4_PER_CHANNEL: `shuffle_weight` (16, 16, use_int4) of the int8-held values, then
    /// the uint32 packing (AITER's a8w4 weights): F1 over the uint32 words.
    Aiter_16x16 = 2,
}

/// Physical order of MX block-scale bytes.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_scale_layout {
    Default = 0,
    /// Row-major `[E*N, K/32]` (INT4_GROUP32: bf16 `[E, N, K/32]`).
    Plain = 1,
    /// AITER `e8m0_shuffle` / `shuffle_scale` (32x8 blocks).
    AiterE8m0 = 2,
    /// triton_kernels CDNA4 MX scale layout.
    Cdna4Swizzle = 3,
    /// AITER `shuffle_scale_for_int4` (INT4_GROUP32): bf16 `[E, K/64, N, 2]`, the scales of
    /// two adjacent groups of one row side by side. ABI 1.1.
    AiterInt4 = 4,
}

/// Backend family in `moeplug_caps.backend`.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_backend {
    None = 0,
    Cpu = 1,
    Cuda = 2,
    Hip = 3,
}

/// e8m0 scale rounding of MX quantization (AITER MxScaleRoundMode + 1). DEFAULT = UP.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_round_mode {
    Default = 0,
    Down = 1,
    Up = 2,
    Even = 3,
    Ceil = 4,
}

/// Bits of `moeplug_caps.features`.
#[repr(u32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_feature {
    Bias = 1 << 0,
    ExpertMask = 1 << 1,
    NumLocalTokens = 1 << 2,
    RouterWeightOnInput = 1 << 3,
    GraphCapture = 1 << 4,
    DevicePrep = 1 << 5,
    /// Repeat launches with the same inputs give the same output bytes, whatever the thread
    /// count (set only where a test proves it; docs/determinism.md). ABI 1.1.
    Deterministic = 1 << 6,
    /// 1.1: pre-quantized `hidden_states` with `hidden_scale` (fp8 per-token, fp8 1x128,
    /// MXFP4, MXFP8 act dtypes; docs/layouts.md "Pre-quantized activations").
    PrequantizedInput = 1 << 7,
    /// 1.1: static per-tensor activation scales `stage1_act_scale` / `stage2_act_scale`
    /// (FP8_PER_TENSOR; vLLM's a1_scale / a2_scale).
    StaticActScale = 1 << 8,
    /// 1.1: a `stage2_act_dtype` other than the stage-1 act_dtype.
    Stage2ActDtype = 1 << 9,
}

/// Bits of `moeplug_layout.flags`.
#[repr(u32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_layout_flag {
    /// The prepared weights come with fp32 biases.
    HasBias = 1 << 0,
    /// 1.1: prepared for an AITER kernel path (`moeplug_prepare_moe_args.target` != 0);
    /// moeplug's own launches refuse the record (LAYOUT_MISMATCH).
    AiterTarget = 1 << 1,
}

/// Whose kernels `moeplug_prepare_moe` lays the weights out for (`target`, ABI 1.1). Never
/// guessed: an AITER path is named explicitly (docs/aiter.md).
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_prep_target {
    /// moeplug's own kernels (CPU, CUDA): SEPARATED rows, AITER_16x16, AITER_E8M0.
    Moeplug = 0,
    /// AITER a4w4 (MXFP4 weights, MXFP4 activations): SEPARATED, shuffle_weight, e8m0_shuffle.
    AiterA4w4 = 1,
    /// AITER a8w4 (MXFP4 weights, MXFP8 activations): INTERLEAVE, w13 shuffle_weight_a16w4 /
    /// shuffle_scale_a16w4 with gate_up, w2 without.
    AiterA8w4 = 2,
    /// AITER MXFP8 a8w8: as A8W4 for w13; w2 scale e8m0_shuffle.
    AiterMxfp8 = 3,
    /// AITER CK/FlyDSL a16w4 (bf16 activations) in the INTERLEAVE pairing (gpt-oss).
    AiterA16w4Interleave = 4,
    /// AITER/triton_kernels Triton a16w4 (bf16 activations): row-interleaved w13 (g0,u0,...),
    /// plain weights, CDNA4-swizzled scales.
    AiterTritonA16w4 = 5,
}

/// `moeplug_layout_fragment.has_bias`: what a preparation call established about biases.
/// ABI 1.1.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_fragment_bias {
    /// Not established by this call (every primitive: a padded bias looks like a padded
    /// fp32 scale).
    Unknown = 0,
    /// The weights come without biases.
    Absent = 1,
    /// The weights come with fp32 biases (`MOEPLUG_LAYOUT_FLAG_HAS_BIAS`).
    Present = 2,
}

/// Bits of `moeplug_fused_moe_args.flags`.
#[repr(u32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_moe_flag {
    /// Multiply the routing weight into the stage-1 output (before bias and activation);
    /// stage 2 then sums unweighted (AITER doweight_stage1).
    RouterWeightOnInput = 1 << 3,
}

/// Severity of a message passed to the log callback (`moeplug_set_log_callback`), most
/// severe first. ABI 1.1.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_log_level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}
