//! The enumerations of the ABI (docs/abi.md §2) as core Rust types. Values arrive from C as
//! integers and are validated here; 0 always means "the documented default".

use crate::error::{Error, Result};
use crate::vocab;

macro_rules! abi_enum {
    ($(#[$doc:meta])* $name:ident = $c:ident, $what:literal, zero $zero:ident {
        $($variant:ident = $cv:ident => $label:literal),+ $(,)?
    }) => {
        $(#[$doc])*
        #[repr(i32)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant = vocab::$c::$cv as i32),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value from C; 0 and unknown values are errors here (callers resolve
            /// defaults first), and the message names `field`.
            pub fn from_raw(field: &str, raw: i32) -> Result<$name> {
                match Self::ALL.iter().find(|v| **v as i32 == raw) {
                    Some(v) => Ok(*v),
                    None => Err(Error::invalid(format!(
                        "{field}: unknown {} value {raw} (valid: {})",
                        $what,
                        Self::ALL
                            .iter()
                            .map(|v| format!("{} {}", *v as i32, v.label()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))),
                }
            }
            /// Lower-case name, as the Python package spells it.
            pub fn label(self) -> &'static str {
                match self { $($name::$variant => $label),+ }
            }
            pub fn from_label(label: &str) -> Option<$name> {
                match label { $($label => Some($name::$variant),)+ _ => None }
            }
            /// Bit of this value in a capability mask.
            pub fn bit(self) -> u32 { 1u32 << (self as i32) }
            pub fn mask_of(values: &[$name]) -> u32 { values.iter().fold(0, |m, v| m | v.bit()) }
            pub fn from_mask(mask: u32) -> Vec<$name> {
                Self::ALL.iter().copied().filter(|v| mask & v.bit() != 0).collect()
            }
            /// The variant of each C value but the zero ("default") one: a value added to
            /// `vocab` without a variant here does not compile.
            #[allow(dead_code)]
            fn of_c(v: vocab::$c) -> Option<$name> {
                match v {
                    vocab::$c::$zero => None,
                    $(vocab::$c::$cv => Some($name::$variant),)+
                }
            }
        }
    };
}

abi_enum!(
    /// How the MoE weights are stored.
    WeightFormat = moeplug_weight_format, "weight_format", zero Default {
        Bf16 = Bf16 => "bf16",
        Fp16 = Fp16 => "fp16",
        Fp8PerTensor = Fp8PerTensor => "fp8_per_tensor",
        Fp8PerChannel = Fp8PerChannel => "fp8_per_channel",
        Fp8Block128 = Fp8Block128 => "fp8_block128",
        Mxfp4 = Mxfp4 => "mxfp4",
        Mxfp8 = Mxfp8 => "mxfp8",
        Int4Group32 = Int4Group32 => "int4_group32",
        Int4PerChannel = Int4PerChannel => "int4_per_channel",
    }
);

abi_enum!(
    /// The activation dtype the GEMMs consume (AITER's quant_dtype_a). DEFAULT is resolved by
    /// [`ActDtype::default_for`]; it never depends on the token count or the environment.
    ActDtype = moeplug_act_dtype, "act_dtype", zero Default {
        Bf16 = Bf16 => "bf16",
        Fp16 = Fp16 => "fp16",
        Fp8PerToken = Fp8PerToken => "fp8_per_token",
        Fp8PerTensor = Fp8PerTensor => "fp8_per_tensor",
        Fp8Block128 = Fp8Block128 => "fp8_block128",
        Mxfp4 = Mxfp4 => "mxfp4",
        Mxfp8 = Mxfp8 => "mxfp8",
    }
);

abi_enum!(
    /// Row order of the fused gate/up weight `w13`.
    GateMode = moeplug_gate_mode, "gate_mode", zero Default {
        Separated = Separated => "separated",
        Interleave = Interleave => "interleave",
        InterleaveRows = InterleaveRows => "interleave_rows",
    }
);

abi_enum!(
    /// The gated activation between the two GEMMs.
    Activation = moeplug_activation, "activation", zero Default {
        Silu = Silu => "silu",
        Gelu = Gelu => "gelu",
        SwigluOai = SwigluOai => "swiglu_oai",
        GeluTanh = GeluTanh => "gelu_tanh",
        NoActivation = None => "none",
    }
);

abi_enum!(
    /// Physical order of weight bytes.
    WeightLayout = moeplug_weight_layout, "weight_layout", zero Default {
        Plain = Plain => "plain",
        Aiter16x16 = Aiter_16x16 => "aiter_16x16",
    }
);

abi_enum!(
    /// Physical order of MX block-scale bytes.
    ScaleLayout = moeplug_scale_layout, "scale_layout", zero Default {
        Plain = Plain => "plain",
        AiterE8m0 = AiterE8m0 => "aiter_e8m0",
        Cdna4Swizzle = Cdna4Swizzle => "cdna4_swizzle",
        AiterInt4 = AiterInt4 => "aiter_int4",
    }
);

abi_enum!(
    /// An AITER kernel path `prepare_moe` can lay weights out for (0 = moeplug's own kernels).
    AiterTarget = moeplug_prep_target, "target", zero Moeplug {
        A4w4 = AiterA4w4 => "aiter_a4w4",
        A8w4 = AiterA8w4 => "aiter_a8w4",
        Mxfp8 = AiterMxfp8 => "aiter_mxfp8",
        A16w4Interleave = AiterA16w4Interleave => "aiter_a16w4_interleave",
        TritonA16w4 = AiterTritonA16w4 => "aiter_triton_a16w4",
    }
);

abi_enum!(
    /// Which backend family runs a device.
    BackendKind = moeplug_backend, "backend", zero None {
        Cpu = Cpu => "cpu",
        Cuda = Cuda => "cuda",
        Hip = Hip => "hip",
    }
);

abi_enum!(
    /// e8m0 scale rounding of MX quantization (AITER's MxScaleRoundMode + 1).
    RoundMode = moeplug_round_mode, "round_mode", zero Default {
        Down = Down => "down",
        Up = Up => "up",
        Even = Even => "even",
        Ceil = Ceil => "ceil",
    }
);

/// Optional launch features, as bits of `moeplug_caps.features`.
pub mod feature {
    use crate::vocab::moeplug_feature as F;
    pub const BIAS: u32 = F::Bias as u32;
    pub const EXPERT_MASK: u32 = F::ExpertMask as u32;
    pub const NUM_LOCAL_TOKENS: u32 = F::NumLocalTokens as u32;
    pub const ROUTER_WEIGHT_ON_INPUT: u32 = F::RouterWeightOnInput as u32;
    pub const GRAPH_CAPTURE: u32 = F::GraphCapture as u32;
    pub const DEVICE_PREP: u32 = F::DevicePrep as u32;
    pub const DETERMINISTIC: u32 = F::Deterministic as u32;
    pub const PREQUANTIZED_INPUT: u32 = F::PrequantizedInput as u32;
    pub const STATIC_ACT_SCALE: u32 = F::StaticActScale as u32;
    pub const STAGE2_ACT_DTYPE: u32 = F::Stage2ActDtype as u32;
    pub const NAMES: [(u32, &str); 10] = [
        (BIAS, "bias"),
        (EXPERT_MASK, "expert_mask"),
        (NUM_LOCAL_TOKENS, "num_local_tokens"),
        (ROUTER_WEIGHT_ON_INPUT, "router_weight_on_input"),
        (GRAPH_CAPTURE, "graph_capture"),
        (DEVICE_PREP, "device_prep"),
        (DETERMINISTIC, "deterministic"),
        (PREQUANTIZED_INPUT, "prequantized_input"),
        (STATIC_ACT_SCALE, "static_act_scale"),
        (STAGE2_ACT_DTYPE, "stage2_act_dtype"),
    ];
    /// A bit added to `vocab` without a name above does not compile.
    #[allow(dead_code)]
    fn named(f: F) -> &'static str {
        let bit = match f {
            F::Bias => BIAS,
            F::ExpertMask => EXPERT_MASK,
            F::NumLocalTokens => NUM_LOCAL_TOKENS,
            F::RouterWeightOnInput => ROUTER_WEIGHT_ON_INPUT,
            F::GraphCapture => GRAPH_CAPTURE,
            F::DevicePrep => DEVICE_PREP,
            F::Deterministic => DETERMINISTIC,
            F::PrequantizedInput => PREQUANTIZED_INPUT,
            F::StaticActScale => STATIC_ACT_SCALE,
            F::Stage2ActDtype => STAGE2_ACT_DTYPE,
        };
        NAMES.iter().find(|(b, _)| *b == bit).map_or("", |(_, n)| n)
    }
}

impl ActDtype {
    /// docs/abi.md §2: the activation dtype DEFAULT stands for, fixed per weight format.
    /// `input_is_fp16` only matters for 16-bit weights ("same as the input").
    pub fn default_for(format: WeightFormat, input_is_fp16: bool) -> ActDtype {
        match format {
            WeightFormat::Bf16 | WeightFormat::Fp16 => {
                if input_is_fp16 {
                    ActDtype::Fp16
                } else {
                    ActDtype::Bf16
                }
            }
            WeightFormat::Fp8Block128 => ActDtype::Fp8Block128,
            WeightFormat::Fp8PerTensor
            | WeightFormat::Fp8PerChannel
            | WeightFormat::Int4PerChannel => ActDtype::Fp8PerToken,
            WeightFormat::Mxfp4 | WeightFormat::Int4Group32 => ActDtype::Bf16,
            WeightFormat::Mxfp8 => ActDtype::Mxfp8,
        }
    }

    /// Whether activations are quantized before a GEMM (anything but bf16/fp16).
    pub fn is_quantized(self) -> bool {
        !matches!(self, ActDtype::Bf16 | ActDtype::Fp16)
    }

    /// The act dtypes whose quantized form a caller may pass as `hidden_states` with
    /// `hidden_scale` (docs/layouts.md "Pre-quantized activations").
    pub const PREQUANTIZABLE: &'static [ActDtype] = &[
        ActDtype::Fp8PerToken,
        ActDtype::Fp8Block128,
        ActDtype::Mxfp4,
        ActDtype::Mxfp8,
    ];

    /// Elements per scale group along a row: 0 = the whole row (per token), None = no
    /// scale (16-bit) or one scale for the whole tensor.
    pub fn scale_group(self) -> Option<usize> {
        match self {
            ActDtype::Fp8PerToken => Some(0),
            ActDtype::Fp8Block128 => Some(128),
            ActDtype::Mxfp4 | ActDtype::Mxfp8 => Some(32),
            ActDtype::Bf16 | ActDtype::Fp16 | ActDtype::Fp8PerTensor => None,
        }
    }
}

impl WeightFormat {
    pub fn is_mx(self) -> bool {
        matches!(self, WeightFormat::Mxfp4 | WeightFormat::Mxfp8)
    }
    /// The scale layouts a record of this format may name; empty when the format has no
    /// per-group scales (its record's scale_layout is 0).
    pub fn scale_layouts(self) -> &'static [ScaleLayout] {
        use ScaleLayout as S;
        match self {
            WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => &[S::Plain, S::AiterE8m0, S::Cdna4Swizzle],
            WeightFormat::Int4Group32 => &[S::Plain, S::AiterInt4],
            _ => &[],
        }
    }
    /// Weights packed several values per storage element along K (MXFP4, INT4_GROUP32: 2
    /// per byte; INT4_PER_CHANNEL: 8 per uint32).
    pub fn is_packed(self) -> bool {
        self.is_int4() || self == WeightFormat::Mxfp4
    }
    /// Signed int4 weights (INT4_GROUP32, INT4_PER_CHANNEL).
    pub fn is_int4(self) -> bool {
        matches!(
            self,
            WeightFormat::Int4Group32 | WeightFormat::Int4PerChannel
        )
    }
    pub fn is_fp8(self) -> bool {
        matches!(
            self,
            WeightFormat::Fp8PerTensor | WeightFormat::Fp8PerChannel | WeightFormat::Fp8Block128
        )
    }
    /// The activation dtypes a launch may ask for with this weight format.
    pub fn allowed_act_dtypes(self) -> &'static [ActDtype] {
        use ActDtype as A;
        match self {
            WeightFormat::Bf16 | WeightFormat::Fp16 => &[A::Bf16, A::Fp16],
            // int4 per channel: those of fp8 per channel (AITER's a8w4 int4 kernels take fp8
            // per-token activations; the CPU and the fp32 family run every one).
            WeightFormat::Fp8PerTensor
            | WeightFormat::Fp8PerChannel
            | WeightFormat::Int4PerChannel => &[A::Bf16, A::Fp16, A::Fp8PerToken, A::Fp8PerTensor],
            WeightFormat::Fp8Block128 => &[A::Bf16, A::Fp16, A::Fp8Block128],
            WeightFormat::Mxfp4 => &[A::Bf16, A::Fp16, A::Mxfp4, A::Mxfp8],
            WeightFormat::Mxfp8 => &[A::Bf16, A::Fp16, A::Mxfp8],
            // a16wi4: the GEMMs read 16-bit activations (AITER has no quantized variant).
            WeightFormat::Int4Group32 => &[A::Bf16, A::Fp16],
        }
    }
    /// Default padding alignment of hidden/intermediate sizes for `prepare_moe`
    /// (256 for MX formats as AITER's gfx950 kernels want, 128 for FP8 block, none else).
    pub fn default_alignment(self) -> i64 {
        match self {
            WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => 256,
            WeightFormat::Fp8Block128 => 128,
            _ => 1,
        }
    }
}

impl Activation {
    /// Whether `w13` holds gate and up halves (every activation but NONE).
    pub fn is_gated(self) -> bool {
        self != Activation::NoActivation
    }

    /// docs/abi.md §2: alpha 0 → 1.702 (SWIGLU_OAI only uses it).
    pub fn resolve_alpha(self, alpha: f32) -> f32 {
        if alpha == 0.0 {
            1.702
        } else {
            alpha
        }
    }
    /// limit 0 → none for SILU/GELU, 7.0 for SWIGLU_OAI.
    pub fn resolve_limit(self, limit: f32) -> Option<f32> {
        match (self, limit == 0.0) {
            (Activation::SwigluOai, true) => Some(7.0),
            (_, true) => None,
            (_, false) => Some(limit),
        }
    }
}

/// An enum field where 0 means `default`.
pub fn enum_or<T>(raw: i32, default: T, parse: impl FnOnce(i32) -> Result<T>) -> Result<T> {
    if raw == 0 {
        Ok(default)
    } else {
        parse(raw)
    }
}
