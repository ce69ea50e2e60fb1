//! Randomized argument fuzzing of the C surface: thousands of calls with random enum values,
//! struct sizes, flags, dtypes, devices and shapes (always within the buffers they describe,
//! since a lying shape is the caller's memory error, not ours). Every call must come back
//! with a documented status — never INTERNAL (a caught panic) — and a message when it fails.

mod common;

use std::ffi::CStr;
use std::ptr;

use common::Rng;
use moeplug::capi::types::*;
use moeplug::capi::*;

const BUF: usize = 1 << 20;
/// Device types a host test may claim: CPU, CUDA host, ROCm host, and invalid ones. Never a
/// GPU type: on a GPU machine that would hand host pointers to a kernel.
const DEVICES: [i32; 8] = [1, 1, 1, 1, 3, 11, 99, -1];
const DTYPES: [(u8, u8); 13] = [
    (0, 8),
    (0, 32),
    (0, 64),
    (1, 8),
    (2, 16),
    (2, 32),
    (4, 16),
    (10, 8),
    (11, 8),
    (14, 8),
    (17, 4),
    (2, 64),
    (5, 16),
];
/// Mostly the multiples the layouts need, sometimes awkward sizes.
const DIMS: [i64; 16] = [0, 1, 2, 3, 5, 48, 2, 4, 32, 32, 64, 64, 128, 128, 256, 256];

/// Host memory for tensors, 8-byte aligned.
struct Arena(Vec<u64>);
impl Arena {
    fn new() -> Arena {
        Arena(vec![0x3F80_3F80_3F80_3F80; BUF / 8])
    }
    fn ptr(&mut self) -> *mut libc::c_void {
        self.0.as_mut_ptr() as *mut libc::c_void
    }
}

struct RandTensor {
    shape: Vec<i64>,
    t: moeplug_tensor,
}

fn rand_tensor(rng: &mut Rng, arena: &mut Arena) -> Box<RandTensor> {
    let (code, bits) = rng.pick(&DTYPES);
    let ndim = rng.pick(&[0, 1, 2, 2, 3, 3, 3, 4]);
    let mut shape: Vec<i64> = (0..ndim).map(|_| rng.pick(&DIMS)).collect();
    let elem_bits = bits.max(8) as i64;
    // Keep the described bytes inside the arena.
    while shape.iter().product::<i64>().saturating_mul(elem_bits / 8) > BUF as i64 {
        let i = rng.below(shape.len());
        shape[i] /= 2;
    }
    let mut b = Box::new(RandTensor {
        shape,
        t: unsafe { std::mem::zeroed() },
    });
    b.t = moeplug_tensor {
        data: arena.ptr(),
        device: moeplug_device {
            device_type: rng.pick(&DEVICES),
            device_id: rng.below(3) as i32 - 1,
        },
        ndim: ndim as i32,
        dtype: moeplug_dtype {
            code,
            bits,
            lanes: if rng.below(20) == 0 { 2 } else { 1 },
        },
        shape: b.shape.as_ptr(),
        strides: ptr::null(),
        byte_offset: 0,
    };
    b
}

fn maybe<'a>(rng: &mut Rng, t: &'a RandTensor) -> *const moeplug_tensor {
    if rng.below(8) == 0 {
        ptr::null()
    } else {
        &t.t
    }
}

fn enum_value(rng: &mut Rng) -> i32 {
    rng.below(12) as i32 - 2
}

fn assert_documented(what: &str, s: moeplug_status) -> bool {
    assert_ne!(
        s,
        moeplug_status::MoeplugInternal,
        "{what}: INTERNAL: {}",
        last_error()
    );
    if s != moeplug_status::MoeplugOk {
        assert!(
            !last_error().is_empty(),
            "{what}: status {s:?} without a message"
        );
    }
    s == moeplug_status::MoeplugOk
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(moeplug_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn rand_layout(rng: &mut Rng) -> moeplug_layout {
    let size = |rng: &mut Rng| rng.pick(&[-1i64, 0, 1, 32, 64, 96, 128, 256, 1 << 40]);
    let (h, i) = (size(rng), size(rng));
    moeplug_layout {
        struct_size: std::mem::size_of::<moeplug_layout>() as u32 + rng.pick(&[0u32, 0, 0, 8]),
        weight_format: enum_value(rng),
        gate_mode: enum_value(rng),
        weight_layout: enum_value(rng),
        scale_layout: enum_value(rng),
        num_experts: rng.pick(&[-1, 0, 1, 2, 4, 8, 1 << 30]),
        hidden_size: h,
        intermediate_size: i,
        hidden_padded: if rng.below(2) == 0 { h } else { size(rng) },
        intermediate_padded: if rng.below(2) == 0 { i } else { size(rng) },
        flags: rng.pick(&[0u32, 1, 2, 0xFFFF_FFFF]),
        // Ignored when read: a 1.0 header left it padding.
        reserved0: rng.pick(&[0u32, 0xAAAA_AAAA]),
        // 1.1 fields: a record filled by hand has no fingerprint.
        act_dtype: 0,
        reserved1: 0,
        prep_fingerprint: 0,
    }
}

#[test]
fn fused_moe_arguments() {
    let mut rng = Rng(0xF022);
    let mut arena = Arena::new();
    for _ in 0..3000 {
        let layout = rand_layout(&mut rng);
        let ts: Vec<Box<RandTensor>> = (0..15).map(|_| rand_tensor(&mut rng, &mut arena)).collect();
        let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
        a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
        a.layout = if rng.below(10) == 0 {
            ptr::null()
        } else {
            &layout
        };
        a.activation = enum_value(&mut rng);
        a.act_dtype = enum_value(&mut rng);
        a.alpha = rng.pick(&[0.0f32, 1.0, -1.0, f32::NAN, f32::INFINITY]);
        a.limit = rng.pick(&[0.0f32, 7.0, -1.0, f32::NAN]);
        a.flags = rng.pick(&[0u32, 8, 1, 0xFFFF]);
        a.hidden_states = maybe(&mut rng, &ts[0]);
        a.hidden_scale = if rng.below(8) == 0 {
            &ts[1].t
        } else {
            ptr::null()
        };
        a.w13 = maybe(&mut rng, &ts[2]);
        a.w13_scale = maybe(&mut rng, &ts[3]);
        a.w13_bias = maybe(&mut rng, &ts[4]);
        a.w2 = maybe(&mut rng, &ts[5]);
        a.w2_scale = maybe(&mut rng, &ts[6]);
        a.w2_bias = maybe(&mut rng, &ts[7]);
        a.topk_weights = maybe(&mut rng, &ts[8]);
        a.topk_ids = maybe(&mut rng, &ts[9]);
        a.expert_mask = if rng.below(3) == 0 {
            &ts[10].t
        } else {
            ptr::null()
        };
        a.num_local_tokens = if rng.below(3) == 0 {
            &ts[11].t
        } else {
            ptr::null()
        };
        a.output = maybe(&mut rng, &ts[12]);
        a.workspace = maybe(&mut rng, &ts[13]);
        let dev = rng.pick(&DEVICES);
        assert_documented("check_fused_moe", unsafe {
            moeplug_check_fused_moe(dev, 0, &a)
        });
        let mut bytes = 0usize;
        assert_documented("workspace_size", unsafe {
            moeplug_fused_moe_workspace_size(&a, &mut bytes)
        });
        assert_documented("fused_moe", unsafe { moeplug_fused_moe(&a) });
    }
}

#[test]
fn prep_arguments() {
    let mut rng = Rng(0x9E9);
    let mut src = Arena::new();
    let mut dst = Arena::new();
    let mut dst2 = Arena::new();
    let mut ok = 0;
    for _ in 0..3000 {
        let s = rand_tensor(&mut rng, &mut src);
        let mut d = rand_tensor(&mut rng, &mut dst);
        if rng.below(2) == 0 {
            // Often the output looks like the input, so calls get past the shape checks.
            d.shape = s.shape.clone();
            d.t = moeplug_tensor {
                data: dst.ptr(),
                shape: d.shape.as_ptr(),
                ..s.t
            };
        }
        let d2 = rand_tensor(&mut rng, &mut dst2);
        let knob = |rng: &mut Rng| rng.pick(&[-1, 0, 1, 2, 16, 32, 33]);
        match rng.below(5) {
            0 => {
                let a = moeplug_shuffle_weight_args {
                    struct_size: std::mem::size_of::<moeplug_shuffle_weight_args>() as u32,
                    src: maybe(&mut rng, &s),
                    dst: maybe(&mut rng, &d),
                    layout_n: knob(&mut rng),
                    layout_k: knob(&mut rng),
                    use_int4: rng.below(2) as i32,
                    is_guinterleave: rng.below(2) as i32,
                    gate_up: rng.below(2) as i32,
                    pad_k_to: knob(&mut rng) as i64,
                    out_fragment: std::ptr::null_mut(),
                };
                ok += usize::from(assert_documented("shuffle_weight", unsafe {
                    moeplug_shuffle_weight(&a, ptr::null_mut())
                }));
            }
            1 => {
                let a = moeplug_shuffle_scale_args {
                    struct_size: std::mem::size_of::<moeplug_shuffle_scale_args>() as u32,
                    src: maybe(&mut rng, &s),
                    dst: maybe(&mut rng, &d),
                    num_experts: knob(&mut rng),
                    is_guinterleave: rng.below(2) as i32,
                    gate_up: rng.below(2) as i32,
                    out_fragment: std::ptr::null_mut(),
                };
                ok += usize::from(assert_documented("shuffle_scale", unsafe {
                    moeplug_shuffle_scale(&a, ptr::null_mut())
                }));
            }
            2 => {
                let a = moeplug_pad_weights_args {
                    struct_size: std::mem::size_of::<moeplug_pad_weights_args>() as u32,
                    src: maybe(&mut rng, &s),
                    dst: maybe(&mut rng, &d),
                    gate_up: rng.below(2) as i32,
                    fill: rng.pick(&[0.0, 1.0, 0.3, f64::NAN, 1e300]),
                    out_fragment: std::ptr::null_mut(),
                };
                ok += usize::from(assert_documented("pad_weights", unsafe {
                    moeplug_pad_weights(&a, ptr::null_mut())
                }));
            }
            3 => {
                let a = moeplug_swizzle_scale_args {
                    struct_size: std::mem::size_of::<moeplug_swizzle_scale_args>() as u32,
                    src: maybe(&mut rng, &s),
                    dst: maybe(&mut rng, &d),
                    layout: enum_value(&mut rng),
                    out_fragment: std::ptr::null_mut(),
                };
                ok += usize::from(assert_documented("swizzle_scale", unsafe {
                    moeplug_swizzle_scale(&a, ptr::null_mut())
                }));
            }
            _ => {
                let a = moeplug_quantize_mx_args {
                    struct_size: std::mem::size_of::<moeplug_quantize_mx_args>() as u32,
                    src: maybe(&mut rng, &s),
                    dst_q: maybe(&mut rng, &d),
                    dst_scale: maybe(&mut rng, &d2),
                    format: enum_value(&mut rng),
                    round_mode: enum_value(&mut rng),
                    shuffle_scale: rng.below(2) as i32,
                    out_fragment: std::ptr::null_mut(),
                };
                ok += usize::from(assert_documented("quantize_mx", unsafe {
                    moeplug_quantize_mx(&a, ptr::null_mut())
                }));
            }
        }
    }
    // The fuzzer must reach the work itself, not only the argument checks.
    assert!(ok >= 20, "only {ok} of 3000 prep calls succeeded");
}
