//! Property tests with a hand-rolled PRNG: random shapes and flags, checked against the
//! inverse index maps; plus every error path of the prep exports (status and message).

mod common;

use common::*;
use moeplug::capi::types::*;
use moeplug::prep::maps::{f1_offset, f3_offset, w13_source_row};
use moeplug::prep::prepare::{self, PrepareInputs, PrepareSpec};
use moeplug::prep::shuffle::{
    plan_shuffle_weight, shuffle_weight, shuffled_offset, ShuffleWeightParams,
};
use moeplug::prep::{pad, scale, swizzle};
use moeplug::types::{GateMode, WeightFormat};

const INVALID: moeplug_status = moeplug_status::MoeplugInvalidArgument;
const UNSUPPORTED: moeplug_status = moeplug_status::MoeplugUnsupported;

#[test]
fn shuffle_weight_inverse_map_gives_the_input() {
    let mut rng = Rng(0x5eed_0001);
    for _ in 0..200 {
        let es = rng.pick(&[1usize, 2]);
        let gui = rng.below(3) == 0;
        let layout_n = rng.pick(&[16usize, 32]);
        let layout_k = rng.pick(&[16usize, 32]);
        let use_int4 = !gui && es == 1 && rng.below(4) == 0;
        let gate_up = gui && rng.below(2) == 0;
        let pad_k_to = if !gui && !use_int4 && rng.below(3) == 0 {
            rng.pick(&[64usize, 96, 128])
        } else {
            0
        };
        let p = ShuffleWeightParams {
            layout_n,
            layout_k,
            use_int4,
            is_guinterleave: gui,
            gate_up,
            pad_k_to,
        };
        // K in units that satisfy the rules most of the time; planning rejects the rest.
        let kq = if gui {
            64 / layout_n * layout_k
        } else {
            2 * layout_k
        };
        let k = kq * (1 + rng.below(4)) - if pad_k_to > 0 { rng.below(kq) } else { 0 };
        let n = layout_n * (1 + rng.below(3)) * if gate_up { 2 } else { 1 };
        let e = 1 + rng.below(3);
        let shape = [e, n, k];
        let plan = match plan_shuffle_weight("src", &shape, es, &p) {
            Ok(plan) => plan,
            Err(err) => {
                assert!(
                    err.message.contains("must be a multiple"),
                    "{}",
                    err.message
                );
                continue;
            }
        };
        let src = rng.bytes(e * n * k * es);
        let mut dst = vec![0xAAu8; plan.out_bytes()];
        shuffle_weight(&plan, &src, &mut dst).unwrap();
        let mut seen = vec![false; dst.len() / es];
        for b in 0..e {
            for r in 0..n {
                for c in 0..plan.k_out {
                    let o = shuffled_offset(&plan, b, r, c);
                    seen[o] = true;
                    let got = &dst[o * es..(o + 1) * es];
                    if c < k {
                        let s = ((b * n + r) * k + c) * es;
                        assert_eq!(got, &src[s..s + es], "{p:?} {shape:?} ({b},{r},{c})");
                    } else {
                        assert!(got.iter().all(|&x| x == 0), "K padding must be zero");
                    }
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "the map is a bijection");
    }
}

#[test]
fn shuffle_scale_f3_and_f4_inverse_maps() {
    let mut rng = Rng(0x5eed_0002);
    for _ in 0..100 {
        let m = 1 + rng.below(600);
        let n = 1 + rng.below(20);
        let src = rng.bytes(m * n);
        let [sm, sn] = scale::f3_shape(m, n);
        let mut dst = vec![0xAAu8; sm * sn];
        scale::shuffle_scale(&src, m, n, &mut dst);
        for r in 0..sm {
            for c in 0..sn {
                let want = if r < m && c < n { src[r * n + c] } else { 0 };
                assert_eq!(dst[f3_offset(r, c, sn)], want, "F3 m={m} n={n} ({r},{c})");
            }
        }
        // F4: experts of N rows (N % 32 == 0), 0x7F column padding, optional gate/up.
        let e = 1 + rng.below(3);
        let nn = 32 * (1 + rng.below(3));
        let gate_up = rng.below(2) == 0;
        let src = rng.bytes(e * nn * n);
        let shape = scale::plan_shuffle_scale_gui("src", e * nn, n, e).unwrap();
        let mut dst = vec![0u8; shape[0] * shape[1]];
        scale::shuffle_scale_gui(&src, e * nn, n, e, gate_up, &mut dst);
        let sn = shape[1];
        for x in 0..e {
            for g in 0..2 {
                for j in 0..nn / 2 {
                    // Logical row (g, j) sits at physical row p of the expert.
                    let logical = g * nn / 2 + j;
                    let p = if gate_up {
                        (j / 16) * 32 + g * 16 + j % 16
                    } else {
                        logical
                    };
                    for c in 0..sn {
                        let want = if c < n {
                            src[(x * nn + logical) * n + c]
                        } else {
                            0x7F
                        };
                        assert_eq!(dst[x * nn * sn + f3_offset(p, c, sn)], want);
                    }
                }
            }
        }
    }
}

#[test]
fn cdna4_swizzle_is_per_expert_f3_with_32_row_alignment() {
    let mut rng = Rng(0x5eed_0003);
    for _ in 0..50 {
        let (e, n, ks) = (1 + rng.below(3), 1 + rng.below(80), 1 + rng.below(17));
        let src = rng.bytes(e * n * ks);
        let shape = swizzle::cdna4_shape(e, n, ks);
        let mut dst = vec![0xAAu8; shape.iter().product()];
        swizzle::swizzle_cdna4(&src, e, n, ks, &mut dst);
        let sn = shape[2] / 32;
        let per = shape[1] * 32 * sn;
        for x in 0..e {
            for r in 0..shape[1] * 32 {
                for c in 0..sn {
                    let want = if r < n && c < ks {
                        src[(x * n + r) * ks + c]
                    } else {
                        0
                    };
                    assert_eq!(dst[x * per + f3_offset(r, c, sn)], want);
                }
            }
        }
    }
}

/// Source row of padded row `p` of one expert (None: a padding row), from the definition:
/// with `gate_up` the gate half stays first and the up half starts at `n_out / 2`.
fn padded_source_row(p: usize, n: usize, n_out: usize, gate_up: bool) -> Option<usize> {
    if !gate_up {
        return (p < n).then_some(p);
    }
    let (half, half_out) = (n / 2, n_out / 2);
    let (up, j) = (p >= half_out, p % half_out);
    (j < half).then_some(j + if up { half } else { 0 })
}

#[test]
fn pad_then_slice_gives_the_input() {
    let mut rng = Rng(0x5eed_0004);
    for _ in 0..100 {
        let es = rng.pick(&[1usize, 2, 4]);
        let gate_up = rng.below(2) == 0;
        let e = 1 + rng.below(3);
        let n = (1 + rng.below(20)) * if gate_up { 2 } else { 1 };
        let k = 1 + rng.below(20);
        let n2 = n + rng.below(10) * if gate_up { 2 } else { 1 };
        let k2 = k + rng.below(10);
        let fill: Vec<u8> = rng.bytes(es);
        let src = rng.bytes(e * n * k * es);
        pad::plan_pad([e, n, k], [e, n2, k2], gate_up).unwrap();
        let mut dst = vec![0u8; e * n2 * k2 * es];
        pad::pad_weights(&src, [e, n, k], &mut dst, [e, n2, k2], gate_up, &fill);
        for x in 0..e {
            for r in 0..n2 {
                let src_row = padded_source_row(r, n, n2, gate_up);
                for c in 0..k2 {
                    let d = ((x * n2 + r) * k2 + c) * es;
                    let got = &dst[d..d + es];
                    match src_row {
                        Some(sr) if c < k => {
                            let s = ((x * n + sr) * k + c) * es;
                            assert_eq!(got, &src[s..s + es]);
                        }
                        _ => assert_eq!(got, &fill[..]),
                    }
                }
            }
        }
        if gate_up {
            // Up rows start at N'/2.
            assert_eq!(padded_source_row(n2 / 2, n, n2, true), Some(n / 2));
        }
    }
}

#[test]
fn prepare_inverse_maps_for_every_gate_mode_and_format() {
    let mut rng = Rng(0x5eed_0005);
    for round in 0..24 {
        let format = [
            WeightFormat::Bf16,
            WeightFormat::Mxfp4,
            WeightFormat::Fp8PerChannel,
        ][round % 3];
        let mode = [
            GateMode::Separated,
            GateMode::Interleave,
            GateMode::InterleaveRows,
        ][round / 3 % 3];
        let vpe = if format == WeightFormat::Mxfp4 { 2 } else { 1 };
        let es = if format == WeightFormat::Bf16 { 2 } else { 1 };
        let e = 1 + rng.below(3);
        let h = 32 * (1 + rng.below(5));
        let i = 32 * (1 + rng.below(4));
        let w13 = rng.bytes(e * 2 * i * h / vpe * es);
        let w2 = rng.bytes(e * h * i / vpe * es);
        let b13: Vec<f32> = (0..e * 2 * i).map(|v| v as f32 + 0.5).collect();
        let b2: Vec<f32> = (0..e * h).map(|v| -(v as f32)).collect();
        let (s13, s2, ss13, ss2) = match format {
            WeightFormat::Mxfp4 => (
                rng.bytes(e * 2 * i * h / 32),
                rng.bytes(e * h * i / 32),
                vec![e, 2 * i, h / 32],
                vec![e * h, i / 32],
            ),
            WeightFormat::Fp8PerChannel => (
                rng.bytes(e * 2 * i * 4),
                rng.bytes(e * h * 4),
                vec![e, 2 * i],
                vec![e, h, 1],
            ),
            _ => (vec![], vec![], vec![], vec![]),
        };
        let has_scale = format != WeightFormat::Bf16;
        let spec = PrepareSpec {
            format,
            target: None,
            gate_mode_in: mode,
            hidden_align: rng.pick(&[0usize, 1, 128]),
            intermediate_align: rng.pick(&[0usize, 1, 96]),
            w13: vec![e, 2 * i, h / vpe],
            w2: vec![e, h, i / vpe],
            w13_scale: has_scale.then(|| ss13.clone()),
            w2_scale: has_scale.then(|| ss2.clone()),
            w13_bias: Some(vec![e, 2 * i]),
            w2_bias: Some(vec![e, h]),
        };
        let (shapes, out) = prepare::prepare_vecs(
            &spec,
            PrepareInputs {
                w13: &w13,
                w2: &w2,
                w13_scale: has_scale.then_some(&s13[..]),
                w2_scale: has_scale.then_some(&s2[..]),
                w13_bias: Some(prepare::f32_bytes(&b13)),
                w2_bias: Some(prepare::f32_bytes(&b2)),
            },
        )
        .unwrap();
        let l = shapes.layout;
        let (hp, ip) = (l.hidden_padded, l.intermediate_padded);
        assert!(hp >= h && ip >= i && hp % (32 * vpe) == 0 && ip % (32 * vpe) == 0);
        let (hs, hps) = (h / vpe * es, hp / vpe * es);
        // w13: every byte at its F1 position, padding zero.
        for x in 0..e {
            for p in 0..2 * ip {
                let (g, j) = (p / ip, p % ip);
                for c in 0..hps {
                    let o = x * 2 * ip * hps + f1_offset(p, c, hps, 16, 16);
                    let want = if j < i && c < hs {
                        w13[(x * 2 * i + w13_source_row(mode, g, j, i)) * hs + c]
                    } else {
                        0
                    };
                    assert_eq!(out.w13[o], want, "{format:?} {mode:?} w13 ({x},{p},{c})");
                }
            }
        }
        // w2 spot check of the last real and first padded rows.
        let (is, ips) = (i / vpe * es, ip / vpe * es);
        let o = f1_offset(h - 1, is - 1, ips, 16, 16);
        assert_eq!(out.w2[o], w2[(h - 1) * is + is - 1]);
        if hp > h {
            assert_eq!(out.w2[f1_offset(h, 0, ips, 16, 16)], 0);
        }
        // Biases re-ordered like the rows, zero padded.
        let ob13: Vec<f32> = out
            .w13_bias
            .as_ref()
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        for x in 0..e {
            for p in 0..2 * ip {
                let (g, j) = (p / ip, p % ip);
                let want = if j < i {
                    b13[x * 2 * i + w13_source_row(mode, g, j, i)]
                } else {
                    0.0
                };
                assert_eq!(ob13[x * 2 * ip + p], want);
            }
        }
        let ob2: Vec<f32> = out
            .w2_bias
            .as_ref()
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(ob2[(e - 1) * hp + h - 1], b2[(e - 1) * h + h - 1]);
        // MX scales: F3 of the re-ordered padded rows.
        if format == WeightFormat::Mxfp4 {
            let sc = out.w13_scale.as_ref().unwrap();
            let sn = shapes.w13_scale.as_ref().unwrap()[1];
            for x in 0..e {
                for p in 0..2 * ip {
                    let (g, j) = (p / ip, p % ip);
                    for c in 0..sn {
                        let want = if j < i && c < h / 32 {
                            s13[(x * 2 * i + w13_source_row(mode, g, j, i)) * (h / 32) + c]
                        } else {
                            0
                        };
                        assert_eq!(sc[f3_offset(x * 2 * ip + p, c, sn)], want);
                    }
                }
            }
        }
        if format == WeightFormat::Fp8PerChannel {
            assert_eq!(shapes.w2_scale.as_ref().unwrap(), &vec![e, hp, 1]);
            let sc = out.w13_scale.as_ref().unwrap();
            let j = i - 1;
            let src_row = w13_source_row(mode, 1, j, i);
            assert_eq!(
                &sc[(ip + j) * 4..(ip + j) * 4 + 4],
                &s13[src_row * 4..src_row * 4 + 4]
            );
        }
    }
}

#[test]
fn prepare_host_checks_its_buffers() {
    // MXFP4, E=1, H=64, I=32: w13 [1, 64, 32] B, w2 [1, 64, 16] B, scales, no biases.
    let (e, h, i) = (1usize, 64usize, 32usize);
    let spec = PrepareSpec {
        format: WeightFormat::Mxfp4,
        target: None,
        gate_mode_in: GateMode::Separated,
        hidden_align: 0,
        intermediate_align: 0,
        w13: vec![e, 2 * i, h / 2],
        w2: vec![e, h, i / 2],
        w13_scale: Some(vec![e, 2 * i, h / 32]),
        w2_scale: Some(vec![e * h, i / 32]),
        w13_bias: None,
        w2_bias: None,
    };
    let shapes = prepare::plan(&spec).unwrap();
    let (w13, w2) = (vec![1u8; e * 2 * i * h / 2], vec![2u8; e * h * i / 2]);
    let (s13, s2) = (vec![3u8; e * 2 * i * h / 32], vec![4u8; e * h * i / 32]);
    let bias = vec![0u8; 4 * e * h];
    let inputs = PrepareInputs {
        w13: &w13,
        w2: &w2,
        w13_scale: Some(&s13),
        w2_scale: Some(&s2),
        w13_bias: None,
        w2_bias: None,
    };
    let mut o = [
        vec![0u8; shapes.w13_bytes()],
        vec![0u8; shapes.w2_bytes()],
        vec![0u8; shapes.w13_scale_bytes()],
        vec![0u8; shapes.w2_scale_bytes()],
    ];
    // (change, expected message); change: 0 none, 1 short w2, 2 long out_w13, 3 no w2_scale
    // input, 4 short out_w13_scale, 5 an extra w2 bias, 6 long w13_scale.
    let cases: [(usize, &str); 7] = [
        (0, ""),
        (1, "w2: expected 1024 bytes of input, got 1023"),
        (2, "out_w13: expected 65536 bytes of output, got 65537"),
        (3, "w2_scale: input required"),
        (4, "out_w13_scale: expected 4096 bytes of output, got 4095"),
        (5, "w2_bias: given, but the plan has no such tensor"),
        (6, "w13_scale: expected 128 bytes of input, got 129"),
    ];
    for (change, want) in cases {
        let mut inp = inputs;
        let long13s = vec![3u8; s13.len() + 1];
        match change {
            1 => inp.w2 = &w2[1..],
            3 => inp.w2_scale = None,
            5 => inp.w2_bias = Some(&bias),
            6 => inp.w13_scale = Some(&long13s),
            _ => {}
        }
        let mut long13 = vec![0u8; o[0].len() + 1];
        let [o13, o2, o13s, o2s] = &mut o;
        let out = prepare::PrepareOutputs {
            w13: if change == 2 { &mut long13 } else { o13 },
            w2: o2,
            w13_scale: Some(if change == 4 { &mut o13s[1..] } else { o13s }),
            w2_scale: Some(o2s),
            w13_bias: None,
            w2_bias: None,
        };
        match prepare::prepare_host(&shapes, inp, out) {
            Ok(()) => assert_eq!(want, "", "case {change} passed"),
            Err(err) => assert_eq!(err.message, want, "case {change}"),
        }
    }
}

#[test]
fn prepare_fp8_block128_and_per_tensor_scales() {
    let (e, h, i) = (2usize, 200usize, 128usize);
    let s13: Vec<f32> = (0..e * 2 * 2).map(|v| v as f32 + 1.0).collect();
    let s2: Vec<f32> = (0..e * 2).map(|v| v as f32 + 10.0).collect();
    let w13 = vec![1u8; e * 2 * i * h];
    let w2 = vec![2u8; e * h * i];
    let spec = PrepareSpec {
        format: WeightFormat::Fp8Block128,
        target: None,
        gate_mode_in: GateMode::Separated,
        hidden_align: 0,
        intermediate_align: 0,
        w13: vec![e, 2 * i, h],
        w2: vec![e, h, i],
        w13_scale: Some(vec![e, 2, 2]),
        w2_scale: Some(vec![e, 2, 1]),
        w13_bias: None,
        w2_bias: None,
    };
    let (shapes, out) = prepare::prepare_vecs(
        &spec,
        PrepareInputs {
            w13: &w13,
            w2: &w2,
            w13_scale: Some(prepare::f32_bytes(&s13)),
            w2_scale: Some(prepare::f32_bytes(&s2)),
            w13_bias: None,
            w2_bias: None,
        },
    )
    .unwrap();
    assert_eq!(shapes.layout.hidden_padded, 256);
    assert_eq!(shapes.w13_scale, Some(vec![e, 2, 2]));
    assert_eq!(shapes.w2_scale, Some(vec![e, 2, 1]));
    let f: Vec<f32> = out
        .w13_scale
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(f, s13);
    // INTERLEAVE rows cannot carry 128-row block scales.
    let mut bad = spec.clone();
    bad.gate_mode_in = GateMode::Interleave;
    let err = prepare::plan(&bad).unwrap_err();
    assert!(err.message.starts_with("gate_mode_in:"), "{}", err.message);
    // Per-tensor scales are copied.
    let mut pt = spec.clone();
    pt.format = WeightFormat::Fp8PerTensor;
    pt.w13_scale = Some(vec![e]);
    pt.w2_scale = Some(vec![e, 1]);
    let shapes = prepare::plan(&pt).unwrap();
    assert_eq!(shapes.layout.hidden_padded, 224); // raised to the 32 F1 needs
    assert_eq!(shapes.w13_scale, Some(vec![e]));
}

// ---------------------------------------------------------------------------------------
// C error paths.

fn sw_call(a: &moeplug_shuffle_weight_args) -> moeplug_status {
    unsafe { moeplug_shuffle_weight(a, std::ptr::null_mut()) }
}

#[test]
fn shuffle_weight_errors() {
    let mut src = vec![0u8; 2 * 32 * 40];
    let mut dst = vec![0u8; 2 * 32 * 64];
    let s = Dl::of(&mut src, "float8_e4m3fn", &[2, 32, 40]);
    let d = Dl::of(&mut dst, "float8_e4m3fn", &[2, 32, 40]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["src: K = 40 storage elements must be a multiple of 32 (2*layout_k)"],
    );
    fails(
        unsafe { moeplug_shuffle_weight(std::ptr::null(), std::ptr::null_mut()) },
        INVALID,
        &["args: must not be NULL"],
    );
    let mut short = a;
    short.struct_size = 8;
    fails(
        sw_call(&short),
        INVALID,
        &["args.struct_size: expected at least"],
    );
    // Wrong dst shape.
    let s = Dl::of(&mut src, "float8_e4m3fn", &[2, 32, 32]);
    let d = Dl::of(&mut dst, "float8_e4m3fn", &[2, 32, 64]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["dst: expected shape [2, 32, 32], got [2, 32, 64]"],
    );
    // pad_k_to grows K.
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, 64);
    ok(sw_call(&a));
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, -1);
    fails(sw_call(&a), INVALID, &["pad_k_to: expected >= 0"]);
    let a = shuffle_weight_args(&s, &d, (-16, 0), false, false, false, 0);
    fails(sw_call(&a), INVALID, &["layout_n"]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, true, 0);
    fails(sw_call(&a), INVALID, &["gate_up:"]);
    // N not a multiple of layout_n.
    let s = Dl::of(&mut src, "float8_e4m3fn", &[2, 24, 32]);
    let d = Dl::of(&mut dst, "float8_e4m3fn", &[2, 24, 32]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["src: N = 24 must be a multiple of 16 (layout_n)"],
    );
    // F2 needs 3-D and K % 64.
    let s = Dl::of(&mut src, "float8_e4m3fn", &[32, 32]);
    let d = Dl::of(&mut dst, "float8_e4m3fn", &[32, 32]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, true, false, 0);
    fails(sw_call(&a), INVALID, &["src: is_guinterleave needs a 3-D"]);
    let s = Dl::of(&mut src, "float8_e4m3fn", &[1, 32, 32]);
    let d = Dl::of(&mut dst, "float8_e4m3fn", &[1, 32, 32]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, true, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["src: K = 32 storage elements must be a multiple of 64"],
    );
    // dtype mismatch, 4-byte dtype, overlap, device memory, NULL tensor.
    let d = Dl::of(&mut dst, "bfloat16", &[1, 32, 32]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["dst: expected dtype float8_e4m3fn (like src), got bfloat16"],
    );
    let s4 = Dl::of(&mut src, "float32", &[1, 16, 32]);
    let a = shuffle_weight_args(&s4, &d, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["src: expected a 1- or 2-byte dtype, got float32"],
    );
    let s = Dl::of(&mut src, "uint8", &[1, 32, 32]);
    let d = Dl::new(src.as_mut_ptr().wrapping_add(16), 1, 8, &[1, 32, 32]);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, 0);
    fails(sw_call(&a), INVALID, &["dst: overlaps src"]);
    let mut dd = Dl::of(&mut dst, "uint8", &[1, 32, 32]);
    dd.t.device.device_type = 2;
    let a = shuffle_weight_args(&s, &dd, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["src: expected device cuda:0 like dst (inputs and outputs of a prep call must be on one device), got cpu:0"],
    );
    // Device tensors are validated like host tensors (same messages) before any device work;
    // ROCm tensors then meet the unvalidated HIP backend.
    let mut ds = Dl::of(&mut src, "uint8", &[1, 32, 32]);
    ds.t.device.device_type = 10;
    let mut dd = Dl::of(&mut dst, "uint8", &[1, 32, 16]);
    dd.t.device.device_type = 10;
    let a = shuffle_weight_args(&ds, &dd, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        INVALID,
        &["dst: expected shape [1, 32, 32], got [1, 32, 16]"],
    );
    let mut dd = Dl::of(&mut dst, "uint8", &[1, 32, 32]);
    dd.t.device.device_type = 10;
    let a = shuffle_weight_args(&ds, &dd, (0, 0), false, false, false, 0);
    fails(
        sw_call(&a),
        moeplug_status::MoeplugBackendUnavailable,
        &[""],
    );
    let mut a = shuffle_weight_args(&s, &s, (0, 0), false, false, false, 0);
    a.dst = std::ptr::null();
    fails(sw_call(&a), INVALID, &["dst: must not be NULL"]);
    // A longer struct with a non-zero tail is UNSUPPORTED; zero tail is fine.
    #[repr(C)]
    struct Longer {
        a: moeplug_shuffle_weight_args,
        extra: u64,
    }
    let d = Dl::of(&mut dst, "uint8", &[1, 32, 32]);
    let mut l = Longer {
        a: shuffle_weight_args(&s, &d, (0, 0), false, false, false, 0),
        extra: 0,
    };
    l.a.struct_size = std::mem::size_of::<Longer>() as u32;
    ok(sw_call(&l.a));
    l.extra = 1;
    fails(sw_call(&l.a), UNSUPPORTED, &["args: byte"]);
}

#[test]
fn shuffle_scale_errors() {
    let mut src = vec![0u8; 64 * 8];
    let mut dst = vec![0u8; 256 * 8];
    let call = |s: &Dl, d: &Dl, e: i32, gui: bool, gu: bool| {
        let a = moeplug_shuffle_scale_args {
            struct_size: std::mem::size_of::<moeplug_shuffle_scale_args>() as u32,
            src: s.ptr(),
            dst: d.ptr(),
            num_experts: e,
            is_guinterleave: gui as i32,
            gate_up: gu as i32,
            out_fragment: std::ptr::null_mut(),
        };
        unsafe { moeplug_shuffle_scale(&a, std::ptr::null_mut()) }
    };
    let s = Dl::of(&mut src, "float8_e8m0fnu", &[64, 8]);
    let d = Dl::of(&mut dst, "float8_e8m0fnu", &[64, 8]);
    fails(
        call(&s, &d, 0, false, false),
        INVALID,
        &["dst: expected shape [256, 8], got [64, 8]"],
    );
    ok(call(&s, &d, 2, true, true));
    fails(
        call(&s, &d, 0, true, false),
        INVALID,
        &["num_experts: required"],
    );
    fails(
        call(&s, &d, 3, true, false),
        INVALID,
        &["src: 64 rows", "num_experts = 3"],
    );
    fails(
        call(&s, &d, 4, true, false),
        INVALID,
        &["src: rows per expert N = 16 must be a multiple of 32"],
    );
    fails(
        call(&s, &d, 2, false, true),
        INVALID,
        &["gate_up: requires is_guinterleave"],
    );
    fails(
        call(&s, &d, -1, true, false),
        INVALID,
        &["num_experts: expected >= 0, got -1"],
    );
    let s3 = Dl::of(&mut src, "float8_e8m0fnu", &[1, 64, 8]);
    fails(
        call(&s3, &d, 0, false, false),
        INVALID,
        &["src: expected 2 dimensions"],
    );
    let sb = Dl::of(&mut src, "bfloat16", &[16, 8]);
    let db = Dl::of(&mut dst, "bfloat16", &[16, 8]);
    fails(
        call(&sb, &db, 0, false, false),
        INVALID,
        &["src: expected dtype float8_e8m0fnu, uint8 or float32, got bfloat16"],
    );
    fails(
        unsafe { moeplug_shuffle_scale(std::ptr::null(), std::ptr::null_mut()) },
        INVALID,
        &["args: must not be NULL"],
    );
}

#[test]
fn pad_weights_through_c_and_errors() {
    let mut src: Vec<u8> = (0..2 * 4 * 3 * 2).map(|v| v as u8).collect();
    let mut dst = vec![0xAAu8; 2 * 6 * 5 * 2];
    let call = |s: &Dl, d: &Dl, gu: bool, fill: f64| {
        let a = moeplug_pad_weights_args {
            struct_size: std::mem::size_of::<moeplug_pad_weights_args>() as u32,
            src: s.ptr(),
            dst: d.ptr(),
            gate_up: gu as i32,
            fill,
            out_fragment: std::ptr::null_mut(),
        };
        unsafe { moeplug_pad_weights(&a, std::ptr::null_mut()) }
    };
    let s = Dl::of(&mut src, "bfloat16", &[2, 4, 3]);
    let d = Dl::of(&mut dst, "bfloat16", &[2, 6, 5]);
    ok(call(&s, &d, true, 1.0));
    // Expert 1, up row 0 (source row 2) lands at row 3 = N'/2.
    let at = |x: usize, r: usize, c: usize| {
        let o = ((x * 6 + r) * 5 + c) * 2;
        [dst[o], dst[o + 1]]
    };
    let src_at = |x: usize, r: usize, c: usize| {
        let o = ((x * 4 + r) * 3 + c) * 2;
        [src[o], src[o + 1]]
    };
    assert_eq!(at(1, 3, 2), src_at(1, 2, 2));
    assert_eq!(at(1, 2, 0), half::bf16::from_f32(1.0).to_le_bytes());
    assert_eq!(at(0, 0, 4), half::bf16::from_f32(1.0).to_le_bytes());
    fails(
        call(&s, &d, false, 0.1),
        INVALID,
        &["fill: 0.1 is not exactly representable in bfloat16"],
    );
    fails(
        call(&s, &d, false, f64::INFINITY),
        INVALID,
        &["fill: expected a finite value"],
    );
    let d_small = Dl::of(&mut dst, "bfloat16", &[2, 3, 5]);
    fails(
        call(&s, &d_small, false, 0.0),
        INVALID,
        &["dst: shape [2, 3, 5] must be at least src shape [2, 4, 3]"],
    );
    let d_odd = Dl::of(&mut dst, "bfloat16", &[2, 5, 5]);
    fails(
        call(&s, &d_odd, true, 0.0),
        INVALID,
        &["gate_up: rows of src (4) and dst (5) must both be even"],
    );
    let d_e = Dl::of(&mut dst, "bfloat16", &[1, 6, 5]);
    fails(
        call(&s, &d_e, false, 0.0),
        INVALID,
        &["dst: expected 2 experts like src [2, 4, 3], got shape [1, 6, 5]"],
    );
    let d_rank = Dl::of(&mut dst, "bfloat16", &[2, 30]);
    fails(
        call(&s, &d_rank, false, 0.0),
        INVALID,
        &["dst: expected 3 dimensions"],
    );
    // fp32 biases [E, N] -> [E, N'].
    let mut bias: Vec<u8> = prepare::f32_bytes(&[1.0f32, 2.0, 3.0, 4.0]).to_vec();
    let mut out = vec![0u8; 2 * 4 * 4];
    let sb = Dl::of(&mut bias, "float32", &[2, 2]);
    let db = Dl::of(&mut out, "float32", &[2, 4]);
    ok(call(&sb, &db, true, 0.0));
    let f: Vec<f32> = out
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(f, [1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0]);
    // e8m0 fill must be a power of two.
    let mut sc = vec![127u8; 4];
    let mut so = vec![0u8; 8];
    let ss = Dl::of(&mut sc, "float8_e8m0fnu", &[1, 2, 2]);
    let so_t = Dl::of(&mut so, "float8_e8m0fnu", &[1, 2, 4]);
    ok(call(&ss, &so_t, false, 1.0));
    assert_eq!(so, [127, 127, 127, 127, 127, 127, 127, 127]);
    fails(
        call(&ss, &so_t, false, 3.0),
        INVALID,
        &["fill: 3 is not exactly representable in float8_e8m0fnu"],
    );
}

#[test]
fn swizzle_and_quantize_errors() {
    let mut src = vec![0u8; 64 * 8];
    let mut dst = vec![0u8; 2 * 256];
    let s = Dl::of(&mut src, "float8_e8m0fnu", &[1, 64, 8]);
    let d = Dl::of(&mut dst, "float8_e8m0fnu", &[1, 2, 128]);
    let mut a = moeplug_swizzle_scale_args {
        struct_size: std::mem::size_of::<moeplug_swizzle_scale_args>() as u32,
        src: s.ptr(),
        dst: d.ptr(),
        layout: 0,
        out_fragment: std::ptr::null_mut(),
    };
    let call =
        |a: &moeplug_swizzle_scale_args| unsafe { moeplug_swizzle_scale(a, std::ptr::null_mut()) };
    fails(
        call(&a),
        INVALID,
        &["dst: expected shape [1, 2, 256], got [1, 2, 128]"],
    );
    a.layout = 9;
    fails(call(&a), INVALID, &["layout: unknown scale_layout value 9"]);
    a.layout = 1;
    fails(call(&a), UNSUPPORTED, &["layout: plain is not a swizzle"]);

    let mut x = vec![0u8; 4 * 64 * 2];
    let mut q = vec![0u8; 4 * 32];
    let mut sc = vec![0u8; 4 * 2];
    let tx = Dl::of(&mut x, "bfloat16", &[4, 64]);
    let tq = Dl::of(&mut q, "uint8", &[4, 32]);
    let ts = Dl::of(&mut sc, "uint8", &[4, 2]);
    let mut qa = moeplug_quantize_mx_args {
        struct_size: std::mem::size_of::<moeplug_quantize_mx_args>() as u32,
        src: tx.ptr(),
        dst_q: tq.ptr(),
        dst_scale: ts.ptr(),
        format: 0,
        round_mode: 0,
        shuffle_scale: 0,
        out_fragment: std::ptr::null_mut(),
    };
    let qcall =
        |a: &moeplug_quantize_mx_args| unsafe { moeplug_quantize_mx(a, std::ptr::null_mut()) };
    ok(qcall(&qa));
    qa.round_mode = 7;
    fails(
        qcall(&qa),
        INVALID,
        &["round_mode: unknown round_mode value 7"],
    );
    qa.round_mode = 0;
    qa.format = 1;
    fails(
        qcall(&qa),
        INVALID,
        &["format: expected 6 mxfp4 or 7 mxfp8, got 1 bf16"],
    );
    qa.format = 7;
    fails(
        qcall(&qa),
        INVALID,
        &["dst_q: expected dtype float8_e4m3fn or float8_e4m3fnuz, got uint8"],
    );
    qa.format = 6;
    qa.shuffle_scale = 1;
    fails(
        qcall(&qa),
        INVALID,
        &["dst_scale: expected shape [256, 8], got [4, 2]"],
    );
    qa.shuffle_scale = 0;
    let tx_bad = Dl::of(&mut x, "bfloat16", &[8, 16]);
    qa.src = tx_bad.ptr();
    fails(
        qcall(&qa),
        INVALID,
        &["src: K = 16 must be a multiple of 32"],
    );
}

fn prepare_args() -> moeplug_prepare_moe_args {
    moeplug_prepare_moe_args {
        struct_size: std::mem::size_of::<moeplug_prepare_moe_args>() as u32,
        weight_format: 1,
        gate_mode_in: 0,
        device_type: 0,
        device_id: 0,
        act_dtype: 0,
        hidden_align: 0,
        intermediate_align: 0,
        w13: std::ptr::null(),
        w13_scale: std::ptr::null(),
        w13_bias: std::ptr::null(),
        w2: std::ptr::null(),
        w2_scale: std::ptr::null(),
        w2_bias: std::ptr::null(),
        out_w13: std::ptr::null(),
        out_w13_scale: std::ptr::null(),
        out_w13_bias: std::ptr::null(),
        out_w2: std::ptr::null(),
        out_w2_scale: std::ptr::null(),
        out_w2_bias: std::ptr::null(),
        out_layout: std::ptr::null_mut(),
        target: 0,
    }
}

#[test]
fn prepare_moe_errors_and_bf16_round_trip() {
    let (e, h, i) = (2usize, 48usize, 40usize);
    let mut w13 = vec![3u8; e * 2 * i * h * 2];
    let mut w2 = vec![5u8; e * h * i * 2];
    let t13 = Dl::new(std::ptr::null_mut(), 4, 16, &[e, 2 * i, h]);
    let t2 = Dl::new(std::ptr::null_mut(), 4, 16, &[e, h, i]);
    let mut a = prepare_args();
    a.w13 = t13.ptr();
    a.w2 = t2.ptr();
    let mut sizes: moeplug_prepare_moe_sizes_out = unsafe { std::mem::zeroed() };
    sizes.struct_size = std::mem::size_of_val(&sizes) as u32;
    let sz = |a: &moeplug_prepare_moe_args, s: &mut moeplug_prepare_moe_sizes_out| unsafe {
        moeplug_prepare_moe_sizes(a, s)
    };
    ok(sz(&a, &mut sizes));
    // bf16: alignment 1 raised to 32 for the (16, 16) shuffle.
    assert_eq!(
        (sizes.layout.hidden_padded, sizes.layout.intermediate_padded),
        (64, 64)
    );
    assert_eq!(sizes.w13_shape, [2, 128, 64, 0]);
    assert_eq!(sizes.w13_bytes, 2 * 128 * 64 * 2);
    assert_eq!(sizes.layout.scale_layout, 0);
    let mut small = sizes;
    small.struct_size = 4;
    fails(
        sz(&a, &mut small),
        INVALID,
        &["out.struct_size: expected at least"],
    );
    fails(
        unsafe { moeplug_prepare_moe_sizes(&a, std::ptr::null_mut()) },
        INVALID,
        &["out: must not be NULL"],
    );
    let mut b = a;
    b.weight_format = 0;
    fails(sz(&b, &mut sizes), INVALID, &["weight_format: required"]);
    b.weight_format = 99;
    fails(
        sz(&b, &mut sizes),
        INVALID,
        &["weight_format: unknown weight_format value 99"],
    );
    let mut b = a;
    b.gate_mode_in = 7;
    fails(
        sz(&b, &mut sizes),
        INVALID,
        &["gate_mode_in: unknown gate_mode value 7"],
    );
    let mut b = a;
    b.device_type = 3;
    fails(
        sz(&b, &mut sizes),
        UNSUPPORTED,
        &["device_type: prepare_moe produces layouts for the CPU and CUDA backends, got cuda_host"],
    );
    // A CUDA target gets the CPU layout (the GPU fused_moe reads the same one).
    let mut b = a;
    b.device_type = 2;
    let mut cuda_sizes = sizes;
    ok(sz(&b, &mut cuda_sizes));
    b.device_type = 1;
    ok(sz(&b, &mut sizes));
    assert_eq!(cuda_sizes.w13_bytes, sizes.w13_bytes);
    b.device_type = 10;
    fails(
        sz(&b, &mut sizes),
        moeplug_status::MoeplugBackendUnavailable,
        &[""],
    );
    let mut b = a;
    b.act_dtype = 6;
    fails(
        sz(&b, &mut sizes),
        UNSUPPORTED,
        &["act_dtype: mxfp4 cannot be used with weight_format bf16"],
    );
    let mut b = a;
    b.hidden_align = -2;
    fails(
        sz(&b, &mut sizes),
        INVALID,
        &["hidden_align: expected >= 0"],
    );
    let mut b = a;
    b.w2 = std::ptr::null();
    fails(sz(&b, &mut sizes), INVALID, &["w2: must not be NULL"]);
    let bad13 = Dl::new(std::ptr::null_mut(), 4, 16, &[e, 2 * i, h + 1]);
    let mut b = a;
    b.w13 = bad13.ptr();
    fails(
        sz(&b, &mut sizes),
        INVALID,
        &["w13: expected shape [2, 80, 48], got [2, 80, 49]"],
    );
    let fp16 = Dl::new(std::ptr::null_mut(), 2, 16, &[e, 2 * i, h]);
    let mut b = a;
    b.w13 = fp16.ptr();
    fails(
        sz(&b, &mut sizes),
        INVALID,
        &["w13: expected dtype bfloat16, got float16"],
    );
    let scale = Dl::new(std::ptr::null_mut(), 2, 32, &[e]);
    let mut b = a;
    b.w13_scale = scale.ptr();
    fails(
        sz(&b, &mut sizes),
        INVALID,
        &["w13_scale: must be NULL for weight_format bf16"],
    );
    let mut b = a;
    b.weight_format = 6;
    let f4_13 = Dl::new(std::ptr::null_mut(), 1, 8, &[e, 2 * i, h / 2]);
    let f4_2 = Dl::new(std::ptr::null_mut(), 1, 8, &[e, h, i / 2]);
    b.w13 = f4_13.ptr();
    b.w2 = f4_2.ptr();
    fails(
        sz(&b, &mut sizes),
        INVALID,
        &["w13_scale: required for weight_format mxfp4"],
    );

    // The real call: data present, outputs checked.
    let mut o13 = vec![0xAAu8; sizes.w13_bytes as usize];
    let mut o2 = vec![0xAAu8; sizes.w2_bytes as usize];
    let t13 = Dl::of(&mut w13, "bfloat16", &[e, 2 * i, h]);
    let t2 = Dl::of(&mut w2, "bfloat16", &[e, h, i]);
    let to13 = Dl::of(&mut o13, "bfloat16", &[2, 128, 64]);
    let to2 = Dl::of(&mut o2, "bfloat16", &[2, 64, 64]);
    let mut layout: moeplug_layout = unsafe { std::mem::zeroed() };
    layout.struct_size = std::mem::size_of_val(&layout) as u32;
    let mut a = prepare_args();
    a.w13 = t13.ptr();
    a.w2 = t2.ptr();
    a.out_w13 = to13.ptr();
    a.out_w2 = to2.ptr();
    let call =
        |a: &moeplug_prepare_moe_args| unsafe { moeplug_prepare_moe(a, std::ptr::null_mut()) };
    fails(call(&a), INVALID, &["out_layout: must not be NULL"]);
    a.out_layout = &mut layout;
    ok(call(&a));
    assert_eq!(
        (
            layout.weight_format,
            layout.gate_mode,
            layout.weight_layout,
            layout.num_experts
        ),
        (1, 1, 2, 2)
    );
    assert_eq!((layout.hidden_size, layout.intermediate_size), (48, 40));
    // Row 0 of expert 0 starts the output; padded columns are zero.
    assert_eq!(&o13[..16], &w13[..16]);
    assert_eq!(o13.iter().filter(|&&b| b == 0xAA).count(), 0);
    let wrong = Dl::of(&mut o2, "bfloat16", &[2, 48, 64]);
    let mut b = a;
    b.out_w2 = wrong.ptr();
    fails(
        call(&b),
        INVALID,
        &["out_w2: expected shape [2, 64, 64], got [2, 48, 64]"],
    );
    let mut b = a;
    b.out_w2 = std::ptr::null();
    fails(call(&b), INVALID, &["out_w2: must not be NULL"]);
    let mut bias = vec![0u8; 2 * 80 * 4];
    let tb = Dl::of(&mut bias, "float32", &[2, 80]);
    let mut b = a;
    b.out_w13_bias = tb.ptr();
    fails(
        call(&b),
        INVALID,
        &["out_w13_bias: must be NULL (its input is absent)"],
    );
    // An output over an input, and two outputs over each other.
    let mut big = vec![0u8; 2 * 128 * 64 * 2];
    let in_big = Dl::new(big.as_mut_ptr(), 4, 16, &[e, 2 * i, h]);
    let out_big = Dl::new(big.as_mut_ptr(), 4, 16, &[2, 128, 64]);
    let mut b = a;
    b.w13 = in_big.ptr();
    b.out_w13 = out_big.ptr();
    fails(call(&b), INVALID, &["out_w13: overlaps w13"]);
    let alias = Dl::new(o13.as_mut_ptr(), 4, 16, &[2, 64, 64]);
    let mut b = a;
    b.out_w2 = alias.ptr();
    fails(call(&b), INVALID, &["out_w2: overlaps out_w13"]);
    let mut dev = Dl::of(&mut o2, "bfloat16", &[2, 64, 64]);
    dev.t.device.device_type = 10;
    let mut b = a;
    b.out_w2 = dev.ptr();
    fails(
        call(&b),
        INVALID,
        &["w13: expected device rocm:0 like out_w2 (inputs and outputs of a prep call must be on one device), got cpu:0"],
    );
    fails(
        unsafe { moeplug_prepare_moe(std::ptr::null(), std::ptr::null_mut()) },
        INVALID,
        &["args: must not be NULL"],
    );
}
