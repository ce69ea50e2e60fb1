//! CPU fused_moe on a Qwen3-30B-A3B MoE layer (E=128, topk=8, H=2048, I=768), bf16 and MXFP4
//! weights (AITER 16x16 layout, e8m0 scales shuffled), M ∈ {1, 8, 64}: time per launch and the
//! achieved weight bandwidth (bytes of the experts actually touched / time), next to a memcpy
//! bandwidth measured in the same run. `cargo bench --bench fused_moe`.

use std::time::{Duration, Instant};

use moeplug::capi::types::*;
use moeplug::capi::{moeplug_fused_moe, moeplug_last_error};

const E: usize = 128;
const TOPK: usize = 8;
const H: usize = 2048;
const I: usize = 768;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Bytes in a u64 store (8-byte aligned), filled from a small random pattern.
fn buffer(n: usize, pattern: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; n.div_ceil(8)];
    // SAFETY: v holds at least n bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n) };
    for (c, chunk) in bytes.chunks_mut(pattern.len()).enumerate() {
        let rot = c % pattern.len();
        for (d, s) in chunk.iter_mut().zip(pattern.iter().cycle().skip(rot)) {
            *d = *s;
        }
    }
    v
}

fn tensor(store: &mut [u64], shape: &[i64], code: u8, bits: u8) -> moeplug_tensor {
    moeplug_tensor::host(store.as_mut_ptr() as *mut _, shape, code, bits)
}

fn memcpy_bandwidth() -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed());
    }
    std::hint::black_box(&dst);
    // Read + write traffic counted as bytes copied (the usual "memcpy GB/s").
    n as f64 / best.as_secs_f64() / 1e9
}

fn bench(mxfp4: bool, m: usize, rng: &mut Rng) -> (Duration, f64) {
    let (w_code, w_bits, kdiv) = if mxfp4 { (17u8, 4u8, 2) } else { (4, 16, 1) };
    let el = if mxfp4 { 1 } else { 2 };
    // Small random values: bf16 ±[2^-8, 2^-3); fp4 any code.
    let pattern: Vec<u8> = (0..4093)
        .flat_map(|_| {
            let r = rng.next();
            if mxfp4 {
                vec![r as u8]
            } else {
                let b = half::bf16::from_f32(((r % 1000) as f32 / 1000.0 - 0.5) * 0.2);
                b.to_bits().to_le_bytes().to_vec()
            }
        })
        .collect();
    let mut w13 = buffer(E * 2 * I * H / kdiv * el, &pattern);
    let mut w2 = buffer(E * H * I / kdiv * el, &pattern);
    let sn = |k: usize| (k / 32).div_ceil(8) * 8;
    let mut s13 = buffer((E * 2 * I).div_ceil(256) * 256 * sn(H), &[120, 121, 119]);
    let mut s2 = buffer((E * H).div_ceil(256) * 256 * sn(I), &[120, 121, 119]);
    let hidden_pattern: Vec<u8> = (0..997)
        .flat_map(|_| {
            half::bf16::from_f32((rng.next() % 2000) as f32 / 1000.0 - 1.0)
                .to_bits()
                .to_le_bytes()
        })
        .collect();
    let mut hidden = buffer(m * H * 2, &hidden_pattern);
    let mut out = buffer(m * H * 2, &[0]);
    // Distinct experts per token.
    let mut ids = Vec::with_capacity(m * TOPK);
    for _ in 0..m {
        let mut chosen: Vec<i32> = Vec::new();
        while chosen.len() < TOPK {
            let e = (rng.next() % E as u64) as i32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        ids.extend(chosen);
    }
    let mut touched: Vec<i32> = ids.clone();
    touched.sort();
    touched.dedup();
    let id_bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut ids_store = buffer(id_bytes.len(), &id_bytes);
    let w_bytes: Vec<u8> = (0..m * TOPK).flat_map(|_| 0.125f32.to_le_bytes()).collect();
    let mut tw_store = buffer(w_bytes.len(), &w_bytes);

    let shapes: Vec<Vec<i64>> = vec![
        vec![m as i64, H as i64],
        vec![E as i64, 2 * I as i64, H as i64],
        vec![E as i64, H as i64, I as i64],
        vec![((E * 2 * I).div_ceil(256) * 256) as i64, sn(H) as i64],
        vec![((E * H).div_ceil(256) * 256) as i64, sn(I) as i64],
        vec![m as i64, TOPK as i64],
    ];
    let layout = moeplug_layout {
        struct_size: std::mem::size_of::<moeplug_layout>() as u32,
        weight_format: if mxfp4 { 6 } else { 1 },
        gate_mode: 1,
        weight_layout: 2,
        scale_layout: if mxfp4 { 2 } else { 0 },
        num_experts: E as i32,
        hidden_size: H as i64,
        intermediate_size: I as i64,
        hidden_padded: H as i64,
        intermediate_padded: I as i64,
        flags: 0,
        reserved0: 0,
        act_dtype: 0,
        reserved1: 0,
        prep_fingerprint: 0,
    };
    let th = tensor(&mut hidden, &shapes[0], 4, 16);
    let tw13 = tensor(&mut w13, &shapes[1], w_code, w_bits);
    let tw2 = tensor(&mut w2, &shapes[2], w_code, w_bits);
    let ts13 = tensor(&mut s13, &shapes[3], 14, 8);
    let ts2 = tensor(&mut s2, &shapes[4], 14, 8);
    let tids = tensor(&mut ids_store, &shapes[5], 0, 32);
    let ttw = tensor(&mut tw_store, &shapes[5], 2, 32);
    let tout = tensor(&mut out, &shapes[0], 4, 16);
    let args = moeplug_fused_moe_args {
        struct_size: std::mem::size_of::<moeplug_fused_moe_args>() as u32,
        layout: &layout,
        activation: 1,
        alpha: 0.0,
        limit: 0.0,
        act_dtype: 0,
        flags: 0,
        hidden_states: &th,
        hidden_scale: std::ptr::null(),
        w13: &tw13,
        w13_scale: if mxfp4 { &ts13 } else { std::ptr::null() },
        w13_bias: std::ptr::null(),
        w2: &tw2,
        w2_scale: if mxfp4 { &ts2 } else { std::ptr::null() },
        w2_bias: std::ptr::null(),
        topk_weights: &ttw,
        topk_ids: &tids,
        expert_mask: std::ptr::null(),
        num_local_tokens: std::ptr::null(),
        output: &tout,
        workspace: std::ptr::null(),
        stream: std::ptr::null_mut(),
        stage1_act_scale: std::ptr::null(),
        stage2_act_scale: std::ptr::null(),
        stage2_act_dtype: 0,
        reserved0: 0,
    };
    let run = || {
        // SAFETY: all pointers name live buffers of this frame.
        let st = unsafe { moeplug_fused_moe(&args) } as i32;
        if st != 0 {
            let msg = unsafe { std::ffi::CStr::from_ptr(moeplug_last_error()) };
            panic!("fused_moe failed: {st} {msg:?}");
        }
    };
    run(); // warm-up
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed() < Duration::from_secs(2) && times.len() < 50) {
        let t = Instant::now();
        run();
        times.push(t.elapsed());
    }
    times.sort();
    let median = times[times.len() / 2];
    let per_expert =
        (2 * I * H + H * I) * el / kdiv + if mxfp4 { (2 * I * H + H * I) / 32 } else { 0 };
    let bytes = touched.len() * per_expert;
    (median, bytes as f64 / median.as_secs_f64() / 1e9)
}

fn main() {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "CPU fused_moe, Qwen3-30B-A3B layer (E={E}, topk={TOPK}, H={H}, I={I}), {threads} threads"
    );
    println!("memcpy (1 thread, 256 MiB): {:.1} GB/s", memcpy_bandwidth());
    // Optional filters: `cargo bench --bench fused_moe -- 1 mxfp4` runs only those.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let ms: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let formats: Vec<&String> = args
        .iter()
        .filter(|a| a.parse::<usize>().is_err())
        .collect();
    let mut rng = Rng(42);
    for mxfp4 in [false, true] {
        let name = if mxfp4 { "mxfp4" } else { "bf16" };
        if !formats.is_empty() && !formats.iter().any(|f| f.as_str() == name) {
            continue;
        }
        for m in [1, 8, 64] {
            if !ms.is_empty() && !ms.contains(&m) {
                continue;
            }
            let (t, bw) = bench(mxfp4, m, &mut rng);
            println!(
                "{name:>6} M={m:>3}: {:>9.3} ms  weight bandwidth {bw:>6.2} GB/s",
                t.as_secs_f64() * 1e3
            );
        }
    }
    println!("memcpy (1 thread, 256 MiB): {:.1} GB/s", memcpy_bandwidth());
}
