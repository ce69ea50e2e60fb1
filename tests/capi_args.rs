//! Argument validation at the C boundary, driven from Rust through the exported functions:
//! each bad input gives the documented status and a message naming the argument.

use std::ffi::CStr;
use std::ptr;

use moeplug::capi::types::*;
use moeplug::capi::*;

fn last_error() -> String {
    unsafe {
        CStr::from_ptr(moeplug_last_error())
            .to_string_lossy()
            .into_owned()
    }
}

fn layout() -> moeplug_layout {
    moeplug_layout {
        struct_size: std::mem::size_of::<moeplug_layout>() as u32,
        weight_format: moeplug_weight_format::Bf16 as i32,
        gate_mode: moeplug_gate_mode::Separated as i32,
        weight_layout: moeplug_weight_layout::Plain as i32,
        scale_layout: 0,
        num_experts: 4,
        hidden_size: 64,
        intermediate_size: 32,
        hidden_padded: 64,
        intermediate_padded: 32,
        flags: 0,
        reserved0: 0,
        // 1.1 fields: a record filled by hand has no fingerprint.
        act_dtype: 0,
        reserved1: 0,
        prep_fingerprint: 0,
    }
}

fn tensor(data: *mut u8, shape: &[i64], code: u8, bits: u8) -> moeplug_tensor {
    moeplug_tensor::host(data as *mut libc::c_void, shape, code, bits)
}

fn args(l: &moeplug_layout, hidden: *const moeplug_tensor) -> moeplug_fused_moe_args {
    moeplug_fused_moe_args {
        struct_size: std::mem::size_of::<moeplug_fused_moe_args>() as u32,
        layout: l,
        activation: 0,
        alpha: 0.0,
        limit: 0.0,
        act_dtype: 0,
        flags: 0,
        hidden_states: hidden,
        hidden_scale: ptr::null(),
        w13: ptr::null(),
        w13_scale: ptr::null(),
        w13_bias: ptr::null(),
        w2: ptr::null(),
        w2_scale: ptr::null(),
        w2_bias: ptr::null(),
        topk_weights: ptr::null(),
        topk_ids: ptr::null(),
        expert_mask: ptr::null(),
        num_local_tokens: ptr::null(),
        output: ptr::null(),
        workspace: ptr::null(),
        stream: ptr::null_mut(),
        stage1_act_scale: ptr::null(),
        stage2_act_scale: ptr::null(),
        stage2_act_dtype: 0,
        reserved0: 0,
    }
}

/// Launch with only `hidden_states` set to `t`: the tensor is read first, so its error wins.
fn launch_status(t: &moeplug_tensor) -> (moeplug_status, String) {
    let l = layout();
    let a = args(&l, t);
    let s = unsafe { moeplug_fused_moe(&a) };
    (s, last_error())
}

fn assert_refused(t: &moeplug_tensor, want: moeplug_status, needle: &str) {
    let (s, msg) = launch_status(t);
    assert_eq!(s, want, "{msg}");
    assert!(
        msg.contains(needle),
        "message '{msg}' does not contain '{needle}'"
    );
    assert!(msg.starts_with("moeplug_fused_moe: "), "{msg}");
}

#[test]
fn tensors_are_validated_before_use() {
    let mut buf = vec![0u8; 4096];
    let p = buf.as_mut_ptr();
    let shape = [4i64, 64];
    let mut t = tensor(p, &shape, 4, 16);

    t.ndim = 9;
    assert_refused(
        &t,
        moeplug_status::MoeplugInvalidArgument,
        "hidden_states.ndim: expected 0..=8, got 9",
    );
    t.ndim = -1;
    assert_refused(
        &t,
        moeplug_status::MoeplugInvalidArgument,
        "hidden_states.ndim",
    );

    let t2 = moeplug_tensor {
        shape: ptr::null(),
        ..tensor(p, &shape, 4, 16)
    };
    assert_refused(
        &t2,
        moeplug_status::MoeplugInvalidArgument,
        "hidden_states.shape: must not be NULL",
    );

    let neg = [4i64, -2];
    assert_refused(
        &tensor(p, &neg, 4, 16),
        moeplug_status::MoeplugInvalidArgument,
        "negative dimension -2",
    );

    assert_refused(
        &tensor(p, &shape, 5, 16),
        moeplug_status::MoeplugUnsupported,
        "hidden_states: dtype {code 5, bits 16}",
    );
    let mut lanes = tensor(p, &shape, 4, 16);
    lanes.dtype.lanes = 4;
    assert_refused(
        &lanes,
        moeplug_status::MoeplugUnsupported,
        "lanes must be 1, got 4",
    );

    let mut dev = tensor(p, &shape, 4, 16);
    dev.device.device_type = 99;
    assert_refused(
        &dev,
        moeplug_status::MoeplugInvalidArgument,
        "hidden_states.device: unknown device_type 99",
    );

    assert_refused(
        &tensor(ptr::null_mut(), &shape, 4, 16),
        moeplug_status::MoeplugInvalidArgument,
        "hidden_states.data: must not be NULL",
    );

    let strides = [1i64, 4];
    let st = moeplug_tensor {
        strides: strides.as_ptr(),
        ..tensor(p, &shape, 4, 16)
    };
    assert_refused(
        &st,
        moeplug_status::MoeplugUnsupported,
        "only compact row-major",
    );

    let odd = [4i64, 63];
    assert_refused(
        &tensor(p, &odd, 17, 4),
        moeplug_status::MoeplugInvalidArgument,
        "even last dimension, got 63",
    );

    let huge = [i64::MAX, 4];
    assert_refused(
        &tensor(p, &huge, 4, 16),
        moeplug_status::MoeplugInvalidArgument,
        "overflows the address space",
    );
}

#[test]
fn compact_strides_are_accepted_as_compact() {
    // Compact strides given explicitly are the same as NULL: the error is then about w13.
    let mut buf = vec![0u8; 4096];
    let shape = [4i64, 64];
    let strides = [64i64, 1];
    let t = moeplug_tensor {
        strides: strides.as_ptr(),
        ..tensor(buf.as_mut_ptr(), &shape, 4, 16)
    };
    let (s, msg) = launch_status(&t);
    assert_eq!(s, moeplug_status::MoeplugInvalidArgument, "{msg}");
    assert!(msg.contains("w13: must not be NULL"), "{msg}");
}

#[test]
fn unknown_flags_and_bad_floats_are_refused() {
    let l = layout();
    let mut a = args(&l, ptr::null());
    a.flags = 1 << 7;
    assert_eq!(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugUnsupported
    );
    assert!(
        last_error().contains("flags: unknown bits 0x80"),
        "{}",
        last_error()
    );
    a.flags = 0;
    a.limit = -1.0;
    assert_eq!(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugInvalidArgument
    );
    assert!(last_error().contains("limit >= 0"), "{}", last_error());
    a.limit = f32::NAN;
    assert_eq!(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugInvalidArgument
    );
}

#[test]
fn layout_record_is_validated() {
    let mut l = layout();
    l.scale_layout = 2;
    let a = args(&l, ptr::null());
    assert_eq!(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugInvalidArgument
    );
    assert!(
        last_error().contains("layout.scale_layout: expected 0 for weight_format bf16"),
        "{}",
        last_error()
    );

    let mut l = layout();
    l.weight_format = moeplug_weight_format::Mxfp4 as i32;
    let a = args(&l, ptr::null());
    assert_eq!(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugInvalidArgument
    );
    assert!(
        last_error().contains("layout.scale_layout: unknown scale_layout value 0"),
        "{}",
        last_error()
    );

    let mut l = layout();
    l.num_experts = 0;
    let a = args(&l, ptr::null());
    assert_eq!(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugInvalidArgument
    );
    assert!(
        last_error().contains("layout.num_experts: expected 1..=2^20, got 0"),
        "{}",
        last_error()
    );

    let mut l = layout();
    l.flags = 1 << 5;
    let a = args(&l, ptr::null());
    assert_eq!(
        unsafe { moeplug_check_fused_moe(1, 0, &a) },
        moeplug_status::MoeplugUnsupported
    );
    assert!(
        last_error().contains("layout.flags: unknown bits 0x20"),
        "{}",
        last_error()
    );
}

#[test]
fn last_error_is_per_thread_and_cleared_by_success() {
    let mut caps: moeplug_caps = unsafe { std::mem::zeroed() };
    caps.struct_size = 4;
    assert_eq!(
        unsafe { moeplug_get_caps(1, 0, &mut caps) },
        moeplug_status::MoeplugInvalidArgument
    );
    let here = last_error();
    assert!(here.contains("out.struct_size"));
    let other = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(other, "", "another thread sees this thread's error");
    caps.struct_size = std::mem::size_of::<moeplug_caps>() as u32;
    assert_eq!(
        unsafe { moeplug_get_caps(1, 0, &mut caps) },
        moeplug_status::MoeplugOk
    );
    assert_eq!(last_error(), "");
}
