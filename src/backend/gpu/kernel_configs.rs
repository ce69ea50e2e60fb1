//! What the HIP backend can compile, listed once, for the offline HIP compile check in CI
//! (`scripts/hip_compile_check.sh`, which reads it from `examples/kernel_configs.rs`): each
//! translation unit exactly as the backend hands it to hipRTC, and every `-D` set it can be
//! compiled with. The fused-MoE sets are the kernel specs of the families
//! [`hip_exclusion`] allows, enumerated like the NVRTC check's
//! ([`super::compile_check::specs_where`]); the options are [`super::hip::hiprtc_options`].
//!
//! A new kernel family is one arm of [`hip_exclusion`]; a new translation unit one entry of
//! [`UNITS`].

use super::cache::{fused_moe_source, KERNEL_HEADERS, PREP_SOURCE};
use super::compile_check::specs_where;
use super::spec::{Family, KernelSpec};

/// Why the HIP backend never selects a family, or `None` if it may. Exhaustive, so a new
/// family has to answer; `heuristics::choose` must agree (tested below).
pub fn hip_exclusion(family: Family) -> Option<&'static str> {
    match family {
        Family::Fp32 => None,
        Family::Tile32 | Family::Stream => Some(
            "inline PTX mma.sync (mma_sm80.cuh) with 32-lane warp fragments has no HIP form; \
             heuristics::choose gives HIP the fp32 family until the MFMA layer lands",
        ),
        Family::Wgmma => Some("wgmma (mma_sm90.cuh) is NVIDIA sm_90a only"),
    }
}

/// Every fused-MoE kernel configuration the HIP backend can select.
pub fn hip_specs() -> Vec<KernelSpec> {
    specs_where(|s| hip_exclusion(s.family).is_none())
}

/// A translation unit the HIP backend compiles: its file name (`#line` name and the name the
/// check writes it under), its source as compiled, and every `-D` set.
pub struct Unit {
    pub file: &'static str,
    pub source: fn() -> String,
    /// (what the configuration is, for the log; its defines).
    pub configs: fn() -> Vec<(String, Vec<String>)>,
}

pub const UNITS: &[Unit] = &[
    Unit {
        file: "prep.cu",
        source: || PREP_SOURCE.to_string(),
        configs: || vec![("prep".to_string(), vec![])],
    },
    Unit {
        file: "fused_moe.cu",
        source: fused_moe_source,
        configs: || {
            hip_specs()
                .into_iter()
                .map(|s| (format!("fused_moe {}", s.family.name()), s.defines()))
                .collect()
        },
    },
];

/// The headers every unit may include, by the name it includes them as.
pub fn headers() -> &'static [(&'static str, &'static str)] {
    &KERNEL_HEADERS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::heuristics;
    use crate::backend::gpu::spec::FamilySet;
    use crate::layout::Layout;
    use crate::moe::check::LaunchShape;
    use crate::moe::{MoeConfig, MoeLaunch};
    use crate::tensor::{DeviceKind, ElemType, Tensor};
    use crate::types::{ActDtype, WeightFormat};
    use std::collections::BTreeSet;

    fn descriptor(name: &'static str, elem: ElemType) -> Tensor {
        // Never dereferenced: the spec and the heuristics read types and presence only.
        Tensor {
            name,
            ptr: std::ptr::null_mut(),
            device: DeviceKind::Rocm,
            device_id: 0,
            elem,
            shape: vec![4, 256],
        }
    }

    /// A launch with the spec's choices.
    fn launch_for(s: &KernelSpec) -> MoeLaunch {
        let weight = match s.weight_format {
            WeightFormat::Bf16 => ElemType::Bf16,
            WeightFormat::Fp16 => ElemType::F16,
            WeightFormat::Mxfp4 => ElemType::Fp4x2,
            _ if s.fp8_fnuz => ElemType::Fp8E4m3fnuz,
            _ => ElemType::Fp8E4m3fn,
        };
        let act16 = |f16: bool| if f16 { ElemType::F16 } else { ElemType::Bf16 };
        let bias = s.has_bias.then(|| descriptor("w13_bias", ElemType::F32));
        MoeLaunch {
            config: MoeConfig {
                layout: Layout {
                    weight_format: s.weight_format,
                    gate_mode: s.gate_mode,
                    weight_layout: s.weight_layout,
                    scale_layout: s.scale_layout,
                    num_experts: 8,
                    hidden_size: 256,
                    intermediate_size: 256,
                    hidden_padded: 256,
                    intermediate_padded: 256,
                    has_bias: s.has_bias,
                },
                activation: s.activation,
                alpha: s.activation.resolve_alpha(0.0),
                limit: s.activation.resolve_limit(0.0),
                act_dtype: s.act_dtype,
                stage2_act_dtype: s.act_dtype,
                prequantized_input: false,
                static_act_scale: [false; 2],
                router_weight_on_input: s.router_weight_on_input,
                has_expert_mask: s.has_mask,
                has_num_local_tokens: false,
            },
            hidden_states: descriptor("hidden_states", act16(s.in_f16)),
            hidden_scale: None,
            w13: descriptor("w13", weight),
            w13_scale: None,
            w13_bias: bias.clone(),
            w2: descriptor("w2", weight),
            w2_scale: None,
            w2_bias: bias,
            topk_weights: descriptor("topk_weights", ElemType::F32),
            topk_ids: descriptor("topk_ids", ElemType::I32),
            expert_mask: s.has_mask.then(|| descriptor("expert_mask", ElemType::I32)),
            num_local_tokens: None,
            output: descriptor("output", act16(s.out_f16)),
            workspace: None,
            stream: 0,
            stage1_act_scale: None,
            stage2_act_scale: None,
        }
    }

    #[test]
    fn hip_specs_are_what_the_heuristics_choose_on_amd() {
        let specs = hip_specs();
        assert!(!specs.is_empty());
        for (m, topk) in [(1, 1), (4, 2), (4096, 8)] {
            let shape = LaunchShape {
                m,
                topk,
                hidden_cols: 256,
                output_cols: 256,
                weight_elem: ElemType::Bf16,
            };
            for s in &specs {
                let l = launch_for(s);
                // The launch stands for exactly this configuration (its defines are what is
                // compiled) ...
                assert_eq!(KernelSpec::for_launch(&l, s.family).defines(), s.defines());
                // ... and the backend's heuristics pick it on gfx942/gfx950.
                for arch in ["gfx942", "gfx950"] {
                    let chosen = heuristics::spec_for(arch, &l, &shape, FamilySet::all()).unwrap();
                    assert_eq!(chosen.defines(), s.defines(), "{arch} m={m}");
                    assert_eq!(hip_exclusion(chosen.family), None);
                }
            }
        }
    }

    #[test]
    fn every_axis_of_the_fp32_family_is_compiled() {
        let specs = hip_specs();
        assert!(specs.iter().all(|s| s.family == Family::Fp32));
        let seen = |f: &dyn Fn(&KernelSpec) -> String| {
            specs.iter().map(f).collect::<BTreeSet<String>>().len()
        };
        assert_eq!(seen(&|s| format!("{:?}", s.weight_format)), 7);
        assert_eq!(seen(&|s| format!("{:?}", s.act_dtype)), ActDtype::ALL.len());
        assert_eq!(seen(&|s| format!("{:?}", s.scale_layout)), 4); // none + 3
        assert_eq!(seen(&|s| format!("{:?}", s.gate_mode)), 3);
        assert_eq!(
            seen(&|s| format!("{:?}", s.activation)),
            super::super::GPU_ACTIVATIONS.len()
        );
        assert_eq!(seen(&|s| format!("{:?}", s.weight_layout)), 2);
        for b in [
            &(|s: &KernelSpec| s.has_bias) as &dyn Fn(&KernelSpec) -> bool,
            &|s| s.has_mask,
            &|s| s.router_weight_on_input,
            &|s| s.out_f16,
            &|s| s.in_f16,
            &|s| s.fp8_fnuz,
        ] {
            assert_eq!(seen(&|s| b(s).to_string()), 2);
        }
        let distinct: BTreeSet<Vec<String>> = specs.iter().map(|s| s.defines()).collect();
        assert_eq!(distinct.len(), specs.len());
    }

    #[test]
    fn only_fp32_is_hip_selectable_and_the_others_say_why() {
        for f in Family::ALL {
            match f {
                Family::Fp32 => assert_eq!(hip_exclusion(f), None),
                Family::Wgmma => assert!(hip_exclusion(f).unwrap().contains("wgmma"), "{f:?}"),
                _ => assert!(hip_exclusion(f).unwrap().contains("mma.sync"), "{f:?}"),
            }
        }
    }

    #[test]
    fn units_are_the_sources_the_backend_compiles() {
        let files: Vec<&str> = UNITS.iter().map(|u| u.file).collect();
        assert_eq!(files, ["prep.cu", "fused_moe.cu"]);
        assert_eq!((UNITS[1].source)(), fused_moe_source());
        assert!((UNITS[1].source)().starts_with("// generated by src/backend/gpu/spec.rs"));
        assert_eq!((UNITS[1].configs)().len(), hip_specs().len());
        assert_eq!((UNITS[0].configs)(), [("prep".to_string(), vec![])]);
        assert!(headers().iter().any(|(n, _)| *n == "moeplug_port.h"));
    }
}
