//! Layout fragments through the C ABI (docs/abi.md §8, ABI 1.1): what each primitive reports
//! through `out_fragment`, `moeplug_layout_from_fragments` (assembly, its refusals with their
//! exact messages), and the launch refusing a hand edit of an assembled record with
//! LAYOUT_MISMATCH naming the field. tests/c/fragments.c does the whole path from C.

mod common;

use std::ffi::CStr;
use std::mem::size_of;
use std::process::Command;
use std::ptr;

use common::{c_compiler, include_dir, library, root, run, scratch};
use moeplug::capi::types::*;
use moeplug::capi::*;

fn last_error() -> String {
    unsafe { CStr::from_ptr(moeplug_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The C program of tests/c/fragments.c, compiled against the current header and linked like
/// an engine links (soname, symbol versions).
#[test]
fn c_program_prepares_with_primitives_assembles_the_record_and_launches() {
    let dir = scratch("fragments_c");
    for name in ["libmoeplug.so", "libmoeplug.so.1"] {
        std::os::unix::fs::symlink(library(), dir.join(name)).unwrap();
    }
    let exe = dir.join("fragments");
    run(Command::new(c_compiler())
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(include_dir())
        .arg(root().join("tests/c/fragments.c"))
        .arg(format!("-L{}", dir.display()))
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .args(["-lmoeplug", "-lm"]));
    let needed = run(Command::new("readelf")
        .args(["--dyn-syms", "--wide"])
        .arg(&exe));
    assert!(
        needed.contains("moeplug_layout_from_fragments@MOEPLUG_1.1"),
        "not linked against the 1.1 symbol:\n{needed}"
    );
    let out = run(&mut Command::new(&exe));
    assert!(out.contains("all checks passed"), "{out}");
}

fn fragment() -> moeplug_layout_fragment {
    // SAFETY: all-zero is a valid fragment (nothing established).
    let mut f: moeplug_layout_fragment = unsafe { std::mem::zeroed() };
    f.struct_size = size_of::<moeplug_layout_fragment>() as u32;
    f
}

/// What `pad_weights` (gate_up) and `shuffle_weight` report for a bf16 w13, E=2, H=64 → 128,
/// I=32 → 64, and a declared fragment: biases present, activations bf16.
fn bf16_parts() -> [moeplug_layout_fragment; 3] {
    let mut pad = fragment();
    pad.weight_format = moeplug_weight_format::Bf16 as i32;
    pad.gate_mode = moeplug_gate_mode::Separated as i32;
    pad.num_experts = 2;
    pad.hidden_size = 64;
    pad.intermediate_size = 32;
    pad.hidden_padded = 128;
    pad.intermediate_padded = 64;
    let mut shuffle = fragment();
    shuffle.weight_format = moeplug_weight_format::Bf16 as i32;
    shuffle.weight_layout = moeplug_weight_layout::Aiter_16x16 as i32;
    let mut declared = fragment();
    declared.has_bias = moeplug_fragment_bias::Present as i32;
    declared.act_dtype = moeplug_act_dtype::Bf16 as i32;
    [pad, shuffle, declared]
}

fn assemble(parts: &[moeplug_layout_fragment]) -> (moeplug_status, String, moeplug_layout) {
    let ptrs: Vec<*const moeplug_layout_fragment> = parts.iter().map(|p| p as *const _).collect();
    // SAFETY: all-zero is a valid record; the fill shows what a failed call left.
    let mut out: moeplug_layout = unsafe { std::mem::zeroed() };
    out.struct_size = size_of::<moeplug_layout>() as u32;
    out.num_experts = -7;
    let s = unsafe { moeplug_layout_from_fragments(ptrs.as_ptr(), ptrs.len(), &mut out) };
    (s, last_error(), out)
}

#[test]
fn the_primitives_report_what_they_established() {
    // bf16 [2, 48, 64] padded as w13 to [2, 64, 96], then F1-shuffled.
    let src = vec![0u16; 2 * 48 * 64];
    let mut padded = vec![0u16; 2 * 64 * 96];
    let mut shuffled = vec![0u16; 2 * 64 * 96];
    let (s_src, s_pad) = ([2i64, 48, 64], [2i64, 64, 96]);
    let t_src = moeplug_tensor::host(src.as_ptr() as *mut _, &s_src, 4, 16);
    let t_pad = moeplug_tensor::host(padded.as_mut_ptr().cast(), &s_pad, 4, 16);
    let t_shuf = moeplug_tensor::host(shuffled.as_mut_ptr().cast(), &s_pad, 4, 16);
    let mut f = fragment();
    let a = moeplug_pad_weights_args {
        struct_size: size_of::<moeplug_pad_weights_args>() as u32,
        src: &t_src,
        dst: &t_pad,
        gate_up: 1,
        fill: 0.0,
        out_fragment: &mut f,
    };
    assert_eq!(
        unsafe { moeplug_pad_weights(&a, ptr::null_mut()) },
        moeplug_status::MoeplugOk,
        "{}",
        last_error()
    );
    let got = (
        f.weight_format,
        f.gate_mode,
        f.weight_layout,
        [
            f.num_experts,
            f.hidden_size,
            f.intermediate_size,
            f.hidden_padded,
            f.intermediate_padded,
        ],
        f.has_bias,
    );
    assert_eq!(got, (1, 1, 0, [2, 64, 24, 96, 32], 0));
    let mut f = fragment();
    let a = moeplug_shuffle_weight_args {
        struct_size: size_of::<moeplug_shuffle_weight_args>() as u32,
        src: &t_pad,
        dst: &t_shuf,
        layout_n: 0,
        layout_k: 0,
        use_int4: 0,
        is_guinterleave: 0,
        gate_up: 0,
        pad_k_to: 0,
        out_fragment: &mut f,
    };
    assert_eq!(
        unsafe { moeplug_shuffle_weight(&a, ptr::null_mut()) },
        moeplug_status::MoeplugOk,
        "{}",
        last_error()
    );
    assert_eq!(
        (f.weight_format, f.weight_layout, f.gate_mode, f.num_experts),
        (1, 2, 0, 0)
    );

    // MXFP4 quantization with shuffled scales: format and scale layout.
    let x = vec![0x3F80u16; 4 * 64]; // bf16 1.0
    let mut q = vec![0u8; 4 * 32];
    let mut sc = vec![0u8; 256 * 8];
    let (sx, sq, ss) = ([4i64, 64], [4i64, 32], [256i64, 8]);
    let tx = moeplug_tensor::host(x.as_ptr() as *mut _, &sx, 4, 16);
    let tq = moeplug_tensor::host(q.as_mut_ptr().cast(), &sq, 1, 8);
    let ts = moeplug_tensor::host(sc.as_mut_ptr().cast(), &ss, 14, 8);
    let mut f = fragment();
    let a = moeplug_quantize_mx_args {
        struct_size: size_of::<moeplug_quantize_mx_args>() as u32,
        src: &tx,
        dst_q: &tq,
        dst_scale: &ts,
        format: moeplug_weight_format::Mxfp4 as i32,
        round_mode: 0,
        shuffle_scale: 1,
        out_fragment: &mut f,
    };
    assert_eq!(
        unsafe { moeplug_quantize_mx(&a, ptr::null_mut()) },
        moeplug_status::MoeplugOk,
        "{}",
        last_error()
    );
    assert_eq!(
        (f.weight_format, f.scale_layout, f.num_experts, f.has_bias),
        (6, 2, 0, 0)
    );

    // swizzle_scale: the scale layout and the expert count.
    let src = vec![127u8; 2 * 32 * 8];
    let mut dst = vec![0u8; 2 * 256];
    let (s3, d3) = ([2i64, 32, 8], [2i64, 1, 256]);
    let ts = moeplug_tensor::host(src.as_ptr() as *mut _, &s3, 14, 8);
    let td = moeplug_tensor::host(dst.as_mut_ptr().cast(), &d3, 14, 8);
    let mut f = fragment();
    let a = moeplug_swizzle_scale_args {
        struct_size: size_of::<moeplug_swizzle_scale_args>() as u32,
        src: &ts,
        dst: &td,
        layout: 0,
        out_fragment: &mut f,
    };
    assert_eq!(
        unsafe { moeplug_swizzle_scale(&a, ptr::null_mut()) },
        moeplug_status::MoeplugOk,
        "{}",
        last_error()
    );
    assert_eq!((f.scale_layout, f.num_experts, f.weight_format), (3, 2, 0));

    // shuffle_scale F3: the AITER e8m0 layout; F4 (gui) establishes nothing.
    let src = vec![127u8; 64 * 8];
    let mut dst = vec![0u8; 256 * 8];
    let (s2, d2) = ([64i64, 8], [256i64, 8]);
    let ts = moeplug_tensor::host(src.as_ptr() as *mut _, &s2, 14, 8);
    let td = moeplug_tensor::host(dst.as_mut_ptr().cast(), &d2, 14, 8);
    let mut f = fragment();
    let mut a = moeplug_shuffle_scale_args {
        struct_size: size_of::<moeplug_shuffle_scale_args>() as u32,
        src: &ts,
        dst: &td,
        num_experts: 0,
        is_guinterleave: 0,
        gate_up: 0,
        out_fragment: &mut f,
    };
    assert_eq!(
        unsafe { moeplug_shuffle_scale(&a, ptr::null_mut()) },
        moeplug_status::MoeplugOk,
        "{}",
        last_error()
    );
    assert_eq!((f.scale_layout, f.num_experts), (2, 0));
    let td = moeplug_tensor::host(dst.as_mut_ptr().cast(), &s2, 14, 8);
    let mut g = fragment();
    g.scale_layout = 99; // overwritten: every field is written
    a.dst = &td;
    a.num_experts = 2;
    a.is_guinterleave = 1;
    a.out_fragment = &mut g;
    assert_eq!(
        unsafe { moeplug_shuffle_scale(&a, ptr::null_mut()) },
        moeplug_status::MoeplugOk,
        "{}",
        last_error()
    );
    let nothing = fragment();
    assert_eq!(format!("{g:?}"), format!("{nothing:?}"));
}

#[test]
fn a_failed_primitive_leaves_its_fragment_untouched() {
    let src = vec![0u16; 2 * 16 * 32];
    let mut dst = vec![0u16; 2 * 16 * 16]; // wrong shape
    let (ss, sd) = ([2i64, 16, 32], [2i64, 16, 16]);
    let ts = moeplug_tensor::host(src.as_ptr() as *mut _, &ss, 4, 16);
    let td = moeplug_tensor::host(dst.as_mut_ptr().cast(), &sd, 4, 16);
    let mut f = fragment();
    f.weight_format = 77;
    let a = moeplug_shuffle_weight_args {
        struct_size: size_of::<moeplug_shuffle_weight_args>() as u32,
        src: &ts,
        dst: &td,
        layout_n: 0,
        layout_k: 0,
        use_int4: 0,
        is_guinterleave: 0,
        gate_up: 0,
        pad_k_to: 0,
        out_fragment: &mut f,
    };
    let s = unsafe { moeplug_shuffle_weight(&a, ptr::null_mut()) };
    assert_eq!(
        s,
        moeplug_status::MoeplugInvalidArgument,
        "{}",
        last_error()
    );
    assert_eq!(f.weight_format, 77);
}

#[test]
fn fragments_assemble_into_a_sealed_record() {
    let (s, m, l) = assemble(&bf16_parts());
    assert_eq!(s, moeplug_status::MoeplugOk, "{m}");
    assert_eq!(
        (
            l.struct_size as usize,
            l.weight_format,
            l.gate_mode,
            l.weight_layout,
            l.scale_layout,
            l.num_experts,
            [
                l.hidden_size,
                l.intermediate_size,
                l.hidden_padded,
                l.intermediate_padded
            ],
            l.flags,
            l.act_dtype,
        ),
        (
            size_of::<moeplug_layout>(),
            1,
            1,
            2,
            0,
            2,
            [64, 32, 128, 64],
            moeplug_layout_flag::HasBias as u32,
            1
        )
    );
    assert_ne!(l.prep_fingerprint, 0);
    // The order of the fragments does not matter.
    let [a, b, c] = bf16_parts();
    let (_, _, l2) = assemble(&[c, a, b]);
    assert_eq!(l2.prep_fingerprint, l.prep_fingerprint);
}

/// `moeplug_check_fused_moe` on a record: it compares the record with its seal before anything
/// else (no tensors needed).
fn check(l: &moeplug_layout) -> (moeplug_status, String) {
    // SAFETY: all-zero is a valid moeplug_fused_moe_args.
    let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = size_of::<moeplug_fused_moe_args>() as u32;
    a.layout = l;
    let s = unsafe { moeplug_check_fused_moe(1, 0, &a) };
    (s, last_error())
}

#[test]
fn each_hand_edit_of_an_assembled_record_is_named() {
    let (_, _, l) = assemble(&bf16_parts());
    assert_eq!(check(&l).0, moeplug_status::MoeplugOk, "{}", check(&l).1);
    let p = "moeplug_check_fused_moe: ";
    let seal = "(layout.prep_fingerprint)";
    type Edit = fn(&mut moeplug_layout);
    let edits: [(Edit, String); 10] = [
        (
            |l| l.weight_format = 2,
            format!("{p}layout.weight_format: the record says fp16, but preparation produced bf16 {seal}"),
        ),
        (
            |l| l.gate_mode = 3,
            format!("{p}layout.gate_mode: the record says interleave_rows, but preparation produced separated {seal}"),
        ),
        (
            |l| l.weight_layout = 1,
            format!("{p}layout.weight_layout: the record says plain, but preparation produced aiter_16x16 {seal}"),
        ),
        (
            |l| l.flags = 0,
            format!("{p}layout.flags: the record says no HAS_BIAS, but preparation produced HAS_BIAS {seal}"),
        ),
        (
            |l| l.act_dtype = 2,
            format!("{p}layout.act_dtype: the record says fp16, but preparation produced bf16 {seal}"),
        ),
        (
            |l| l.num_experts = 3,
            format!("{p}layout.num_experts: 3 differs from the size preparation produced {seal}"),
        ),
        (
            |l| l.hidden_size = 60,
            format!("{p}layout.hidden_size: 60 differs from the size preparation produced {seal}"),
        ),
        (
            |l| l.intermediate_size = 30,
            format!("{p}layout.intermediate_size: 30 differs from the size preparation produced {seal}"),
        ),
        (
            |l| l.hidden_padded = 192,
            format!("{p}layout.hidden_padded: 192 differs from the size preparation produced {seal}"),
        ),
        (
            |l| l.intermediate_padded = 96,
            format!("{p}layout.intermediate_padded: 96 differs from the size preparation produced {seal}"),
        ),
    ];
    for (edit, want) in edits {
        let mut x = l;
        edit(&mut x);
        assert_eq!(check(&x), (moeplug_status::MoeplugLayoutMismatch, want));
    }
    // Zeroing the seal turns the check off: a record filled by hand (docs/abi.md §8).
    let mut x = l;
    x.gate_mode = 3;
    x.prep_fingerprint = 0;
    assert_eq!(check(&x).0, moeplug_status::MoeplugOk, "{}", check(&x).1);
}

#[test]
fn assembly_refusals_name_the_fragment_and_field() {
    let p = "moeplug_layout_from_fragments: ";
    let refused = |parts: &[moeplug_layout_fragment], status: moeplug_status, want: String| {
        let (s, m, l) = assemble(parts);
        assert_eq!((s, m), (status, want));
        assert_eq!(l.num_experts, -7, "out_layout written on failure");
    };
    let invalid = moeplug_status::MoeplugInvalidArgument;
    // Two calls that prepared different layouts.
    let [pad, shuffle, declared] = bf16_parts();
    let mut other = fragment();
    other.hidden_padded = 192;
    refused(
        &[pad, shuffle, other],
        invalid,
        format!(
            "{p}fragments[2].hidden_padded: 192, but fragments[0] established 128 (the calls \
             prepared different layouts)"
        ),
    );
    let mut fp16 = shuffle;
    fp16.weight_format = 2;
    refused(
        &[pad, fp16],
        invalid,
        format!(
            "{p}fragments[1].weight_format: fp16, but fragments[0] established bf16 (the calls \
             prepared different layouts)"
        ),
    );
    // A field no fragment establishes.
    refused(
        &[pad, declared],
        invalid,
        format!(
            "{p}fragments: none establishes weight_layout, which a record needs (docs/abi.md §8 \
             says which call establishes which field; declare the others in a fragment of your \
             own)"
        ),
    );
    let mut mx = pad;
    mx.weight_format = 6;
    let mut fp4_shuffle = shuffle;
    fp4_shuffle.weight_format = 6;
    refused(
        &[mx, fp4_shuffle],
        invalid,
        format!(
            "{p}fragments: none establishes scale_layout, which a record needs (docs/abi.md §8 \
             says which call establishes which field; declare the others in a fragment of your \
             own)"
        ),
    );
    // Fields a record cannot hold.
    let mut bad = fragment();
    bad.has_bias = 3;
    refused(
        &[pad, shuffle, bad],
        invalid,
        format!("{p}fragments[2].has_bias: expected 0 unknown, 1 absent or 2 present, got 3"),
    );
    let mut bad = fragment();
    bad.hidden_size = -1;
    refused(
        &[bad],
        invalid,
        format!("{p}fragments[0].hidden_size: expected 0 (not established) or 1..=2^31, got -1"),
    );
    let mut bad = fragment();
    bad.reserved0 = 1;
    refused(
        &[bad],
        invalid,
        format!("{p}fragments[0].reserved0: must be zero, got 0x1"),
    );
    let mut bad = fragment();
    bad.gate_mode = 9;
    let (s, m, _) = assemble(&[bad]);
    assert_eq!(s, invalid);
    assert!(
        m.starts_with(&format!(
            "{p}fragments[0].gate_mode: unknown gate_mode value 9"
        )),
        "{m}"
    );
    let mut small = fragment();
    small.struct_size = 64;
    refused(
        &[pad, small],
        invalid,
        format!(
            "{p}fragments[1].struct_size: expected at least 72 (the 1.1 size of \
             moeplug_layout_fragment), got 64"
        ),
    );
    // A padded size below the logical one.
    let mut shrunk = pad;
    shrunk.hidden_padded = 32;
    refused(
        &[shrunk, shuffle],
        invalid,
        format!("{p}layout.hidden_padded: expected >= hidden_size 64, got 32"),
    );
}

#[test]
fn assembly_argument_errors() {
    // SAFETY: all-zero is a valid record.
    let mut out: moeplug_layout = unsafe { std::mem::zeroed() };
    out.struct_size = size_of::<moeplug_layout>() as u32;
    let pad = bf16_parts()[0];
    let one = [&pad as *const moeplug_layout_fragment];
    let call = |f: *const *const moeplug_layout_fragment, n: usize, o: *mut moeplug_layout| {
        let s = unsafe { moeplug_layout_from_fragments(f, n, o) };
        (s, last_error())
    };
    let invalid = moeplug_status::MoeplugInvalidArgument;
    let p = "moeplug_layout_from_fragments: ";
    assert_eq!(
        call(one.as_ptr(), 0, &mut out),
        (
            invalid,
            format!("{p}num_fragments: expected 1 to 256, got 0")
        )
    );
    assert_eq!(
        call(one.as_ptr(), 257, &mut out),
        (
            invalid,
            format!("{p}num_fragments: expected 1 to 256, got 257")
        )
    );
    assert_eq!(
        call(ptr::null(), 1, &mut out),
        (invalid, format!("{p}fragments: must not be NULL"))
    );
    let holes = [&pad as *const moeplug_layout_fragment, ptr::null()];
    assert_eq!(
        call(holes.as_ptr(), 2, &mut out),
        (invalid, format!("{p}fragments[1]: must not be NULL"))
    );
    assert_eq!(
        call(one.as_ptr(), 1, ptr::null_mut()),
        (invalid, format!("{p}out_layout: must not be NULL"))
    );
}
