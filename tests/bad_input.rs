//! Issue 14: bad input never crashes, corrupts memory or computes a wrong answer. One test per
//! finding: descriptors whose addresses wrap or leave the user space, top-k above 128 and M
//! above 2^24 on the CPU (no packed index), the GPU limits as data, prepare_moe_sizes with
//! overflowing byte counts, M >= 2^31 with num_local_tokens, and CPU scratch that stays
//! bounded (and turns a failed allocation into OUT_OF_MEMORY) under an address-space limit.

use std::ffi::CStr;
use std::ptr;

use moeplug::capi::types::*;
use moeplug::capi::*;

extern "C" {
    fn moeplug_shuffle_weight(
        a: *const moeplug_shuffle_weight_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
    fn moeplug_pad_weights(
        a: *const moeplug_pad_weights_args,
        s: *mut libc::c_void,
    ) -> moeplug_status;
    fn moeplug_prepare_moe_sizes(
        a: *const moeplug_prepare_moe_args,
        out: *mut moeplug_prepare_moe_sizes_out,
    ) -> moeplug_status;
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(moeplug_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn expect(status: moeplug_status, want: moeplug_status, fragments: &[&str]) {
    let msg = last_error();
    assert_eq!(status, want, "message: {msg}");
    for f in fragments {
        assert!(msg.contains(f), "message {msg:?} lacks {f:?}");
    }
}

const BF16: (u8, u8) = (4, 16);
const F32: (u8, u8) = (2, 32);
const I32: (u8, u8) = (0, 32);

fn desc(data: *mut u8, shape: &[i64], dtype: (u8, u8)) -> moeplug_tensor {
    moeplug_tensor::host(data as *mut libc::c_void, shape, dtype.0, dtype.1)
}

fn shuffle_args(src: &moeplug_tensor, dst: &moeplug_tensor) -> moeplug_shuffle_weight_args {
    moeplug_shuffle_weight_args {
        struct_size: std::mem::size_of::<moeplug_shuffle_weight_args>() as u32,
        src,
        dst,
        layout_n: 0,
        layout_k: 0,
        use_int4: 0,
        is_guinterleave: 0,
        gate_up: 0,
        pad_k_to: 0,
        out_fragment: std::ptr::null_mut(),
    }
}

/// `dst.data + byte_offset` wrapping past 2^64 onto memory before `dst.data`: refused, and
/// those bytes stay as they were (the run that found this saw 8 KiB written there).
#[test]
fn an_address_that_wraps_is_refused_and_nothing_is_written() {
    const BYTES: usize = 16 * 256 * 2;
    let shape = [16i64, 256];
    let mut src = vec![0x3F80u16; BYTES / 2];
    let mut arena = vec![0x5Au8; 2 * BYTES];
    let s = desc(src.as_mut_ptr() as *mut u8, &shape, BF16);
    // data = arena + BYTES, byte_offset = 2^64 - BYTES: the sum wraps to arena[0].
    let mut d = desc(unsafe { arena.as_mut_ptr().add(BYTES) }, &shape, BF16);
    d.byte_offset = (BYTES as u64).wrapping_neg();
    let st = unsafe { moeplug_shuffle_weight(&shuffle_args(&s, &d), ptr::null_mut()) };
    expect(
        st,
        moeplug_status::MoeplugInvalidArgument,
        &[
            "moeplug_shuffle_weight: dst: data 0x",
            "reaches past the user address space (2^57)",
        ],
    );
    assert!(
        arena.iter().all(|&b| b == 0x5A),
        "bytes before dst.data were written"
    );
}

/// A byte_offset of 2^62, and a data address above the 57-bit user space: refused instead of
/// a SIGSEGV.
#[test]
fn offsets_and_addresses_outside_the_user_space_are_refused() {
    let shape = [16i64, 256];
    let mut src = vec![0u16; 16 * 256];
    let mut dst = vec![0u16; 16 * 256];
    let s = desc(src.as_mut_ptr() as *mut u8, &shape, BF16);
    let mut d = desc(dst.as_mut_ptr() as *mut u8, &shape, BF16);
    d.byte_offset = 1 << 62;
    let st = unsafe { moeplug_shuffle_weight(&shuffle_args(&s, &d), ptr::null_mut()) };
    expect(
        st,
        moeplug_status::MoeplugInvalidArgument,
        &[
            "moeplug_shuffle_weight: dst: ",
            "byte_offset 0x4000000000000000",
        ],
    );
    let high = desc((1u64 << 57) as usize as *mut u8, &shape, BF16);
    let d = desc(dst.as_mut_ptr() as *mut u8, &shape, BF16);
    let st = unsafe { moeplug_shuffle_weight(&shuffle_args(&high, &d), ptr::null_mut()) };
    expect(
        st,
        moeplug_status::MoeplugInvalidArgument,
        &["moeplug_shuffle_weight: src: data 0x200000000000000"],
    );
    // The last byte of the user space is still an address.
    let edge = desc(((1u64 << 57) - 8192) as usize as *mut u8, &shape, BF16);
    let st = unsafe { moeplug_shuffle_weight(&shuffle_args(&edge, &edge), ptr::null_mut()) };
    expect(
        st,
        moeplug_status::MoeplugInvalidArgument,
        &["dst: overlaps src"],
    );
}

/// Host buffers of a bf16 launch with H = I = 1 (gate = up = 1, w2 = 1): output row t is
/// `Σ_s w[t,s] · silu(x_t) · x_t` over routed slots.
struct Tiny {
    layout: moeplug_layout,
    shapes: Vec<Vec<i64>>,
    hidden: Vec<u16>,
    w13: Vec<u16>,
    w2: Vec<u16>,
    weights: Vec<f32>,
    ids: Vec<i32>,
    output: Vec<u16>,
}

impl Tiny {
    fn new(m: usize, k: usize) -> Tiny {
        let (mi, ki) = (m as i64, k as i64);
        Tiny {
            layout: moeplug_layout {
                struct_size: std::mem::size_of::<moeplug_layout>() as u32,
                weight_format: 1,
                gate_mode: 1,
                weight_layout: 1,
                scale_layout: 0,
                num_experts: 1,
                hidden_size: 1,
                intermediate_size: 1,
                hidden_padded: 1,
                intermediate_padded: 1,
                flags: 0,
                reserved0: 0,
                act_dtype: 0,
                reserved1: 0,
                prep_fingerprint: 0,
            },
            shapes: vec![
                vec![mi, 1],
                vec![1, 2, 1],
                vec![1, 1, 1],
                vec![mi, ki],
                vec![mi, ki],
                vec![mi, 1],
            ],
            hidden: vec![0x3F80; m],
            w13: vec![0x3F80; 2],
            w2: vec![0x3F80; 1],
            weights: vec![0.0; m * k],
            ids: vec![-1; m * k],
            output: vec![0xFFFF; m],
        }
    }
    fn run(&mut self) -> (moeplug_status, String) {
        let sh = &self.shapes;
        let h = desc(self.hidden.as_mut_ptr() as _, &sh[0], BF16);
        let w13 = desc(self.w13.as_mut_ptr() as _, &sh[1], BF16);
        let w2 = desc(self.w2.as_mut_ptr() as _, &sh[2], BF16);
        let tw = desc(self.weights.as_mut_ptr() as _, &sh[3], F32);
        let ti = desc(self.ids.as_mut_ptr() as _, &sh[4], I32);
        let out = desc(self.output.as_mut_ptr() as _, &sh[5], BF16);
        let mut a = fused_args(&self.layout);
        a.hidden_states = &h;
        a.w13 = &w13;
        a.w2 = &w2;
        a.topk_weights = &tw;
        a.topk_ids = &ti;
        a.output = &out;
        let st = unsafe { moeplug_fused_moe(&a) };
        (st, last_error())
    }
}

fn fused_args(l: &moeplug_layout) -> moeplug_fused_moe_args {
    moeplug_fused_moe_args {
        struct_size: std::mem::size_of::<moeplug_fused_moe_args>() as u32,
        layout: l,
        activation: 0,
        alpha: 0.0,
        limit: 0.0,
        act_dtype: 0,
        flags: 0,
        hidden_states: ptr::null(),
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

/// silu(1) · 1 in bf16: what a routed slot of weight 1 contributes to a row of ones.
fn one_slot() -> u16 {
    let mut t = Tiny::new(1, 1);
    t.ids[0] = 0;
    t.weights[0] = 1.0;
    let (st, msg) = t.run();
    assert_eq!(st, moeplug_status::MoeplugOk, "{msg}");
    assert_ne!(t.output[0], 0);
    t.output[0]
}

/// Top-k 200: slot 150 alone is routed (weight 1) and must count, as in a top-1 launch.
#[test]
fn topk_above_128_counts_every_slot() {
    let mut t = Tiny::new(2, 200);
    t.ids.fill(0);
    t.weights[150] = 1.0;
    t.weights[200 + 199] = 1.0;
    let (st, msg) = t.run();
    assert_eq!(st, moeplug_status::MoeplugOk, "{msg}");
    assert_eq!(t.output, vec![one_slot(); 2]);
}

/// M = 2^24 + 1: the rows from token 2^24 on are computed like row 0.
#[test]
fn m_above_2_pow_24_computes_every_row() {
    let m = (1 << 24) + 1;
    let mut t = Tiny::new(m, 1);
    for r in [0, (1 << 24) - 1, 1 << 24] {
        t.ids[r] = 0;
        t.weights[r] = 1.0;
    }
    let (st, msg) = t.run();
    assert_eq!(st, moeplug_status::MoeplugOk, "{msg}");
    let v = one_slot();
    assert_eq!(
        [t.output[0], t.output[(1 << 24) - 1], t.output[1 << 24]],
        [v; 3]
    );
    assert_eq!(
        t.output[1..(1 << 24) - 1]
            .iter()
            .filter(|&&o| o != 0)
            .count(),
        0
    );
}

/// The GPU kernels route with AITER's packed `(slot << 24) | token`: a CUDA launch of M =
/// 2^24 or k = 129 is UNSUPPORTED naming the limit (the check runs before any device call),
/// and the limits are data the caps report (the CPU has none).
#[test]
fn gpu_limits_are_data_the_launch_check_consults() {
    use moeplug::backend::Limits;
    use moeplug::moe::check::check_launch;
    use moeplug::tensor::{DeviceKind, ElemType, Tensor};
    use moeplug::types::BackendKind;
    let gpu = Limits::of(BackendKind::Cuda);
    assert_eq!((gpu.max_tokens, gpu.max_topk), ((1 << 24) - 1, 128));
    assert_eq!(Limits::of(BackendKind::Hip), gpu);
    assert_eq!(Limits::of(BackendKind::Cpu).max_tokens, u64::MAX);

    let mut caps: moeplug_caps = unsafe { std::mem::zeroed() };
    caps.struct_size = std::mem::size_of::<moeplug_caps>() as u32;
    assert_eq!(
        unsafe { moeplug_get_caps(1, 0, &mut caps) },
        moeplug_status::MoeplugOk
    );
    assert_eq!((caps.max_tokens, caps.max_topk), (u64::MAX, u64::MAX));
    // A 1.0 caller's struct ends at `features`: nothing past it is written.
    let mut old = [0xEEu8; std::mem::size_of::<moeplug_caps>()];
    old[..4].copy_from_slice(&(MOEPLUG_CAPS_SIZE_V1_0).to_le_bytes());
    let st = unsafe { moeplug_get_caps(1, 0, old.as_mut_ptr() as *mut moeplug_caps) };
    assert_eq!(st, moeplug_status::MoeplugOk, "{}", last_error());
    assert!(old[MOEPLUG_CAPS_SIZE_V1_0 as usize..]
        .iter()
        .all(|&b| b == 0xEE));

    let layout = moeplug::layout::Layout::new(1, 1, 1, 0, 1, [1, 1, 1, 1], 0).unwrap();
    // Device tensors at distinct made-up addresses: the check never reads them.
    let t = |name, at: u64, elem, shape: &[usize]| Tensor {
        name,
        ptr: (at << 40) as usize as *mut u8,
        device: DeviceKind::Cuda,
        device_id: 0,
        elem,
        shape: shape.to_vec(),
    };
    for (m, k, ok) in [
        (1 << 24, 1, false),
        (1, 129, false),
        ((1 << 24) - 1, 128, true),
    ] {
        let launch = moeplug::moe::MoeLaunch {
            config: moeplug::moe::MoeConfig {
                layout,
                activation: moeplug::types::Activation::Silu,
                alpha: 1.702,
                limit: None,
                act_dtype: moeplug::types::ActDtype::Bf16,
                stage2_act_dtype: moeplug::types::ActDtype::Bf16,
                prequantized_input: false,
                static_act_scale: [false; 2],
                router_weight_on_input: false,
                has_expert_mask: false,
                has_num_local_tokens: false,
            },
            hidden_states: t("hidden_states", 1, ElemType::Bf16, &[m, 1]),
            hidden_scale: None,
            w13: t("w13", 2, ElemType::Bf16, &[1, 2, 1]),
            w13_scale: None,
            w13_bias: None,
            w2: t("w2", 3, ElemType::Bf16, &[1, 1, 1]),
            w2_scale: None,
            w2_bias: None,
            topk_weights: t("topk_weights", 4, ElemType::F32, &[m, k]),
            topk_ids: t("topk_ids", 5, ElemType::I32, &[m, k]),
            expert_mask: None,
            num_local_tokens: None,
            output: t("output", 6, ElemType::Bf16, &[m, 1]),
            workspace: None,
            stream: 0,
            stage1_act_scale: None,
            stage2_act_scale: None,
        };
        match check_launch(&launch) {
            Ok(_) => assert!(ok, "M {m} k {k} passed"),
            Err(e) => {
                assert!(!ok, "M {m} k {k}: {}", e.message);
                assert_eq!(e.status, moeplug::error::Status::Unsupported);
                assert_eq!(
                    e.message,
                    format!(
                        "topk_ids: shape [{m}, {k}] exceeds what the cuda backend indexes (at \
                         most 16777215 tokens and 128 slots per token: caps max_tokens / \
                         max_topk); split the batch"
                    )
                );
            }
        }
    }
}

/// M = 2^31 with num_local_tokens (int32): INVALID_ARGUMENT, not a panic in a clamp. Only
/// num_local_tokens is real memory; the other descriptors are never read.
#[test]
fn m_of_2_pow_31_with_num_local_tokens_is_invalid() {
    let mut t = Tiny::new(1, 1);
    let m = 1i64 << 31;
    let fake = |at: u64| (at << 40) as usize as *mut u8;
    // Shapes outlive the descriptors that point at them.
    let (rows, w13_shape, w2_shape, one) = ([m, 1], [1, 2, 1], [1, 1, 1], [1]);
    let h = desc(fake(1), &rows, BF16);
    let w13 = desc(t.w13.as_mut_ptr() as _, &w13_shape, BF16);
    let w2 = desc(t.w2.as_mut_ptr() as _, &w2_shape, BF16);
    let tw = desc(fake(2), &rows, F32);
    let ti = desc(fake(3), &rows, I32);
    let out = desc(fake(4), &rows, BF16);
    let mut n = [5i32];
    let nlt = desc(n.as_mut_ptr() as _, &one, I32);
    let mut a = fused_args(&t.layout);
    a.hidden_states = &h;
    a.w13 = &w13;
    a.w2 = &w2;
    a.topk_weights = &tw;
    a.topk_ids = &ti;
    a.output = &out;
    a.num_local_tokens = &nlt;
    expect(
        unsafe { moeplug_fused_moe(&a) },
        moeplug_status::MoeplugInvalidArgument,
        &["moeplug_fused_moe: num_local_tokens: an int32 count cannot cover M = 2147483648 rows"],
    );
}

fn prepare_args(w13: &moeplug_tensor, w2: &moeplug_tensor) -> moeplug_prepare_moe_args {
    let mut a: moeplug_prepare_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = std::mem::size_of::<moeplug_prepare_moe_args>() as u32;
    a.weight_format = 1;
    a.w13 = w13;
    a.w2 = w2;
    a
}

/// Shapes whose prepared byte counts overflow, or whose E does not fit the record: refused,
/// never OK with 0-byte sizes or a negative num_experts. (Data is NULL: sizes only.)
#[test]
fn prepare_moe_sizes_refuses_what_overflows() {
    let mut out: moeplug_prepare_moe_sizes_out = unsafe { std::mem::zeroed() };
    out.struct_size = std::mem::size_of::<moeplug_prepare_moe_sizes_out>() as u32;
    // [2^20, 2^23, 1] bf16 padded to H = 2^20: 2^64 output bytes.
    let s13 = [1i64 << 20, 1 << 23, 1];
    let s2 = [1i64 << 20, 1, 1 << 22];
    let w13 = desc(ptr::null_mut(), &s13, BF16);
    let w2 = desc(ptr::null_mut(), &s2, BF16);
    let mut a = prepare_args(&w13, &w2);
    a.hidden_align = 1 << 20;
    expect(
        unsafe { moeplug_prepare_moe_sizes(&a, &mut out) },
        moeplug_status::MoeplugInvalidArgument,
        &["moeplug_prepare_moe_sizes: out_w13: the prepared shape [1048576, 8388608, 1048576] of 2-byte elements overflows the address space"],
    );
    // E = 2^31 would be a negative num_experts in the record.
    let s13 = [1i64 << 31, 2, 1];
    let s2 = [1i64 << 31, 1, 1];
    let w13 = desc(ptr::null_mut(), &s13, BF16);
    let w2 = desc(ptr::null_mut(), &s2, BF16);
    let a = prepare_args(&w13, &w2);
    expect(
        unsafe { moeplug_prepare_moe_sizes(&a, &mut out) },
        moeplug_status::MoeplugInvalidArgument,
        &["moeplug_prepare_moe_sizes: w2: expected E <= 2^20 and H, I <= 2^31 (what a layout record holds), got shape [2147483648, 1, 1]"],
    );
    // The largest E still prepares.
    let s13 = [1i64 << 20, 2, 1];
    let s2 = [1i64 << 20, 1, 1];
    let w13 = desc(ptr::null_mut(), &s13, BF16);
    let w2 = desc(ptr::null_mut(), &s2, BF16);
    let a = prepare_args(&w13, &w2);
    let st = unsafe { moeplug_prepare_moe_sizes(&a, &mut out) };
    assert_eq!(st, moeplug_status::MoeplugOk, "{}", last_error());
    assert_eq!(out.layout.num_experts, 1 << 20);
    assert_eq!(out.w13_bytes, (1 << 20) * 64 * 32 * 2);
}

/// The child side of the address-space tests: run under `RLIMIT_AS` = `limit` bytes above
/// what the process has mapped (or absolute), in a process of its own.
fn limit_address_space(bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
}

fn mapped_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Run this test binary's `name` in a child with `MOEPLUG_ADDRESS_LIMIT_CHILD` set; the child
/// must exit 0 (an allocation abort is a signal).
fn in_child(name: &str) {
    in_child_with(name, &[]);
}

/// [`in_child`] with `env` added to the child's environment.
fn in_child_with(name: &str, env: &[(&str, &str)]) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("MOEPLUG_ADDRESS_LIMIT_CHILD", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child {name}: {:?}\n{text}",
        out.status
    );
    assert!(text.contains("child done"), "{text}");
}

/// M = 65536, k = 8, H = 128, I = 256 (39 MB of caller tensors) under a 1 GiB address-space
/// limit: scratch is tiled over M, so the launch runs (it aborted with 1.6 GB of scratch).
#[test]
fn a_large_launch_runs_under_a_1_gib_address_space_limit() {
    if std::env::var_os("MOEPLUG_ADDRESS_LIMIT_CHILD").is_none() {
        return in_child("a_large_launch_runs_under_a_1_gib_address_space_limit");
    }
    let mut l = big_launch();
    limit_address_space(1 << 30);
    let (st, msg) = l.run();
    assert_eq!(st, moeplug_status::MoeplugOk, "{msg}");
    assert!(l.output.iter().any(|&v| v != 0));
    println!("child done");
}

/// The same launch with 64 and 128 workers under the 1 GiB limit: the OS refuses some of the
/// threads, and the launch still runs (it was INTERNAL "failed to spawn thread"), with the
/// same bytes as one worker. The worker counts are the caller's, so this fails without the
/// fallback on any machine.
///
/// The child pins what fills the address space. Without a cap, glibc gives each new thread a
/// malloc arena of 64 MiB reserve (up to 8 per core) that outlives it, and how many fit before
/// the threads' stacks is a race: on one CI machine they left no room for the next launch's
/// scratch (OUT_OF_MEMORY, a legitimate answer, but not this test's subject). With two arenas
/// and 16 MiB stacks the threads' stacks alone are what the OS refuses, on every machine.
#[test]
fn workers_the_os_refuses_under_a_1_gib_limit_still_give_the_result() {
    if std::env::var_os("MOEPLUG_ADDRESS_LIMIT_CHILD").is_none() {
        return in_child_with(
            "workers_the_os_refuses_under_a_1_gib_limit_still_give_the_result",
            &[("MALLOC_ARENA_MAX", "2"), ("RUST_MIN_STACK", "16777216")],
        );
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Counts the refused-worker messages; prints the first (one launch logs hundreds, which
    // would bury a failure's message).
    static REFUSALS: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn count_refusals(
        _level: i32,
        msg: *const std::ffi::c_char,
        _: *mut libc::c_void,
    ) {
        let msg = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
        if msg.starts_with("could not start ") && REFUSALS.fetch_add(1, Ordering::Relaxed) == 0 {
            println!("log (first of the refusals): {msg}");
        }
    }
    let st = moeplug_set_log_callback(Some(count_refusals), ptr::null_mut());
    assert_eq!(st, moeplug_status::MoeplugOk);
    let mut l = big_launch();
    limit_address_space(1 << 30);
    let mut runs = Vec::new();
    for n in [64u32, 128, 1] {
        assert_eq!(moeplug_set_num_threads(n), moeplug_status::MoeplugOk);
        l.output.fill(0);
        let (st, msg) = l.run();
        assert_eq!(st, moeplug_status::MoeplugOk, "{n} threads: {msg}");
        runs.push(l.output.clone());
    }
    let refusals = REFUSALS.load(Ordering::Relaxed);
    assert!(
        refusals > 0,
        "the OS started every worker: the fallback was not taken"
    );
    println!("refused-worker messages: {refusals}");
    assert!(runs[2].iter().any(|&v| v != 0));
    assert!(runs[0] == runs[2], "64 threads differ from 1");
    assert!(runs[1] == runs[2], "128 threads differ from 1");
    println!("child done");
}

/// With only 32 MiB of address space to spare, the scratch cannot be had: OUT_OF_MEMORY with
/// a message, the output untouched, the process alive.
#[test]
fn scratch_that_cannot_be_allocated_is_out_of_memory() {
    if std::env::var_os("MOEPLUG_ADDRESS_LIMIT_CHILD").is_none() {
        return in_child("scratch_that_cannot_be_allocated_is_out_of_memory");
    }
    let mut l = big_launch();
    l.output.fill(0xABCD);
    // The worker threads and their arenas exist before the limit (a warm-up launch).
    let mut warm = Tiny::new(1, 1);
    assert_eq!(warm.run().0, moeplug_status::MoeplugOk);
    limit_address_space(mapped_bytes() + (32 << 20));
    let (st, msg) = l.run();
    assert_eq!(st, moeplug_status::MoeplugOutOfMemory, "{msg}");
    assert!(
        msg.starts_with("moeplug_fused_moe: cannot allocate ")
            && msg.contains("bytes of CPU scratch"),
        "{msg}"
    );
    assert!(
        l.output.iter().all(|&v| v == 0xABCD),
        "output written on failure"
    );
    println!("child done");
}

struct Big {
    layout: moeplug_layout,
    bufs: Vec<Vec<u16>>,
    f32s: Vec<f32>,
    ids: Vec<i32>,
    output: Vec<u16>,
}

const BIG: (usize, usize, usize, usize, usize) = (65536, 8, 128, 256, 8);

fn big_launch() -> Big {
    let (m, k, h, i, e) = BIG;
    let mut layout = Tiny::new(1, 1).layout;
    layout.num_experts = e as i32;
    layout.hidden_size = h as i64;
    layout.hidden_padded = h as i64;
    layout.intermediate_size = i as i64;
    layout.intermediate_padded = i as i64;
    let small = |n: usize, seed: usize| -> Vec<u16> {
        (0..n)
            .map(|j| half::bf16::from_f32((((j * 7 + seed) % 13) as f32 - 6.0) / 64.0).to_bits())
            .collect()
    };
    Big {
        layout,
        bufs: vec![
            small(m * h, 1),
            small(e * 2 * i * h, 2),
            small(e * h * i, 3),
        ],
        f32s: vec![0.125; m * k],
        ids: (0..m * k).map(|j| (j % e) as i32).collect(),
        output: vec![0; m * h],
    }
}

impl Big {
    fn run(&mut self) -> (moeplug_status, String) {
        let (m, k, h, i, e) = BIG;
        let (m, k, h, i, e) = (m as i64, k as i64, h as i64, i as i64, e as i64);
        let shapes = [[m, h, 0], [e, 2 * i, h], [e, h, i]];
        let hs = desc(self.bufs[0].as_mut_ptr() as _, &shapes[0][..2], BF16);
        let w13 = desc(self.bufs[1].as_mut_ptr() as _, &shapes[1], BF16);
        let w2 = desc(self.bufs[2].as_mut_ptr() as _, &shapes[2], BF16);
        let mk = [m, k];
        let tw = desc(self.f32s.as_mut_ptr() as _, &mk, F32);
        let ti = desc(self.ids.as_mut_ptr() as _, &mk, I32);
        let out = desc(self.output.as_mut_ptr() as _, &shapes[0][..2], BF16);
        let mut a = fused_args(&self.layout);
        a.hidden_states = &hs;
        a.w13 = &w13;
        a.w2 = &w2;
        a.topk_weights = &tw;
        a.topk_ids = &ti;
        a.output = &out;
        let st = unsafe { moeplug_fused_moe(&a) };
        (st, last_error())
    }
}

/// pad_weights of e8m0 scales with fill 2^-127: code 0x00 is exactly that value (it was
/// refused as "not exactly representable"); 2^-126 is 0x01.
#[test]
fn e8m0_fill_of_2_pow_minus_127_is_code_zero() {
    let (s, d) = ([1i64, 2, 1], [1i64, 2, 3]);
    for (fill, code) in [(2f64.powi(-127), 0x00u8), (2f64.powi(-126), 0x01)] {
        let mut src = [0x7Fu8; 2];
        let mut dst = [0xEEu8; 6];
        let ts = desc(src.as_mut_ptr(), &s, (14, 8));
        let td = desc(dst.as_mut_ptr(), &d, (14, 8));
        let a = moeplug_pad_weights_args {
            struct_size: std::mem::size_of::<moeplug_pad_weights_args>() as u32,
            src: &ts,
            dst: &td,
            gate_up: 0,
            fill,
            out_fragment: std::ptr::null_mut(),
        };
        let st = unsafe { moeplug_pad_weights(&a, ptr::null_mut()) };
        assert_eq!(
            st,
            moeplug_status::MoeplugOk,
            "fill {fill}: {}",
            last_error()
        );
        assert_eq!(dst, [0x7F, code, code, 0x7F, code, code], "fill {fill}");
    }
}
