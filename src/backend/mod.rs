//! One interface, several implementations: the launch path asks a backend what it can do and
//! hands it the work; it never branches on the vendor.

pub mod cpu;
pub mod gpu;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::moe::{MoeConfig, MoeLaunch};
use crate::prep::request::PrepJob;
use crate::tensor::DeviceKind;
use crate::types::BackendKind;

/// What a backend can run, as bit masks of the ABI enums (bit `1 << value`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caps {
    pub backend: Option<BackendKind>,
    pub arch: String,
    pub runtime_version: String,
    pub weight_formats: u32,
    pub act_dtypes: u32,
    pub gate_modes: u32,
    pub activations: u32,
    pub weight_layouts: u32,
    pub scale_layouts: u32,
    pub features: u32,
    pub limits: Limits,
}

/// The largest launch a backend indexes: rows of hidden_states (M) and slots per token (k).
/// The launch check refuses more with UNSUPPORTED naming the limit; caps report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_tokens: u64,
    pub max_topk: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::of(BackendKind::Cpu)
    }
}

impl Limits {
    pub fn of(kind: BackendKind) -> Limits {
        use crate::moe::sort::{PACKED_MAX_TOKENS, PACKED_MAX_TOPK};
        match kind {
            // Slots are `usize` indices: only memory bounds a CPU launch.
            BackendKind::Cpu => Limits {
                max_tokens: u64::MAX,
                max_topk: u64::MAX,
            },
            // The GPU kernels route with AITER's packed int32 `(slot << 24) | token`.
            BackendKind::Cuda | BackendKind::Hip => Limits {
                max_tokens: PACKED_MAX_TOKENS as u64,
                max_topk: PACKED_MAX_TOPK as u64,
            },
        }
    }
    /// The limits of the backend that runs tensors in `device` memory.
    pub fn for_device(device: DeviceKind) -> Limits {
        Limits::of(match device {
            DeviceKind::Cpu | DeviceKind::CudaHost | DeviceKind::RocmHost => BackendKind::Cpu,
            DeviceKind::Cuda | DeviceKind::CudaManaged => BackendKind::Cuda,
            DeviceKind::Rocm => BackendKind::Hip,
        })
    }
}

impl Caps {
    /// Every format, activation dtype, gate mode, activation and layout of the shared fused_moe
    /// semantics (`moe`), with the launch options both backends implement; a backend adds its
    /// own features (graph capture, device prep) on top.
    pub fn full_fused_moe(backend: BackendKind, arch: String, runtime_version: String) -> Caps {
        use crate::types::{
            feature, ActDtype, Activation, GateMode, ScaleLayout, WeightFormat, WeightLayout,
        };
        Caps {
            backend: Some(backend),
            arch,
            runtime_version,
            weight_formats: WeightFormat::mask_of(WeightFormat::ALL),
            act_dtypes: ActDtype::mask_of(ActDtype::ALL),
            gate_modes: GateMode::mask_of(GateMode::ALL),
            activations: Activation::mask_of(Activation::ALL),
            weight_layouts: WeightLayout::mask_of(WeightLayout::ALL),
            scale_layouts: ScaleLayout::mask_of(ScaleLayout::ALL),
            features: feature::BIAS
                | feature::EXPERT_MASK
                | feature::NUM_LOCAL_TOKENS
                | feature::ROUTER_WEIGHT_ON_INPUT
                | feature::PREQUANTIZED_INPUT
                | feature::STATIC_ACT_SCALE
                | feature::STAGE2_ACT_DTYPE,
            limits: Limits::of(backend),
        }
    }
}

pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    fn caps(&self) -> Caps;

    /// Can this backend run exactly this configuration? UNSUPPORTED says why not.
    fn check(&self, config: &MoeConfig) -> Result<()> {
        check_against_caps(&self.caps(), config)
    }

    /// Scratch bytes a launch needs.
    fn workspace_size(&self, launch: &MoeLaunch) -> Result<usize> {
        self.check(&launch.config)?;
        Ok(0)
    }

    fn fused_moe(&self, launch: &MoeLaunch) -> Result<()> {
        self.check(&launch.config)?;
        Err(Error::unsupported(format!(
            "fused_moe is not implemented by the {} backend yet",
            self.kind().label()
        )))
    }

    /// Run a checked prep job (`crate::prep::request`) whose memory this backend owns; device
    /// work is queued on `stream` (the caller's handle, 0 = default stream).
    ///
    /// # Safety
    /// As [`PrepJob::run`]: the job's tensors name live memory of their sizes.
    unsafe fn run_prep(&self, job: &PrepJob, stream: usize) -> Result<()> {
        let _ = (job, stream);
        Err(Error::unsupported(format!(
            "weight preparation is not implemented by the {} backend",
            self.kind().label()
        )))
    }
}

/// The backend that serves memory of `device` (host memory runs on the CPU backend).
pub fn for_device(device: DeviceKind, device_id: i32) -> Result<Arc<dyn Backend>> {
    match device {
        DeviceKind::Cpu | DeviceKind::CudaHost | DeviceKind::RocmHost => Ok(cpu::backend()),
        DeviceKind::Cuda | DeviceKind::CudaManaged => gpu::backend(gpu::Vendor::Cuda, device_id),
        DeviceKind::Rocm => gpu::backend(gpu::Vendor::Hip, device_id),
    }
}

/// The configuration check of `device`'s backend (`moeplug_resolve_config`). A CUDA or ROCm
/// device whose runtime cannot be loaded (BACKEND_UNAVAILABLE) is answered with the rules
/// its backend applies: `GpuBackend::check` is the vendor's caps (arch-independent) and the
/// record check.
pub fn check_offline(device: DeviceKind, device_id: i32, c: &MoeConfig) -> Result<BackendKind> {
    let vendor = match device {
        DeviceKind::Cuda | DeviceKind::CudaManaged => Some(gpu::Vendor::Cuda),
        DeviceKind::Rocm => Some(gpu::Vendor::Hip),
        _ => None,
    };
    match (for_device(device, device_id), vendor) {
        (Ok(b), _) => {
            b.check(c)?;
            Ok(b.kind())
        }
        (Err(e), Some(v)) if e.status == crate::error::Status::BackendUnavailable => {
            check_against_caps(&gpu::vendor_caps(v, "", ""), c)?;
            crate::moe::check::check_record(&c.layout)?;
            Ok(v.backend_kind())
        }
        (Err(e), _) => Err(e),
    }
}

fn require(mask: u32, bit: u32, what: &str, label: &str, backend: &Caps) -> Result<()> {
    if mask & bit == 0 {
        return Err(Error::unsupported(format!(
            "{what} {label} is not supported by the {} backend ({})",
            backend.backend.map(|b| b.label()).unwrap_or("unknown"),
            if backend.arch.is_empty() {
                "no arch"
            } else {
                &backend.arch
            }
        )));
    }
    Ok(())
}

/// The generic answer from capability masks alone; backends with finer rules add to it.
pub fn check_against_caps(caps: &Caps, c: &MoeConfig) -> Result<()> {
    let l = &c.layout;
    require(
        caps.weight_formats,
        l.weight_format.bit(),
        "weight_format",
        l.weight_format.label(),
        caps,
    )?;
    require(
        caps.gate_modes,
        l.gate_mode.bit(),
        "gate_mode",
        l.gate_mode.label(),
        caps,
    )?;
    require(
        caps.weight_layouts,
        l.weight_layout.bit(),
        "weight_layout",
        l.weight_layout.label(),
        caps,
    )?;
    if let Some(s) = l.scale_layout {
        require(caps.scale_layouts, s.bit(), "scale_layout", s.label(), caps)?;
    }
    require(
        caps.activations,
        c.activation.bit(),
        "activation",
        c.activation.label(),
        caps,
    )?;
    require(
        caps.act_dtypes,
        c.act_dtype.bit(),
        "act_dtype",
        c.act_dtype.label(),
        caps,
    )?;
    require(
        caps.act_dtypes,
        c.stage2_act_dtype.bit(),
        "stage2_act_dtype",
        c.stage2_act_dtype.label(),
        caps,
    )?;
    for (field, act) in [
        ("act_dtype", c.act_dtype),
        ("stage2_act_dtype", c.stage2_act_dtype),
    ] {
        if !l.weight_format.allowed_act_dtypes().contains(&act) {
            return Err(Error::unsupported(format!(
                "{field} {} is not defined for weight_format {} (allowed: {})",
                act.label(),
                l.weight_format.label(),
                l.weight_format
                    .allowed_act_dtypes()
                    .iter()
                    .map(|a| a.label())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    use crate::types::feature as f;
    let wants = [
        (l.has_bias, f::BIAS, "bias"),
        (c.has_expert_mask, f::EXPERT_MASK, "expert_mask"),
        (
            c.has_num_local_tokens,
            f::NUM_LOCAL_TOKENS,
            "num_local_tokens",
        ),
        (
            c.router_weight_on_input,
            f::ROUTER_WEIGHT_ON_INPUT,
            "ROUTER_WEIGHT_ON_INPUT",
        ),
        (
            c.prequantized_input,
            f::PREQUANTIZED_INPUT,
            "prequantized_input (hidden_scale)",
        ),
        (
            c.static_act_scale.contains(&true),
            f::STATIC_ACT_SCALE,
            "static_act_scale (stage1_act_scale / stage2_act_scale)",
        ),
        (
            c.stage2_act_dtype != c.act_dtype,
            f::STAGE2_ACT_DTYPE,
            "stage2_act_dtype (a stage-2 act dtype other than act_dtype)",
        ),
    ];
    for (wanted, bit, name) in wants {
        if wanted && caps.features & bit == 0 {
            return Err(Error::unsupported(format!(
                "feature {name} is not supported by the {} backend",
                caps.backend.map(|b| b.label()).unwrap_or("unknown")
            )));
        }
    }
    Ok(())
}
