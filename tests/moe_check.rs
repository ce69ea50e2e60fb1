//! Every launch-check error of the CPU backend: exact status and message.

mod common;
use common::*;

const E: usize = 2;
const M: usize = 3;
const K: usize = 2;

/// A valid MXFP4 launch with biases: H=64, I=32 padded to 64, plain layouts.
fn base() -> Launch {
    let (h, i, hp, ip) = (64, 32, 64, 64);
    let fill = |n: usize, b: u8| vec![b; n];
    Launch {
        layout: layout(6, 1, 1, 1, E, [h, i, hp, ip], true),
        activation: 1,
        alpha: 0.0,
        limit: 0.0,
        act_dtype: 0,
        flags: 0,
        hidden: T::u16s(&[0x3F80; M * 64], &[M, h], BF16),
        hidden_scale: None,
        w13: T::new(fill(E * 2 * ip * hp / 2, 0x21), &[E, 2 * ip, hp], FP4),
        w13_scale: Some(T::new(
            fill(E * 2 * ip * hp / 32, 120),
            &[E * 2 * ip, hp / 32],
            E8M0,
        )),
        w13_bias: Some(T::f32s(&vec![0.5; E * 2 * ip], &[E, 2 * ip])),
        w2: T::new(fill(E * hp * ip / 2, 0x12), &[E, hp, ip], FP4),
        w2_scale: Some(T::new(
            fill(E * hp * ip / 32, 120),
            &[E * hp, ip / 32],
            E8M0,
        )),
        w2_bias: Some(T::f32s(&vec![0.25; E * hp], &[E, hp])),
        topk_weights: T::f32s(&[0.5; M * K], &[M, K]),
        topk_ids: T::i32s(&[0, 1, 1, 0, 0, 1], &[M, K]),
        expert_mask: None,
        num_local_tokens: None,
        output: T::zeros(&[M, h], BF16),
        stage1_act_scale: None,
        stage2_act_scale: None,
        stage2_act_dtype: 0,
    }
}

fn bf16_base() -> Launch {
    let mut l = base();
    l.layout = layout(1, 1, 1, 0, E, [64, 32, 64, 64], false);
    l.w13 = T::zeros(&[E, 128, 64], BF16);
    l.w2 = T::zeros(&[E, 64, 64], BF16);
    l.w13_scale = None;
    l.w2_scale = None;
    l.w13_bias = None;
    l.w2_bias = None;
    l
}

fn expect(mut l: Launch, status: i32, msg: &str) {
    let got = l.run().expect_err("expected an error");
    println!("{:?}", got);
    assert_eq!(got, (status, format!("moeplug_fused_moe: {msg}")));
}

const INVALID: i32 = 1;
const UNSUPPORTED: i32 = 2;
const MISMATCH: i32 = 3;

#[test]
fn the_base_launches_run() {
    let mut l = base();
    l.run().unwrap();
    assert!(l.output.values().iter().any(|&v| v != 0.0));
    assert_eq!(l.workspace_size(), Ok(0));
    bf16_base().run().unwrap();
}

#[test]
fn every_check_error_has_its_status_and_message() {
    let cases: Vec<(&str, Launch, i32, &str)> = vec![
        (
            "w13 shape",
            { let mut l = base(); l.w13 = T::zeros(&[E, 128, 32], FP4); l },
            MISMATCH,
            "w13: expected shape [2, 128, 64] from the layout record (E=2, 2*intermediate_padded=128, hidden_padded=64), got [2, 128, 32]",
        ),
        (
            "w13 shape u8",
            { let mut l = base(); l.w13 = T::zeros(&[E, 128, 16], U8); l },
            MISMATCH,
            "w13: expected shape [2, 128, 32] from the layout record (E=2, 2*intermediate_padded=128, hidden_padded/2 (uint8: two fp4 values per byte)=32), got [2, 128, 16]",
        ),
        (
            "w2 shape",
            { let mut l = base(); l.w2 = T::zeros(&[E, 32, 64], FP4); l },
            MISMATCH,
            "w2: expected shape [2, 64, 64] from the layout record (E=2, hidden_padded=64, intermediate_padded=64), got [2, 32, 64]",
        ),
        (
            "w13 dtype",
            { let mut l = base(); l.w13 = T::zeros(&[E, 128, 64], BF16); l },
            MISMATCH,
            "w13: expected dtype float4_e2m1fn_x2 or uint8 for layout.weight_format mxfp4, got bfloat16",
        ),
        (
            "w2 elem",
            { let mut l = base(); l.layout.weight_format = 7; l.w13 = T::zeros(&[E, 128, 64], FP8_FN); l.w2 = T::zeros(&[E, 64, 64], FP8_FNUZ); l.w13_scale = Some(T::zeros(&[E*128, 2], E8M0)); l.w2_scale = Some(T::zeros(&[E*64, 2], E8M0)); l },
            INVALID,
            "w2: expected the element type of w13 (float8_e4m3fn, or uint8 holding it), got float8_e4m3fnuz",
        ),
        (
            "scale missing",
            { let mut l = base(); l.w13_scale = None; l },
            MISMATCH,
            "w13_scale: expected a tensor of shape [256, 2] for layout.weight_format mxfp4, got NULL",
        ),
        (
            "scale for bf16",
            { let mut l = bf16_base(); l.w2_scale = Some(T::zeros(&[E], F32)); l },
            MISMATCH,
            "w2_scale: expected NULL for layout.weight_format bf16 (no scales), got a tensor of shape [2]",
        ),
        (
            "scale shape f3",
            { let mut l = base(); l.layout.scale_layout = 2; l },
            MISMATCH,
            "w13_scale: expected shape [256, 8] from the layout record (scale_layout aiter_e8m0: E*128 rows padded to 256, 64/32 columns padded to 8), got [256, 2]",
        ),
        (
            "scale shape cdna4",
            { let mut l = base(); l.layout.scale_layout = 3; l },
            MISMATCH,
            "w13_scale: expected shape [2, 4, 256] from the layout record (scale_layout cdna4_swizzle: E=2, ceil(128/32) row groups, 64/32 columns padded to 8, times 32), got [256, 2]",
        ),
        (
            "scale dtype",
            { let mut l = base(); l.w2_scale = Some(T::zeros(&[E * 64, 2], F32)); l },
            MISMATCH,
            "w2_scale: expected dtype float8_e8m0fnu or uint8 for layout.weight_format mxfp4, got float32",
        ),
        (
            "fp8 channel scale",
            { let mut l = bf16_base(); l.layout.weight_format = 4; l.w13 = T::zeros(&[E, 128, 64], FP8_FN); l.w2 = T::zeros(&[E, 64, 64], FP8_FN); l.w13_scale = Some(T::zeros(&[E, 64], F32)); l.w2_scale = Some(T::zeros(&[E, 64], F32)); l },
            MISMATCH,
            "w13_scale: expected shape [2, 128] or [2, 128, 1] from the layout record (E=2, one fp32 scale per row: 128), got [2, 64]",
        ),
        (
            "fp8 block scale",
            { let mut l = bf16_base(); l.layout.weight_format = 5; l.w13 = T::zeros(&[E, 128, 64], FP8_FN); l.w2 = T::zeros(&[E, 64, 64], FP8_FN); l.w13_scale = Some(T::zeros(&[E, 1, 1], F32)); l.w2_scale = Some(T::zeros(&[E, 2, 1], F32)); l },
            MISMATCH,
            "w2_scale: expected shape [2, 1, 1] from the layout record (E=2, ceil(64/128), ceil(64/128) blocks of 128x128), got [2, 2, 1]",
        ),
        (
            "bias without flag",
            { let mut l = base(); l.layout.flags = 0; l },
            MISMATCH,
            "w13_bias: expected NULL (the layout record has no HAS_BIAS flag), got a tensor of shape [2, 128]",
        ),
        (
            "flag without bias",
            { let mut l = base(); l.w2_bias = None; l },
            MISMATCH,
            "w2_bias: expected a fp32 tensor of shape [2, 64] (the layout record has HAS_BIAS), got NULL",
        ),
        (
            "bias shape",
            { let mut l = base(); l.w13_bias = Some(T::zeros(&[E, 64], F32)); l },
            MISMATCH,
            "w13_bias: expected shape [2, 128] from the layout record (E=2, 128 rows), got [2, 64]",
        ),
        (
            "bias dtype",
            { let mut l = base(); l.w2_bias = Some(T::zeros(&[E, 64], BF16)); l },
            INVALID,
            "w2_bias: expected dtype float32, got bfloat16",
        ),
        (
            "hidden cols",
            { let mut l = base(); l.hidden = T::zeros(&[M, 48], BF16); l },
            MISMATCH,
            "hidden_states: expected shape [3, 64] from the layout record (hidden_size=64, hidden_padded=64), got [3, 48]",
        ),
        (
            "hidden dtype",
            { let mut l = base(); l.hidden = T::zeros(&[M, 64], F32); l },
            INVALID,
            "hidden_states: expected dtype bfloat16 or float16, got float32",
        ),
        (
            "hidden scale",
            { let mut l = base(); l.hidden_scale = Some(T::zeros(&[M, 2], E8M0)); l },
            INVALID,
            "hidden_scale: pre-quantized hidden_states need act_dtype fp8_per_token, fp8_block128, mxfp4 or mxfp8, got bf16",
        ),
        (
            "ids rows",
            { let mut l = base(); l.topk_ids = T::zeros(&[M + 1, K], I32); l },
            INVALID,
            "topk_ids: expected shape [3, k] with k >= 1 (M from hidden_states), got [4, 2]",
        ),
        (
            "ids dtype",
            { let mut l = base(); l.topk_ids = T::zeros(&[M, K], F32); l },
            INVALID,
            "topk_ids: expected dtype int32, got float32",
        ),
        (
            "weights shape",
            { let mut l = base(); l.topk_weights = T::zeros(&[M, K + 1], F32); l },
            INVALID,
            "topk_weights: expected shape [3, 2], got [3, 3]",
        ),
        (
            "output rows",
            { let mut l = base(); l.output = T::zeros(&[M + 1, 64], BF16); l },
            INVALID,
            "output: expected 3 rows like hidden_states, got shape [4, 64]",
        ),
        (
            "output cols",
            { let mut l = base(); l.output = T::zeros(&[M, 63], BF16); l },
            MISMATCH,
            "output: expected shape [3, 64] from the layout record (hidden_size=64, hidden_padded=64), got [3, 63]",
        ),
        (
            "output dtype",
            { let mut l = base(); l.output = T::zeros(&[M, 64], F32); l },
            INVALID,
            "output: expected dtype bfloat16 or float16, got float32",
        ),
        (
            "mask short",
            { let mut l = base(); l.expert_mask = Some(T::i32s(&[1], &[1])); l },
            MISMATCH,
            "expert_mask: expected [E_global] with E_global >= 2 (layout.num_experts local experts), got [1]",
        ),
        (
            "mask value",
            { let mut l = base(); l.expert_mask = Some(T::i32s(&[1, 2, 0], &[3])); l },
            INVALID,
            "expert_mask: expected 0/1 values, got 2 at index 1",
        ),
        (
            "mask count",
            { let mut l = base(); l.expert_mask = Some(T::i32s(&[1, 0, 0], &[3])); l },
            MISMATCH,
            "expert_mask: expected 2 experts switched on (layout.num_experts local experts), got 1",
        ),
        (
            "nlt shape",
            { let mut l = base(); l.num_local_tokens = Some(T::i32s(&[1, 1], &[2])); l },
            INVALID,
            "num_local_tokens: expected shape [1], got [2]",
        ),
        (
            "record mx align",
            { let mut l = base(); l.layout.hidden_size = 40; l.layout.hidden_padded = 48; l },
            MISMATCH,
            "layout.hidden_padded: expected a multiple of 32 (weight_format mxfp4 has 1x32 scale blocks), got 48",
        ),
        (
            "record interleave",
            { let mut l = bf16_base(); l.layout.gate_mode = 2; l.layout.intermediate_padded = 40; l },
            MISMATCH,
            "layout.intermediate_padded: expected a multiple of 16 (gate_mode interleave alternates 16-row gate/up blocks), got 40",
        ),
        (
            "record f1",
            { let mut l = bf16_base(); l.layout.weight_layout = 2; l.layout.hidden_padded = 72; l },
            MISMATCH,
            "layout.hidden_padded: expected a multiple of 16 (weight_layout aiter_16x16 reads 16-row tiles of 16-byte packs (8 bf16 values)), got 72",
        ),
        (
            "act dtype",
            { let mut l = bf16_base(); l.act_dtype = 6; l },
            UNSUPPORTED,
            "act_dtype mxfp4 is not defined for weight_format bf16 (allowed: bf16, fp16)",
        ),
    ];
    for (name, l, status, msg) in cases {
        println!("{name}");
        expect(l, status, msg);
    }
}

#[test]
fn the_config_check_answers_for_the_record_and_the_caps() {
    use moeplug::capi::types::moeplug_fused_moe_args;
    use moeplug::capi::{moeplug_check_fused_moe, moeplug_last_error};
    let check = |l: &moeplug::capi::types::moeplug_layout, act_dtype: i32| {
        let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
        a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
        a.layout = l;
        a.act_dtype = act_dtype;
        let st = unsafe { moeplug_check_fused_moe(1, 0, &a) } as i32;
        let msg = unsafe { std::ffi::CStr::from_ptr(moeplug_last_error()) };
        (st, msg.to_string_lossy().into_owned())
    };
    let ok = layout(6, 2, 2, 3, 8, [2880, 2880, 3072, 3072], true);
    assert_eq!(check(&ok, 7), (0, String::new()));
    let bad = layout(6, 2, 2, 3, 8, [2880, 2880, 2900, 3072], true);
    assert_eq!(
        check(&bad, 0),
        (
            MISMATCH,
            "moeplug_check_fused_moe: layout.hidden_padded: expected a multiple of 32 \
             (weight_format mxfp4 has 1x32 scale blocks), got 2900"
                .into()
        )
    );
    assert_eq!(
        check(&ok, 3),
        (
            UNSUPPORTED,
            "moeplug_check_fused_moe: act_dtype fp8_per_token is not defined for weight_format \
             mxfp4 (allowed: bf16, fp16, mxfp4, mxfp8)"
                .into()
        )
    );
}

#[test]
fn caps_report_what_the_tests_prove() {
    use moeplug::capi::moeplug_get_caps;
    use moeplug::capi::types::moeplug_caps;
    let mut c: moeplug_caps = unsafe { std::mem::zeroed() };
    c.struct_size = std::mem::size_of::<moeplug_caps>() as u32;
    assert_eq!(unsafe { moeplug_get_caps(1, 0, &mut c) } as i32, 0);
    // BF16..MXFP8, INT4_GROUP32 (tests/int4.rs), INT4_PER_CHANNEL (tests/int4_per_channel.rs)
    assert_eq!(c.weight_formats, 0b11_1111_1110);
    assert_eq!(c.act_dtypes, 0b1111_1110);
    assert_eq!(c.gate_modes, 0b1110);
    assert_eq!(c.activations, 0b11_1110); // SILU..SWIGLU_OAI, GELU_TANH, NONE
    assert_eq!(c.weight_layouts, 0b110);
    assert_eq!(c.scale_layouts, 0b1_1110); // PLAIN..CDNA4_SWIZZLE, AITER_INT4
                                           // BIAS, EXPERT_MASK, NUM_LOCAL_TOKENS, ROUTER_WEIGHT_ON_INPUT, DETERMINISTIC
                                           // (tests/determinism.rs); PREQUANTIZED_INPUT, STATIC_ACT_SCALE, STAGE2_ACT_DTYPE
                                           // (tests/launch_fields.rs, tests/moe_reference.rs)
    assert_eq!(c.features, 0b11_1100_1111);
}
