//! INT4_GROUP32 (AITER a16wi4): AITER's `pack_int8_to_packed_int4` and
//! `shuffle_scale_for_int4` byte for byte (golden vectors from AITER, tests/golden/aiter_int4.json),
//! `prepare_moe` from int8-held and from packed checkpoints against the test's own composition
//! of AITER's functions, what the caps claim, and the refusals with their exact messages.

mod common;

use moeplug::backend;
use moeplug::error::Status;
use moeplug::prep::int4;
use moeplug::prep::request::{run_host, PrepareMoe, PrepareTarget, PrepareTargetArgs};
use moeplug::prep::steps::{self, RowMap};
use moeplug::tensor::{DeviceKind, ElemType, Tensor};
use moeplug::types::{ScaleLayout, WeightFormat, WeightLayout};

/// A tensor of tests/golden/aiter_int4.json: bytes and shape.
fn golden(case: &str, role: &str, name: &str) -> (Vec<u8>, Vec<usize>) {
    let g = common::tensor(
        common::case_of(&common::manifest_in("aiter_int4.json"), case),
        role,
        name,
    );
    (g.bytes, g.shape)
}

#[test]
fn pack_int8_to_packed_int4_golden() {
    let (x, _) = golden("pack_int8_to_packed_int4", "input", "x");
    let (want, _) = golden("pack_int8_to_packed_int4", "output", "out");
    let mut got = vec![0u8; x.len() / 2];
    int4::pack_int8_to_packed_int4(&x, &mut got);
    assert_eq!(got, want);
}

/// AITER takes `[E, G, N]`; moeplug reads row-major `[E, N, G]` checkpoints (each weight row's
/// scales together): the golden input transposed goes through the prepare step.
#[test]
fn shuffle_scale_for_int4_golden() {
    let (x, shape) = golden("shuffle_scale_for_int4_bf16", "input", "scale");
    let (want, out_shape) = golden("shuffle_scale_for_int4_bf16", "output", "out");
    let (e, g, n) = (shape[0], shape[1], shape[2]);
    assert_eq!(out_shape, int4::scale_shape(e, n, g));
    let mut rows = vec![0u8; x.len()];
    for xe in 0..e {
        for gi in 0..g {
            for ni in 0..n {
                let src = ((xe * g + gi) * n + ni) * 2;
                let dst = ((xe * n + ni) * g + gi) * 2;
                rows[dst..dst + 2].copy_from_slice(&x[src..src + 2]);
            }
        }
    }
    let step = int4::scale_step(RowMap::plain(e, n, n, n), g, g);
    let mut got = vec![0u8; want.len()];
    steps::run_host(&step, &rows, &mut got);
    assert_eq!(got, want);
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
        weight_format: WeightFormat::Int4Group32 as i32,
        gate_mode_in: 0,
        device_type,
        device_id: 0,
        act_dtype: 0,
        hidden_align: 0,
        intermediate_align: 0,
        target: 0,
    })
}

/// A small deterministic generator.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// AITER's F1 (16, 16) of int8 values `[rows, k]` (tiles of 16 rows × 16 values), written
/// from docs/layouts.md §2.1, independent of moeplug's writers.
fn f1_int8(x: &[u8], rows: usize, k: usize) -> Vec<u8> {
    let mut out = vec![0u8; x.len()];
    let mut o = 0;
    for n0 in 0..rows / 16 {
        for c in 0..k / 16 {
            for n1 in 0..16 {
                for k2 in 0..16 {
                    out[o] = x[(n0 * 16 + n1) * k + c * 16 + k2];
                    o += 1;
                }
            }
        }
    }
    out
}

/// AITER `pack_int8_to_packed_int4`, written again here from aiter/ops/shuffle.py.
fn pack(x: &[u8]) -> Vec<u8> {
    x.chunks_exact(8)
        .flat_map(|v| (0..4).map(move |j| (v[j] & 15) | (v[j + 4] << 4)))
        .collect()
}

struct Outs {
    w13: Vec<u8>,
    w2: Vec<u8>,
    s13: Vec<u8>,
    s2: Vec<u8>,
    layout: moeplug::layout::Layout,
}

/// prepare_moe on host tensors: weights int8-held (`packed` false) or packed uint8.
#[allow(clippy::too_many_arguments)]
fn prepare(
    packed: bool,
    w13: &[u8],
    w2: &[u8],
    s13: &[u8],
    s2: &[u8],
    e: usize,
    h: usize,
    i: usize,
) -> moeplug::error::Result<Outs> {
    let (mut w13, mut w2) = if packed {
        (pack(w13), pack(w2))
    } else {
        (w13.to_vec(), w2.to_vec())
    };
    let (mut s13, mut s2) = (s13.to_vec(), s2.to_vec());
    let (elem, div) = if packed {
        (ElemType::U8, 2)
    } else {
        (ElemType::I8, 1)
    };
    let req = PrepareMoe {
        target: target(0)?,
        w13: host("w13", &mut w13, elem, &[e, 2 * i, h / div]),
        w2: host("w2", &mut w2, elem, &[e, h, i / div]),
        w13_scale: Some(host(
            "w13_scale",
            &mut s13,
            ElemType::Bf16,
            &[e, 2 * i, h / 32],
        )),
        w2_scale: Some(host("w2_scale", &mut s2, ElemType::Bf16, &[e, h, i / 32])),
        w13_bias: None,
        w2_bias: None,
    };
    let plan = req.plan()?;
    let mut o13 = vec![0xAAu8; plan.w13_bytes()];
    let mut o2 = vec![0xAAu8; plan.w2_bytes()];
    let mut os13 = vec![0xAAu8; plan.w13_scale_bytes()];
    let mut os2 = vec![0xAAu8; plan.w2_scale_bytes()];
    let outs = [
        Some(host("out_w13", &mut o13, elem, &plan.w13)),
        Some(host("out_w2", &mut o2, elem, &plan.w2)),
        Some(host(
            "out_w13_scale",
            &mut os13,
            ElemType::Bf16,
            plan.w13_scale.as_ref().unwrap(),
        )),
        Some(host(
            "out_w2_scale",
            &mut os2,
            ElemType::Bf16,
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

/// Zero-pad `[groups, rows, cols]` of `es`-byte elements to `[groups, rows_pad, cols_pad]`.
fn pad(x: &[u8], es: usize, groups: usize, r: (usize, usize), c: (usize, usize)) -> Vec<u8> {
    let mut out = vec![0u8; groups * r.1 * c.1 * es];
    for g in 0..groups {
        for row in 0..r.0 {
            let src = ((g * r.0 + row) * c.0) * es;
            let dst = ((g * r.1 + row) * c.1) * es;
            out[dst..dst + c.0 * es].copy_from_slice(&x[src..src + c.0 * es]);
        }
    }
    out
}

/// AITER's shuffle_scale_for_int4 of row-major `[E, N, G]` bf16 bytes → `[E, G/2, N, 2]`.
fn shuffle_scale_ref(x: &[u8], e: usize, n: usize, g: usize) -> Vec<u8> {
    let mut out = vec![0u8; x.len()];
    for xe in 0..e {
        for ni in 0..n {
            for gi in 0..g {
                let src = ((xe * n + ni) * g + gi) * 2;
                let dst = (((xe * (g / 2) + gi / 2) * n + ni) * 2 + gi % 2) * 2;
                out[dst..dst + 2].copy_from_slice(&x[src..src + 2]);
            }
        }
    }
    out
}

/// Both checkpoint forms give the same bytes, and those are AITER's a16wi4 preparation of the
/// zero-padded weights: pack(F1(int8)) and shuffle_scale_for_int4 (gate and up halves each
/// padded to I_pad rows, SEPARATED).
#[test]
fn prepare_moe_int8_held_and_packed_give_aiters_layout() {
    let (e, h, i) = (2usize, 96usize, 32usize);
    let mut r = Lcg(7);
    let vals = |n: usize, r: &mut Lcg| -> Vec<u8> {
        (0..n).map(|_| ((r.next() % 16) as i8 - 8) as u8).collect()
    };
    let w13 = vals(e * 2 * i * h, &mut r);
    let w2 = vals(e * h * i, &mut r);
    let scales = |n: usize, r: &mut Lcg| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                half::bf16::from_f32(0.001 + (r.next() % 1000) as f32 * 1e-5)
                    .to_bits()
                    .to_le_bytes()
            })
            .collect()
    };
    let s13 = scales(e * 2 * i * (h / 32), &mut r);
    let s2 = scales(e * h * (i / 32), &mut r);
    let a = prepare(false, &w13, &w2, &s13, &s2, e, h, i).unwrap();
    let b = prepare(true, &w13, &w2, &s13, &s2, e, h, i).unwrap();
    assert_eq!(a.w13, b.w13);
    assert_eq!(a.w2, b.w2);
    assert_eq!(a.s13, b.s13);
    assert_eq!(a.s2, b.s2);
    let l = &a.layout;
    assert_eq!(
        (l.weight_format, l.weight_layout, l.scale_layout),
        (
            WeightFormat::Int4Group32,
            WeightLayout::Aiter16x16,
            Some(ScaleLayout::AiterInt4)
        )
    );
    // H, I padded to 64 (F1 tiles 32 values wide and whole scale-group pairs).
    let (hp, ip) = (128usize, 64usize);
    assert_eq!((l.hidden_padded, l.intermediate_padded), (hp, ip));
    let w13p = pad(&w13, 1, e * 2, (i, ip), (h, hp));
    let w2p = pad(&w2, 1, e, (h, hp), (i, ip));
    assert_eq!(a.w13, pack(&f1_int8(&w13p, e * 2 * ip, hp)));
    assert_eq!(a.w2, pack(&f1_int8(&w2p, e * hp, ip)));
    let s13p = pad(&s13, 2, e * 2, (i, ip), (h / 32, hp / 32));
    let s2p = pad(&s2, 2, e, (h, hp), (i / 32, ip / 32));
    assert_eq!(a.s13, shuffle_scale_ref(&s13p, e, 2 * ip, hp / 32));
    assert_eq!(a.s2, shuffle_scale_ref(&s2p, e, hp, ip / 32));
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
    let s13 = vec![0u8; e * 2 * i * (h / 32) * 2];
    let s2 = vec![0u8; e * h * (i / 32) * 2];
    let mut bad = w2.clone();
    bad[5] = 9;
    fails(
        prepare(false, &w13, &bad, &s13, &s2, e, h, i),
        Status::InvalidArgument,
        "w2: int8-held int4 values must lie in [-8, 7], got 9 at flat index 5",
    );
    bad[5] = (-9i8) as u8;
    fails(
        prepare(false, &w13, &bad, &s13, &s2, e, h, i),
        Status::InvalidArgument,
        "w2: int8-held int4 values must lie in [-8, 7], got -9 at flat index 5",
    );
    // H = 48 is not a whole number of 32-value groups.
    let (h48, w13_48, w2_48) = (48usize, vec![0u8; 2 * i * 48], vec![0u8; 48 * i]);
    fails(
        prepare(
            false,
            &w13_48,
            &w2_48,
            &vec![0u8; 2 * i * 2],
            &vec![0u8; h48 * 2],
            e,
            h48,
            i,
        ),
        Status::InvalidArgument,
        "w13: int4_group32 needs H and I multiples of 32 (one bf16 scale per 32 values), got H = 48, I = 32",
    );
    assert!(target(2).is_ok());
}

/// The CPU and GPU backends claim INT4_GROUP32 and its scale layout (the GPU runs it in the
/// fp32 family).
#[test]
fn caps_claim_int4() {
    let int4 = WeightFormat::Int4Group32.bit();
    let aiter_int4 = ScaleLayout::AiterInt4.bit();
    let cpu = backend::cpu::backend().caps();
    assert_ne!(cpu.weight_formats & int4, 0);
    assert_ne!(cpu.scale_layouts & aiter_int4, 0);
    let cuda = backend::gpu::gpu_caps("sm_90", "13.0");
    assert_eq!(cuda.weight_formats, cpu.weight_formats);
    assert_eq!(cuda.scale_layouts, cpu.scale_layouts);
}

/// moeplug_check_fused_moe on the CPU answers for INT4_GROUP32 records exactly: the accepted
/// pairings pass, the rest name their rule.
#[test]
fn check_fused_moe_answers_for_int4_records() {
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
    let (int4, aiter_int4) = (8, 4);
    // Kimi-K2-like sizes: H 7168, I 2048, both layouts, both 16-bit act dtypes.
    for (wl, sl) in [(2, aiter_int4), (1, 1), (2, 1), (1, aiter_int4)] {
        let l = layout(int4, 1, wl, sl, 8, [7168, 2048, 7168, 2048], false);
        for act in [0, 1, 2] {
            assert_eq!(
                check(&l, act),
                (0, String::new()),
                "wl {wl} sl {sl} act {act}"
            );
        }
    }
    let l = layout(int4, 1, 2, aiter_int4, 8, [7168, 2048, 7168, 2048], false);
    assert_eq!(
        check(&l, 3),
        (
            2,
            "moeplug_check_fused_moe: act_dtype fp8_per_token is not defined for weight_format \
             int4_group32 (allowed: bf16, fp16)"
                .into()
        )
    );
    let l = layout(int4, 1, 1, aiter_int4, 8, [96, 64, 96, 64], false);
    assert_eq!(
        check(&l, 0),
        (
            3,
            "moeplug_check_fused_moe: layout.hidden_padded: expected a multiple of 64 (scale_layout \
             aiter_int4 pairs adjacent 32-value scale groups), got 96"
                .into()
        )
    );
    let l = layout(int4, 1, 1, 1, 8, [80, 64, 80, 64], false);
    assert_eq!(
        check(&l, 0),
        (
            3,
            "moeplug_check_fused_moe: layout.hidden_padded: expected a multiple of 32 \
             (weight_format int4_group32 has 1x32 scale groups), got 80"
                .into()
        )
    );
    // aiter_int4 names int4 scales only; an MX record with it is refused as a record.
    let l = layout(6, 1, 2, aiter_int4, 8, [256, 256, 256, 256], false);
    assert_eq!(
        check(&l, 0),
        (
            1,
            "moeplug_check_fused_moe: layout.scale_layout: aiter_int4 is not a scale layout of \
             weight_format mxfp4 (valid: 1 plain, 2 aiter_e8m0, 3 cdna4_swizzle)"
                .into()
        )
    );
}
