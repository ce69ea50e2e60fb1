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
}

/// Activation dtype the GEMMs consume (AITER's quant_dtype_a). DEFAULT is fixed per weight
/// format: BF16/FP16 weights -> the input's; FP8_BLOCK128 -> FP8_BLOCK128; other FP8 ->
/// FP8_PER_TOKEN; MXFP4 -> BF16 (a16w4); MXFP8 -> MXFP8. Never chosen from M or environment.
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
    /// AITER `shuffle_weight` layout (16, 16).
    Aiter_16x16 = 2,
}

/// Physical order of MX block-scale bytes.
#[repr(i32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_scale_layout {
    Default = 0,
    /// Row-major `[E*N, K/32]`.
    Plain = 1,
    /// AITER `e8m0_shuffle` / `shuffle_scale` (32x8 blocks).
    AiterE8m0 = 2,
    /// triton_kernels CDNA4 MX scale layout.
    Cdna4Swizzle = 3,
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
    /// 1.1: pre-quantized `hidden_states` with `hidden_scale` (fp8 per-token, fp8 1x128,
    /// MXFP4, MXFP8 act dtypes; docs/layouts.md "Pre-quantized activations").
    PrequantizedInput = 1 << 6,
    /// 1.1: static per-tensor activation scales `stage1_act_scale` / `stage2_act_scale`
    /// (FP8_PER_TENSOR; vLLM's a1_scale / a2_scale).
    StaticActScale = 1 << 7,
    /// 1.1: a `stage2_act_dtype` other than the stage-1 act_dtype.
    Stage2ActDtype = 1 << 8,
}

/// Bits of `moeplug_layout.flags`.
#[repr(u32)]
#[derive(Debug, Clone, Copy)]
pub enum moeplug_layout_flag {
    /// The prepared weights come with fp32 biases.
    HasBias = 1 << 0,
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
