//! Every golden case of the preparation functions (tests/golden, produced by AITER as
//! tests/golden/manifest.json records), reproduced byte for byte through the C exports or the
//! core codecs.
//! Bytes upstream leaves undefined are skipped through the shipped defined-masks.

mod common;

use common::*;
use moeplug::capi::types::*;
use moeplug::prep::maps::{interleave16_source_row, w13_source_row};
use moeplug::quant;
use moeplug::types::{GateMode, RoundMode};
use serde_json::Value;

fn args_layout(c: &Value) -> (i32, i32) {
    let l = &c["args"]["layout"];
    (l[0].as_i64().unwrap() as i32, l[1].as_i64().unwrap() as i32)
}

fn flag(c: &Value, k: &str) -> bool {
    c["args"][k].as_bool().unwrap_or(false)
}

#[test]
fn shuffle_weight_f1_and_f2_cases() {
    let names = [
        "sw_fp4_e2_n32_kb64",
        "sw_fp8_e2_n32_k64",
        "sw_bf16_e2_n32_k64",
        "sw_fp8_2d_n48_k96",
        "sw_fp8_layout32x16",
        "sw_int8_use_int4",
        "sw_int8_pad_k_to_128",
        "swgu_fp4_gateup_e3_n64_kb128",
        "swgu_fp4_nogu_e3_n32_kb128",
        "swgu_fp8_gateup_e2_n64_k128",
        "swgu_fp4_gateup_nlane32",
    ];
    for name in names {
        let c = case(name);
        let x = tensor(c, "input", "x");
        let want = tensor(c, "output", "out");
        let pad = c["args"]["pad_k_to"].as_i64().unwrap_or(0);
        let got = shuffle_weight(
            &x,
            &want.shape,
            args_layout(c),
            flag(c, "use_int4"),
            flag(c, "is_guinterleave"),
            flag(c, "gate_up"),
            pad,
        );
        assert_bytes(&got, &want.bytes, None, name);
    }
}

#[test]
fn shuffle_weight_a16w4_wrappers() {
    for name in ["a16w4_wrapper_fp4_gateup", "a16w4_wrapper_fp4_nogu"] {
        let c = case(name);
        let x = tensor(c, "input", "x");
        let want = tensor(c, "output", "out");
        let nlane = c["args"]["NLane"].as_i64().unwrap() as i32;
        let got = shuffle_weight(
            &x,
            &want.shape,
            (nlane, 16),
            false,
            true,
            flag(c, "gate_up"),
            0,
        );
        assert_bytes(&got, &want.bytes, None, name);
    }
}

#[test]
fn packed_fp4_given_with_its_logical_shape() {
    // {17, 4, 1} with the logical K (values) must behave like the uint8 byte view.
    let c = case("sw_fp4_e2_n32_kb64");
    let x = tensor(c, "input", "x");
    let want = tensor(c, "output", "out");
    let mut src = x.bytes.clone();
    let mut out = vec![0u8; want.bytes.len()];
    let logical = [2, 32, 128];
    let s = Dl::new(src.as_mut_ptr(), 17, 4, &logical);
    let d = Dl::new(out.as_mut_ptr(), 17, 4, &logical);
    let a = shuffle_weight_args(&s, &d, (0, 0), false, false, false, 0);
    ok(unsafe { moeplug_shuffle_weight(&a, std::ptr::null_mut()) });
    assert_bytes(&out, &want.bytes, None, "fp4 logical shape");
}

#[test]
fn fact_f1_equals_f2_without_gate_up() {
    let c = case("fact_F1_equals_F2_nogu_bytes");
    let x = tensor(c, "input", "x");
    let standard = tensor(c, "output", "standard");
    let a16w4 = tensor(c, "output", "a16w4_nogu");
    let f1 = shuffle_weight(&x, &x.shape, (16, 16), false, false, false, 0);
    let f2 = shuffle_weight(&x, &x.shape, (16, 16), false, true, false, 0);
    assert_bytes(&f1, &standard.bytes, None, "F1");
    assert_bytes(&f2, &a16w4.bytes, None, "F2");
    assert_eq!(f1, f2);
}

/// Rows of `[E, N, K]` re-ordered into 16-row gate/up blocks (AITER INTERLEAVE).
fn interleave16(x: &G) -> G {
    let (e, n, k) = (x.shape[0], x.shape[1], x.shape[2]);
    let mut out = vec![0u8; x.bytes.len()];
    for ex in 0..e {
        for p in 0..n {
            let r = interleave16_source_row(p, n / 2, 16);
            let (d, s) = ((ex * n + p) * k, (ex * n + r) * k);
            out[d..d + k].copy_from_slice(&x.bytes[s..s + k]);
        }
    }
    G {
        bytes: out,
        shape: x.shape.clone(),
        dtype: x.dtype.clone(),
    }
}

#[test]
fn fact_f2_gate_up_equals_f1_of_interleave16() {
    let c = case("fact_F2_gateup_equals_F1_of_row16_interleave");
    let x = tensor(c, "input", "x");
    let a = tensor(c, "output", "a16w4_gateup");
    let b = tensor(c, "output", "standard_of_interleaved");
    let f2 = shuffle_weight(&x, &x.shape, (16, 16), false, true, true, 0);
    let f1 = shuffle_weight(
        &interleave16(&x),
        &x.shape,
        (16, 16),
        false,
        false,
        false,
        0,
    );
    assert_bytes(&f2, &a.bytes, None, "F2 gate_up");
    assert_bytes(&f1, &b.bytes, None, "F1 of interleave16");
}

#[test]
fn shuffle_scale_f3_cases_with_masks() {
    for name in [
        "ss_aligned_256x8",
        "ss_aligned_512x16_e8m0",
        "ss_unaligned_80x5",
        "ss_unaligned_300x12_e8m0",
    ] {
        let c = case(name);
        let x = tensor(c, "input", "scale");
        let want = tensor(c, "output", "out");
        let mask = tensor(c, "aux", "defined_mask");
        let got = shuffle_scale(&x, &want.shape, 0, false, false);
        assert_bytes(&got, &want.bytes, Some(&mask.bytes), name);
        // moeplug's own padding contract: undefined bytes are 0x00.
        for (i, &m) in mask.bytes.iter().enumerate() {
            if m == 0 {
                assert_eq!(got[i], 0, "{name}: padding byte {i}");
            }
        }
    }
}

#[test]
fn shuffle_scale_f4_cases() {
    for name in [
        "ssgu_gateup_e2_n64_k8",
        "ssgu_nogu_e2_n32_k8",
        "ssgu_gateup_e3_n64_k16",
        "ssgu_gateup_kpad_e2_n64_k6",
        "ss_a16w4_wrapper_gateup",
        "ss_a16w4_wrapper_nogu",
    ] {
        let c = case(name);
        let x = tensor(c, "input", "scale");
        let want = tensor(c, "output", "out");
        let e = c["args"]["experts_cnt"].as_i64().unwrap() as i32;
        let got = shuffle_scale(&x, &want.shape, e, true, flag(c, "gate_up"));
        assert_bytes(&got, &want.bytes, None, name);
    }
}

#[test]
fn fact_f4_without_gate_up_equals_e8m0_shuffle() {
    let c = case("fact_a16w4_nogu_equals_e8m0_shuffle");
    let x = tensor(c, "input", "scale");
    let a = tensor(c, "output", "a16w4");
    let b = tensor(c, "output", "e8m0");
    let f4 = shuffle_scale(&x, &a.shape, 2, true, false);
    let f3 = shuffle_scale(&x, &b.shape, 0, false, false);
    assert_bytes(&f4, &a.bytes, None, "F4");
    assert_bytes(&f3, &b.bytes, None, "F3");
    assert_eq!(f3, f4);
}

#[test]
fn shuffle_scale_fp32_passes_through() {
    let c = case("ss_fp32_passthrough");
    let x = tensor(c, "input", "scale");
    let want = tensor(c, "output", "out");
    let got = shuffle_scale(&x, &want.shape, 0, false, false);
    assert_bytes(&got, &want.bytes, None, "fp32");
}

#[test]
fn cdna4_swizzle_cases() {
    for name in ["cdna4_swz_e2_n64_sk8", "cdna4_swz_e1_n40_sk5_padded"] {
        let c = case(name);
        let mut x = tensor(c, "input", "scale_checkpoint_ENK");
        let want = tensor(c, "output", "swizzled_memory_image");
        let mut out = vec![0xAAu8; want.bytes.len()];
        let s = Dl::of(&mut x.bytes, &x.dtype, &x.shape);
        let d = Dl::of(&mut out, &want.dtype, &want.shape);
        for layout in [0, 3] {
            let a = moeplug_swizzle_scale_args {
                struct_size: std::mem::size_of::<moeplug_swizzle_scale_args>() as u32,
                src: s.ptr(),
                dst: d.ptr(),
                layout,
                out_fragment: std::ptr::null_mut(),
            };
            ok(unsafe { moeplug_swizzle_scale(&a, std::ptr::null_mut()) });
            assert_bytes(&out, &want.bytes, None, name);
        }
    }
}

#[test]
fn f32_to_mxfp4_table() {
    let c = case("f32_to_mxfp4_table");
    let x = tensor(c, "input", "x");
    let want = tensor(c, "output", "packed");
    let vals: Vec<f32> = x
        .bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let nibbles: Vec<u8> = vals.iter().map(|&v| quant::f32_to_e2m1(v)).collect();
    let expect: Vec<u8> = c["args"]["nibbles_out"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u8)
        .collect();
    assert_eq!(nibbles, expect);
    let packed: Vec<u8> = nibbles
        .chunks_exact(2)
        .map(|p| quant::pack_fp4x2(p[0], p[1]))
        .collect();
    assert_bytes(&packed, &want.bytes, None, "packed");
}

fn f32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn mxfp4_and_e8m0_decoders_on_all_bytes() {
    let c = case("mxfp4_to_f32_all_bytes");
    let want = f32s(&tensor(c, "output", "f32").bytes);
    let got: Vec<u32> = (0..=255u8)
        .flat_map(quant::fp4x2_to_f32)
        .map(f32::to_bits)
        .collect();
    assert_eq!(got, want);
    let c = case("e8m0_to_f32_all_bytes");
    let want = f32s(&tensor(c, "output", "f32").bytes);
    let got: Vec<u32> = (0..=255u8)
        .map(|b| quant::e8m0_to_f32(b).to_bits())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn e8m0_scale_all_modes_and_dtypes() {
    let c = case("f32_to_mx_e8m0_scale_modes");
    let amax: Vec<f32> = f32s(&tensor(c, "input", "amax").bytes)
        .into_iter()
        .map(f32::from_bits)
        .collect();
    let modes = [
        RoundMode::Down,
        RoundMode::Up,
        RoundMode::Even,
        RoundMode::Ceil,
    ];
    let dtypes = [
        ("fp4", quant::MxDtype::Fp4E2m1),
        ("fp8e4m3", quant::MxDtype::Fp8E4m3),
        ("fp8e4m3fnuz", quant::MxDtype::Fp8E4m3Fnuz),
    ];
    for (mi, mode) in modes.iter().enumerate() {
        for (dn, dt) in dtypes {
            let want = tensor(c, "output", &format!("mode{mi}_{dn}")).bytes;
            let got: Vec<u8> = amax
                .iter()
                .map(|&a| quant::e8m0_scale_from_amax(a, *mode, dt))
                .collect();
            assert_eq!(got, want, "mode {mi} {dn}");
        }
    }
}

/// `moeplug_quantize_mx` of a golden bf16 input; returns (q, scale).
fn quantize(
    x: &G,
    format: i32,
    q_dtype: &str,
    q_shape: &[usize],
    s_shape: &[usize],
    mode: i32,
    shuffle: bool,
) -> (Vec<u8>, Vec<u8>) {
    let mut src = x.bytes.clone();
    let mut q = vec![0xAAu8; q_shape.iter().product()];
    let mut sc = vec![0xAAu8; s_shape.iter().product()];
    let s = Dl::of(&mut src, &x.dtype, &x.shape);
    let dq = Dl::of(&mut q, q_dtype, q_shape);
    let ds = Dl::of(&mut sc, "float8_e8m0fnu", s_shape);
    let a = moeplug_quantize_mx_args {
        struct_size: std::mem::size_of::<moeplug_quantize_mx_args>() as u32,
        src: s.ptr(),
        dst_q: dq.ptr(),
        dst_scale: ds.ptr(),
        format,
        round_mode: mode,
        shuffle_scale: shuffle as i32,
        out_fragment: std::ptr::null_mut(),
    };
    ok(unsafe { moeplug_quantize_mx(&a, std::ptr::null_mut()) });
    (q, sc)
}

#[test]
fn per_1x32_f4_quant_all_modes() {
    for mode in 0..4 {
        let name = format!("per_1x32_f4_quant_mode{mode}");
        let c = case(&name);
        let x = tensor(c, "input", "x");
        let wq = tensor(c, "output", "q");
        let ws = tensor(c, "output", "scale");
        let (q, s) = quantize(&x, 6, "uint8", &wq.shape, &ws.shape, mode + 1, false);
        assert_bytes(&q, &wq.bytes, None, &format!("{name} q"));
        assert_bytes(&s, &ws.bytes, None, &format!("{name} scale"));
        // The decoders agree with upstream's dequantization.
        let deq = f32s(&tensor(c, "output", "dequant_f32").bytes);
        let k = x.shape[1];
        for (idx, want) in deq.iter().enumerate() {
            let (r, col) = (idx / k, idx % k);
            let v = quant::fp4x2_to_f32(q[r * k / 2 + col / 2])[col % 2]
                * quant::e8m0_to_f32(s[r * k / 32 + col / 32]);
            assert_eq!(v.to_bits(), *want, "{name} dequant {idx}");
        }
    }
    // Also through the core quantizer directly (the path fused_moe uses).
    let c = case("per_1x32_f4_quant_mode1");
    let x = tensor(c, "input", "x");
    let vals: Vec<half::bf16> = x
        .bytes
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
        .collect();
    let mut q = vec![0u8; 64 * 64];
    let mut s = vec![0u8; 64 * 4];
    quant::quantize_mx(
        quant::MxSource::Bf16(&vals),
        128,
        RoundMode::Up,
        quant::MxDtype::Fp4E2m1,
        &mut q,
        &mut s,
    );
    assert_bytes(&q, &tensor(c, "output", "q").bytes, None, "core q");
    assert_bytes(&s, &tensor(c, "output", "scale").bytes, None, "core scale");
}

#[test]
fn per_1x32_f4_quant_shuffled_scale() {
    let c = case("per_1x32_f4_quant_shuffled");
    let x = tensor(c, "input", "x");
    let wq = tensor(c, "output", "q");
    let ws = tensor(c, "output", "scale_shuffled");
    let mask = tensor(c, "aux", "scale_defined_mask");
    let (q, s) = quantize(&x, 0, "uint8", &wq.shape, &ws.shape, 0, true);
    assert_bytes(&q, &wq.bytes, None, "q");
    assert_bytes(&s, &ws.bytes, Some(&mask.bytes), "scale");
}

#[test]
fn per_1x32_f8_quant_e8m0() {
    let c = case("per_1x32_f8_quant_e8m0");
    let x = tensor(c, "input", "x");
    let wq = tensor(c, "output", "q");
    let ws = tensor(c, "output", "scale");
    let (q, s) = quantize(&x, 7, "float8_e4m3fn", &wq.shape, &ws.shape, 2, false);
    assert_bytes(&q, &wq.bytes, None, "q");
    assert_bytes(&s, &ws.bytes, None, "scale");
}

#[test]
fn interleave_gate_up_rows_matches_the_row_map() {
    // Golden: GGUU -> g0,u0,g1,u1 rows. moeplug reads that order as INTERLEAVE_ROWS.
    let c = case("interleave_gate_up_rows");
    let x = tensor(c, "input", "x");
    let want = tensor(c, "output", "out");
    let (e, n, k) = (x.shape[0], x.shape[1], x.shape[2]);
    let inter = n / 2;
    for ex in 0..e {
        for g in 0..2 {
            for j in 0..inter {
                let phys = w13_source_row(GateMode::InterleaveRows, g, j, inter);
                let s = (ex * n + g * inter + j) * k;
                let d = (ex * n + phys) * k;
                assert_eq!(&want.bytes[d..d + k], &x.bytes[s..s + k], "row {g} {j}");
            }
        }
    }
}

/// Rows of `[E, 2I, K]` (SEPARATED) re-ordered into `mode`.
fn to_gate_mode(x: &[u8], e: usize, inter: usize, k: usize, mode: GateMode) -> Vec<u8> {
    let mut out = vec![0u8; x.len()];
    for ex in 0..e {
        for g in 0..2 {
            for j in 0..inter {
                let s = (ex * 2 * inter + g * inter + j) * k;
                let d = (ex * 2 * inter + w13_source_row(mode, g, j, inter)) * k;
                out[d..d + k].copy_from_slice(&x[s..s + k]);
            }
        }
    }
    out
}

/// `moeplug_prepare_moe` on MXFP4 weights; returns (w13, w13_scale, w2, w2_scale, layout).
fn prepare_mxfp4(
    w1: &[u8],
    s1: &[u8],
    w2: &[u8],
    s2: &[u8],
    mode: GateMode,
) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>, moeplug_layout) {
    let (e, h, i) = (4usize, 256usize, 128usize);
    let (mut w1, mut s1, mut w2, mut s2) = (w1.to_vec(), s1.to_vec(), w2.to_vec(), s2.to_vec());
    let tw1 = Dl::of(&mut w1, "uint8", &[e, 2 * i, h / 2]);
    let ts1 = Dl::of(&mut s1, "float8_e8m0fnu", &[e * 2 * i, h / 32]);
    let tw2 = Dl::of(&mut w2, "uint8", &[e, h, i / 2]);
    let ts2 = Dl::of(&mut s2, "float8_e8m0fnu", &[e * h, i / 32]);
    let mut args = moeplug_prepare_moe_args {
        struct_size: std::mem::size_of::<moeplug_prepare_moe_args>() as u32,
        weight_format: 6,
        gate_mode_in: mode as i32,
        device_type: 0,
        device_id: 0,
        act_dtype: 0,
        hidden_align: 0,
        // 32 is raised to the 64 F1 needs for packed fp4: I stays 128.
        intermediate_align: 32,
        w13: tw1.ptr(),
        w13_scale: ts1.ptr(),
        w13_bias: std::ptr::null(),
        w2: tw2.ptr(),
        w2_scale: ts2.ptr(),
        w2_bias: std::ptr::null(),
        out_w13: std::ptr::null(),
        out_w13_scale: std::ptr::null(),
        out_w13_bias: std::ptr::null(),
        out_w2: std::ptr::null(),
        out_w2_scale: std::ptr::null(),
        out_w2_bias: std::ptr::null(),
        out_layout: std::ptr::null_mut(),
        target: 0,
    };
    let mut sizes: moeplug_prepare_moe_sizes_out = unsafe { std::mem::zeroed() };
    sizes.struct_size = std::mem::size_of_val(&sizes) as u32;
    ok(unsafe { moeplug_prepare_moe_sizes(&args, &mut sizes) });
    assert_eq!(sizes.w13_ndim, 3);
    assert_eq!(sizes.w13_shape, [4, 256, 128, 0]);
    assert_eq!(sizes.w13_scale_shape, [1024, 8, 0, 0]);
    assert_eq!(sizes.w2_shape, [4, 256, 64, 0]);
    assert_eq!(sizes.w2_scale_shape, [1024, 8, 0, 0]);
    assert_eq!(sizes.w13_bias_ndim, 0);
    let mut o1 = vec![0xAAu8; sizes.w13_bytes as usize];
    let mut os1 = vec![0xAAu8; sizes.w13_scale_bytes as usize];
    let mut o2 = vec![0xAAu8; sizes.w2_bytes as usize];
    let mut os2 = vec![0xAAu8; sizes.w2_scale_bytes as usize];
    let to1 = Dl::of(&mut o1, "uint8", &[4, 256, 128]);
    let tos1 = Dl::of(&mut os1, "float8_e8m0fnu", &[1024, 8]);
    let to2 = Dl::of(&mut o2, "uint8", &[4, 256, 64]);
    let tos2 = Dl::of(&mut os2, "float8_e8m0fnu", &[1024, 8]);
    let mut layout: moeplug_layout = unsafe { std::mem::zeroed() };
    layout.struct_size = std::mem::size_of_val(&layout) as u32;
    args.out_w13 = to1.ptr();
    args.out_w13_scale = tos1.ptr();
    args.out_w2 = to2.ptr();
    args.out_w2_scale = tos2.ptr();
    args.out_layout = &mut layout;
    ok(unsafe { moeplug_prepare_moe(&args, std::ptr::null_mut()) });
    assert_eq!(sizes.layout.hidden_padded, layout.hidden_padded);
    (o1, os1, o2, os2, layout)
}

#[test]
fn moe_weight_packs_mxfp4_all_pairings() {
    let c = case("moe_weight_packs_mxfp4");
    let w1 = tensor(c, "input", "w1_fp4");
    let s1 = tensor(c, "input", "w1_scale_e8m0");
    let w2 = tensor(c, "input", "w2_fp4");
    let s2 = tensor(c, "input", "w2_scale_e8m0");
    let out = |n: &str| tensor(c, "output", n);
    let mask = tensor(c, "aux", "SEPARATED_w2_scale_defined_mask");

    // SEPARATED-standard through prepare_moe, from each checkpoint row order.
    for mode in [
        GateMode::Separated,
        GateMode::Interleave,
        GateMode::InterleaveRows,
    ] {
        let w1m = to_gate_mode(&w1.bytes, 4, 128, 128, mode);
        let s1m = to_gate_mode(&s1.bytes, 4, 128, 8, mode);
        let (o1, os1, o2, os2, layout) = prepare_mxfp4(&w1m, &s1m, &w2.bytes, &s2.bytes, mode);
        let what = format!("prepare_moe from {mode:?}");
        assert_bytes(&o1, &out("SEPARATED_w1").bytes, None, &what);
        assert_bytes(&os1, &out("SEPARATED_w1_scale").bytes, None, &what);
        assert_bytes(&o2, &out("SEPARATED_w2").bytes, None, &what);
        assert_bytes(
            &os2,
            &out("SEPARATED_w2_scale").bytes,
            Some(&mask.bytes),
            &what,
        );
        assert_eq!(
            (
                layout.weight_format,
                layout.gate_mode,
                layout.weight_layout,
                layout.scale_layout,
                layout.num_experts
            ),
            (6, 1, 2, 2, 4)
        );
        assert_eq!(
            (
                layout.hidden_size,
                layout.intermediate_size,
                layout.hidden_padded,
                layout.intermediate_padded,
                layout.flags
            ),
            (256, 128, 256, 128, 0)
        );
    }

    // The primitives for the other pairings.
    let sw = |x: &G, gui, gu| shuffle_weight(x, &x.shape, (16, 16), false, gui, gu, 0);
    assert_bytes(
        &sw(&w1, false, false),
        &out("SEPARATED_w1").bytes,
        None,
        "F1 w1",
    );
    assert_bytes(
        &sw(&w1, true, false),
        &out("A16W4_GGUU_w1").bytes,
        None,
        "F2 w1",
    );
    assert_bytes(
        &sw(&w1, true, true),
        &out("INTERLEAVE_w1").bytes,
        None,
        "F2 gu w1",
    );
    assert_bytes(&sw(&w2, true, false), &out("A16W4_w2").bytes, None, "F2 w2");
    assert_bytes(
        &sw(&w2, false, false),
        &out("SEPARATED_w2").bytes,
        None,
        "F1 w2",
    );
    let ss = |x: &G, shape: &[usize], e, gui, gu| shuffle_scale(x, shape, e, gui, gu);
    let s1o = [1024, 8];
    assert_bytes(
        &ss(&s1, &s1o, 0, false, false),
        &out("SEPARATED_w1_scale").bytes,
        None,
        "F3 s1",
    );
    assert_bytes(
        &ss(&s1, &s1o, 4, true, false),
        &out("A16W4_GGUU_w1_scale").bytes,
        None,
        "F4 s1",
    );
    assert_bytes(
        &ss(&s1, &s1o, 4, true, true),
        &out("INTERLEAVE_w1_scale").bytes,
        None,
        "F4 gu s1",
    );
    assert_bytes(
        &ss(&s2, &s1o, 4, true, false),
        &out("A16W4_w2_scale").bytes,
        None,
        "F4 s2",
    );
    assert_bytes(
        &ss(&s2, &s1o, 0, false, false),
        &out("SEPARATED_w2_scale").bytes,
        Some(&mask.bytes),
        "F3 s2",
    );
}
