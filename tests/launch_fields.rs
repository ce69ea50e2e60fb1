//! The 1.1 launch options (issue 11) at the C boundary of the CPU backend: what caps and
//! `moeplug_check_fused_moe` report, the exact status and message of each bad use, and what
//! each option does to the output (pre-quantized inputs, static scales, the stage-2 act
//! dtype, GELU_TANH, NONE). Their numerics against float64 are in tests/moe_reference.rs.

mod common;
use common::*;
use moeplug::capi::types::*;
use moeplug::capi::{
    moeplug_check_fused_moe, moeplug_get_caps, moeplug_last_error, moeplug_resolve_config,
};
use moeplug::moe::actquant::{quantize_row, Fp8Kind};
use moeplug::types::ActDtype;

const E: usize = 2;
const M: usize = 3;
const K: usize = 2;
const H: usize = 256;
const I: usize = 128;

const INVALID: i32 = 1;
const UNSUPPORTED: i32 = 2;

/// A valid fp8 per-channel launch (fp8_per_token acts by default), random weights and input.
fn fp8_launch(seed: u64) -> Launch {
    let mut r = Rng(seed);
    let fp8 = |r: &mut Rng, n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                let b = r.next_u64() as u8;
                if b & 0x7F == 0x7F {
                    0x38
                } else {
                    b
                }
            })
            .collect()
    };
    let hidden: Vec<u16> = (0..M * H)
        .map(|_| half::bf16::from_f64(r.nonzero(1.0)).to_bits())
        .collect();
    let sc = |r: &mut Rng, n: usize| -> Vec<f32> {
        (0..n).map(|_| r.uniform(0.001, 0.004) as f32).collect()
    };
    Launch {
        layout: layout(4, 1, 1, 0, E, [H, I, H, I], false),
        activation: 1,
        alpha: 0.0,
        limit: 0.0,
        act_dtype: 0,
        flags: 0,
        hidden: T::u16s(&hidden, &[M, H], BF16),
        hidden_scale: None,
        w13: T::new(fp8(&mut r, E * 2 * I * H), &[E, 2 * I, H], FP8_FN),
        w13_scale: Some(T::f32s(&sc(&mut r, E * 2 * I), &[E, 2 * I])),
        w13_bias: None,
        w2: T::new(fp8(&mut r, E * H * I), &[E, H, I], FP8_FN),
        w2_scale: Some(T::f32s(&sc(&mut r, E * H), &[E, H])),
        w2_bias: None,
        topk_weights: T::f32s(&[0.6, 0.4, 0.3, 0.7, 0.5, 0.5], &[M, K]),
        topk_ids: T::i32s(&[0, 1, 1, 0, 0, 1], &[M, K]),
        expert_mask: None,
        num_local_tokens: None,
        output: T::zeros(&[M, H], BF16),
        stage1_act_scale: None,
        stage2_act_scale: None,
        stage2_act_dtype: 0,
    }
}

/// The launch's hidden_states as moeplug's activation quantizer writes them for `act`.
fn prequantize(l: &Launch, act: ActDtype) -> (Vec<u8>, Vec<u8>) {
    let x: Vec<f32> = l.hidden.values().iter().map(|&v| v as f32).collect();
    let (groups, bytes) = moeplug::moe::actquant::row_scales(act, H).unwrap();
    let cb = moeplug::moe::actquant::code_bytes(act, H);
    let (mut codes, mut scales) = (vec![0u8; M * cb], vec![0u8; M * groups * bytes]);
    for t in 0..M {
        quantize_row(
            &x[t * H..(t + 1) * H],
            act,
            Fp8Kind::E4m3fn,
            &mut codes[t * cb..(t + 1) * cb],
            &mut scales[t * groups * bytes..(t + 1) * groups * bytes],
        )
        .unwrap();
    }
    (codes, scales)
}

fn expect(mut l: Launch, status: i32, msg: &str) {
    let got = l.run().expect_err("expected an error");
    assert_eq!(got, (status, format!("moeplug_fused_moe: {msg}")));
}

#[test]
fn caps_report_the_new_values_and_features() {
    let mut caps: moeplug_caps = unsafe { std::mem::zeroed() };
    caps.struct_size = std::mem::size_of::<moeplug_caps>() as u32;
    assert_eq!(unsafe { moeplug_get_caps(1, 0, &mut caps) } as i32, 0);
    let act = |v: moeplug_activation| 1u32 << (v as i32);
    for a in [moeplug_activation::GeluTanh, moeplug_activation::None] {
        assert_ne!(caps.activations & act(a), 0, "{a:?}");
    }
    for f in [
        moeplug_feature::PrequantizedInput,
        moeplug_feature::StaticActScale,
        moeplug_feature::Stage2ActDtype,
    ] {
        assert_ne!(caps.features & f as u32, 0, "{f:?}");
    }
    assert_eq!(moeplug_activation::GeluTanh as i32, 4);
    assert_eq!(moeplug_activation::None as i32, 5);
}

/// `moeplug_check_fused_moe` answers for the options without tensors (NULL pointers stand
/// for nothing but presence here), the same on the CPU and on CUDA (whose answer without a GPU
/// comes from the CUDA backend's rules: every option, NONE and a stage-2 act dtype included).
#[test]
fn check_fused_moe_reports_what_passes() {
    for device in [1, 2] {
        check_fused_moe_on(device);
    }
}

fn check_fused_moe_on(device: i32) {
    let l = fp8_launch(1);
    let blank = moeplug_tensor::host(std::ptr::null_mut(), &[], 2, 32);
    let check = |act: i32, act2: i32, scales: [bool; 2], hidden_scale: bool, activation: i32| {
        let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
        a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
        a.layout = &l.layout;
        a.activation = activation;
        a.act_dtype = act;
        a.stage2_act_dtype = act2;
        if scales[0] {
            a.stage1_act_scale = &blank;
        }
        if scales[1] {
            a.stage2_act_scale = &blank;
        }
        if hidden_scale {
            a.hidden_scale = &blank;
        }
        // CUDA without a GPU: the resolver answers from the CUDA backend's rules.
        let mut r: moeplug_resolved_config = unsafe { std::mem::zeroed() };
        r.struct_size = std::mem::size_of_val(&r) as u32;
        let st = unsafe {
            if device == 1 {
                moeplug_check_fused_moe(device, 0, &a)
            } else {
                moeplug_resolve_config(device, 0, &a, &mut r)
            }
        } as i32;
        let msg = unsafe { std::ffi::CStr::from_ptr(moeplug_last_error()) }
            .to_string_lossy()
            .replacen("moeplug_resolve_config: ", "moeplug_check_fused_moe: ", 1);
        if st == 0 && device != 1 {
            let want2 = if act2 == 0 { act } else { act2 };
            assert_eq!((r.act_dtype, r.act_dtype_stage2), (act, want2));
            assert_eq!((r.backend, r.activation), (device, activation));
        }
        (st, if st == 0 { String::new() } else { msg })
    };
    let ok = (0, String::new());
    let (tok, ten) = (ActDtype::Fp8PerToken as i32, ActDtype::Fp8PerTensor as i32);
    assert_eq!(check(ten, 0, [true, true], false, 1), ok);
    assert_eq!(check(tok, ten, [false, true], false, 1), ok);
    assert_eq!(check(tok, 1, [false, false], true, 4), ok);
    assert_eq!(check(tok, 0, [false, false], false, 5), ok);
    assert_eq!(check(1, tok, [false, false], false, 5), ok);
    assert_eq!(check(tok, 2, [false, false], false, 3), ok);
    assert_eq!(
        check(tok, 0, [true, false], false, 1),
        (
            INVALID,
            "moeplug_check_fused_moe: stage1_act_scale: a static scale needs the stage-1 act \
             dtype fp8_per_tensor, got fp8_per_token"
                .into()
        )
    );
    assert_eq!(
        check(ten, tok, [false, true], false, 1),
        (
            INVALID,
            "moeplug_check_fused_moe: stage2_act_scale: a static scale needs the stage-2 act \
             dtype fp8_per_tensor, got fp8_per_token"
                .into()
        )
    );
    assert_eq!(
        check(ten, 0, [false, false], true, 1),
        (
            INVALID,
            "moeplug_check_fused_moe: hidden_scale: pre-quantized hidden_states need act_dtype \
             fp8_per_token, fp8_block128, mxfp4 or mxfp8, got fp8_per_tensor"
                .into()
        )
    );
    assert_eq!(
        check(tok, ActDtype::Mxfp4 as i32, [false, false], false, 1),
        (
            UNSUPPORTED,
            "moeplug_check_fused_moe: stage2_act_dtype mxfp4 is not defined for weight_format \
             fp8_per_channel (allowed: bf16, fp16, fp8_per_token, fp8_per_tensor)"
                .into()
        )
    );
    assert_eq!(
        check(tok, 9, [false, false], false, 1),
        (
            INVALID,
            "moeplug_check_fused_moe: stage2_act_dtype: unknown act_dtype value 9 (valid: 1 \
             bf16, 2 fp16, 3 fp8_per_token, 4 fp8_per_tensor, 5 fp8_block128, 6 mxfp4, 7 mxfp8)"
                .into()
        )
    );
    assert_eq!(
        check(tok, 0, [false, false], false, 6),
        (
            INVALID,
            "moeplug_check_fused_moe: activation: unknown activation value 6 (valid: 1 silu, 2 \
             gelu, 3 swiglu_oai, 4 gelu_tanh, 5 none)"
                .into()
        )
    );
}

/// fp8 per-token and 1x128 inputs pre-quantized by moeplug's quantizer give the bytes of the
/// launch that quantizes the same bf16 input itself (uint8 codes and [M] scales included).
#[test]
fn prequantized_fp8_inputs_give_the_self_quantized_bytes() {
    for (format, act) in [(4, ActDtype::Fp8PerToken), (5, ActDtype::Fp8Block128)] {
        let mut own = fp8_launch(2);
        own.act_dtype = act as i32;
        if format == 5 {
            own.layout = layout(5, 1, 1, 0, E, [H, I, H, I], false);
            own.w13_scale = Some(T::f32s(&vec![0.003; E * 2 * H / 128], &[E, 2, 2]));
            own.w2_scale = Some(T::f32s(&vec![0.002; E * 2], &[E, 2, 1]));
        }
        let (codes, scales) = prequantize(&own, act);
        let mut pre = own.clone();
        own.run().unwrap();
        assert!(own.output.values().iter().any(|&v| v != 0.0));
        for (dtype, scale_shape) in [(FP8_FN, vec![M, scales.len() / 4 / M]), (U8, vec![])] {
            let scale_shape = if scale_shape.is_empty() {
                if act == ActDtype::Fp8PerToken {
                    vec![M]
                } else {
                    vec![M, 2]
                }
            } else {
                scale_shape
            };
            pre.hidden = T::new(codes.clone(), &[M, H], dtype);
            pre.hidden_scale = Some(T::new(scales.clone(), &scale_shape, F32));
            pre.run().unwrap();
            assert_eq!(pre.output.bytes, own.output.bytes, "{act:?} {dtype:?}");
        }
    }
}

/// A static stage-1 scale equal to the dynamic one gives the dynamic launch's bytes; another
/// one changes them. The stage-2 act dtype changes the output as stage 2 alone would.
#[test]
fn static_scales_and_the_stage2_act_dtype_are_used() {
    let mut dynamic = fp8_launch(3);
    dynamic.act_dtype = ActDtype::Fp8PerTensor as i32;
    let amax = dynamic
        .hidden
        .values()
        .iter()
        .fold(0f64, |m, v| m.max(v.abs())) as f32;
    let mut fixed = dynamic.clone();
    dynamic.run().unwrap();
    fixed.stage1_act_scale = Some(T::f32s(&[amax / 448.0], &[1]));
    fixed.run().unwrap();
    assert_eq!(fixed.output.bytes, dynamic.output.bytes);
    fixed.stage1_act_scale = Some(T::f32s(&[amax / 100.0], &[]));
    fixed.run().unwrap();
    assert_ne!(fixed.output.bytes, dynamic.output.bytes);

    let mut same = fp8_launch(4);
    same.act_dtype = ActDtype::Fp8PerToken as i32;
    let mut explicit = same.clone();
    explicit.stage2_act_dtype = ActDtype::Fp8PerToken as i32;
    let mut bf16_stage2 = same.clone();
    bf16_stage2.stage2_act_dtype = ActDtype::Bf16 as i32;
    same.run().unwrap();
    explicit.run().unwrap();
    bf16_stage2.run().unwrap();
    assert_eq!(explicit.output.bytes, same.output.bytes);
    assert_ne!(bf16_stage2.output.bytes, same.output.bytes);
}

#[test]
fn bad_uses_have_exact_messages() {
    let tok = ActDtype::Fp8PerToken;
    let pre = |act: ActDtype| {
        let mut l = fp8_launch(5);
        l.act_dtype = act as i32;
        let (codes, scales) = prequantize(&l, tok);
        l.hidden = T::new(codes, &[M, H], FP8_FN);
        l.hidden_scale = Some(T::new(scales, &[M, 1], F32));
        l
    };
    expect(
        pre(ActDtype::Bf16),
        INVALID,
        "hidden_scale: pre-quantized hidden_states need act_dtype fp8_per_token, fp8_block128, \
         mxfp4 or mxfp8, got bf16",
    );
    let mut l = pre(tok);
    l.hidden_scale = Some(T::f32s(&[1.0; M * 2], &[M, 2]));
    expect(
        l,
        INVALID,
        "hidden_scale: expected shape [3] or [3, 1] for act_dtype fp8_per_token (one fp32 scale \
         per row), got [3, 2]",
    );
    let mut l = pre(tok);
    l.hidden_scale = Some(T::zeros(&[M, 1], E8M0));
    expect(
        l,
        INVALID,
        "hidden_scale: expected dtype float32 for pre-quantized act_dtype fp8_per_token, got \
         float8_e8m0fnu",
    );
    let mut l = pre(tok);
    l.hidden = T::zeros(&[M, H], FP8_FNUZ);
    expect(
        l,
        INVALID,
        "hidden_states: expected dtype float8_e4m3fn (or uint8 holding it) for pre-quantized \
         act_dtype fp8_per_token with float8_e4m3fn weights, got float8_e4m3fnuz",
    );
    let mut l = pre(tok);
    l.hidden = T::zeros(&[M, H - 32], FP8_FN);
    expect(
        l,
        3,
        "hidden_states: expected 256 columns (codes of fp8_per_token) from the layout record \
         (hidden_size=256, hidden_padded=256), got shape [3, 224]",
    );
    let mut l = pre(ActDtype::Fp8Block128);
    l.layout = layout(5, 1, 1, 0, E, [H, I, H, I], false);
    l.w13_scale = Some(T::f32s(&vec![0.003; E * 4], &[E, 2, 2]));
    l.w2_scale = Some(T::f32s(&vec![0.002; E * 2], &[E, 2, 1]));
    expect(
        l,
        INVALID,
        "hidden_scale: expected shape [3, 2] for act_dtype fp8_block128 (one fp32 scale per \
         1x128 group of 256 columns), got [3, 1]",
    );

    let per_tensor = || {
        let mut l = fp8_launch(6);
        l.act_dtype = ActDtype::Fp8PerTensor as i32;
        l
    };
    let mut l = per_tensor();
    l.stage1_act_scale = Some(T::f32s(&[0.5, 0.5], &[2]));
    expect(
        l,
        INVALID,
        "stage1_act_scale: expected shape [1] or [] (one fp32 scale for the stage-1 input), got \
         [2]",
    );
    let mut l = per_tensor();
    l.stage2_act_scale = Some(T::u16s(&[0x3F80], &[1], BF16));
    expect(
        l,
        INVALID,
        "stage2_act_scale: expected dtype float32, got bfloat16",
    );
    let mut l = per_tensor();
    l.stage1_act_scale = Some(T::f32s(&[0.0], &[1]));
    expect(
        l,
        INVALID,
        "stage1_act_scale: expected a finite scale > 0 for the stage-1 input, got 0",
    );
    let mut l = per_tensor();
    l.stage2_act_scale = Some(T::f32s(&[f32::NAN], &[]));
    expect(
        l,
        INVALID,
        "stage2_act_scale: expected a finite scale > 0 for the stage-2 input, got NaN",
    );
    let mut l = fp8_launch(7);
    l.stage1_act_scale = Some(T::f32s(&[0.5], &[1]));
    expect(
        l,
        INVALID,
        "stage1_act_scale: a static scale needs the stage-1 act dtype fp8_per_tensor, got \
         fp8_per_token",
    );

    // NONE: up rows only, gate mode SEPARATED, no limit.
    let none = || {
        let mut l = fp8_launch(8);
        l.activation = 5;
        let up = l.w13.bytes[E * I * H..].to_vec();
        l.w13 = T::new(up[..E * I * H].to_vec(), &[E, I, H], FP8_FN);
        l.w13_scale = Some(T::f32s(&[0.002; E * I], &[E, I]));
        l
    };
    none().run().unwrap();
    let mut l = none();
    l.limit = 7.0;
    expect(l, INVALID, "limit: activation none takes no limit, got 7");
    let mut l = none();
    l.layout.gate_mode = 2;
    expect(
        l,
        INVALID,
        "activation none: w13 holds only the up projection, so layout.gate_mode must be \
         separated, got interleave",
    );
    let mut l = none();
    l.w13 = fp8_launch(8).w13;
    expect(
        l,
        3,
        "w13: expected shape [2, 128, 256] from the layout record (E=2, intermediate_padded \
         (activation none: up rows only)=128, hidden_padded=256), got [2, 256, 256]",
    );
}

/// NONE computes `down(up(x))`: with w13's up rows doubled the output doubles (up to bf16
/// rounding of the intermediate, which doubling keeps exact).
#[test]
fn none_is_linear_in_the_up_rows() {
    let mut l = fp8_launch(10);
    l.activation = 5;
    l.act_dtype = ActDtype::Bf16 as i32;
    l.w13 = T::new(l.w13.bytes[..E * I * H].to_vec(), &[E, I, H], FP8_FN);
    l.w13_scale = Some(T::f32s(&[0.002; E * I], &[E, I]));
    let mut doubled = l.clone();
    doubled.w13_scale = Some(T::f32s(&[0.004; E * I], &[E, I]));
    l.run().unwrap();
    doubled.run().unwrap();
    let (a, b) = (l.output.values(), doubled.output.values());
    assert!(a.iter().any(|&v| v != 0.0));
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(2.0 * x, *y);
    }
}

/// moeplug_quantize_mx (RoundMode UP, plain scales) writes exactly the codes and scales the
/// launch's own MX activation quantizer uses (the pre-quantized MXFP4/MXFP8 form).
#[test]
fn quantize_mx_writes_the_activation_quantizers_bytes() {
    use moeplug::capi::moeplug_quantize_mx;
    let mut r = Rng(11);
    let x: Vec<u16> = (0..M * H)
        .map(|_| half::bf16::from_f64(r.nonzero(3.0)).to_bits())
        .collect();
    for (format, act, dtype) in [(6, ActDtype::Mxfp4, U8), (7, ActDtype::Mxfp8, FP8_FN)] {
        let mut src = T::u16s(&x, &[M, H], BF16);
        let cols = if format == 6 { H / 2 } else { H };
        let mut q = T::zeros(&[M, cols], dtype);
        let mut s = T::zeros(&[M, H / 32], E8M0);
        let (sd, qd, scd) = (src.desc(), q.desc(), s.desc());
        let mut a: moeplug_quantize_mx_args = unsafe { std::mem::zeroed() };
        a.struct_size = std::mem::size_of::<moeplug_quantize_mx_args>() as u32;
        a.src = &sd;
        a.dst_q = &qd;
        a.dst_scale = &scd;
        a.format = format;
        assert_eq!(
            unsafe { moeplug_quantize_mx(&a, std::ptr::null_mut()) } as i32,
            0
        );
        q.read_back();
        s.read_back();
        let l = Launch {
            hidden: T::u16s(&x, &[M, H], BF16),
            ..fp8_launch(12)
        };
        let (codes, scales) = prequantize(&l, act);
        assert_eq!(q.bytes, codes, "{act:?} codes");
        assert_eq!(s.bytes, scales, "{act:?} scales");
    }
}
