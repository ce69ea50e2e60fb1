//! `moeplug_prepare_moe` with an AITER target (docs/aiter.md): byte for byte the layout each
//! named AITER kernel path reads, against the golden vectors AITER's own functions produced
//! (tests/golden, `moe_weight_packs_mxfp4` and `cdna4_swz_*`), the record it writes, and the
//! exact refusals. The MXFP8 pairing has no upstream vector: python/tests/test_aiter.py
//! checks it against a NumPy re-implementation of AITER's shuffles.

mod common;

use common::*;
use moeplug::capi::types::*;
use moeplug::capi::{moeplug_aiter_args, moeplug_check_fused_moe, moeplug_resolve_config};
use moeplug::prep::maps::w13_source_row;
use moeplug::types::GateMode;

const MXFP4: i32 = 6;
const MXFP8: i32 = 7;
const A4W4: i32 = 1;
const A8W4: i32 = 2;
const A16W4_INTERLEAVE: i32 = 4;
const TRITON_A16W4: i32 = 5;
const AITER_TARGET_FLAG: u32 = 2;

/// A checkpoint input: bytes, torch dtype, shape.
struct In {
    bytes: Vec<u8>,
    dtype: &'static str,
    shape: Vec<usize>,
}

fn inp(bytes: &[u8], dtype: &'static str, shape: &[usize]) -> Option<In> {
    Some(In {
        bytes: bytes.to_vec(),
        dtype,
        shape: shape.to_vec(),
    })
}

/// The prepared outputs (w13, w2, w13_scale, w2_scale, w13_bias, w2_bias) and the record.
struct Out {
    parts: [Option<Vec<u8>>; 6],
    shapes: [Vec<i64>; 6],
    layout: moeplug_layout,
}

struct Call {
    format: i32,
    target: i32,
    mode: GateMode,
    align: [i32; 2],
    act_dtype: i32,
    device_type: i32,
}

impl Call {
    fn new(format: i32, target: i32) -> Call {
        Call {
            format,
            target,
            mode: GateMode::Separated,
            align: [0, 0],
            act_dtype: 0,
            device_type: 0,
        }
    }

    /// `ins` in the order w13, w2, w13_scale, w2_scale, w13_bias, w2_bias.
    fn run(&self, ins: [Option<In>; 6]) -> Result<Out, (moeplug_status, String)> {
        let mut ins = ins;
        let dl: Vec<Option<Box<Dl>>> = ins
            .iter_mut()
            .map(|i| i.as_mut().map(|i| Dl::of(&mut i.bytes, i.dtype, &i.shape)))
            .collect();
        let p = |k: usize| dl[k].as_ref().map_or(std::ptr::null(), |d| d.ptr());
        // SAFETY: all-zero is a valid moeplug_prepare_moe_args (NULL tensors, defaults).
        let mut a: moeplug_prepare_moe_args = unsafe { std::mem::zeroed() };
        a.struct_size = std::mem::size_of::<moeplug_prepare_moe_args>() as u32;
        a.weight_format = self.format;
        a.gate_mode_in = self.mode as i32;
        a.device_type = self.device_type;
        a.act_dtype = self.act_dtype;
        a.hidden_align = self.align[0];
        a.intermediate_align = self.align[1];
        a.target = self.target;
        (a.w13, a.w2, a.w13_scale, a.w2_scale, a.w13_bias, a.w2_bias) =
            (p(0), p(1), p(2), p(3), p(4), p(5));
        let mut sizes: moeplug_prepare_moe_sizes_out = unsafe { std::mem::zeroed() };
        sizes.struct_size = std::mem::size_of_val(&sizes) as u32;
        let (s, m) = result(unsafe { moeplug_prepare_moe_sizes(&a, &mut sizes) });
        if s != moeplug_status::MoeplugOk {
            return Err((s, m));
        }
        let shapes = [
            (sizes.w13_ndim, sizes.w13_shape, sizes.w13_bytes),
            (sizes.w2_ndim, sizes.w2_shape, sizes.w2_bytes),
            (
                sizes.w13_scale_ndim,
                sizes.w13_scale_shape,
                sizes.w13_scale_bytes,
            ),
            (
                sizes.w2_scale_ndim,
                sizes.w2_scale_shape,
                sizes.w2_scale_bytes,
            ),
            (
                sizes.w13_bias_ndim,
                sizes.w13_bias_shape,
                sizes.w13_bias_bytes,
            ),
            (sizes.w2_bias_ndim, sizes.w2_bias_shape, sizes.w2_bias_bytes),
        ];
        // Poisoned outputs: every byte must be written.
        let mut bufs: Vec<Option<Vec<u8>>> = shapes
            .iter()
            .map(|&(n, _, b)| (n > 0).then(|| vec![0xA5u8; b as usize]))
            .collect();
        let outs: Vec<Option<Box<Dl>>> = bufs
            .iter_mut()
            .zip(&shapes)
            .zip(&ins)
            .map(|((b, &(n, s, _)), i)| {
                let shape: Vec<usize> = s[..n as usize].iter().map(|&d| d as usize).collect();
                b.as_mut()
                    .map(|b| Dl::of(b, i.as_ref().unwrap().dtype, &shape))
            })
            .collect();
        let q = |k: usize| outs[k].as_ref().map_or(std::ptr::null(), |d| d.ptr());
        (
            a.out_w13,
            a.out_w2,
            a.out_w13_scale,
            a.out_w2_scale,
            a.out_w13_bias,
            a.out_w2_bias,
        ) = (q(0), q(1), q(2), q(3), q(4), q(5));
        let mut layout: moeplug_layout = unsafe { std::mem::zeroed() };
        layout.struct_size = std::mem::size_of_val(&layout) as u32;
        a.out_layout = &mut layout;
        let (s, m) = result(unsafe { moeplug_prepare_moe(&a, std::ptr::null_mut()) });
        if s != moeplug_status::MoeplugOk {
            return Err((s, m));
        }
        assert_eq!(
            sizes.layout.flags, layout.flags,
            "the sizes' record is the written one"
        );
        let mut parts: [Option<Vec<u8>>; 6] = Default::default();
        for (k, b) in bufs.into_iter().enumerate() {
            parts[k] = b;
        }
        Ok(Out {
            parts,
            shapes: shapes.map(|(n, s, _)| s[..n as usize].to_vec()),
            layout,
        })
    }
}

/// Rows of a GGUU `[E, 2·inter, k]` byte matrix re-ordered into checkpoint order `mode`.
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

fn record(l: &moeplug_layout) -> (i32, i32, i32, i32, i32, u32, i32) {
    (
        l.weight_format,
        l.gate_mode,
        l.weight_layout,
        l.scale_layout,
        l.num_experts,
        l.flags,
        l.act_dtype,
    )
}

/// The golden MXFP4 checkpoint (E=4, H=256, I=128) in row order `mode`, with fp32 biases.
fn mxfp4_checkpoint(mode: GateMode, bias: Option<&[u8]>) -> [Option<In>; 6] {
    let c = case("moe_weight_packs_mxfp4");
    let g = |n: &str| tensor(c, "input", n).bytes;
    let (e, h, i) = (4, 256, 128);
    [
        inp(
            &to_gate_mode(&g("w1_fp4"), e, i, h / 2, mode),
            "uint8",
            &[e, 2 * i, h / 2],
        ),
        inp(&g("w2_fp4"), "uint8", &[e, h, i / 2]),
        inp(
            &to_gate_mode(&g("w1_scale_e8m0"), e, i, h / 32, mode),
            "float8_e8m0fnu",
            &[e * 2 * i, h / 32],
        ),
        inp(&g("w2_scale_e8m0"), "float8_e8m0fnu", &[e * h, i / 32]),
        bias.and_then(|b| inp(&to_gate_mode(b, e, i, 4, mode), "float32", &[e, 2 * i])),
        None,
    ]
}

fn packs(n: &str) -> Vec<u8> {
    tensor(case("moe_weight_packs_mxfp4"), "output", n).bytes
}

/// 64-alignment keeps the golden I = 128 unpadded (the default 256 would pad it).
fn golden_call(target: i32, mode: GateMode) -> Call {
    Call {
        mode,
        align: [64, 64],
        ..Call::new(MXFP4, target)
    }
}

#[test]
fn a4w4_is_the_separated_standard_pairing() {
    let mask = tensor(
        case("moe_weight_packs_mxfp4"),
        "aux",
        "SEPARATED_w2_scale_defined_mask",
    )
    .bytes;
    for mode in GateMode::ALL.iter().copied() {
        let o = golden_call(A4W4, mode)
            .run(mxfp4_checkpoint(mode, None))
            .unwrap();
        let what = format!("aiter_a4w4 from {mode:?}");
        let p = |k: usize| o.parts[k].as_deref().unwrap();
        assert_bytes(p(0), &packs("SEPARATED_w1"), None, &what);
        assert_bytes(p(1), &packs("SEPARATED_w2"), None, &what);
        assert_bytes(p(2), &packs("SEPARATED_w1_scale"), None, &what);
        assert_bytes(p(3), &packs("SEPARATED_w2_scale"), Some(&mask), &what);
        assert_eq!(o.shapes[3], [1024, 8], "e8m0_shuffle rows padded to 256");
        // SEPARATED, AITER_16x16, AITER_E8M0, prepared for MXFP4 activations, AITER_TARGET.
        assert_eq!(record(&o.layout), (MXFP4, 1, 2, 2, 4, AITER_TARGET_FLAG, 6));
    }
}

#[test]
fn a8w4_and_a16w4_interleave_are_the_interleave_pairing() {
    // A bias in the checkpoint's row order comes out gate half then up half (AITER's bias1).
    let bias: Vec<u8> = (0..4 * 256)
        .flat_map(|v| (v as f32 * 0.5).to_le_bytes())
        .collect();
    for (target, act) in [(A8W4, 7), (A16W4_INTERLEAVE, 1)] {
        for mode in GateMode::ALL.iter().copied() {
            let o = golden_call(target, mode)
                .run(mxfp4_checkpoint(mode, Some(&bias)))
                .unwrap();
            let what = format!("target {target} from {mode:?}");
            let p = |k: usize| o.parts[k].as_deref().unwrap();
            assert_bytes(p(0), &packs("INTERLEAVE_w1"), None, &what);
            assert_bytes(p(2), &packs("INTERLEAVE_w1_scale"), None, &what);
            assert_bytes(p(1), &packs("A16W4_w2"), None, &what);
            // shuffle_scale_a16w4 of [E·H, I/32 = 4]: no row padding, columns 4..8 are 0x7F.
            assert_bytes(p(3), &packs("A16W4_w2_scale"), None, &what);
            assert_eq!(o.shapes[3], [1024, 8]);
            assert_bytes(p(4), &bias, None, &what);
            assert_eq!(
                record(&o.layout),
                (MXFP4, 2, 2, 2, 4, AITER_TARGET_FLAG | 1, act)
            );
        }
    }
}

#[test]
fn triton_a16w4_keeps_the_row_interleave_and_swizzles_scales_for_cdna4() {
    // The golden CDNA4 case's scale [E=2, N=64, K/32=8] as w13's: I = 32, H = 256.
    let c = case("cdna4_swz_e2_n64_sk8");
    let s13 = tensor(c, "input", "scale_checkpoint_ENK").bytes;
    let want13 = tensor(c, "output", "swizzled_memory_image").bytes;
    let (e, h, i) = (2usize, 256usize, 32usize);
    let mut rng = Rng(5);
    let w13 = rng.bytes(e * 2 * i * h / 2);
    let w2 = rng.bytes(e * h * i / 2);
    let s2 = rng.bytes(e * h);
    let bias = rng.bytes(e * 2 * i * 4);
    let call = Call {
        mode: GateMode::InterleaveRows,
        align: [0, 32],
        ..Call::new(MXFP4, TRITON_A16W4)
    };
    let o = call
        .run([
            inp(&w13, "uint8", &[e, 2 * i, h / 2]),
            inp(&w2, "uint8", &[e, h, i / 2]),
            inp(&s13, "float8_e8m0fnu", &[e, 2 * i, h / 32]),
            inp(&s2, "float8_e8m0fnu", &[e, h, i / 32]),
            inp(&bias, "float32", &[e, 2 * i]),
            None,
        ])
        .unwrap();
    let p = |k: usize| o.parts[k].as_deref().unwrap();
    // Plain weights in the checkpoint's g0,u0,g1,u1 order: the bytes as given.
    assert_bytes(p(0), &w13, None, "w13");
    assert_bytes(p(1), &w2, None, "w2");
    assert_bytes(p(4), &bias, None, "w13_bias");
    assert_bytes(p(2), &want13, None, "w13_scale (golden CDNA4 swizzle)");
    assert_eq!(o.shapes[2], [2, 2, 256]);
    // w2's scale [2, 256, 1]: the CDNA4 swizzle export's bytes (golden-tested on its own).
    let mut src = s2.clone();
    let mut want2 = vec![0xA5u8; e * h * 8];
    let sd = Dl::of(&mut src, "float8_e8m0fnu", &[e, h, 1]);
    let dd = Dl::of(&mut want2, "float8_e8m0fnu", &[e, h / 32, 256]);
    let a = moeplug_swizzle_scale_args {
        struct_size: std::mem::size_of::<moeplug_swizzle_scale_args>() as u32,
        src: sd.ptr(),
        dst: dd.ptr(),
        layout: 3,
        out_fragment: std::ptr::null_mut(),
    };
    ok(unsafe { moeplug_swizzle_scale(&a, std::ptr::null_mut()) });
    assert_bytes(p(3), &want2, None, "w2_scale");
    assert_eq!(o.shapes[3], [2, 8, 256]);
    // INTERLEAVE_ROWS, PLAIN, CDNA4_SWIZZLE, bf16 activations.
    assert_eq!(
        record(&o.layout),
        (MXFP4, 3, 1, 3, 2, AITER_TARGET_FLAG | 1, 1)
    );
}

#[test]
fn default_target_is_unchanged_and_unflagged() {
    let o = golden_call(0, GateMode::Separated)
        .run(mxfp4_checkpoint(GateMode::Separated, None))
        .unwrap();
    assert_bytes(
        o.parts[0].as_deref().unwrap(),
        &packs("SEPARATED_w1"),
        None,
        "w13",
    );
    assert_eq!(record(&o.layout), (MXFP4, 1, 2, 2, 4, 0, 0));
}

fn refused(call: Call, ins: [Option<In>; 6], want: moeplug_status, message: &str) {
    let (s, m) = call.run(ins).err().expect("must be refused");
    assert_eq!(s, want, "{m}");
    assert_eq!(m, message);
}

#[test]
fn bad_targets_are_refused_with_exact_messages() {
    use moeplug_status::*;
    let ck = || mxfp4_checkpoint(GateMode::Separated, None);
    refused(
        Call::new(MXFP4, 9),
        ck(),
        MoeplugInvalidArgument,
        "moeplug_prepare_moe_sizes: target: unknown target value 9 (valid: 1 aiter_a4w4, \
         2 aiter_a8w4, 3 aiter_mxfp8, 4 aiter_a16w4_interleave, 5 aiter_triton_a16w4)",
    );
    refused(
        Call::new(MXFP4, 3),
        ck(),
        MoeplugInvalidArgument,
        "moeplug_prepare_moe_sizes: weight_format: target aiter_mxfp8 reads weight_format \
         mxfp8, got mxfp4",
    );
    refused(
        Call {
            act_dtype: 1,
            ..golden_call(A8W4, GateMode::Separated)
        },
        ck(),
        MoeplugInvalidArgument,
        "moeplug_prepare_moe_sizes: act_dtype: target aiter_a8w4 runs mxfp8 activations, got bf16",
    );
    refused(
        Call {
            device_type: 2,
            ..golden_call(A4W4, GateMode::Separated)
        },
        ck(),
        MoeplugInvalidArgument,
        "moeplug_prepare_moe_sizes: device_type: target aiter_a4w4 is an AITER kernel path \
         (ROCm): expected 0 or 10 (ROCM), got 2",
    );
    // I = 128 padded to 384 (alignment 192, raised to a multiple of the 128 values of
    // shuffle_weight_a16w4's 64-byte K): 12 scale columns, which shuffle_scale_a16w4 would
    // pad with 0x7F after the zero ones.
    refused(
        Call {
            align: [64, 192],
            ..Call::new(MXFP4, A8W4)
        },
        ck(),
        MoeplugInvalidArgument,
        "moeplug_prepare_moe_sizes: intermediate_align: 128 padded to 384 leaves 12 scale \
         columns; shuffle_scale_a16w4 would add 0x7F columns after the zero ones of the \
         padding: use an alignment that is a multiple of 256",
    );
}

#[test]
fn a4w4_with_the_default_alignment_pads_to_256() {
    let o = Call::new(MXFP4, A4W4)
        .run(mxfp4_checkpoint(GateMode::Separated, None))
        .unwrap();
    assert_eq!(
        (o.layout.hidden_padded, o.layout.intermediate_padded),
        (256, 256)
    );
    assert_eq!(o.shapes[0], [4, 512, 128]);
}

#[test]
fn moeplug_launches_refuse_an_aiter_record() {
    let o = golden_call(A8W4, GateMode::Separated)
        .run(mxfp4_checkpoint(GateMode::Separated, None))
        .unwrap();
    let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
    a.layout = &o.layout;
    fails(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugLayoutMismatch,
        &[
            "args.layout.flags: AITER_TARGET: these weights were prepared for an AITER kernel \
           path (prepare_moe target), whose layout moeplug's kernels do not read; prepare \
           them with target 0",
        ],
    );
}

#[test]
fn mxfp8_target_needs_mxfp8_weights_and_writes_the_interleave_record() {
    let (e, h, i) = (2usize, 256usize, 128usize);
    let mut rng = Rng(8);
    let o = Call {
        align: [64, 64],
        ..Call::new(MXFP8, 3)
    }
    .run([
        inp(&rng.bytes(e * 2 * i * h), "float8_e4m3fn", &[e, 2 * i, h]),
        inp(&rng.bytes(e * h * i), "float8_e4m3fn", &[e, h, i]),
        inp(
            &rng.bytes(e * 2 * i * h / 32),
            "float8_e8m0fnu",
            &[e * 2 * i, h / 32],
        ),
        inp(
            &rng.bytes(e * h * i / 32),
            "float8_e8m0fnu",
            &[e * h, i / 32],
        ),
        None,
        None,
    ])
    .unwrap();
    // w13 scale: shuffle_scale_a16w4 [E·2I, 8]; w2 scale: e8m0_shuffle, rows to 256.
    assert_eq!(o.shapes[2], [512, 8]);
    assert_eq!(o.shapes[3], [512, 8]);
    assert_eq!(record(&o.layout), (MXFP8, 2, 2, 2, 2, AITER_TARGET_FLAG, 7));
}

fn text(c: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = c
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as u8)
        .collect();
    String::from_utf8(bytes).unwrap()
}

fn aiter_out() -> moeplug_aiter_args_out {
    let mut o: moeplug_aiter_args_out = unsafe { std::mem::zeroed() };
    o.struct_size = std::mem::size_of_val(&o) as u32;
    o
}

#[test]
fn aiter_args_of_the_a8w4_record() {
    let o = golden_call(A8W4, GateMode::Separated)
        .run(mxfp4_checkpoint(GateMode::Separated, None))
        .unwrap();
    let mut out = aiter_out();
    ok(unsafe { moeplug_aiter_args(&o.layout, 3, &mut out) });
    assert_eq!(out.struct_size, 128);
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
        ["interleave", "per_1x32", "per_1x32", "fp8", "fp8", "Swiglu"]
    );
    assert_eq!(
        (
            out.hidden_pad,
            out.intermediate_pad,
            out.is_shuffled,
            out.scale_swizzled
        ),
        (0, 0, 1, 0)
    );
}

#[test]
fn aiter_args_and_resolve_config_refuse_bad_arguments() {
    use moeplug_status::*;
    let o = golden_call(A8W4, GateMode::Separated)
        .run(mxfp4_checkpoint(GateMode::Separated, None))
        .unwrap();
    let mut out = aiter_out();
    fails(
        unsafe { moeplug_aiter_args(std::ptr::null(), 0, &mut out) },
        MoeplugInvalidArgument,
        &["moeplug_aiter_args: record: must not be NULL"],
    );
    fails(
        unsafe { moeplug_aiter_args(&o.layout, 9, &mut out) },
        MoeplugInvalidArgument,
        &["moeplug_aiter_args: activation: unknown activation value 9"],
    );
    out.struct_size = 64;
    fails(
        unsafe { moeplug_aiter_args(&o.layout, 0, &mut out) },
        MoeplugInvalidArgument,
        &[
            "moeplug_aiter_args: out.struct_size: expected at least 128 (the 1.1 size of \
           moeplug_aiter_args_out), got 64",
        ],
    );
    // A record whose act dtype the format cannot run.
    let mut l = o.layout;
    l.prep_fingerprint = 0;
    l.act_dtype = 5; // fp8_block128
    let mut out = aiter_out();
    fails(
        unsafe { moeplug_aiter_args(&l, 0, &mut out) },
        MoeplugLayoutMismatch,
        &["moeplug_aiter_args: layout.act_dtype: fp8_block128 cannot be used with weight_format mxfp4"],
    );

    let mut r: moeplug_resolved_config = unsafe { std::mem::zeroed() };
    r.struct_size = std::mem::size_of_val(&r) as u32;
    fails(
        unsafe { moeplug_resolve_config(1, 0, std::ptr::null(), &mut r) },
        MoeplugInvalidArgument,
        &["moeplug_resolve_config: args: must not be NULL"],
    );
    let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
    a.layout = &o.layout;
    fails(
        unsafe { moeplug_resolve_config(99, 0, &a, &mut r) },
        MoeplugInvalidArgument,
        &["moeplug_resolve_config: device_type: "],
    );
    // An AITER record is for AITER: the launch check refuses it, and so does the resolver.
    fails(
        unsafe { moeplug_resolve_config(1, 0, &a, &mut r) },
        MoeplugLayoutMismatch,
        &["moeplug_resolve_config: args.layout.flags: AITER_TARGET"],
    );
    r.struct_size = 47;
    fails(
        unsafe { moeplug_resolve_config(1, 0, &a, &mut r) },
        MoeplugInvalidArgument,
        &[
            "moeplug_resolve_config: out.struct_size: expected at least 48 (the 1.1 size of \
           moeplug_resolved_config), got 47",
        ],
    );
}

#[test]
fn resolve_config_of_a_moeplug_mxfp4_record_on_cpu_and_cuda() {
    let o = golden_call(0, GateMode::Separated)
        .run(mxfp4_checkpoint(GateMode::Separated, None))
        .unwrap();
    for (device, backend) in [(1, 1), (2, 2)] {
        for (act_dtype, want) in [(0, 1), (6, 6), (7, 7)] {
            let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
            a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
            a.layout = &o.layout;
            a.activation = 3;
            a.act_dtype = act_dtype;
            let mut r: moeplug_resolved_config = unsafe { std::mem::zeroed() };
            r.struct_size = std::mem::size_of_val(&r) as u32;
            ok(unsafe { moeplug_resolve_config(device, 0, &a, &mut r) });
            // The same configuration passes the launch check where a backend is present.
            if device == 1 {
                ok(unsafe { moeplug_check_fused_moe(device, 0, &a) });
            }
            assert_eq!(
                (r.backend, r.act_dtype, r.act_dtype_stage2, r.activation),
                (backend, want, want, 3)
            );
            assert_eq!((r.alpha, r.limit), (1.702, 7.0));
            assert_eq!(
                (
                    r.weight_format,
                    r.gate_mode,
                    r.weight_layout,
                    r.scale_layout
                ),
                (MXFP4, 1, 2, 2)
            );
        }
    }
}
