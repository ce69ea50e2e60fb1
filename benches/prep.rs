//! Throughput of the host preparation paths on a 1 GiB weight, next to a memcpy of the same
//! size measured in the same run. Buffers are allocated and touched once; each number is the
//! median of a few runs after a warm-up. Run: `cargo bench --bench prep`.

use std::time::Instant;

use moeplug::prep::parallel::parallel_chunks;
use moeplug::prep::prepare::{plan, prepare_host, PrepareInputs, PrepareOutputs, PrepareSpec};
use moeplug::prep::scale;
use moeplug::prep::shuffle::{plan_shuffle_weight, shuffle_weight, ShuffleWeightParams};
use moeplug::types::{GateMode, WeightFormat};

const RUNS: usize = 5;

/// Median seconds of `RUNS` runs of `f` after one warm-up.
fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..RUNS)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[RUNS / 2]
}

/// GB/s counting bytes read + bytes written.
fn report(what: &str, bytes_moved: usize, secs: f64, memcpy: f64) {
    let gbs = bytes_moved as f64 / secs / 1e9;
    println!(
        "{what:<44} {:>8.1} ms {gbs:>7.2} GB/s  ({:>5.1}% of memcpy)",
        secs * 1e3,
        100.0 * gbs / memcpy
    );
}

fn main() {
    // [E, N, K] fp4x2 bytes: 32 experts × 2·2048 rows × 8192 bytes = 1 GiB.
    let (e, n, k) = (32usize, 4096usize, 8192usize);
    let bytes = e * n * k;
    println!(
        "moeplug prep bench: {} MiB weight, {} threads",
        bytes >> 20,
        moeplug::runtime::threads::count()
    );
    let src: Vec<u8> = (0..bytes).map(|i| (i * 31 + i / 4096) as u8).collect();
    let mut dst = vec![1u8; bytes];

    // memcpy baseline: single-threaded copy and the same chunked over all cores.
    let t1 = median(|| dst.copy_from_slice(&src));
    let tn = median(|| {
        parallel_chunks(&mut dst, 1 << 16, |first, chunk| {
            let start = first << 16;
            chunk.copy_from_slice(&src[start..start + chunk.len()]);
        })
    });
    let memcpy = (2 * bytes) as f64 / t1.min(tn) / 1e9;
    report("memcpy (1 thread)", 2 * bytes, t1, memcpy);
    report("memcpy (all threads, chunked)", 2 * bytes, tn, memcpy);

    // shuffle_weight F1 (16, 16) on 1-byte elements.
    let p = ShuffleWeightParams::default();
    let sp = plan_shuffle_weight("src", &[e, n, k], 1, &p).unwrap();
    let t = median(|| shuffle_weight(&sp, &src, &mut dst).unwrap());
    report(
        "shuffle_weight F1 (16,16) u8 [32,4096,8192]",
        2 * bytes,
        t,
        memcpy,
    );
    let p2 = ShuffleWeightParams {
        is_guinterleave: true,
        gate_up: true,
        ..p
    };
    let sp2 = plan_shuffle_weight("src", &[e, n, k], 1, &p2).unwrap();
    let t = median(|| shuffle_weight(&sp2, &src, &mut dst).unwrap());
    report("shuffle_weight F2 gate_up u8", 2 * bytes, t, memcpy);
    let spb = plan_shuffle_weight("src", &[e, n, k / 2], 2, &p).unwrap();
    let t = median(|| shuffle_weight(&spb, &src, &mut dst).unwrap());
    report("shuffle_weight F1 (16,16) bf16", 2 * bytes, t, memcpy);

    // shuffle_scale F3 on a 1 GiB scale matrix (rows of 256 bytes).
    let (m, c) = (bytes / 256, 256usize);
    let [sm, sn] = scale::f3_shape(m, c);
    assert_eq!(sm * sn, bytes);
    let t = median(|| scale::shuffle_scale(&src, m, c, &mut dst));
    report("shuffle_scale F3 [4M, 256]", 2 * bytes, t, memcpy);
    // And the realistic shape: the scales of this weight ([E·N, K·2/32] = 1/16 of it).
    let (m2, c2) = (e * n, k * 2 / 32);
    let sbytes = m2 * c2;
    let [sm2, sn2] = scale::f3_shape(m2, c2);
    let mut sdst = vec![0u8; sm2 * sn2];
    let t = median(|| scale::shuffle_scale(&src[..sbytes], m2, c2, &mut sdst));
    report(
        "shuffle_scale F3 [131072, 512] (64 MiB)",
        2 * sbytes,
        t,
        memcpy,
    );

    // prepare_moe: MXFP4, E=32, H=8192... as w13 [32, 2·2048, 4096 B] + w2 [32, 8192, 1024 B]
    // plus scales, from INTERLEAVE_ROWS (gpt-oss) order. ~1.1 GiB in, same out.
    let (h, i) = (8192usize, 2048usize);
    let spec = PrepareSpec {
        format: WeightFormat::Mxfp4,
        target: None,
        gate_mode_in: GateMode::InterleaveRows,
        hidden_align: 0,
        intermediate_align: 0,
        w13: vec![e, 2 * i, h / 2],
        w2: vec![e, h, i / 2],
        w13_scale: Some(vec![e, 2 * i, h / 32]),
        w2_scale: Some(vec![e, h, i / 32]),
        w13_bias: Some(vec![e, 2 * i]),
        w2_bias: Some(vec![e, h]),
        int4_unpacked: false,
    };
    let shapes = plan(&spec).unwrap();
    let w13_len = e * 2 * i * h / 2;
    let w2_len = e * h * i / 2;
    let s13_len = e * 2 * i * h / 32;
    let s2_len = e * h * i / 32;
    let b13: Vec<u8> = vec![0; e * 2 * i * 4];
    let b2: Vec<u8> = vec![0; e * h * 4];
    let mut o13s = vec![0u8; shapes.w13_scale_bytes()];
    let mut o2s = vec![0u8; shapes.w2_scale_bytes()];
    let mut o13b = vec![0u8; shapes.w13_bias_bytes()];
    let mut o2b = vec![0u8; shapes.w2_bias_bytes()];
    let mut o2 = vec![0u8; shapes.w2_bytes()];
    let moved = 2 * (w13_len + w2_len + s13_len + s2_len + b13.len() + b2.len());
    let t = median(|| {
        prepare_host(
            &shapes,
            PrepareInputs {
                w13: &src[..w13_len],
                w2: &src[w13_len..w13_len + w2_len],
                w13_scale: Some(&src[..s13_len]),
                w2_scale: Some(&src[..s2_len]),
                w13_bias: Some(&b13),
                w2_bias: Some(&b2),
            },
            PrepareOutputs {
                w13: &mut dst[..w13_len],
                w2: &mut o2,
                w13_scale: Some(&mut o13s),
                w2_scale: Some(&mut o2s),
                w13_bias: Some(&mut o13b),
                w2_bias: Some(&mut o2b),
            },
        )
        .unwrap()
    });
    report(
        "prepare_moe MXFP4 interleave_rows (~1.1 GiB)",
        moved,
        t,
        memcpy,
    );
}
