//! One launch check: the CUDA backend validates a launch with `moe::check` (the CPU
//! backend's check) before its own GPU-only rules, so the same bad launch gets the same status
//! and message on both. Runs without a GPU: the GPU side is `gpu::launch::validate`, which
//! never touches device memory.

use moeplug::backend::cpu;
use moeplug::backend::gpu::{gpu_caps, launch};
use moeplug::layout::Layout;
use moeplug::moe::{MoeConfig, MoeLaunch};
use moeplug::tensor::{DeviceKind, ElemType, Tensor};
use moeplug::types::{ActDtype, Activation};
use moeplug::Status;

const E: usize = 2;
const M: usize = 3;
const K: usize = 2;

/// Host memory for the tensors of one launch (zeros; 8-byte aligned).
#[derive(Default)]
struct Mem(Vec<Vec<u64>>);

impl Mem {
    fn t(&mut self, name: &'static str, elem: ElemType, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product::<usize>() * elem.size();
        let mut v = vec![0u64; n.div_ceil(8).max(1)];
        let ptr = v.as_mut_ptr() as *mut u8;
        self.0.push(v);
        Tensor {
            name,
            ptr,
            device: DeviceKind::Cpu,
            device_id: 0,
            elem,
            shape: shape.to_vec(),
        }
    }
}

/// A valid MXFP4 launch with biases: H=64, I=32 padded to 64, plain layouts.
fn base(mem: &mut Mem) -> MoeLaunch {
    let (hp, ip) = (64, 64);
    let layout = Layout::new(6, 1, 1, 1, E as i64, [64, 32, 64, 64], 1).unwrap();
    MoeLaunch {
        config: MoeConfig {
            layout,
            activation: Activation::Silu,
            alpha: 1.702,
            limit: None,
            act_dtype: ActDtype::Bf16,
            stage2_act_dtype: ActDtype::Bf16,
            prequantized_input: false,
            static_act_scale: [false; 2],
            router_weight_on_input: false,
            has_expert_mask: false,
            has_num_local_tokens: false,
        },
        hidden_states: mem.t("hidden_states", ElemType::Bf16, &[M, 64]),
        hidden_scale: None,
        w13: mem.t("w13", ElemType::Fp4x2, &[E, 2 * ip, hp / 2]),
        w13_scale: Some(mem.t("w13_scale", ElemType::E8m0, &[E * 2 * ip, hp / 32])),
        w13_bias: Some(mem.t("w13_bias", ElemType::F32, &[E, 2 * ip])),
        w2: mem.t("w2", ElemType::Fp4x2, &[E, hp, ip / 2]),
        w2_scale: Some(mem.t("w2_scale", ElemType::E8m0, &[E * hp, ip / 32])),
        w2_bias: Some(mem.t("w2_bias", ElemType::F32, &[E, hp])),
        topk_weights: mem.t("topk_weights", ElemType::F32, &[M, K]),
        topk_ids: mem.t("topk_ids", ElemType::I32, &[M, K]),
        expert_mask: None,
        num_local_tokens: None,
        output: mem.t("output", ElemType::Bf16, &[M, 64]),
        workspace: None,
        stream: 0,
        stage1_act_scale: None,
        stage2_act_scale: None,
    }
}

/// FP8 per-channel weights given as uint8 (read as e4m3fn by both backends).
fn fp8_u8(mem: &mut Mem) -> MoeLaunch {
    let mut l = base(mem);
    l.config.layout = Layout::new(4, 1, 1, 0, E as i64, [64, 32, 64, 64], 0).unwrap();
    l.config.act_dtype = ActDtype::Fp8PerToken;
    l.config.stage2_act_dtype = ActDtype::Fp8PerToken;
    l.w13 = mem.t("w13", ElemType::U8, &[E, 128, 64]);
    l.w2 = mem.t("w2", ElemType::U8, &[E, 64, 64]);
    l.w13_scale = Some(mem.t("w13_scale", ElemType::F32, &[E, 128]));
    l.w2_scale = Some(mem.t("w2_scale", ElemType::F32, &[E, 64, 1]));
    l.w13_bias = None;
    l.w2_bias = None;
    l
}

/// The same launch on a CUDA device (the GPU check reads no memory).
fn on_cuda(l: &MoeLaunch) -> MoeLaunch {
    let mut g = l.clone();
    let all = [
        Some(&mut g.hidden_states),
        Some(&mut g.w13),
        Some(&mut g.w2),
        Some(&mut g.topk_weights),
        Some(&mut g.topk_ids),
        Some(&mut g.output),
        g.hidden_scale.as_mut(),
        g.w13_scale.as_mut(),
        g.w2_scale.as_mut(),
        g.w13_bias.as_mut(),
        g.w2_bias.as_mut(),
        g.expert_mask.as_mut(),
        g.num_local_tokens.as_mut(),
        g.stage1_act_scale.as_mut(),
        g.stage2_act_scale.as_mut(),
    ];
    for t in all.into_iter().flatten() {
        t.device = DeviceKind::Cuda;
    }
    g
}

fn cpu_answer(l: &MoeLaunch) -> Result<(), (Status, String)> {
    cpu::backend()
        .fused_moe(l)
        .map_err(|e| (e.status, e.message))
}

fn gpu_answer(l: &MoeLaunch) -> Result<(), (Status, String)> {
    launch::validate(&gpu_caps("sm_90", "test"), &on_cuda(l))
        .map(|_| ())
        .map_err(|e| (e.status, e.message))
}

#[test]
fn valid_launches_pass_both_checks() {
    let mut mem = Mem::default();
    for l in [base(&mut mem), fp8_u8(&mut mem)] {
        assert_eq!(cpu_answer(&l), Ok(()));
        assert_eq!(gpu_answer(&l), Ok(()));
    }
}

#[test]
fn bad_launches_get_the_same_status_and_message_on_cpu_and_gpu() {
    let mut mem = Mem::default();
    let mut cases: Vec<(&str, MoeLaunch, Status)> = Vec::new();
    let mut case = |name, status, f: &dyn Fn(&mut MoeLaunch, &mut Mem)| {
        let mut l = base(&mut mem);
        f(&mut l, &mut mem);
        cases.push((name, l, status));
    };
    case("w13 shape", Status::LayoutMismatch, &|l, m| {
        l.w13 = m.t("w13", ElemType::Fp4x2, &[E, 128, 16])
    });
    case("w2 dtype", Status::LayoutMismatch, &|l, m| {
        l.w2 = m.t("w2", ElemType::Bf16, &[E, 64, 64])
    });
    case("scale missing", Status::LayoutMismatch, &|l, _| {
        l.w13_scale = None
    });
    case("scale layout", Status::LayoutMismatch, &|l, _| {
        l.config.layout.scale_layout = Some(moeplug::types::ScaleLayout::Cdna4Swizzle)
    });
    case("bias without flag", Status::LayoutMismatch, &|l, _| {
        l.config.layout.has_bias = false
    });
    case("bias dtype", Status::InvalidArgument, &|l, m| {
        l.w2_bias = Some(m.t("w2_bias", ElemType::Bf16, &[E, 64]))
    });
    case("hidden cols", Status::LayoutMismatch, &|l, m| {
        l.hidden_states = m.t("hidden_states", ElemType::Bf16, &[M, 48])
    });
    case("hidden dtype", Status::InvalidArgument, &|l, m| {
        l.hidden_states = m.t("hidden_states", ElemType::F32, &[M, 64])
    });
    case("hidden scale", Status::InvalidArgument, &|l, m| {
        l.hidden_scale = Some(m.t("hidden_scale", ElemType::F32, &[M, 1]))
    });
    case("ids rows", Status::InvalidArgument, &|l, m| {
        l.topk_ids = m.t("topk_ids", ElemType::I32, &[M + 1, K])
    });
    case("weights shape", Status::InvalidArgument, &|l, m| {
        l.topk_weights = m.t("topk_weights", ElemType::F32, &[M, K + 1])
    });
    case("output rows", Status::InvalidArgument, &|l, m| {
        l.output = m.t("output", ElemType::Bf16, &[M + 1, 64])
    });
    case("mask too short", Status::LayoutMismatch, &|l, m| {
        l.config.has_expert_mask = true;
        l.expert_mask = Some(m.t("expert_mask", ElemType::I32, &[E - 1]))
    });
    case(
        "num_local_tokens shape",
        Status::InvalidArgument,
        &|l, m| {
            l.config.has_num_local_tokens = true;
            l.num_local_tokens = Some(m.t("num_local_tokens", ElemType::I32, &[2]))
        },
    );
    case("record interleave", Status::LayoutMismatch, &|l, _| {
        l.config.layout.gate_mode = moeplug::types::GateMode::Interleave;
        l.config.layout.intermediate_padded = 40;
    });
    case("act dtype for format", Status::Unsupported, &|l, _| {
        l.config.act_dtype = ActDtype::Fp8PerToken;
        l.config.stage2_act_dtype = ActDtype::Fp8PerToken;
    });
    case("output aliases input", Status::InvalidArgument, &|l, _| {
        l.output.ptr = l.hidden_states.ptr
    });
    for (name, l, status) in &cases {
        let cpu = cpu_answer(l);
        let gpu = gpu_answer(l);
        println!("{name}: {cpu:?}");
        assert_eq!(cpu, gpu, "{name}: CPU and GPU disagree");
        assert_eq!(cpu.as_ref().map_err(|e| e.0), Err(*status), "{name}");
    }
}

#[test]
fn gpu_only_rules_stay_in_the_gpu_check() {
    let mut mem = Mem::default();
    // More experts than the route kernel's shared memory holds: UNSUPPORTED on the GPU only.
    let mut l = base(&mut mem);
    let e = launch::MAX_LOCAL_EXPERTS + 1;
    l.config.layout.num_experts = e;
    l.w13 = mem.t("w13", ElemType::Fp4x2, &[e, 128, 32]);
    l.w2 = mem.t("w2", ElemType::Fp4x2, &[e, 64, 32]);
    l.w13_scale = Some(mem.t("w13_scale", ElemType::E8m0, &[e * 128, 2]));
    l.w2_scale = Some(mem.t("w2_scale", ElemType::E8m0, &[e * 64, 2]));
    l.w13_bias = Some(mem.t("w13_bias", ElemType::F32, &[e, 128]));
    l.w2_bias = Some(mem.t("w2_bias", ElemType::F32, &[e, 64]));
    let (status, msg) = gpu_answer(&l).unwrap_err();
    assert_eq!(status, Status::Unsupported);
    assert!(msg.contains("2048") && msg.contains("2049"), "{msg}");
    // A misaligned device address.
    let mut l = base(&mut mem);
    l.topk_ids.ptr = unsafe { l.topk_ids.ptr.add(2) };
    let (status, msg) = gpu_answer(&l).unwrap_err();
    assert_eq!(status, Status::InvalidArgument);
    assert!(msg.starts_with("topk_ids: device address"), "{msg}");
}

#[test]
fn workspace_grows_with_quantized_activations() {
    let mut mem = Mem::default();
    let l = fp8_u8(&mut mem);
    let caps = gpu_caps("sm_90", "test");
    let q = launch::validate(&caps, &on_cuda(&l))
        .unwrap()
        .workspace_bytes;
    let mut b = l.clone();
    b.config.act_dtype = ActDtype::Bf16;
    b.config.stage2_act_dtype = ActDtype::Bf16;
    let plain = launch::validate(&caps, &on_cuda(&b))
        .unwrap()
        .workspace_bytes;
    // Stage-1 codes [M, H] + scales, stage-2 codes [M*k, I] + scales, each 256-aligned.
    assert_eq!(q - plain, 4 * 256);
    assert_eq!(launch::scale_groups(ActDtype::Fp8Block128, 2880), 23);
    assert_eq!(launch::scale_groups(ActDtype::Mxfp4, 2880), 90);
    assert_eq!(launch::scale_groups(ActDtype::Fp8PerToken, 2880), 1);
}

/// The 1.1 options on CUDA: static scales, pre-quantized inputs, a separate stage-2 act dtype
/// and the activation NONE pass the GPU check as on the CPU, and caps claim them.
#[test]
fn launch_options_of_abi_1_1_on_cuda() {
    use moeplug::types::{feature, Activation};
    let mut mem = Mem::default();
    let mut l = fp8_u8(&mut mem);
    l.config.act_dtype = ActDtype::Fp8PerTensor;
    l.config.stage2_act_dtype = ActDtype::Fp8PerTensor;
    l.config.static_act_scale = [true, true];
    l.stage1_act_scale = Some(mem.t("stage1_act_scale", ElemType::F32, &[1]));
    l.stage2_act_scale = Some(mem.t("stage2_act_scale", ElemType::F32, &[]));
    assert_eq!(gpu_answer(&l), Ok(()));

    let mut p = fp8_u8(&mut mem);
    p.config.act_dtype = ActDtype::Fp8Block128;
    p.config.stage2_act_dtype = ActDtype::Fp8Block128;
    p.config.layout.weight_format = moeplug::types::WeightFormat::Fp8Block128;
    p.w13_scale = Some(mem.t("w13_scale", ElemType::F32, &[E, 1, 1]));
    p.w2_scale = Some(mem.t("w2_scale", ElemType::F32, &[E, 1, 1]));
    p.config.prequantized_input = true;
    p.hidden_states = mem.t("hidden_states", ElemType::Fp8E4m3fn, &[M, 64]);
    p.hidden_scale = Some(mem.t("hidden_scale", ElemType::F32, &[M, 1]));
    assert_eq!(gpu_answer(&p), Ok(()));

    let mut s2 = fp8_u8(&mut mem);
    s2.config.stage2_act_dtype = ActDtype::Bf16;
    assert_eq!(cpu_answer(&s2), Ok(()));
    assert_eq!(gpu_answer(&s2), Ok(()));
    let none = non_gated(&mut mem);
    assert_eq!(cpu_answer(&none), Ok(()));
    assert_eq!(gpu_answer(&none), Ok(()));
    let caps = gpu_caps("sm_90", "test");
    assert_ne!(caps.activations & Activation::NoActivation.bit(), 0);
    assert_ne!(caps.activations & Activation::GeluTanh.bit(), 0);
    assert_ne!(caps.features & feature::STAGE2_ACT_DTYPE, 0);
    assert_ne!(caps.features & feature::PREQUANTIZED_INPUT, 0);
    assert_ne!(caps.features & feature::STATIC_ACT_SCALE, 0);
}

/// `fp8_u8` with the activation NONE: w13 holds the Ip = 64 up rows only.
fn non_gated(mem: &mut Mem) -> MoeLaunch {
    let mut l = fp8_u8(mem);
    l.config.activation = Activation::NoActivation;
    l.w13 = mem.t("w13", ElemType::U8, &[E, 64, 64]);
    l.w13_scale = Some(mem.t("w13_scale", ElemType::F32, &[E, 64]));
    l
}

/// `l` with `m` tokens (zeros), so that the heuristics see m * K pairs.
fn with_tokens(mem: &mut Mem, l: &MoeLaunch, m: usize) -> MoeLaunch {
    let mut l = l.clone();
    l.hidden_states = mem.t("hidden_states", ElemType::Bf16, &[m, 64]);
    l.topk_weights = mem.t("topk_weights", ElemType::F32, &[m, K]);
    l.topk_ids = mem.t("topk_ids", ElemType::I32, &[m, K]);
    l.output = mem.t("output", ElemType::Bf16, &[m, 64]);
    l
}

/// A separate stage-2 act dtype runs stage 2 from the module of that dtype, with the workspace
/// of each stage's own dtype, and the stage-1 epilogue stores the intermediate as stage 2
/// reads it; NONE maps stage 1 as stage 2. Families that do not implement them (wgmma) are
/// passed over for one that does, on every token count.
#[test]
fn separate_stage2_and_none_plans() {
    use moeplug::backend::gpu::spec::Family;
    let mut mem = Mem::default();
    let caps = gpu_caps("sm_90", "test");
    let fp8 = fp8_u8(&mut mem);
    let mut s2 = fp8.clone();
    s2.config.stage2_act_dtype = ActDtype::Bf16;
    let plan = |l: &MoeLaunch| launch::validate(&caps, &on_cuda(l)).unwrap();
    let (p8, p2) = (plan(&fp8), plan(&s2));
    assert_eq!(p8.spec2, p8.spec);
    assert_eq!(
        (p2.spec.act_dtype, p2.spec2.act_dtype),
        (ActDtype::Fp8PerToken, ActDtype::Bf16)
    );
    assert_eq!(p2.spec2.stage2(), p2.spec2);
    // The stage-1 module stores the intermediate in bf16 (stage 2's dtype) ...
    assert!(p2.spec.defines().contains(&"INTER_F16=0".to_string()));
    // ... and the stage-2 codes [M*K, I] and scales are not needed: two 256-byte regions.
    assert_eq!(p8.workspace_bytes - p2.workspace_bytes, 2 * 256);
    let mut fp16_out = s2.clone();
    fp16_out.config.stage2_act_dtype = ActDtype::Fp16;
    fp16_out.output = mem.t("output", ElemType::F16, &[M, 64]);
    let f = plan(&fp16_out);
    assert!(f.spec.defines().contains(&"INTER_F16=1".to_string()));
    // Stage 2 quantized: the intermediate in the output dtype.
    let mut q2 = fp16_out.clone();
    q2.config.stage2_act_dtype = ActDtype::Fp8PerToken;
    q2.config.act_dtype = ActDtype::Bf16;
    let q = plan(&q2);
    assert!(q.spec.defines().contains(&"INTER_F16=1".to_string()));
    assert_eq!(q.spec.stage2().act_dtype, ActDtype::Fp8PerToken);

    let none = non_gated(&mut mem);
    for m in [1, 16, 4096] {
        let single = plan(&with_tokens(&mut mem, &fp8, m));
        for l in [&s2, &none] {
            let p = plan(&with_tokens(&mut mem, l, m));
            assert_ne!(p.spec.family, Family::Wgmma, "m={m}");
            if single.spec.family != Family::Wgmma {
                assert_eq!(p.spec.family, single.spec.family, "m={m}");
            }
        }
        if m == 4096 {
            assert_eq!(single.spec.family, Family::Wgmma);
        }
    }
    // The stream family (AITER layout, few tokens) takes a second act dtype only where it
    // covers both stages: fp8 activations in both.
    let mut aiter = fp8.clone();
    aiter.config.layout = Layout::new(4, 1, 2, 0, E as i64, [64, 32, 64, 64], 0).unwrap();
    let family_of = |l: &MoeLaunch, a2| {
        let mut l = l.clone();
        l.config.stage2_act_dtype = a2;
        plan(&l).spec.family
    };
    assert_eq!(family_of(&aiter, ActDtype::Fp8PerToken), Family::Stream);
    assert_eq!(family_of(&aiter, ActDtype::Fp8PerTensor), Family::Stream);
    assert_eq!(family_of(&aiter, ActDtype::Bf16), Family::Tile32);
    let mut aiter_none = non_gated(&mut mem);
    aiter_none.config.layout = aiter.config.layout;
    assert_eq!(plan(&aiter_none).spec.family, Family::Stream);
    let stream = plan(&aiter_none).spec;
    let kw1 = stream.split_k[0] as usize;
    assert_eq!(stream.block_columns().0, 32 * (8 / kw1));

    // NONE: a stage-1 block of tile32 covers 128 columns (one weight row each), as stage 2.
    let t = plan(&with_tokens(&mut mem, &none, 4096));
    assert_eq!(t.spec.family, Family::Tile32);
    assert_eq!(t.spec.block_columns(), (128, 128));
    assert!(t.spec.defines().contains(&"ACT=5".to_string()));
}
