//! The kernel families, the compile configurations each can be selected in, and the
//! run-time compiler's options: listed once, for the backend (which compiles through
//! [`rtc_options`]) and for the offline HIP compile check in CI
//! (`scripts/hip_compile_check.sh`, which reads them from `examples/kernel_configs.rs`).
//!
//! A new kernel family is one more entry in [`FAMILIES`].

use super::cache::{FUSED_MOE_SOURCE, PREP_SOURCE};
use super::{hip, launch, Vendor};
use crate::layout::Layout;
use crate::moe::check::weight_elems;
use crate::moe::{MoeConfig, MoeLaunch};
use crate::tensor::{DeviceKind, ElemType, Tensor};
use crate::types::{ActDtype, Activation, GateMode, ScaleLayout, WeightFormat, WeightLayout};

/// Whether the HIP backend may select a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HipSupport {
    Selectable,
    /// Never selected on HIP, and why (printed by the compile check).
    Excluded(&'static str),
}

pub struct KernelFamily {
    pub name: &'static str,
    /// kernels/`stem`.cu
    pub stem: &'static str,
    pub source: &'static str,
    pub hip: HipSupport,
    /// Every -D set (without the -D) the backend can compile this family with.
    pub configs: fn() -> Vec<Vec<String>>,
}

/// One line per family: name, kernels/`stem`.cu, its source, whether HIP may select it, and
/// its configurations.
#[rustfmt::skip]
pub const FAMILIES: &[KernelFamily] = &[
    family("prep", "prep", PREP_SOURCE, HipSupport::Selectable, no_defines),
    family("fused_moe_fp32", "fused_moe", FUSED_MOE_SOURCE, HipSupport::Selectable, fp32),
    family("fused_moe_tc", "fused_moe", FUSED_MOE_SOURCE, HipSupport::Excluded(TC_ON_HIP), tc),
];

const TC_ON_HIP: &str = "inline PTX mma.sync with 32-lane warp fragments has no HIP form; \
     launch::tensor_cores() is false for every gfx arch until the MFMA layer lands";

const fn family(
    name: &'static str,
    stem: &'static str,
    source: &'static str,
    hip: HipSupport,
    configs: fn() -> Vec<Vec<String>>,
) -> KernelFamily {
    KernelFamily {
        name,
        stem,
        source,
        hip,
        configs,
    }
}

fn no_defines() -> Vec<Vec<String>> {
    vec![vec![]]
}
fn fp32() -> Vec<Vec<String>> {
    fused_moe_configs(false)
}
fn tc() -> Vec<Vec<String>> {
    fused_moe_configs(true)
}

/// The run-time compiler's options for `arch` and a configuration's `defines`: what the
/// backend passes to NVRTC / hipRTC, and what the offline HIP check passes to clang.
pub fn rtc_options(vendor: Vendor, arch: &str, defines: &[String]) -> Vec<String> {
    match vendor {
        Vendor::Cuda => {
            let mut options = vec![
                format!("--gpu-architecture={arch}"),
                "-std=c++17".to_string(),
                "-default-device".to_string(),
            ];
            options.extend(defines.iter().map(|d| format!("-D{d}")));
            options
        }
        Vendor::Hip => hip::hiprtc_options(arch, defines),
    }
}

/// One launch shape: the choices that decide the fused_moe defines.
#[derive(Debug, Clone, Copy)]
struct Choice {
    format: WeightFormat,
    act_dtype: ActDtype,
    weight_layout: WeightLayout,
    scale_layout: Option<ScaleLayout>,
    gate: GateMode,
    activation: Activation,
    weight_elem: ElemType,
    input_f16: bool,
    output_f16: bool,
    bias: bool,
    router_weight_on_input: bool,
    expert_mask: bool,
}

/// A covering set: every (weight format, allowed act dtype) pair once, with every other
/// choice cycling at its own stride so each value of each meets several formats. Exhaustive
/// products are tens of thousands of configurations; this is 22.
fn choices() -> Vec<Choice> {
    let pairs = WeightFormat::ALL
        .iter()
        .flat_map(|&f| f.allowed_act_dtypes().iter().map(move |&a| (f, a)));
    pairs
        .enumerate()
        .map(|(i, (format, act_dtype))| {
            let pick = |n: usize, stride: usize| (i / stride) % n;
            let elems = weight_elems(format);
            Choice {
                format,
                act_dtype,
                weight_layout: WeightLayout::ALL[pick(WeightLayout::ALL.len(), 1)],
                scale_layout: format
                    .is_mx()
                    .then(|| ScaleLayout::ALL[i % ScaleLayout::ALL.len()]),
                gate: GateMode::ALL[pick(GateMode::ALL.len(), 1)],
                activation: Activation::ALL[pick(Activation::ALL.len(), 2)],
                weight_elem: elems[i % elems.len()],
                input_f16: pick(2, 2) == 1,
                output_f16: pick(2, 4) == 1,
                bias: pick(2, 3) == 1,
                router_weight_on_input: i % 5 == 4,
                expert_mask: pick(2, 6) == 1,
            }
        })
        .collect()
}

fn descriptor(name: &'static str, elem: ElemType) -> Tensor {
    // Never dereferenced: `launch::defines` reads element types and presence only.
    Tensor {
        name,
        ptr: std::ptr::null_mut(),
        device: DeviceKind::Rocm,
        device_id: 0,
        elem,
        shape: vec![1],
    }
}

/// The launch a choice stands for, to ask [`launch::defines`] (the backend's own function)
/// for its defines.
fn launch_of(c: &Choice) -> MoeLaunch {
    let layout = Layout {
        weight_format: c.format,
        gate_mode: c.gate,
        weight_layout: c.weight_layout,
        scale_layout: c.scale_layout,
        num_experts: 8,
        hidden_size: 256,
        intermediate_size: 256,
        hidden_padded: 256,
        intermediate_padded: 256,
        has_bias: c.bias,
    };
    let act16 = |f16: bool| if f16 { ElemType::F16 } else { ElemType::Bf16 };
    let bias = c.bias.then(|| descriptor("w13_bias", ElemType::F32));
    MoeLaunch {
        config: MoeConfig {
            layout,
            activation: c.activation,
            alpha: c.activation.resolve_alpha(0.0),
            limit: c.activation.resolve_limit(0.0),
            act_dtype: c.act_dtype,
            router_weight_on_input: c.router_weight_on_input,
            has_expert_mask: c.expert_mask,
            has_num_local_tokens: false,
        },
        hidden_states: descriptor("hidden_states", act16(c.input_f16)),
        hidden_scale: None,
        w13: descriptor("w13", c.weight_elem),
        w13_scale: None,
        w13_bias: bias.clone(),
        w2: descriptor("w2", c.weight_elem),
        w2_scale: None,
        w2_bias: bias,
        topk_weights: descriptor("topk_weights", ElemType::F32),
        topk_ids: descriptor("topk_ids", ElemType::I32),
        expert_mask: c
            .expert_mask
            .then(|| descriptor("expert_mask", ElemType::I32)),
        num_local_tokens: None,
        output: descriptor("output", act16(c.output_f16)),
        workspace: None,
        stream: 0,
    }
}

/// The fused_moe defines of every covering choice, with or without tensor cores.
pub fn fused_moe_configs(tensor_cores: bool) -> Vec<Vec<String>> {
    choices()
        .iter()
        .map(|c| launch::defines(&launch_of(c), tensor_cores))
        .collect()
}

/// Families the HIP backend may select.
pub fn hip_selectable() -> impl Iterator<Item = &'static KernelFamily> {
    FAMILIES.iter().filter(|f| f.hip == HipSupport::Selectable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// Every value each define takes across a family's configurations.
    fn values(configs: &[Vec<String>]) -> BTreeMap<String, BTreeSet<String>> {
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for d in configs.iter().flatten() {
            let (k, v) = d.split_once('=').expect("NAME=VALUE");
            seen.entry(k.into()).or_default().insert(v.into());
        }
        seen
    }

    #[test]
    fn choices_cover_every_value_of_every_axis() {
        let cs = choices();
        assert_eq!(
            cs.len(),
            WeightFormat::ALL
                .iter()
                .map(|f| f.allowed_act_dtypes().len())
                .sum::<usize>()
        );
        let set = |f: &dyn Fn(&Choice) -> String| cs.iter().map(f).collect::<BTreeSet<_>>();
        let all = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();
        let labels = |v: &[&str]| all(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            set(&|c| c.weight_layout.label().into()),
            labels(
                &WeightLayout::ALL
                    .iter()
                    .map(|x| x.label())
                    .collect::<Vec<_>>()
            )
        );
        assert_eq!(
            set(&|c| c.gate.label().into()),
            labels(&GateMode::ALL.iter().map(|x| x.label()).collect::<Vec<_>>())
        );
        assert_eq!(
            set(&|c| c.activation.label().into()),
            labels(
                &Activation::ALL
                    .iter()
                    .map(|x| x.label())
                    .collect::<Vec<_>>()
            )
        );
        let mut scale: BTreeSet<String> = set(&|c| format!("{:?}", c.scale_layout));
        scale.remove("None");
        assert_eq!(
            scale,
            all(ScaleLayout::ALL
                .iter()
                .map(|s| format!("{:?}", Some(*s)))
                .collect())
        );
        // Every storage dtype each format accepts (fn, fnuz and uint8 for fp8).
        for f in WeightFormat::ALL {
            let have: BTreeSet<String> = cs
                .iter()
                .filter(|c| c.format == *f)
                .map(|c| format!("{:?}", c.weight_elem))
                .collect();
            let want: BTreeSet<String> =
                weight_elems(*f).iter().map(|e| format!("{e:?}")).collect();
            assert_eq!(have, want, "{f:?}");
        }
        for (name, field) in [
            (
                "input_f16",
                &(|c: &Choice| c.input_f16) as &dyn Fn(&Choice) -> bool,
            ),
            ("output_f16", &|c| c.output_f16),
            ("bias", &|c| c.bias),
            ("router_weight_on_input", &|c| c.router_weight_on_input),
            ("expert_mask", &|c| c.expert_mask),
        ] {
            assert_eq!(set(&|c| field(c).to_string()).len(), 2, "{name}");
        }
    }

    #[test]
    fn fused_moe_configs_are_the_backends_defines() {
        let fp32 = fused_moe_configs(false);
        let seen = values(&fp32);
        // Every define launch::defines emits varies across the set (except TC), so a new
        // axis the launch adds shows up here.
        for (k, v) in &seen {
            if k == "TC" {
                assert_eq!(v.iter().collect::<Vec<_>>(), ["0"]);
            } else {
                assert!(v.len() >= 2, "define {k} takes only {v:?}");
            }
        }
        assert_eq!(seen["WFMT"].len(), WeightFormat::ALL.len());
        assert_eq!(seen["FP8_FNUZ"].len(), 2);
        assert_eq!(seen["SLAYOUT"].len(), 4); // none, plain, aiter e8m0, cdna4 swizzle
        let tc = values(&fused_moe_configs(true));
        assert_eq!(tc["TC"].iter().collect::<Vec<_>>(), ["1"]);
        // No two configurations compile the same thing.
        let distinct: BTreeSet<_> = fp32.iter().collect();
        assert_eq!(distinct.len(), fp32.len());
    }

    #[test]
    fn hip_never_selects_an_excluded_family() {
        let names: Vec<&str> = hip_selectable().map(|f| f.name).collect();
        assert_eq!(names, ["prep", "fused_moe_fp32"]);
        // The tensor-core family is excluded because the backend never picks it on a gfx arch.
        for arch in ["gfx942", "gfx950", "gfx90a", "gfx1100"] {
            assert!(!launch::tensor_cores(arch), "{arch}");
        }
        assert!(launch::tensor_cores("sm_90"));
        for f in FAMILIES {
            assert!(!(f.configs)().is_empty(), "{}", f.name);
            assert!(f.source.contains("MP_KERNEL"), "{}", f.name);
        }
    }

    #[test]
    fn options_per_vendor() {
        let d = vec!["WFMT=1".to_string()];
        assert_eq!(
            rtc_options(Vendor::Cuda, "sm_90", &d),
            [
                "--gpu-architecture=sm_90",
                "-std=c++17",
                "-default-device",
                "-DWFMT=1"
            ]
        );
        assert_eq!(
            rtc_options(Vendor::Hip, "gfx942", &d),
            ["--offload-arch=gfx942", "-std=c++17", "-O3", "-DWFMT=1"]
        );
    }
}
