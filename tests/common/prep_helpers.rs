#![allow(dead_code)]
//! Shared helpers of the prep tests: the golden manifest, DLPack tensors over Rust buffers,
//! and the C exports declared for calling them directly.

use std::path::PathBuf;
use std::sync::OnceLock;

#[allow(unused_imports)]
use super::Rng;
use moeplug::capi::types::*;
use serde_json::Value;

extern "C" {
    pub fn moeplug_shuffle_weight(
        a: *const moeplug_shuffle_weight_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
    pub fn moeplug_shuffle_scale(
        a: *const moeplug_shuffle_scale_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
    pub fn moeplug_pad_weights(
        a: *const moeplug_pad_weights_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
    pub fn moeplug_swizzle_scale(
        a: *const moeplug_swizzle_scale_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
    pub fn moeplug_quantize_mx(
        a: *const moeplug_quantize_mx_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
    pub fn moeplug_prepare_moe_sizes(
        a: *const moeplug_prepare_moe_args,
        out: *mut moeplug_prepare_moe_sizes_out,
    ) -> moeplug_status;
    pub fn moeplug_prepare_moe(
        a: *const moeplug_prepare_moe_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
}

/// (status, last error) of a call.
pub fn result(s: moeplug_status) -> (moeplug_status, String) {
    let msg = unsafe { std::ffi::CStr::from_ptr(moeplug::capi::moeplug_last_error()) };
    (s, msg.to_string_lossy().into_owned())
}

/// Assert OK, printing the message otherwise.
pub fn ok(s: moeplug_status) {
    let (s, m) = result(s);
    assert_eq!(s, moeplug_status::MoeplugOk, "{m}");
}

/// Assert the status and that the message contains every fragment.
pub fn fails(s: moeplug_status, want: moeplug_status, fragments: &[&str]) {
    let (s, m) = result(s);
    assert_eq!(s, want, "message: {m}");
    for f in fragments {
        assert!(m.contains(f), "message {m:?} lacks {f:?}");
    }
}

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// A golden manifest of tests/golden by file name (`manifest.json`: the upstream vectors;
/// `aiter_int4*.json`: made by scripts/gen_golden_int4.py).
pub fn manifest_in(file: &str) -> Value {
    let text = std::fs::read_to_string(golden_dir().join(file)).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn manifest() -> &'static Value {
    static M: OnceLock<Value> = OnceLock::new();
    M.get_or_init(|| manifest_in("manifest.json"))
}

/// The case `name` of a manifest.
pub fn case_of<'m>(m: &'m Value, name: &str) -> &'m Value {
    m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no golden case {name}"))
}

pub fn case(name: &str) -> &'static Value {
    case_of(manifest(), name)
}

/// A golden tensor: bytes, shape, torch dtype name.
pub struct G {
    pub bytes: Vec<u8>,
    pub shape: Vec<usize>,
    pub dtype: String,
}

pub fn tensor(c: &Value, role: &str, name: &str) -> G {
    let t = c["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["role"] == role && t["name"] == name)
        .unwrap_or_else(|| panic!("{}: no {role} {name}", c["name"]));
    let bytes = std::fs::read(golden_dir().join(t["file"].as_str().unwrap())).unwrap();
    assert_eq!(bytes.len() as u64, t["nbytes"].as_u64().unwrap());
    G {
        bytes,
        shape: t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect(),
        dtype: t["dtype"].as_str().unwrap().to_string(),
    }
}

/// DLPack (code, bits) of a torch dtype name; packed fp4 is given as uint8 bytes.
pub fn dl_dtype(torch: &str) -> (u8, u8) {
    match torch {
        "float4_e2m1fn_x2" | "uint8" => (1, 8),
        "int8" => (0, 8),
        "float8_e4m3fn" => (10, 8),
        "float8_e4m3fnuz" => (11, 8),
        "float8_e8m0fnu" => (14, 8),
        "bfloat16" => (4, 16),
        "float16" => (2, 16),
        "float32" => (2, 32),
        "int32" => (0, 32),
        other => panic!("dtype {other}"),
    }
}

/// A `moeplug_tensor` that owns its shape array. Keep it alive while the pointer is used.
pub struct Dl {
    pub shape: Box<[i64]>,
    pub t: moeplug_tensor,
}

impl Dl {
    pub fn new(data: *mut u8, code: u8, bits: u8, shape: &[usize]) -> Box<Dl> {
        let shape: Box<[i64]> = shape.iter().map(|&d| d as i64).collect();
        let mut d = Box::new(Dl {
            t: moeplug_tensor::host(data as *mut libc::c_void, &[], code, bits),
            shape,
        });
        d.t.shape = d.shape.as_ptr();
        d.t.ndim = d.shape.len() as i32;
        d
    }
    pub fn of(buf: &mut [u8], torch: &str, shape: &[usize]) -> Box<Dl> {
        let (c, b) = dl_dtype(torch);
        Dl::new(buf.as_mut_ptr(), c, b, shape)
    }
    pub fn ptr(&self) -> *const moeplug_tensor {
        &self.t
    }
}

/// Byte equality where `mask` (1 = defined) says which bytes count.
pub fn assert_bytes(got: &[u8], want: &[u8], mask: Option<&[u8]>, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut bad = 0;
    let mut first = None;
    for i in 0..got.len() {
        if mask.is_some_and(|m| m[i] == 0) {
            continue;
        }
        if got[i] != want[i] {
            bad += 1;
            first.get_or_insert(i);
        }
    }
    if let Some(i) = first {
        panic!(
            "{what}: {bad} bytes differ, first at {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}

pub fn shuffle_weight_args(
    src: &Dl,
    dst: &Dl,
    layout: (i32, i32),
    use_int4: bool,
    gui: bool,
    gate_up: bool,
    pad_k_to: i64,
) -> moeplug_shuffle_weight_args {
    moeplug_shuffle_weight_args {
        struct_size: std::mem::size_of::<moeplug_shuffle_weight_args>() as u32,
        src: src.ptr(),
        dst: dst.ptr(),
        layout_n: layout.0,
        layout_k: layout.1,
        use_int4: use_int4 as i32,
        is_guinterleave: gui as i32,
        gate_up: gate_up as i32,
        pad_k_to,
        out_fragment: std::ptr::null_mut(),
    }
}

/// Run `moeplug_shuffle_weight` on a golden-style input and return the output bytes.
#[allow(clippy::too_many_arguments)]
pub fn shuffle_weight(
    x: &G,
    out_shape: &[usize],
    layout: (i32, i32),
    use_int4: bool,
    gui: bool,
    gate_up: bool,
    pad_k_to: i64,
) -> Vec<u8> {
    let mut src = x.bytes.clone();
    let esz = dl_dtype(&x.dtype).1 as usize / 8;
    let mut out = vec![0xAAu8; out_shape.iter().product::<usize>() * esz];
    let s = Dl::of(&mut src, &x.dtype, &x.shape);
    let d = Dl::of(&mut out, &x.dtype, out_shape);
    let a = shuffle_weight_args(&s, &d, layout, use_int4, gui, gate_up, pad_k_to);
    ok(unsafe { moeplug_shuffle_weight(&a, std::ptr::null_mut()) });
    out
}

pub fn shuffle_scale(
    x: &G,
    out_shape: &[usize],
    experts: i32,
    gui: bool,
    gate_up: bool,
) -> Vec<u8> {
    let mut src = x.bytes.clone();
    let esz = dl_dtype(&x.dtype).1 as usize / 8;
    let mut out = vec![0xAAu8; out_shape.iter().product::<usize>() * esz];
    let s = Dl::of(&mut src, &x.dtype, &x.shape);
    let d = Dl::of(&mut out, &x.dtype, out_shape);
    let a = moeplug_shuffle_scale_args {
        struct_size: std::mem::size_of::<moeplug_shuffle_scale_args>() as u32,
        src: s.ptr(),
        dst: d.ptr(),
        num_experts: experts,
        is_guinterleave: gui as i32,
        gate_up: gate_up as i32,
        out_fragment: std::ptr::null_mut(),
    };
    ok(unsafe { moeplug_shuffle_scale(&a, std::ptr::null_mut()) });
    out
}
