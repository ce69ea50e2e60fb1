//! All functions are thread-safe (README): 16 threads run a mixed stream of calls at once —
//! fused_moe of several shapes and formats, a launch that fails, shuffle_weight, quantize_mx,
//! get_caps — and every result (output bytes, status, this thread's last error) equals the
//! one the same call gave serially.

mod common;

use common::*;
use moeplug::capi::types::*;

const THREADS: usize = 16;
const ROUNDS: usize = 12;

/// One kind of call and everything it produced: status, last error, output bytes.
type Outcome = (i32, String, Vec<u8>);

fn launch(kind: usize) -> Launch {
    let mut r = Rng(0xC0C0 + kind as u64);
    let (e, h, i) = (3, 64, 32);
    let m = [1, 7, 33, 64][kind % 4];
    let k = 1 + kind % 3;
    let bf = |n: usize, r: &mut Rng| -> Vec<u16> {
        (0..n)
            .map(|_| half::bf16::from_f64(r.uniform(-1.0, 1.0) / 8.0).to_bits())
            .collect()
    };
    let ids: Vec<i32> = (0..m * k).map(|_| r.below(e + 1) as i32).collect();
    let w: Vec<f32> = (0..m * k).map(|_| r.uniform(0.0, 1.0) as f32).collect();
    Launch {
        layout: layout(1, 1 + (kind % 3) as i32, 1, 0, e, [h, i, h, i], false),
        activation: 1 + (kind % 3) as i32,
        alpha: 0.0,
        limit: 0.0,
        act_dtype: 0,
        flags: 0,
        hidden: T::u16s(&bf(m * h, &mut r), &[m, h], BF16),
        hidden_scale: None,
        w13: T::u16s(&bf(e * 2 * i * h, &mut r), &[e, 2 * i, h], BF16),
        w13_scale: None,
        w13_bias: None,
        w2: T::u16s(&bf(e * h * i, &mut r), &[e, h, i], BF16),
        w2_scale: None,
        w2_bias: None,
        topk_weights: T::f32s(&w, &[m, k]),
        topk_ids: T::i32s(&ids, &[m, k]),
        expert_mask: None,
        num_local_tokens: None,
        output: T::zeros(&[m, h], BF16),
        stage1_act_scale: None,
        stage2_act_scale: None,
        stage2_act_dtype: 0,
    }
}

fn call(kind: usize) -> Outcome {
    match kind % 8 {
        0..=4 => {
            let mut l = launch(kind);
            match l.run() {
                Ok(()) => (0, String::new(), l.output.bytes),
                Err((s, m)) => (s, m, l.output.bytes),
            }
        }
        5 => {
            // Fails: topk_ids as float32; the message must be this thread's.
            let mut l = launch(kind);
            l.topk_ids.code = 2;
            let (s, m) = l.run().unwrap_err();
            (s, m, l.output.bytes)
        }
        6 => {
            let mut src: Vec<u8> = (0..2 * 32 * 64).map(|j| (j * 7 + kind) as u8).collect();
            let mut dst = vec![0u8; src.len()];
            let s = Dl::new(src.as_mut_ptr(), 1, 8, &[2, 32, 64]);
            let d = Dl::new(dst.as_mut_ptr(), 1, 8, &[2, 32, 64]);
            let a = moeplug_shuffle_weight_args {
                struct_size: std::mem::size_of::<moeplug_shuffle_weight_args>() as u32,
                src: s.ptr(),
                dst: d.ptr(),
                layout_n: 16,
                layout_k: 16,
                use_int4: 0,
                is_guinterleave: 0,
                gate_up: 0,
                pad_k_to: 0,
                out_fragment: std::ptr::null_mut(),
            };
            let (st, m) = result(unsafe { moeplug_shuffle_weight(&a, std::ptr::null_mut()) });
            (st as i32, m, dst)
        }
        _ => {
            let mut src: Vec<u8> = (0..16 * 64)
                .flat_map(|j| {
                    half::bf16::from_f32((j % 29) as f32 - 14.0)
                        .to_bits()
                        .to_le_bytes()
                })
                .collect();
            let mut q = vec![0u8; 16 * 32];
            let mut sc = vec![0u8; 16 * 2];
            let s = Dl::new(src.as_mut_ptr(), 4, 16, &[16, 64]);
            let dq = Dl::new(q.as_mut_ptr(), 1, 8, &[16, 32]);
            let ds = Dl::new(sc.as_mut_ptr(), 14, 8, &[16, 2]);
            let a = moeplug_quantize_mx_args {
                struct_size: std::mem::size_of::<moeplug_quantize_mx_args>() as u32,
                src: s.ptr(),
                dst_q: dq.ptr(),
                dst_scale: ds.ptr(),
                format: 6,
                round_mode: 0,
                shuffle_scale: 0,
                out_fragment: std::ptr::null_mut(),
            };
            let (st, m) = result(unsafe { moeplug_quantize_mx(&a, std::ptr::null_mut()) });
            q.extend(sc);
            let mut caps: moeplug_caps = unsafe { std::mem::zeroed() };
            caps.struct_size = std::mem::size_of::<moeplug_caps>() as u32;
            let cs = unsafe { moeplug::capi::moeplug_get_caps(1, 0, &mut caps) };
            q.extend(caps.weight_formats.to_le_bytes());
            (st as i32 | (cs as i32) << 8, m, q)
        }
    }
}

#[test]
fn threads_get_the_serial_results() {
    let kinds = 16;
    let serial: Vec<Outcome> = (0..kinds).map(call).collect();
    assert!(
        serial.iter().filter(|o| o.0 == 0).count() >= 12,
        "most calls succeed"
    );
    assert!(serial[5]
        .1
        .starts_with("moeplug_fused_moe: topk_ids: expected dtype int32"));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let serial = &serial;
            s.spawn(move || {
                for round in 0..ROUNDS {
                    let kind = (t * 5 + round * 3) % kinds;
                    let got = call(kind);
                    assert!(
                        got == serial[kind],
                        "thread {t} round {round} kind {kind}: {:?} != serial {:?}",
                        (&got.0, &got.1),
                        (&serial[kind].0, &serial[kind].1)
                    );
                }
            });
        }
    });
}
