//! The `struct_size` rule (docs/abi.md, "Versioning") at every export that takes a struct.
//! Each input struct is passed at its frozen 1.0 size, larger with a zero tail (also past
//! 4096 bytes), larger with one non-zero tail byte, and below the 1.0 size; each output struct
//! at its 1.0 size, larger, and below the 1.0 size, with guard bytes after the caller's size
//! that must stay untouched, and over a 0xAA then a 0x55 fill (of the buffer and the stack
//! under the call), which must not change a byte of what it writes. Every call is a real one
//! (valid tensors), so "accepted" means "computed the same result", and "refused" means
//! "wrote nothing".

use std::ffi::CStr;
use std::fmt::Debug;
use std::mem::{offset_of, size_of};
use std::ops::Range;
use std::ptr;

use moeplug::capi::types::*;
use moeplug::capi::*;

/// Bytes after a caller's struct, and the fill of output buffers before a call.
const GUARD: u8 = 0xA5;
/// Offset past the library's size of the non-zero byte in a dirty tail.
const DIRT_AT: usize = 17;

fn last_error() -> String {
    unsafe { CStr::from_ptr(moeplug_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A struct as a caller lays it out: `size` bytes (`struct_size` = `size`), then 64 guard
/// bytes. Bytes past `sizeof(T)` are zero, or one of them is 1 when `dirty`.
struct Caller {
    store: Vec<u64>,
    size: usize,
}

impl Caller {
    fn new<T: Copy>(value: &T, size: usize, dirty: bool) -> Caller {
        let mut c = Caller {
            store: vec![0; (size + 64).div_ceil(8)],
            size,
        };
        let bytes = c.bytes_mut();
        bytes.fill(GUARD);
        bytes[..size].fill(0);
        let n = size.min(size_of::<T>());
        // SAFETY: `value` is `size_of::<T>()` readable bytes and `n` is at most that.
        unsafe { ptr::copy_nonoverlapping(value as *const T as *const u8, bytes.as_mut_ptr(), n) };
        bytes[..4].copy_from_slice(&(size as u32).to_le_bytes());
        if dirty {
            bytes[size_of::<T>() + DIRT_AT] = 1;
        }
        c
    }
    /// An output struct: only `struct_size` set, every other byte (and the guard) GUARD.
    fn output(size: usize) -> Caller {
        let mut c = Caller {
            store: vec![0; (size + 64).div_ceil(8)],
            size,
        };
        let bytes = c.bytes_mut();
        bytes.fill(GUARD);
        bytes[..4].copy_from_slice(&(size as u32).to_le_bytes());
        c
    }
    fn bytes(&self) -> &[u8] {
        let n = self.size + 64;
        // SAFETY: the store holds at least `n` bytes.
        unsafe { std::slice::from_raw_parts(self.store.as_ptr() as *const u8, n) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.size + 64;
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.store.as_mut_ptr() as *mut u8, n) }
    }
    fn ptr<T>(&mut self) -> *mut T {
        self.store.as_mut_ptr() as *mut T
    }
    fn guard_intact(&self) -> bool {
        self.bytes()[self.size..].iter().all(|&b| b == GUARD)
    }
    /// The struct as the library filled it (fields only: padding bytes are not compared).
    fn read<T: Copy>(&self) -> T {
        // SAFETY: at least `size_of::<T>()` bytes when size >= sizeof; tests read no smaller.
        unsafe { ptr::read_unaligned(self.store.as_ptr() as *const T) }
    }
}

/// What one call did: its status, message, a comparable rendering of what it produced, and
/// whether every output byte still holds its pre-call fill.
struct Outcome {
    status: moeplug_status,
    message: String,
    produced: String,
    untouched: bool,
}

/// The input rule for the struct `what` (`"args"`, `"args.layout"`): `call` runs the export
/// with the given struct pointer on freshly filled outputs.
fn input_rule<T: Copy>(what: &str, value: &T, v1: u32, mut call: impl FnMut(*const T) -> Outcome) {
    let known = size_of::<T>();
    let v1 = v1 as usize;
    let mut run = |size: usize, dirty: bool| {
        let mut c = Caller::new(value, size, dirty);
        call(c.ptr::<T>())
    };
    let reference = run(known, false);
    assert_eq!(
        reference.status,
        moeplug_status::MoeplugOk,
        "{what} at sizeof: {}",
        reference.message
    );
    assert!(
        reference.produced == "[]" || !reference.untouched,
        "{what}: the reference call wrote no output"
    );
    for size in [v1, known + 64, known + 8192] {
        let o = run(size, false);
        assert_eq!(
            o.status,
            moeplug_status::MoeplugOk,
            "{what}.struct_size {size}: {}",
            o.message
        );
        assert_eq!(o.produced, reference.produced, "{what}.struct_size {size}");
    }
    let dirty = run(known + 64, true);
    assert_eq!(
        dirty.status,
        moeplug_status::MoeplugUnsupported,
        "{what} dirty tail: {}",
        dirty.message
    );
    let needle = format!("{what}: byte {} is non-zero", known + DIRT_AT);
    assert!(
        dirty.message.contains(&needle),
        "{} lacks {needle}",
        dirty.message
    );
    assert!(
        dirty.untouched,
        "{what} dirty tail: outputs written on failure"
    );
    let short = run(v1 - 1, false);
    assert_eq!(
        short.status,
        moeplug_status::MoeplugInvalidArgument,
        "{what} short: {}",
        short.message
    );
    let needle = format!("{what}.struct_size: expected at least {v1}");
    assert!(
        short.message.contains(&needle),
        "{} lacks {needle}",
        short.message
    );
    assert!(short.untouched, "{what} short: outputs written on failure");
}

/// Overwrite the stack below the caller with `fill`, so that any byte the next call leaves
/// unwritten in its own frames (padding of a struct it builds there) holds `fill`.
#[inline(never)]
fn paint_stack(fill: u8) {
    let mut area = [fill; 1 << 16];
    std::hint::black_box(&mut area);
}

/// Every byte an output call writes is determined by its inputs (docs/abi.md §5: engines hash
/// and compare records): with the caller's buffer and the stack under the call pre-filled
/// with 0xAA, then with 0x55, the `size` bytes written are identical, and `reserved` (byte
/// ranges of reserved fields) are zero.
fn output_is_deterministic<T>(
    what: &str,
    size: usize,
    reserved: &[Range<usize>],
    call: &mut impl FnMut(*mut T) -> (moeplug_status, String),
) {
    let mut results = vec![];
    for fill in [0xAA, 0x55] {
        let mut c = Caller::output(size);
        c.bytes_mut()[4..size].fill(fill);
        paint_stack(fill);
        let (s, m) = call(c.ptr());
        assert_eq!(s, moeplug_status::MoeplugOk, "{what} filled {fill:#x}: {m}");
        results.push(c.bytes()[..size].to_vec());
    }
    if let Some(at) = (0..size).find(|&i| results[0][i] != results[1][i]) {
        panic!(
            "{what} (struct_size {size}): byte {at} is {:#04x} over a 0xAA fill and {:#04x} \
             over a 0x55 fill: the library left it unwritten",
            results[0][at], results[1][at]
        );
    }
    for r in reserved.iter().filter(|r| r.end <= size) {
        assert!(
            results[0][r.clone()].iter().all(|&b| b == 0),
            "{what} (struct_size {size}): reserved bytes {r:?} are {:?}, not zero",
            &results[0][r.clone()]
        );
    }
}

/// The 4-byte field at `offset`.
fn u32_at(offset: usize) -> Range<usize> {
    offset..offset + 4
}

/// The reserved bytes of a `moeplug_layout` at `base`.
fn reserved_layout(base: usize) -> Vec<Range<usize>> {
    vec![u32_at(base + offset_of!(moeplug_layout, reserved0))]
}

/// The reserved bytes of `moeplug_prepare_moe_sizes_out`, its nested record's included.
fn reserved_sizes_out() -> Vec<Range<usize>> {
    type S = moeplug_prepare_moe_sizes_out;
    let mut r = vec![
        u32_at(offset_of!(S, reserved0)),
        u32_at(offset_of!(S, reserved1)),
        u32_at(offset_of!(S, reserved2)),
        u32_at(offset_of!(S, reserved3)),
        u32_at(offset_of!(S, reserved4)),
    ];
    r.extend(reserved_layout(offset_of!(S, layout)));
    r
}

/// The output rule for the struct `what`: `call` runs the export writing into the pointer.
/// `reserved` are the byte ranges of its reserved fields (always written as zero).
fn output_rule<T: Copy + Debug>(
    what: &str,
    v1: u32,
    reserved: &[Range<usize>],
    nested_size_at: Option<usize>,
    mut call: impl FnMut(*mut T) -> (moeplug_status, String),
) -> T {
    let known = size_of::<T>();
    let v1 = v1 as usize;
    for size in [v1, known, known + 40] {
        output_is_deterministic(what, size, reserved, &mut call);
    }
    let mut reference = Caller::output(known);
    let (s, m) = call(reference.ptr());
    assert_eq!(s, moeplug_status::MoeplugOk, "{what}: {m}");
    assert!(reference.guard_intact(), "{what}: written past struct_size");
    let want: T = reference.read();

    let mut at_v1 = Caller::output(v1);
    let (s, m) = call(at_v1.ptr());
    assert_eq!(s, moeplug_status::MoeplugOk, "{what} at 1.0 size: {m}");
    assert!(
        at_v1.guard_intact(),
        "{what} at 1.0 size: written past struct_size"
    );
    // A 1.0 caller gets the 1.0 prefix of the current struct, its `struct_size` (and that of
    // a nested record, clamped to the room left) saying how much was filled.
    let mut expect = reference.bytes()[..v1].to_vec();
    expect[..4].copy_from_slice(&(v1 as u32).to_le_bytes());
    if let Some(at) = nested_size_at {
        expect[at..at + 4].copy_from_slice(&((v1 - at) as u32).to_le_bytes());
    }
    assert_eq!(
        at_v1.bytes()[..v1],
        expect[..],
        "{what} at 1.0 size: not the 1.0 prefix of the current struct"
    );
    assert_eq!(
        at_v1.read::<u32>() as usize,
        v1,
        "{what}.struct_size after the call"
    );

    let mut newer = Caller::output(known + 40);
    let (s, m) = call(newer.ptr());
    assert_eq!(s, moeplug_status::MoeplugOk, "{what} larger: {m}");
    assert!(
        newer.guard_intact(),
        "{what} larger: written past struct_size"
    );
    assert!(
        newer.bytes()[known..known + 40].iter().all(|&b| b == 0),
        "{what} larger: the fields this library does not know are not zeroed"
    );
    assert_eq!(
        newer.read::<u32>() as usize,
        known,
        "{what}.struct_size: the bytes filled"
    );
    assert_eq!(
        format!("{:?}", {
            let mut v: T = newer.read();
            // struct_size differs by design (the bytes filled); the rest must match.
            // SAFETY: every ABI struct starts with a u32 struct_size.
            unsafe { ptr::write_unaligned(&mut v as *mut T as *mut u32, known as u32) };
            v
        }),
        format!("{want:?}")
    );

    let mut short = Caller::output(v1 - 1);
    let before = short.bytes().to_vec();
    let (s, m) = call(short.ptr());
    assert_eq!(
        s,
        moeplug_status::MoeplugInvalidArgument,
        "{what} short: {m}"
    );
    let needle = format!("{what}.struct_size: expected at least {v1}");
    assert!(m.contains(&needle), "{m} lacks {needle}");
    assert_eq!(
        short.bytes(),
        &before[..],
        "{what} short: written on failure"
    );
    want
}

/// A host tensor with its own aligned storage and shape.
struct Buf {
    store: Vec<u64>,
    len: usize,
    shape: Box<[i64]>,
    code: u8,
    bits: u8,
}

impl Buf {
    fn new(bytes: &[u8], shape: &[usize], (code, bits): (u8, u8)) -> Buf {
        let mut store = vec![0u64; bytes.len().div_ceil(8).max(1)];
        // SAFETY: the store holds at least `bytes.len()` bytes.
        unsafe {
            ptr::copy_nonoverlapping(bytes.as_ptr(), store.as_mut_ptr() as *mut u8, bytes.len())
        };
        Buf {
            store,
            len: bytes.len(),
            shape: shape.iter().map(|&d| d as i64).collect(),
            code,
            bits,
        }
    }
    fn filled(len: usize, shape: &[usize], dtype: (u8, u8)) -> Buf {
        Buf::new(&vec![GUARD; len], shape, dtype)
    }
    fn desc(&mut self) -> moeplug_tensor {
        moeplug_tensor::host(
            self.store.as_mut_ptr() as *mut libc::c_void,
            &self.shape,
            self.code,
            self.bits,
        )
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes were allocated.
        unsafe { std::slice::from_raw_parts(self.store.as_ptr() as *const u8, self.len) }
    }
    fn untouched(&self) -> bool {
        self.bytes().iter().all(|&b| b == GUARD)
    }
}

const BF16: (u8, u8) = (4, 16);
const F32: (u8, u8) = (2, 32);
const I32: (u8, u8) = (0, 32);
const U8: (u8, u8) = (1, 8);
const E8M0: (u8, u8) = (14, 8);

/// Deterministic bf16 values in [-1, 1).
fn bf16_bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let x = ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32;
            (((2.0 * x - 1.0).to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

fn outcome(status: moeplug_status, outputs: &[&Buf]) -> Outcome {
    Outcome {
        status,
        message: last_error(),
        produced: format!(
            "{:?}",
            outputs.iter().map(|b| b.bytes()).collect::<Vec<_>>()
        ),
        untouched: outputs.iter().all(|b| b.untouched()),
    }
}

/// A primitive `f(args, stream)` over one `src` and one `dst` tensor: `base` is its struct
/// (tensors NULL), `repoint` sets the tensors in a caller's copy.
fn primitive<T: Copy>(
    f: unsafe extern "C" fn(*const T, *mut libc::c_void) -> moeplug_status,
    src: &mut Buf,
    dst: (usize, &[usize], (u8, u8)),
    base: T,
    repoint: impl Fn(&mut T, *const moeplug_tensor, *const moeplug_tensor),
    v1: u32,
) {
    input_rule("args", &base, v1, |p| {
        let mut d = Buf::filled(dst.0, dst.1, dst.2);
        let (sd, dd) = (src.desc(), d.desc());
        // SAFETY: `p` is the caller's struct, at least the 1.0 size (which holds the tensors).
        repoint(unsafe { &mut *p.cast_mut() }, &sd, &dd);
        let s = unsafe { f(p, ptr::null_mut()) };
        outcome(s, &[&d])
    });
}

#[test]
fn shuffle_weight() {
    let mut src = Buf::new(&bf16_bytes(2 * 16 * 32, 1), &[2, 16, 32], BF16);
    primitive(
        moeplug_shuffle_weight,
        &mut src,
        (2 * 16 * 32 * 2, &[2, 16, 32], BF16),
        moeplug_shuffle_weight_args {
            struct_size: size_of::<moeplug_shuffle_weight_args>() as u32,
            src: ptr::null(),
            dst: ptr::null(),
            layout_n: 16,
            layout_k: 16,
            use_int4: 0,
            is_guinterleave: 0,
            gate_up: 0,
            pad_k_to: 0,
            out_fragment: std::ptr::null_mut(),
        },
        |a, s, d| (a.src, a.dst) = (s, d),
        MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_0,
    );
}

#[test]
fn shuffle_scale() {
    let bytes: Vec<u8> = (0..64 * 8).map(|i| 100 + (i % 50) as u8).collect();
    let mut src = Buf::new(&bytes, &[64, 8], E8M0);
    primitive(
        moeplug_shuffle_scale,
        &mut src,
        (256 * 8, &[256, 8], E8M0),
        moeplug_shuffle_scale_args {
            struct_size: size_of::<moeplug_shuffle_scale_args>() as u32,
            src: ptr::null(),
            dst: ptr::null(),
            num_experts: 0,
            is_guinterleave: 0,
            gate_up: 0,
            out_fragment: std::ptr::null_mut(),
        },
        |a, s, d| (a.src, a.dst) = (s, d),
        MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_0,
    );
}

#[test]
fn pad_weights() {
    let mut src = Buf::new(&bf16_bytes(2 * 4 * 8, 2), &[2, 4, 8], BF16);
    primitive(
        moeplug_pad_weights,
        &mut src,
        (2 * 8 * 16 * 2, &[2, 8, 16], BF16),
        moeplug_pad_weights_args {
            struct_size: size_of::<moeplug_pad_weights_args>() as u32,
            src: ptr::null(),
            dst: ptr::null(),
            gate_up: 1,
            fill: 0.0,
            out_fragment: std::ptr::null_mut(),
        },
        |a, s, d| (a.src, a.dst) = (s, d),
        MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_0,
    );
}

#[test]
fn swizzle_scale() {
    let bytes: Vec<u8> = (0..2 * 32 * 8).map(|i| 90 + (i % 60) as u8).collect();
    let mut src = Buf::new(&bytes, &[2, 32, 8], E8M0);
    primitive(
        moeplug_swizzle_scale,
        &mut src,
        (2 * 256, &[2, 1, 256], E8M0),
        moeplug_swizzle_scale_args {
            struct_size: size_of::<moeplug_swizzle_scale_args>() as u32,
            src: ptr::null(),
            dst: ptr::null(),
            layout: 0,
            out_fragment: std::ptr::null_mut(),
        },
        |a, s, d| (a.src, a.dst) = (s, d),
        MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_0,
    );
}

#[test]
fn quantize_mx() {
    let mut src = Buf::new(&bf16_bytes(4 * 64, 3), &[4, 64], BF16);
    let base = moeplug_quantize_mx_args {
        struct_size: size_of::<moeplug_quantize_mx_args>() as u32,
        src: ptr::null(),
        dst_q: ptr::null(),
        dst_scale: ptr::null(),
        format: moeplug_weight_format::Mxfp4 as i32,
        round_mode: 0,
        shuffle_scale: 0,
        out_fragment: std::ptr::null_mut(),
    };
    input_rule("args", &base, MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_0, |p| {
        let mut q = Buf::filled(4 * 32, &[4, 32], U8);
        let mut sc = Buf::filled(4 * 2, &[4, 2], E8M0);
        let (sd, qd, scd) = (src.desc(), q.desc(), sc.desc());
        // SAFETY: `p` is the caller's struct of at least the 1.0 size.
        unsafe {
            (*p.cast_mut()).src = &sd;
            (*p.cast_mut()).dst_q = &qd;
            (*p.cast_mut()).dst_scale = &scd;
        }
        let s = unsafe { moeplug_quantize_mx(p, ptr::null_mut()) };
        outcome(s, &[&q, &sc])
    });
}

/// bf16 checkpoint weights for E=2, H=64, I=32, and the prepare_moe arguments over them.
struct Checkpoint {
    w13: Buf,
    w2: Buf,
}

const E: usize = 2;
const H: usize = 64;
const I: usize = 32;

fn checkpoint() -> Checkpoint {
    Checkpoint {
        w13: Buf::new(&bf16_bytes(E * 2 * I * H, 4), &[E, 2 * I, H], BF16),
        w2: Buf::new(&bf16_bytes(E * H * I, 5), &[E, H, I], BF16),
    }
}

fn prepare_args() -> moeplug_prepare_moe_args {
    // SAFETY: all-zero is a valid moeplug_prepare_moe_args (NULL tensors, defaults).
    let mut a: moeplug_prepare_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = size_of::<moeplug_prepare_moe_args>() as u32;
    a.weight_format = moeplug_weight_format::Bf16 as i32;
    a
}

#[test]
fn prepare_moe_sizes() {
    let mut ck = checkpoint();
    let (w13, w2) = (ck.w13.desc(), ck.w2.desc());
    let mut base = prepare_args();
    base.w13 = &w13;
    base.w2 = &w2;
    input_rule("args", &base, MOEPLUG_PREPARE_MOE_ARGS_SIZE_V1_0, |p| {
        let mut out = Caller::output(size_of::<moeplug_prepare_moe_sizes_out>());
        let before = out.bytes().to_vec();
        let s = unsafe { moeplug_prepare_moe_sizes(p, out.ptr()) };
        Outcome {
            status: s,
            message: last_error(),
            produced: format!("{:?}", out.read::<moeplug_prepare_moe_sizes_out>()),
            untouched: out.bytes() == &before[..],
        }
    });
    let sizes = output_rule(
        "out",
        MOEPLUG_PREPARE_MOE_SIZES_OUT_SIZE_V1_0,
        &reserved_sizes_out(),
        Some(std::mem::offset_of!(moeplug_prepare_moe_sizes_out, layout)),
        |out: *mut moeplug_prepare_moe_sizes_out| {
            (
                unsafe { moeplug_prepare_moe_sizes(&base, out) },
                last_error(),
            )
        },
    );
    // A current caller gets the current record (a 1.0 caller the 1.0 one: checked above).
    assert_eq!(
        sizes.layout.struct_size as usize,
        size_of::<moeplug_layout>()
    );
    assert_eq!(sizes.w13_shape[..3], [E as i64, 2 * I as i64, H as i64]);
}

/// Prepared weights and their record, from `moeplug_prepare_moe` at the current sizes.
struct Prepared {
    w13: Buf,
    w2: Buf,
    layout: moeplug_layout,
}

fn prepare(ck: &mut Checkpoint) -> Prepared {
    let (w13, w2) = (ck.w13.desc(), ck.w2.desc());
    let mut out13 = Buf::filled(E * 2 * I * H * 2, &[E, 2 * I, H], BF16);
    let mut out2 = Buf::filled(E * H * I * 2, &[E, H, I], BF16);
    let (o13, o2) = (out13.desc(), out2.desc());
    // SAFETY: all-zero is a valid record; struct_size is set below.
    let mut layout: moeplug_layout = unsafe { std::mem::zeroed() };
    layout.struct_size = size_of::<moeplug_layout>() as u32;
    let mut a = prepare_args();
    a.w13 = &w13;
    a.w2 = &w2;
    a.out_w13 = &o13;
    a.out_w2 = &o2;
    a.out_layout = &mut layout;
    let s = unsafe { moeplug_prepare_moe(&a, ptr::null_mut()) };
    assert_eq!(s, moeplug_status::MoeplugOk, "{}", last_error());
    Prepared {
        w13: out13,
        w2: out2,
        layout,
    }
}

#[test]
fn prepare_moe() {
    let mut ck = checkpoint();
    let (w13, w2) = (ck.w13.desc(), ck.w2.desc());
    let mut base = prepare_args();
    base.w13 = &w13;
    base.w2 = &w2;
    input_rule("args", &base, MOEPLUG_PREPARE_MOE_ARGS_SIZE_V1_0, |p| {
        let mut out13 = Buf::filled(E * 2 * I * H * 2, &[E, 2 * I, H], BF16);
        let mut out2 = Buf::filled(E * H * I * 2, &[E, H, I], BF16);
        let (o13, o2) = (out13.desc(), out2.desc());
        let mut layout = Caller::output(size_of::<moeplug_layout>());
        let before = layout.bytes().to_vec();
        // SAFETY: `p` is the caller's struct of at least the 1.0 size.
        unsafe {
            (*p.cast_mut()).out_w13 = &o13;
            (*p.cast_mut()).out_w2 = &o2;
            (*p.cast_mut()).out_layout = layout.ptr();
        }
        let s = unsafe { moeplug_prepare_moe(p, ptr::null_mut()) };
        let mut o = outcome(s, &[&out13, &out2]);
        o.produced += &format!("{:?}", layout.read::<moeplug_layout>());
        o.untouched &= layout.bytes() == &before[..];
        o
    });
    let mut out13 = Buf::filled(E * 2 * I * H * 2, &[E, 2 * I, H], BF16);
    let mut out2 = Buf::filled(E * H * I * 2, &[E, H, I], BF16);
    let (o13, o2) = (out13.desc(), out2.desc());
    let mut a = base;
    a.out_w13 = &o13;
    a.out_w2 = &o2;
    let layout = output_rule(
        "out_layout",
        MOEPLUG_LAYOUT_SIZE_V1_0,
        &reserved_layout(0),
        None,
        |out| {
            a.out_layout = out;
            (
                unsafe { moeplug_prepare_moe(&a, ptr::null_mut()) },
                last_error(),
            )
        },
    );
    assert_eq!(layout.hidden_size, H as i64);
    assert_eq!(layout.num_experts, E as i32);
}

#[test]
fn get_caps() {
    let caps = output_rule("out", MOEPLUG_CAPS_SIZE_V1_0, &[], None, |out| {
        (unsafe { moeplug_get_caps(1, 0, out) }, last_error())
    });
    assert_eq!(caps.backend, moeplug_backend::Cpu as i32);
}

/// A CPU launch over prepared weights: M=3 tokens, top-1.
struct Moe {
    prepared: Prepared,
    hidden: Buf,
    weights: Buf,
    ids: Buf,
}

fn moe() -> Moe {
    let mut ck = checkpoint();
    let weights: Vec<u8> = [1.0f32, 0.5, 2.0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let ids: Vec<u8> = [0i32, 1, 1].iter().flat_map(|i| i.to_le_bytes()).collect();
    Moe {
        prepared: prepare(&mut ck),
        hidden: Buf::new(&bf16_bytes(3 * H, 6), &[3, H], BF16),
        weights: Buf::new(&weights, &[3, 1], F32),
        ids: Buf::new(&ids, &[3, 1], I32),
    }
}

/// The launch arguments over `m` with `output`; `layout` as given.
fn moe_args(d: &[moeplug_tensor; 6], layout: *const moeplug_layout) -> moeplug_fused_moe_args {
    // SAFETY: all-zero is a valid moeplug_fused_moe_args.
    let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = size_of::<moeplug_fused_moe_args>() as u32;
    a.layout = layout;
    a.hidden_states = &d[0];
    a.w13 = &d[1];
    a.w2 = &d[2];
    a.topk_weights = &d[3];
    a.topk_ids = &d[4];
    a.output = &d[5];
    a
}

/// Which launch export a rule drives.
#[derive(Clone, Copy)]
enum Call {
    Check,
    WorkspaceSize,
    Launch,
}

fn run_call(call: Call, a: *const moeplug_fused_moe_args, out: &Buf) -> Outcome {
    let mut bytes = [GUARD; size_of::<usize>()];
    let s = unsafe {
        match call {
            Call::Check => moeplug_check_fused_moe(1, 0, a),
            Call::WorkspaceSize => moeplug_fused_moe_workspace_size(a, bytes.as_mut_ptr().cast()),
            Call::Launch => moeplug_fused_moe(a),
        }
    };
    let ws = Buf::new(&bytes, &[8], U8);
    match call {
        Call::Launch => outcome(s, &[out]),
        Call::WorkspaceSize => outcome(s, &[&ws]),
        Call::Check => outcome(s, &[]),
    }
}

fn launch_rules(call: Call) {
    let mut m = moe();
    let d = |m: &mut Moe, out: &mut Buf| {
        [
            m.hidden.desc(),
            m.prepared.w13.desc(),
            m.prepared.w2.desc(),
            m.weights.desc(),
            m.ids.desc(),
            out.desc(),
        ]
    };
    // The args struct under the rule, with the record at its current size.
    let layout = m.prepared.layout;
    let mut out = Buf::filled(3 * H * 2, &[3, H], BF16);
    let base = moe_args(&d(&mut m, &mut out), &layout);
    input_rule("args", &base, MOEPLUG_FUSED_MOE_ARGS_SIZE_V1_0, |p| {
        let mut out = Buf::filled(3 * H * 2, &[3, H], BF16);
        let descs = d(&mut m, &mut out);
        let fresh = moe_args(&descs, &layout);
        // SAFETY: `p` is the caller's struct of at least the 1.0 size: re-point its tensors.
        unsafe {
            let q = p.cast_mut();
            (*q).hidden_states = fresh.hidden_states;
            (*q).w13 = fresh.w13;
            (*q).w2 = fresh.w2;
            (*q).topk_weights = fresh.topk_weights;
            (*q).topk_ids = fresh.topk_ids;
            (*q).output = fresh.output;
        }
        run_call(call, p, &out)
    });
    // The record under the rule, inside a current-size args struct.
    input_rule("args.layout", &layout, MOEPLUG_LAYOUT_SIZE_V1_0, |l| {
        let mut out = Buf::filled(3 * H * 2, &[3, H], BF16);
        let descs = d(&mut m, &mut out);
        let a = moe_args(&descs, l);
        run_call(call, &a, &out)
    });
}

#[test]
fn check_fused_moe() {
    launch_rules(Call::Check);
}

#[test]
fn fused_moe_workspace_size() {
    launch_rules(Call::WorkspaceSize);
}

#[test]
fn fused_moe() {
    launch_rules(Call::Launch);
}

/// `moeplug_layout.reserved0` was tail padding in the 1.0 header, so a hand-filled 1.0 record
/// may hold anything there: a launch ignores it.
#[test]
fn layout_reserved_is_ignored_on_input() {
    let mut m = moe();
    let mut run = |reserved0: u32| {
        let mut layout = m.prepared.layout;
        layout.reserved0 = reserved0;
        let mut out = Buf::filled(3 * H * 2, &[3, H], BF16);
        let d = [
            m.hidden.desc(),
            m.prepared.w13.desc(),
            m.prepared.w2.desc(),
            m.weights.desc(),
            m.ids.desc(),
            out.desc(),
        ];
        let o = run_call(Call::Launch, &moe_args(&d, &layout), &out);
        assert_eq!(
            o.status,
            moeplug_status::MoeplugOk,
            "reserved0 {reserved0:#x}: {}",
            o.message
        );
        assert!(!o.untouched, "reserved0 {reserved0:#x}: no output written");
        o.produced
    };
    assert_eq!(run(0), run(0xFEFE_FEFE));
}

/// A primitive's `out_fragment` (ABI 1.1) is an output struct of the same rule, its first
/// size the 1.1 one.
#[test]
fn out_fragment() {
    let mut src = Buf::new(&bf16_bytes(2 * 16 * 32, 1), &[2, 16, 32], BF16);
    let reserved = [u32_at(offset_of!(moeplug_layout_fragment, reserved0))];
    let f = output_rule(
        "out_fragment",
        MOEPLUG_LAYOUT_FRAGMENT_SIZE_V1_1,
        &reserved,
        None,
        |out: *mut moeplug_layout_fragment| {
            let mut d = Buf::filled(2 * 16 * 32 * 2, &[2, 16, 32], BF16);
            let (sd, dd) = (src.desc(), d.desc());
            let a = moeplug_shuffle_weight_args {
                struct_size: size_of::<moeplug_shuffle_weight_args>() as u32,
                src: &sd,
                dst: &dd,
                layout_n: 0,
                layout_k: 0,
                use_int4: 0,
                is_guinterleave: 0,
                gate_up: 0,
                pad_k_to: 0,
                out_fragment: out,
            };
            (
                unsafe { moeplug_shuffle_weight(&a, ptr::null_mut()) },
                last_error(),
            )
        },
    );
    assert_eq!(f.weight_layout, moeplug_weight_layout::Aiter_16x16 as i32);
}

/// A fragment that establishes every field of a bf16 record.
fn whole_fragment() -> moeplug_layout_fragment {
    moeplug_layout_fragment {
        struct_size: size_of::<moeplug_layout_fragment>() as u32,
        weight_format: moeplug_weight_format::Bf16 as i32,
        gate_mode: moeplug_gate_mode::Separated as i32,
        weight_layout: moeplug_weight_layout::Aiter_16x16 as i32,
        scale_layout: 0,
        act_dtype: 0,
        num_experts: E as i64,
        hidden_size: H as i64,
        intermediate_size: I as i64,
        hidden_padded: H as i64,
        intermediate_padded: I as i64,
        has_bias: moeplug_fragment_bias::Absent as i32,
        reserved0: 0,
    }
}

/// `moeplug_layout_from_fragments`: each fragment is an input struct (first size 1.1), the
/// record an output struct.
#[test]
fn layout_from_fragments() {
    let whole = whole_fragment();
    input_rule(
        "fragments[0]",
        &whole,
        MOEPLUG_LAYOUT_FRAGMENT_SIZE_V1_1,
        |p| {
            let mut out = Caller::output(size_of::<moeplug_layout>());
            let before = out.bytes().to_vec();
            let parts = [p];
            let s = unsafe { moeplug_layout_from_fragments(parts.as_ptr(), 1, out.ptr()) };
            Outcome {
                status: s,
                message: last_error(),
                produced: format!("{:?}", out.read::<moeplug_layout>()),
                untouched: out.bytes() == &before[..],
            }
        },
    );
    let parts = [&whole as *const moeplug_layout_fragment];
    let l = output_rule(
        "out_layout",
        MOEPLUG_LAYOUT_SIZE_V1_0,
        &reserved_layout(0),
        None,
        |out| {
            (
                unsafe { moeplug_layout_from_fragments(parts.as_ptr(), 1, out) },
                last_error(),
            )
        },
    );
    assert_eq!(l.hidden_size, H as i64);
    assert_ne!(l.prep_fingerprint, 0);
}
