//! INT4_PER_CHANNEL (AITER a8w4 int4, Quark int4-fp8): AITER's `convert_int8_to_uint32_int4`,
//! `rearrange_4bit_elements` and `shuffle_weight(.., use_int4=True)` byte for byte (golden
//! vectors made by running AITER's functions, tests/golden/aiter_int4_per_channel.json),
//! `prepare_moe` from int8-held values and from packed words, what the caps,
//! `moeplug_check_fused_moe`, `moeplug_resolve_config` and `moeplug_aiter_args` answer, and
//! the refusals with their exact messages.

mod common;

use moeplug::backend;
use moeplug::error::Status;
use moeplug::prep::int4;
use moeplug::prep::request::{run_host, PrepareMoe, PrepareTarget, PrepareTargetArgs};
use moeplug::tensor::{DeviceKind, ElemType, Tensor};
use moeplug::types::{GateMode, WeightFormat, WeightLayout};

const INT4_PER_CHANNEL: i32 = 9;

/// A tensor of tests/golden/aiter_int4_per_channel.json (made from AITER at e4048607):
/// bytes and shape.
fn golden(case: &str, role: &str, name: &str) -> (Vec<u8>, Vec<usize>) {
    let m = common::manifest_in("aiter_int4_per_channel.json");
    assert_eq!(
        m["aiter_commit"],
        "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
    );
    let g = common::tensor(common::case_of(&m, case), role, name);
    (g.bytes, g.shape)
}

/// convert_int8_to_uint32_int4 then rearrange_4bit_elements is moeplug's word packing; the
/// intermediate (value j in nibble j) shows that the rearrangement is the nibble order.
#[test]
fn word_packing_is_aiters() {
    let (x, shape) = golden("convert_int8_to_uint32_int4", "input", "x");
    let (plain, _) = golden("convert_int8_to_uint32_int4", "output", "out");
    let (u, _) = golden("rearrange_4bit_elements", "input", "x");
    let (want, out_shape) = golden("rearrange_4bit_elements", "output", "out");
    assert_eq!(u, plain);
    assert_eq!(out_shape, [shape[0], shape[1], shape[2] / 8]);
    let mut got = vec![0u8; x.len() / 2];
    int4::pack_int8_to_a8w4_words(&x, &mut got);
    assert_eq!(got, want);
    // Nibble j of AITER's unrearranged word holds value j: the golden input says where each
    // value went.
    for (w, v) in want.chunks_exact(4).zip(x.chunks_exact(8)) {
        let w = u32::from_le_bytes(w.try_into().unwrap());
        for (j, &val) in v.iter().enumerate() {
            let nib = (w >> (4 * int4::A8W4_NIBBLE_OF_VALUE[j])) & 15;
            assert_eq!(nib as u8, val & 15);
        }
    }
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn host(name: &'static str, bytes: &mut [u8], elem: ElemType, shape: &[usize]) -> Tensor {
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Tensor {
        name,
        ptr: bytes.as_mut_ptr(),
        device: DeviceKind::Cpu,
        device_id: 0,
        elem,
        shape: shape.to_vec(),
    }
}

fn target(device_type: i32) -> moeplug::error::Result<PrepareTarget> {
    PrepareTarget::new(PrepareTargetArgs {
        weight_format: INT4_PER_CHANNEL,
        gate_mode_in: 0,
        device_type,
        device_id: 0,
        act_dtype: 0,
        hidden_align: 0,
        intermediate_align: 0,
        target: 0,
    })
}

struct Outs {
    w13: Vec<u8>,
    w2: Vec<u8>,
    s13: Vec<u8>,
    s2: Vec<u8>,
    layout: moeplug::layout::Layout,
}

/// prepare_moe on host tensors: weights `elem` (int8-held values, or uint32/int32 words of
/// the same values packed by the test's caller), fp32 scales `[E, N, 1]`; outputs `out_elem`.
#[allow(clippy::too_many_arguments)]
fn prepare(
    elem: ElemType,
    out_elem: ElemType,
    w13: &[u8],
    w2: &[u8],
    s13: &[u8],
    s2: &[u8],
    e: usize,
    h: usize,
    i: usize,
) -> moeplug::error::Result<Outs> {
    let div = if elem == ElemType::I8 { 1 } else { 8 };
    let (mut w13, mut w2) = (w13.to_vec(), w2.to_vec());
    let (mut s13, mut s2) = (s13.to_vec(), s2.to_vec());
    let req = PrepareMoe {
        target: target(0)?,
        w13: host("w13", &mut w13, elem, &[e, 2 * i, h / div]),
        w2: host("w2", &mut w2, elem, &[e, h, i / div]),
        w13_scale: Some(host("w13_scale", &mut s13, ElemType::F32, &[e, 2 * i, 1])),
        w2_scale: Some(host("w2_scale", &mut s2, ElemType::F32, &[e, h, 1])),
        w13_bias: None,
        w2_bias: None,
    };
    let plan = req.plan()?;
    let mut o13 = vec![0xAAu8; plan.w13_bytes()];
    let mut o2 = vec![0xAAu8; plan.w2_bytes()];
    let mut os13 = vec![0xAAu8; plan.w13_scale_bytes()];
    let mut os2 = vec![0xAAu8; plan.w2_scale_bytes()];
    let outs = [
        Some(host("out_w13", &mut o13, out_elem, &plan.w13)),
        Some(host("out_w2", &mut o2, out_elem, &plan.w2)),
        Some(host(
            "out_w13_scale",
            &mut os13,
            ElemType::F32,
            plan.w13_scale.as_ref().unwrap(),
        )),
        Some(host(
            "out_w2_scale",
            &mut os2,
            ElemType::F32,
            plan.w2_scale.as_ref().unwrap(),
        )),
        None,
        None,
    ];
    let (job, layout) = req.job(outs)?;
    // SAFETY: every tensor names a live Vec of its size for the call.
    unsafe { run_host(&job)? };
    Ok(Outs {
        w13: o13,
        w2: o2,
        s13: os13,
        s2: os2,
        layout,
    })
}

/// prepare_moe gives AITER's a8w4 bytes (test_moe_2stage.py's preparation, run by AITER)
/// from int8-held values and from the unshuffled words, uint32 or int32; the fp32 scales pass
/// through as AITER's shuffle_scale passes them.
#[test]
fn prepare_moe_gives_aiters_a8w4_int4_bytes() {
    let (x13, sh13) = golden("a8w4_int4_weight_w13", "input", "x");
    let (x2, sh2) = golden("a8w4_int4_weight_w2", "input", "x");
    let (want13, _) = golden("a8w4_int4_weight_w13", "output", "out");
    let (want2, _) = golden("a8w4_int4_weight_w2", "output", "out");
    let (words13, _) = golden("a8w4_int4_words_w13", "output", "out");
    let (words2, _) = golden("a8w4_int4_words_w2", "output", "out");
    assert_eq!(golden("a8w4_int4_words_w13", "input", "x").0, x13);
    let (s13, _) = golden("shuffle_scale_fp32_w13", "input", "scale");
    let (s2, _) = golden("shuffle_scale_fp32_w2", "input", "scale");
    let (e, h, i) = (sh2[0], sh2[1], sh2[2]);
    assert_eq!(sh13, [e, 2 * i, h]);
    for (elem, out_elem, w13, w2) in [
        (ElemType::I8, ElemType::U32, &x13, &x2),
        (ElemType::I8, ElemType::I32, &x13, &x2),
        (ElemType::U32, ElemType::U32, &words13, &words2),
        (ElemType::I32, ElemType::I32, &words13, &words2),
    ] {
        let o = prepare(elem, out_elem, w13, w2, &s13, &s2, e, h, i).unwrap();
        assert_eq!(o.w13, want13, "{elem:?}");
        assert_eq!(o.w2, want2, "{elem:?}");
        assert_eq!(o.s13, golden("shuffle_scale_fp32_w13", "output", "out").0);
        assert_eq!(o.s2, golden("shuffle_scale_fp32_w2", "output", "out").0);
        let l = &o.layout;
        assert_eq!(
            (
                l.weight_format,
                l.weight_layout,
                l.scale_layout,
                l.gate_mode
            ),
            (
                WeightFormat::Int4PerChannel,
                WeightLayout::Aiter16x16,
                None,
                GateMode::Separated
            )
        );
        assert_eq!((l.hidden_padded, l.intermediate_padded), (h, i));
    }
}

/// Padding: H 40 and I 24 go to 64 and 32 (the 32-value tiles of use_int4), the padded
/// values and scales zero; the result is the golden-checked packing of AITER's F1 of the
/// zero-padded int8 values.
#[test]
fn prepare_moe_pads_with_zero_values() {
    let (e, h, i) = (1usize, 40usize, 24usize);
    let vals = |n: usize, seed: usize| -> Vec<u8> {
        (0..n)
            .map(|k| (((k * 7 + seed) % 16) as i8 - 8) as u8)
            .collect()
    };
    let (w13, w2) = (vals(e * 2 * i * h, 1), vals(e * h * i, 5));
    let f32s = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|k| (0.01 + k as f32 * 1e-3).to_le_bytes())
            .collect()
    };
    let (s13, s2) = (f32s(e * 2 * i), f32s(e * h));
    let o = prepare(ElemType::I8, ElemType::U32, &w13, &w2, &s13, &s2, e, h, i).unwrap();
    let (hp, ip) = (64usize, 32usize);
    assert_eq!(
        (o.layout.hidden_padded, o.layout.intermediate_padded),
        (hp, ip)
    );
    // [rows, k] int8 values → zero-padded [rows_pad, k_pad] (gate and up halves each).
    let pad = |x: &[u8], blocks: usize, r: (usize, usize), c: (usize, usize)| {
        let mut out = vec![0u8; blocks * r.1 * c.1];
        for b in 0..blocks {
            for row in 0..r.0 {
                let (s, d) = ((b * r.0 + row) * c.0, (b * r.1 + row) * c.1);
                out[d..d + c.0].copy_from_slice(&x[s..s + c.0]);
            }
        }
        out
    };
    // AITER's F1 with use_int4: tiles of 16 rows x 32 values (docs/layouts.md §2.1).
    let f1 = |x: &[u8], rows: usize, k: usize| {
        let mut out = Vec::new();
        for n0 in (0..rows).step_by(16) {
            for k0 in (0..k).step_by(32) {
                for r in n0..n0 + 16 {
                    out.extend_from_slice(&x[r * k + k0..r * k + k0 + 32]);
                }
            }
        }
        out
    };
    let words = |x: &[u8]| {
        let mut out = vec![0u8; x.len() / 2];
        int4::pack_int8_to_a8w4_words(x, &mut out);
        out
    };
    let w13p = pad(&w13, e * 2, (i, ip), (h, hp));
    let w2p = pad(&w2, e, (h, hp), (i, ip));
    assert_eq!(o.w13, words(&f1(&w13p, e * 2 * ip, hp)));
    assert_eq!(o.w2, words(&f1(&w2p, e * hp, ip)));
    assert_eq!(o.s13, pad(&s13, e * 2, (i, ip), (4, 4)));
    assert_eq!(o.s2, pad(&s2, e, (h, hp), (4, 4)));
}

fn fails(r: moeplug::error::Result<impl Sized>, status: Status, message: &str) {
    match r {
        Ok(_) => panic!("expected {status:?}: {message}"),
        Err(err) => {
            assert_eq!(err.status, status, "{}", err.message);
            assert_eq!(err.message, message);
        }
    }
}

#[test]
fn prepare_moe_refusals() {
    let (e, h, i) = (1usize, 64usize, 32usize);
    let w13 = vec![0u8; e * 2 * i * h];
    let w2 = vec![0u8; e * h * i];
    let s13 = vec![0u8; e * 2 * i * 4];
    let s2 = vec![0u8; e * h * 4];
    let mut bad = w2.clone();
    bad[5] = 8;
    fails(
        prepare(ElemType::I8, ElemType::U32, &w13, &bad, &s13, &s2, e, h, i),
        Status::InvalidArgument,
        "w2: int8-held int4 values must lie in [-8, 7], got 8 at flat index 5",
    );
    bad[5] = (-9i8) as u8;
    fails(
        prepare(ElemType::I8, ElemType::U32, &w13, &bad, &s13, &s2, e, h, i),
        Status::InvalidArgument,
        "w2: int8-held int4 values must lie in [-8, 7], got -9 at flat index 5",
    );
    fails(
        prepare(ElemType::I8, ElemType::I8, &w13, &w2, &s13, &s2, e, h, i),
        Status::InvalidArgument,
        "out_w13: expected dtype uint32 or int32, got int8",
    );
    // Words must keep the input's dtype (no int32 → uint32 reinterpretation in between).
    let (w13w, w2w) = (vec![0u8; w13.len() / 2], vec![0u8; w2.len() / 2]);
    fails(
        prepare(
            ElemType::U32,
            ElemType::I32,
            &w13w,
            &w2w,
            &s13,
            &s2,
            e,
            h,
            i,
        ),
        Status::InvalidArgument,
        "out_w13: expected dtype uint32 (like w13), got int32",
    );
    // H = 36 is not a whole number of words.
    let (h36, i36) = (36usize, 32usize);
    fails(
        prepare(
            ElemType::I8,
            ElemType::U32,
            &vec![0u8; 2 * i36 * h36],
            &vec![0u8; h36 * i36],
            &s13,
            &vec![0u8; h36 * 4],
            e,
            h36,
            i36,
        ),
        Status::InvalidArgument,
        "w13: int4_per_channel needs H and I multiples of 8 (eight values per uint32 word), got \
         H = 36, I = 32",
    );
    fails(
        prepare(ElemType::U8, ElemType::U8, &w13w, &w2w, &s13, &s2, e, h, i),
        Status::InvalidArgument,
        "w13: expected dtype uint32 or int32 or int8, got uint8",
    );
}

/// The CPU backend and the CUDA one (fp32 family) claim the format.
#[test]
fn caps_claim_int4_per_channel() {
    let bit = WeightFormat::Int4PerChannel.bit();
    let cpu = backend::cpu::backend().caps();
    assert_ne!(cpu.weight_formats & bit, 0);
    let cuda = backend::gpu::gpu_caps("sm_90", "13.0");
    assert_eq!(cuda.weight_formats, cpu.weight_formats);
}

/// moeplug_check_fused_moe on the CPU: the act dtypes of fp8 per channel pass with both
/// weight layouts, the others and unaligned records name their rule.
#[test]
fn check_fused_moe_answers_for_int4_per_channel_records() {
    use common::layout;
    use moeplug::capi::types::{moeplug_fused_moe_args, moeplug_layout};
    use moeplug::capi::{moeplug_check_fused_moe, moeplug_last_error};
    let check = |l: &moeplug_layout, act_dtype: i32| {
        let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
        a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
        a.layout = l;
        a.act_dtype = act_dtype;
        let st = unsafe { moeplug_check_fused_moe(1, 0, &a) } as i32;
        let msg = unsafe { std::ffi::CStr::from_ptr(moeplug_last_error()) };
        (st, msg.to_string_lossy().into_owned())
    };
    for wl in [1, 2] {
        let l = layout(
            INT4_PER_CHANNEL,
            1,
            wl,
            0,
            8,
            [4096, 1536, 4096, 1536],
            false,
        );
        for act in [0, 1, 2, 3, 4] {
            assert_eq!(check(&l, act), (0, String::new()), "wl {wl} act {act}");
        }
    }
    let l = layout(
        INT4_PER_CHANNEL,
        1,
        2,
        0,
        8,
        [4096, 1536, 4096, 1536],
        false,
    );
    assert_eq!(
        check(&l, 7),
        (
            2,
            "moeplug_check_fused_moe: act_dtype mxfp8 is not defined for weight_format \
             int4_per_channel (allowed: bf16, fp16, fp8_per_token, fp8_per_tensor)"
                .into()
        )
    );
    let l = layout(INT4_PER_CHANNEL, 1, 1, 0, 8, [36, 64, 36, 64], false);
    assert_eq!(
        check(&l, 0),
        (
            3,
            "moeplug_check_fused_moe: layout.hidden_padded: expected a multiple of 8 \
             (weight_format int4_per_channel packs 8 values per uint32), got 36"
                .into()
        )
    );
    let l = layout(INT4_PER_CHANNEL, 1, 2, 0, 8, [48, 64, 48, 64], false);
    assert_eq!(
        check(&l, 0),
        (
            3,
            "moeplug_check_fused_moe: layout.hidden_padded: expected a multiple of 32 \
             (weight_layout aiter_16x16 of int4_per_channel shuffles the int8-held values in \
             16-row tiles of 32-value packs (use_int4)), got 48"
                .into()
        )
    );
    // A scale layout is for group scales only.
    let l = layout(INT4_PER_CHANNEL, 1, 2, 1, 8, [64, 64, 64, 64], false);
    assert_eq!(
        check(&l, 0),
        (
            1,
            "moeplug_check_fused_moe: layout.scale_layout: expected 0 for weight_format \
             int4_per_channel (no e8m0 block scales), got 1"
                .into()
        )
    );
}

fn text(c: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = c
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as u8)
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// AITER's fused_moe keywords for an int4 per-channel record (Quark int4-fp8 with Gelu, the pairing
/// AITER's asm kernels run): per_Token, fp8 activations, shuffled; other act dtypes are not
/// AITER's.
#[test]
fn aiter_args_of_an_int4_per_channel_record() {
    use moeplug::capi::moeplug_aiter_args;
    use moeplug::capi::types::moeplug_aiter_args_out;
    // The record prepare_moe writes (prepare_moe_gives_aiters_a8w4_int4_bytes), by hand.
    let record = common::layout(
        INT4_PER_CHANNEL,
        1,
        2,
        0,
        8,
        [7168, 2048, 7168, 2048],
        false,
    );
    let mut out: moeplug_aiter_args_out = unsafe { std::mem::zeroed() };
    out.struct_size = std::mem::size_of_val(&out) as u32;
    let st = unsafe { moeplug_aiter_args(&record, 2, &mut out) };
    assert_eq!(st as i32, 0);
    let got = [
        &out.gate_mode[..],
        &out.quant_type,
        &out.quant_type_a,
        &out.quant_dtype_a,
        &out.quant_dtype_a2,
        &out.activation,
    ]
    .map(text);
    assert_eq!(
        got,
        ["separated", "per_Token", "per_Token", "fp8", "fp8", "Gelu"]
    );
    assert_eq!(
        (out.hidden_pad, out.is_shuffled, out.scale_swizzled),
        (0, 1, 0)
    );
    let mut l = record;
    l.prep_fingerprint = 0;
    l.act_dtype = 1; // bf16
    let st = unsafe { moeplug_aiter_args(&l, 2, &mut out) };
    let msg = unsafe { std::ffi::CStr::from_ptr(moeplug::capi::moeplug_last_error()) };
    assert_eq!(
        (st as i32, msg.to_str().unwrap()),
        (
            2,
            "moeplug_aiter_args: layout.act_dtype: AITER's a8w4 int4 path (weight_format \
             int4_per_channel) takes fp8_per_token activations only, got bf16"
        )
    );
}

/// moeplug_resolve_config: DEFAULT is fp8_per_token on both stages, on the CPU and on CUDA
/// (the fp32 family), with the record's layouts; a stage-2 act dtype of its own is kept.
#[test]
fn resolve_config_of_an_int4_per_channel_record() {
    use moeplug::capi::moeplug_resolve_config;
    use moeplug::capi::types::{moeplug_fused_moe_args, moeplug_resolved_config};
    let l = common::layout(
        INT4_PER_CHANNEL,
        1,
        2,
        0,
        8,
        [7168, 2048, 7168, 2048],
        false,
    );
    for device in [1, 2] {
        for (act, act2, want) in [
            (0, 0, (3, 3)),
            (4, 0, (4, 4)),
            (3, 1, (3, 1)),
            (2, 0, (2, 2)),
        ] {
            let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
            a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
            a.layout = &l;
            a.activation = 2;
            a.act_dtype = act;
            a.stage2_act_dtype = act2;
            let mut r: moeplug_resolved_config = unsafe { std::mem::zeroed() };
            r.struct_size = std::mem::size_of_val(&r) as u32;
            let st = unsafe { moeplug_resolve_config(device, 0, &a, &mut r) };
            assert_eq!(st as i32, 0, "device {device} act {act}/{act2}");
            assert_eq!(
                (r.backend, r.act_dtype, r.act_dtype_stage2, r.activation),
                (device, want.0, want.1, 2)
            );
            assert_eq!(
                (
                    r.weight_format,
                    r.gate_mode,
                    r.weight_layout,
                    r.scale_layout
                ),
                (INT4_PER_CHANNEL, 1, 2, 0)
            );
        }
    }
}
