//! What the HIP backend can compile, listed once, for the offline HIP compile check in CI
//! (`scripts/hip_compile_check.sh`, which reads it from `examples/kernel_configs.rs`): each
//! translation unit exactly as the backend hands it to hipRTC, and every `-D` set it can be
//! compiled with. The fused-MoE sets are the kernel specs of the families
//! [`hip_exclusion`] allows, enumerated like the NVRTC check's
//! ([`super::compile_check::specs_where`]); the options are [`super::hip::hiprtc_options`].
//! For the MFMA family the check also requires, per arch, the matrix-core instruction
//! [`expected_mfma`] names in both GEMM kernels.
//!
//! A new kernel family is one arm of [`hip_exclusion`]; a new translation unit one entry of
//! [`UNITS`].

use super::cache::{fused_moe_source, KERNEL_HEADERS, PREP_SOURCE};
use super::compile_check::specs_where;
use super::heuristics::{mfma_arch, mfma_spec_unsupported};
use super::spec::{Family, KernelSpec};
use crate::types::{ActDtype, WeightFormat};

/// Why the HIP backend never selects a family, or `None` if it may. Exhaustive, so a new
/// family has to answer; `heuristics::choose` must agree (tested below). The fp32 family
/// stays selectable next to MFMA: archs without MFMA, and the fallback when a device's
/// self-test refuses MFMA.
pub fn hip_exclusion(family: Family) -> Option<&'static str> {
    match family {
        Family::Fp32 | Family::Mfma => None,
        Family::Tile32 | Family::Stream => Some(
            "inline PTX mma.sync (mma_sm80.cuh) with 32-lane warp fragments has no HIP form; \
             the MFMA family is their AMD counterpart",
        ),
        Family::Wgmma => Some("wgmma (mma_sm90.cuh) is NVIDIA sm_90a only"),
    }
}

/// Every fused-MoE kernel configuration the HIP backend can select.
pub fn hip_specs() -> Vec<KernelSpec> {
    specs_where(|s| {
        hip_exclusion(s.family).is_none()
            && !s.fused_combine // CUDA only (heuristics::fused_combine)
            && (s.family == Family::Fp32 || mfma_spec_unsupported(s).is_none())
    })
}

/// The matrix-core instruction both GEMM kernels of `spec` must contain on `arch`, or `None`
/// (not the MFMA family, or an arch it does not run on). Mirrors moe_gemm_mfma.cuh's choice of
/// operand type: fp8 codes when weights and activations are fp8 of the flavour the arch's fp8
/// MFMA reads (e4m3fnuz on gfx942, OCP e4m3fn on gfx950), fp16 when the activations are fp16
/// and the weights not bf16, bf16 otherwise.
pub fn expected_mfma(arch: &str, spec: &KernelSpec) -> Option<&'static str> {
    use ActDtype as A;
    use WeightFormat as W;
    if spec.family != Family::Mfma || !mfma_arch(arch) {
        return None;
    }
    let fp8_weights = matches!(
        spec.weight_format,
        W::Fp8PerTensor | W::Fp8PerChannel | W::Fp8Block128 | W::Mxfp8
    );
    let fp8_acts = matches!(
        spec.act_dtype,
        A::Fp8PerToken | A::Fp8PerTensor | A::Fp8Block128 | A::Mxfp8
    );
    let arch_fnuz = arch.starts_with("gfx942");
    Some(if fp8_weights && fp8_acts && spec.fp8_fnuz == arch_fnuz {
        "v_mfma_f32_16x16x32_fp8_fp8"
    } else if spec.act_dtype == A::Fp16 && spec.weight_format != W::Bf16 {
        "v_mfma_f32_16x16x16_f16"
    } else {
        "v_mfma_f32_16x16x16_bf16"
    })
}

/// One compile of a unit: what it is (for the log), its defines, and the MFMA instruction its
/// GEMM kernels must contain.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub what: String,
    pub defines: Vec<String>,
    pub mfma: Option<&'static str>,
}

/// A translation unit the HIP backend compiles: its file name (`#line` name and the name the
/// check writes it under), its source as compiled, and every configuration for an arch.
pub struct Unit {
    pub file: &'static str,
    pub source: fn() -> String,
    pub configs: fn(arch: &str) -> Vec<Config>,
}

pub const UNITS: &[Unit] = &[
    Unit {
        file: "prep.cu",
        source: || PREP_SOURCE.to_string(),
        configs: |_| {
            vec![Config {
                what: "prep".to_string(),
                defines: vec![],
                mfma: None,
            }]
        },
    },
    Unit {
        file: "fused_moe.cu",
        source: fused_moe_source,
        configs: |arch| {
            hip_specs()
                .into_iter()
                .map(|s| Config {
                    what: format!("fused_moe {}", s.family.name()),
                    defines: s.defines(),
                    mfma: expected_mfma(arch, &s),
                })
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
            WeightFormat::Int4Group32 => ElemType::U8,
            WeightFormat::Int4PerChannel => ElemType::U32,
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
                stage2_act_dtype: s.stage2_act_dtype,
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
        assert!(specs.iter().any(|s| s.family == Family::Mfma));
        assert!(specs.iter().any(|s| s.family == Family::Fp32));
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
                // ... and the backend's heuristics pick it: MFMA on gfx942/gfx950 (any target
                // id spelling), fp32 on AMD archs without the MFMA family.
                let archs: &[&str] = match s.family {
                    Family::Mfma => &["gfx942", "gfx950", "gfx942:sramecc+:xnack-"],
                    _ => &["gfx90a", "gfx1100"],
                };
                for arch in archs {
                    let chosen = heuristics::spec_for(arch, &l, &shape, FamilySet::all()).unwrap();
                    assert_eq!(chosen.defines(), s.defines(), "{arch} m={m}");
                    assert_eq!(hip_exclusion(chosen.family), None);
                }
            }
        }
    }

    #[test]
    fn every_axis_of_each_hip_family_is_compiled() {
        for family in [Family::Fp32, Family::Mfma] {
            let specs: Vec<KernelSpec> = hip_specs()
                .into_iter()
                .filter(|s| s.family == family)
                .collect();
            let seen = |f: &dyn Fn(&KernelSpec) -> String| {
                specs.iter().map(f).collect::<BTreeSet<String>>().len()
            };
            // int4 (group32, per channel) is decoded by the fp32 family only
            let int4 = (family == Family::Fp32) as usize;
            assert_eq!(
                seen(&|s| format!("{:?}", s.weight_format)),
                WeightFormat::ALL.len() - 2 + 2 * int4
            );
            assert_eq!(seen(&|s| format!("{:?}", s.act_dtype)), ActDtype::ALL.len());
            assert_eq!(seen(&|s| format!("{:?}", s.scale_layout)), 4 + int4); // none, 3 MX, aiter_int4
            assert_eq!(seen(&|s| format!("{:?}", s.gate_mode)), 3);
            // MFMA: every gated activation (NONE runs on fp32, heuristics::options_unsupported)
            let gated = super::super::GPU_ACTIVATIONS
                .iter()
                .filter(|a| a.is_gated())
                .count();
            let activations = if family == Family::Fp32 {
                super::super::GPU_ACTIVATIONS.len()
            } else {
                gated
            };
            assert_eq!(seen(&|s| format!("{:?}", s.activation)), activations);
            // A separate stage-2 act dtype: fp32 only.
            assert_eq!(
                specs.iter().any(|s| s.separate_stage2()),
                family == Family::Fp32
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
                assert_eq!(seen(&|s| b(s).to_string()), 2, "{family:?}");
            }
        }
        let specs = hip_specs();
        let distinct: BTreeSet<Vec<String>> = specs.iter().map(|s| s.defines()).collect();
        assert_eq!(distinct.len(), specs.len());
        assert!(specs
            .iter()
            .all(|s| matches!(s.family, Family::Fp32 | Family::Mfma)));
    }

    #[test]
    fn only_fp32_and_mfma_are_hip_selectable_and_the_others_say_why() {
        for f in Family::ALL {
            match f {
                Family::Fp32 | Family::Mfma => assert_eq!(hip_exclusion(f), None),
                Family::Wgmma => assert!(hip_exclusion(f).unwrap().contains("wgmma"), "{f:?}"),
                _ => assert!(hip_exclusion(f).unwrap().contains("mma.sync"), "{f:?}"),
            }
        }
    }

    #[test]
    fn expected_mfma_follows_the_operand_rule() {
        let mfma: Vec<KernelSpec> = hip_specs()
            .into_iter()
            .filter(|s| s.family == Family::Mfma)
            .collect();
        let count = |arch: &str, insn: &str| {
            mfma.iter()
                .filter(|s| expected_mfma(arch, s) == Some(insn))
                .count()
        };
        // Every MFMA spec expects an instruction on both archs, and each operand type occurs.
        for arch in ["gfx942", "gfx950"] {
            assert!(mfma.iter().all(|s| expected_mfma(arch, s).is_some()));
            for insn in [
                "v_mfma_f32_16x16x32_fp8_fp8",
                "v_mfma_f32_16x16x16_f16",
                "v_mfma_f32_16x16x16_bf16",
            ] {
                assert!(count(arch, insn) > 0, "{arch} {insn}");
            }
        }
        let one = |wf, act, fnuz| {
            let mut s = mfma[0].clone();
            (s.weight_format, s.act_dtype, s.fp8_fnuz) = (wf, act, fnuz);
            s
        };
        use ActDtype as A;
        use WeightFormat as W;
        let fp8 = "v_mfma_f32_16x16x32_fp8_fp8";
        // fnuz fp8 reaches the fp8 MFMA on gfx942 only, OCP fp8 on gfx950 only.
        let fnuz = one(W::Fp8PerChannel, A::Fp8PerToken, true);
        let ocp = one(W::Fp8Block128, A::Fp8Block128, false);
        assert_eq!(expected_mfma("gfx942", &fnuz), Some(fp8));
        assert_eq!(
            expected_mfma("gfx950", &fnuz),
            Some("v_mfma_f32_16x16x16_bf16")
        );
        assert_eq!(expected_mfma("gfx950", &ocp), Some(fp8));
        assert_eq!(
            expected_mfma("gfx942", &ocp),
            Some("v_mfma_f32_16x16x16_bf16")
        );
        assert_eq!(
            expected_mfma("gfx950", &one(W::Mxfp8, A::Mxfp8, false)),
            Some(fp8)
        );
        // w4a16 and fp8 weights with 16-bit activations: 16-bit MFMA of the activation type.
        assert_eq!(
            expected_mfma("gfx950", &one(W::Mxfp4, A::Bf16, false)),
            Some("v_mfma_f32_16x16x16_bf16")
        );
        assert_eq!(
            expected_mfma("gfx942", &one(W::Fp8PerTensor, A::Fp16, true)),
            Some("v_mfma_f32_16x16x16_f16")
        );
        assert_eq!(
            expected_mfma("gfx942", &one(W::Bf16, A::Fp16, false)),
            Some("v_mfma_f32_16x16x16_bf16")
        );
        // Not MFMA, or not an MFMA arch: nothing expected.
        assert_eq!(expected_mfma("gfx90a", &ocp), None);
        let mut fp32 = ocp.clone();
        fp32.family = Family::Fp32;
        assert_eq!(expected_mfma("gfx950", &fp32), None);
    }

    #[test]
    fn the_combine_fuses_on_cuda_only_where_the_family_has_it_with_one_workspace_size() {
        use crate::backend::gpu::launch;
        let shape = |m| LaunchShape {
            m,
            topk: 2,
            hidden_cols: 256,
            output_cols: 256,
            weight_elem: ElemType::Bf16,
        };
        let cuda = super::super::compile_check::selectable_specs(90);
        for f in Family::ALL {
            // every family the CUDA check compiles, fused exactly where it can be
            let of_f: Vec<&KernelSpec> = cuda.iter().filter(|s| s.family == f).collect();
            assert_eq!(of_f.is_empty(), f == Family::Mfma, "{f:?}"); // MFMA: AMD only
            assert_eq!(
                of_f.iter().any(|s| s.fused_combine),
                f.fuses_combine(),
                "{f:?}"
            );
            // an opt-in (MOEPLUG_FUSED_COMBINE=1), only where the family has it
            assert!(!heuristics::fused_combine("sm_90", f) || f.fuses_combine());
            assert!(!heuristics::fused_combine("gfx942", f), "{f:?}");
        }
        assert!(hip_specs().iter().all(|s| !s.fused_combine));
        for s in cuda.iter().step_by(7) {
            let l = launch_for(s);
            let chosen = heuristics::spec_for("sm_90", &l, &shape(3), FamilySet::all()).unwrap();
            assert_eq!(
                chosen.fused_combine,
                heuristics::fused_combine("sm_90", chosen.family)
            );
            let want = format!("FUSED_COMBINE={}", chosen.fused_combine as i32);
            assert!(chosen.defines().contains(&want));
            for m in [1, 300, 5000] {
                let plans: Vec<launch::Plan> = Family::ALL
                    .iter()
                    .flat_map(|&family| {
                        [false, true].map(|fused_combine| KernelSpec {
                            family,
                            fused_combine,
                            ..s.clone()
                        })
                    })
                    .map(|spec| launch::plan(&l, &shape(m), spec).unwrap())
                    .collect();
                for p in &plans {
                    assert_eq!(p.workspace_bytes, plans[0].workspace_bytes, "{s:?} m={m}");
                    let zero_blocks = if p.spec.fused_combine {
                        m.div_ceil(256)
                    } else {
                        0
                    };
                    assert_eq!(p.combine_zero_blocks, zero_blocks);
                    assert_eq!(
                        p.stage2_column_blocks,
                        256usize.div_ceil(p.spec.block_columns().1)
                    );
                }
            }
        }
    }

    #[test]
    fn units_are_the_sources_the_backend_compiles() {
        let files: Vec<&str> = UNITS.iter().map(|u| u.file).collect();
        assert_eq!(files, ["prep.cu", "fused_moe.cu"]);
        assert_eq!((UNITS[1].source)(), fused_moe_source());
        assert!((UNITS[1].source)().starts_with("// generated by src/backend/gpu/spec.rs"));
        let configs = (UNITS[1].configs)("gfx950");
        assert_eq!(configs.len(), hip_specs().len());
        for (c, s) in configs.iter().zip(hip_specs()) {
            assert_eq!(c.defines, s.defines());
            assert_eq!(c.what, format!("fused_moe {}", s.family.name()));
            assert_eq!(c.mfma, expected_mfma("gfx950", &s));
        }
        assert_eq!(
            (UNITS[0].configs)("gfx942"),
            [Config {
                what: "prep".to_string(),
                defines: vec![],
                mfma: None
            }]
        );
        assert!(headers().iter().any(|(n, _)| *n == "moeplug_port.h"));
    }
}
