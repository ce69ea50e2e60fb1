//! The enumerations of the ABI (API.md §2) as core Rust types. Values arrive from C as
//! integers and are validated here; 0 always means "the documented default".

use crate::error::{Error, Result};

macro_rules! abi_enum {
    ($(#[$doc:meta])* $name:ident, $what:literal { $($variant:ident = $value:literal => $label:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant = $value),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value from C; 0 and unknown values are errors here (callers resolve
            /// defaults first), and the message names `field`.
            pub fn from_raw(field: &str, raw: i32) -> Result<$name> {
                match raw {
                    $($value => Ok($name::$variant),)+
                    _ => Err(Error::invalid(format!(
                        "{field}: unknown {} value {raw} (valid: {})", $what,
                        [$(concat!($value, " ", $label)),+].join(", ")))),
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
        }
    };
}

abi_enum!(
    /// How the MoE weights are stored.
    WeightFormat, "weight_format" {
        Bf16 = 1 => "bf16",
        Fp16 = 2 => "fp16",
        Fp8PerTensor = 3 => "fp8_per_tensor",
        Fp8PerChannel = 4 => "fp8_per_channel",
        Fp8Block128 = 5 => "fp8_block128",
        Mxfp4 = 6 => "mxfp4",
        Mxfp8 = 7 => "mxfp8",
    }
);

abi_enum!(
    /// The activation dtype the GEMMs consume (AITER's quant_dtype_a). DEFAULT is resolved by
    /// [`ActDtype::default_for`]; it never depends on the token count or the environment.
    ActDtype, "act_dtype" {
        Bf16 = 1 => "bf16",
        Fp16 = 2 => "fp16",
        Fp8PerToken = 3 => "fp8_per_token",
        Fp8PerTensor = 4 => "fp8_per_tensor",
        Fp8Block128 = 5 => "fp8_block128",
        Mxfp4 = 6 => "mxfp4",
        Mxfp8 = 7 => "mxfp8",
    }
);

abi_enum!(
    /// Row order of the fused gate/up weight `w13`.
    GateMode, "gate_mode" {
        Separated = 1 => "separated",
        Interleave = 2 => "interleave",
        InterleaveRows = 3 => "interleave_rows",
    }
);

abi_enum!(
    /// The gated activation between the two GEMMs.
    Activation, "activation" {
        Silu = 1 => "silu",
        Gelu = 2 => "gelu",
        SwigluOai = 3 => "swiglu_oai",
    }
);

abi_enum!(
    /// Physical order of weight bytes.
    WeightLayout, "weight_layout" {
        Plain = 1 => "plain",
        Aiter16x16 = 2 => "aiter_16x16",
    }
);

abi_enum!(
    /// Physical order of MX block-scale bytes.
    ScaleLayout, "scale_layout" {
        Plain = 1 => "plain",
        AiterE8m0 = 2 => "aiter_e8m0",
        Cdna4Swizzle = 3 => "cdna4_swizzle",
    }
);

abi_enum!(
    /// Which backend family runs a device.
    BackendKind, "backend" {
        Cpu = 1 => "cpu",
        Cuda = 2 => "cuda",
        Hip = 3 => "hip",
    }
);

abi_enum!(
    /// e8m0 scale rounding of MX quantization (AITER's MxScaleRoundMode + 1).
    RoundMode, "round_mode" {
        Down = 1 => "down",
        Up = 2 => "up",
        Even = 3 => "even",
        Ceil = 4 => "ceil",
    }
);

/// Optional launch features, as bits of `moeplug_caps.features`.
pub mod feature {
    pub const BIAS: u32 = 1 << 0;
    pub const EXPERT_MASK: u32 = 1 << 1;
    pub const NUM_LOCAL_TOKENS: u32 = 1 << 2;
    pub const ROUTER_WEIGHT_ON_INPUT: u32 = 1 << 3;
    pub const GRAPH_CAPTURE: u32 = 1 << 4;
    pub const DEVICE_PREP: u32 = 1 << 5;
    pub const NAMES: [(u32, &str); 6] = [
        (BIAS, "bias"),
        (EXPERT_MASK, "expert_mask"),
        (NUM_LOCAL_TOKENS, "num_local_tokens"),
        (ROUTER_WEIGHT_ON_INPUT, "router_weight_on_input"),
        (GRAPH_CAPTURE, "graph_capture"),
        (DEVICE_PREP, "device_prep"),
    ];
}

impl ActDtype {
    /// API.md §2: the activation dtype DEFAULT stands for, fixed per weight format.
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
            WeightFormat::Fp8PerTensor | WeightFormat::Fp8PerChannel => ActDtype::Fp8PerToken,
            WeightFormat::Mxfp4 => ActDtype::Bf16,
            WeightFormat::Mxfp8 => ActDtype::Mxfp8,
        }
    }

    /// Whether activations are quantized before a GEMM (anything but bf16/fp16).
    pub fn is_quantized(self) -> bool {
        !matches!(self, ActDtype::Bf16 | ActDtype::Fp16)
    }
}

impl WeightFormat {
    pub fn is_mx(self) -> bool {
        matches!(self, WeightFormat::Mxfp4 | WeightFormat::Mxfp8)
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
            WeightFormat::Fp8PerTensor | WeightFormat::Fp8PerChannel => {
                &[A::Bf16, A::Fp16, A::Fp8PerToken, A::Fp8PerTensor]
            }
            WeightFormat::Fp8Block128 => &[A::Bf16, A::Fp16, A::Fp8Block128],
            WeightFormat::Mxfp4 => &[A::Bf16, A::Fp16, A::Mxfp4, A::Mxfp8],
            WeightFormat::Mxfp8 => &[A::Bf16, A::Fp16, A::Mxfp8],
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
    /// API.md §2: alpha 0 → 1.702 (SWIGLU_OAI only uses it).
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
