//! fused_moe on the CPU against an independent float64 reference, on random configurations:
//! every weight format, allowed act dtype, gate mode, activation, weight/scale layout, with
//! expert masks, out-of-range ids, num_local_tokens, biases, router weight on input, and
//! padding filled with garbage (NaN included) that must be skipped; the 1.1 launch options
//! too: a separate stage-2 act dtype, static per-tensor act scales, GELU_TANH and the
//! non-gated NONE, and pre-quantized hidden_states (which must give the same output bytes
//! as the launch that quantizes the same input itself).
//!
//! The reference decodes the *logical* weight codes the test generated (never the stored
//! bytes), quantizes activations with its own f64 rounding, and emulates AITER's casts
//! (stage-1 output to the output dtype).

mod common;
use common::*;
use moeplug::moe::actquant::{code_bytes, quantize_row, row_scales, Fp8Kind};
use moeplug::types::{ActDtype, WeightFormat};

/// Round to nearest even on a float grid with `mant` mantissa bits and smallest normal
/// exponent `min_exp`, saturating at `max` when given.
fn round_fmt(x: f64, mant: i32, min_exp: i32, max: Option<f64>) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let a = x.abs();
    let e = (a.log2().floor() as i32).max(min_exp);
    let q = 2f64.powi(e - mant);
    let mut r = (a / q).round_ties_even() * q;
    if let Some(m) = max {
        r = r.min(m);
    }
    r.copysign(x)
}
fn bf16(x: f64) -> f64 {
    round_fmt(x, 7, -126, None)
}
/// IEEE half: beyond 65504 after rounding is infinite (as the kernel's cast gives).
fn f16(x: f64) -> f64 {
    let r = round_fmt(x, 10, -14, None);
    if r.abs() > 65504.0 {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}
fn fp8(x: f64, fnuz: bool) -> f64 {
    if fnuz {
        round_fmt(x, 3, -7, Some(240.0))
    } else {
        round_fmt(x, 3, -6, Some(448.0))
    }
}
fn fp4(x: f64) -> f64 {
    round_fmt(x, 1, 0, Some(6.0))
}
fn fp8_max(fnuz: bool) -> f64 {
    if fnuz {
        240.0
    } else {
        448.0
    }
}

/// e4m3 byte → value, from the bit layout (bias 7 fn / 8 fnuz).
fn fp8_decode(b: u8, fnuz: bool) -> f64 {
    let bias = if fnuz { 8 } else { 7 };
    let (s, e, m) = (b >> 7, ((b >> 3) & 15) as i32, (b & 7) as f64);
    let v = if e == 0 {
        m / 8.0 * 2f64.powi(1 - bias)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - bias)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}
fn fp4_decode(n: u8) -> f64 {
    let m = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(n & 7) as usize];
    if n & 8 != 0 {
        -m
    } else {
        m
    }
}

/// Activation quantization of the rows of `x` (`width` columns) as `act` asks.
/// `static_scale`: the FP8_PER_TENSOR scale when the launch passes one (else amax / max).
fn quant_rows(x: &mut [f64], width: usize, act: ActDtype, fnuz: bool, static_scale: Option<f64>) {
    let amax = |v: &[f64]| v.iter().fold(0f64, |m, a| m.max(a.abs()));
    // AITER computes scales and x/scale in fp32 (x is 16-bit, so exact in f32); doing the
    // same here keeps the fp8 rounding decisions identical.
    let scaled = |v: &mut [f64], s: f64, f: &dyn Fn(f64) -> f64| {
        for a in v.iter_mut() {
            *a = f((*a as f32 / s as f32) as f64) * s;
        }
    };
    let fp8s = |a: f64| {
        let s = (a as f32 / fp8_max(fnuz) as f32) as f64;
        if s == 0.0 {
            1.0
        } else {
            s
        }
    };
    // Power of two ≥ amax/max (e8m0 RoundUp); 2^-127 for zero blocks.
    let pow2_up = |v: f64| {
        if v == 0.0 {
            2f64.powi(-127)
        } else {
            let e = v.log2().floor();
            let p = 2f64.powf(e);
            if p < v {
                2.0 * p
            } else {
                p
            }
        }
    };
    let per_tensor = static_scale.unwrap_or_else(|| fp8s(amax(x)));
    for row in x.chunks_mut(width) {
        match act {
            ActDtype::Bf16 => row.iter_mut().for_each(|a| *a = bf16(*a)),
            ActDtype::Fp16 => row.iter_mut().for_each(|a| *a = f16(*a)),
            ActDtype::Fp8PerToken => {
                let s = fp8s(amax(row));
                scaled(row, s, &|v| fp8(v, fnuz))
            }
            ActDtype::Fp8PerTensor => scaled(row, per_tensor, &|v| fp8(v, fnuz)),
            ActDtype::Fp8Block128 => {
                for g in row.chunks_mut(128) {
                    let s = fp8s(amax(g));
                    scaled(g, s, &|v| fp8(v, fnuz))
                }
            }
            ActDtype::Mxfp4 => {
                for g in row.chunks_mut(32) {
                    let s = pow2_up(amax(g) / 6.0);
                    scaled(g, s, &fp4)
                }
            }
            ActDtype::Mxfp8 => {
                for g in row.chunks_mut(32) {
                    let s = pow2_up(amax(g) / fp8_max(fnuz));
                    scaled(g, s, &|v| fp8(v, fnuz))
                }
            }
        }
    }
}

fn act_f64(act: i32, g: f64, u: f64, alpha: f64, limit: Option<f64>) -> f64 {
    let (g, u) = match limit {
        Some(l) => (g.min(l), u.clamp(-l, l)),
        None => (g, u),
    };
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let c = (2.0 / std::f64::consts::PI).sqrt();
    match act {
        1 => g * sig(g) * u,
        2 => 0.5 * g * (1.0 + erf(g / 2f64.sqrt())) * u,
        3 => g * sig(alpha * g) * (u + 1.0),
        4 => 0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u,
        _ => u, // NONE: not gated
    }
}

/// erf by its Maclaurin series (|x| < 3) or the asymptotic continued fraction.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a * a / n;
            sum += term / (2.0 * n + 1.0);
        }
        2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = k as f64 / 2.0 / (a + f);
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f)
    };
    r.copysign(x)
}

/// Physical row of (gate 0 | up 1, j) in a gate mode, with `ip` rows per half.
fn phys_row(mode: i32, g: usize, j: usize, ip: usize) -> usize {
    match mode {
        1 => g * ip + j,
        2 => (j / 16) * 32 + g * 16 + j % 16,
        _ => 2 * j + g,
    }
}

struct Cfg {
    format: WeightFormat,
    act: ActDtype,
    gate_mode: i32,
    activation: i32,
    weight_layout: i32,
    scale_layout: i32,
    fnuz: bool,
    e: usize,
    e_global: usize,
    topk: usize,
    m: usize,
    h: usize,
    i: usize,
    hp: usize,
    ip: usize,
    bias: bool,
    rwoi: bool,
    mask: bool,
    nlt: Option<usize>,
    out_fp16: bool,
    in_fp16: bool,
    hidden_padded: bool,
    output_padded: bool,
    alpha: f32,
    limit: f32,
    /// The stage-2 act dtype (== act unless a different one was drawn).
    act2: ActDtype,
    /// Static FP8_PER_TENSOR scales: a factor on the dynamic scale, per stage.
    static_factor: [Option<f64>; 2],
    /// Also run the launch with the input pre-quantized (act dtypes that have a form).
    prequantize: bool,
}

/// The formats of the first test; INT4_GROUP32 (added later) has its own test and seed, so
/// that these cases keep their random stream.
const FORMATS_1_0: &[WeightFormat] = &[
    WeightFormat::Bf16,
    WeightFormat::Fp16,
    WeightFormat::Fp8PerTensor,
    WeightFormat::Fp8PerChannel,
    WeightFormat::Fp8Block128,
    WeightFormat::Mxfp4,
    WeightFormat::Mxfp8,
];

/// `x` draws the 1.1 options, so `r` draws what it drew before they existed.
fn random_cfg(r: &mut Rng, x: &mut Rng, formats: &[WeightFormat]) -> Cfg {
    let format = r.pick(formats);
    let act = r.pick(format.allowed_act_dtypes());
    let gate_mode = r.pick(&[1, 2, 3]);
    let weight_layout = r.pick(&[1, 2]);
    let mx = format.is_mx();
    let int4 = format == WeightFormat::Int4Group32;
    // int4: plain bf16 scales [E, N, K/32] or AITER's shuffle_scale_for_int4 (group pairs).
    let int4_scale = if int4 { r.pick(&[1, 4]) } else { 0 };
    // Alignment the recorded layouts need (and the test's F1 writer: K%32 storage elements).
    let mut align_h = match (mx, int4, int4_scale) {
        (_, true, 4) => 64,
        (true, _, _) | (_, true, _) => 32,
        // int4 per channel: whole uint32 words of 8 values.
        _ if format == WeightFormat::Int4PerChannel => 8,
        _ => 1,
    };
    let mut align_i = align_h;
    if gate_mode == 2 {
        align_i = align_i.max(16);
    }
    if weight_layout == 2 {
        align_h = 64;
        align_i = 64;
    }
    let h = 16 + r.below(160);
    let i = 8 + r.below(90);
    let up = |v: usize, a: usize| v.div_ceil(a) * a;
    let hp = up(h, align_h) + r.below(2) * align_h.max(8);
    let ip = up(i, align_i) + r.below(2) * align_i.max(8);
    let e = 1 + r.below(4);
    let mask = r.below(3) == 0;
    let activation = r.pick(&[1, 2, 3]);
    let mut c = Cfg {
        format,
        act,
        gate_mode,
        activation,
        weight_layout,
        scale_layout: if mx {
            r.pick(&[1, 2, 3])
        } else if int4 {
            int4_scale
        } else {
            0
        },
        fnuz: r.below(2) == 0,
        e,
        e_global: if mask { e + 1 + r.below(3) } else { e },
        topk: 1 + r.below(e.min(3)),
        m: 1 + r.below(7),
        h,
        i,
        hp,
        ip,
        bias: r.below(2) == 0,
        rwoi: r.below(4) == 0,
        mask,
        nlt: (r.below(3) == 0).then(|| r.below(8)),
        out_fp16: r.below(3) == 0,
        in_fp16: r.below(3) == 0,
        hidden_padded: r.below(2) == 0,
        output_padded: r.below(2) == 0,
        alpha: if r.below(2) == 0 {
            0.0
        } else {
            r.uniform(0.5, 2.5) as f32
        },
        limit: match (activation, r.below(3)) {
            (_, 0) => 0.0,
            _ => r.uniform(0.3, 3.0) as f32,
        },
        act2: act,
        static_factor: [None; 2],
        prequantize: false,
    };
    // The 1.1 options, from their own generator.
    if x.below(4) == 0 {
        c.activation = 4; // GELU_TANH
    } else if x.below(6) == 0 {
        c.activation = 5; // NONE: not gated, w13 SEPARATED with up rows only, no limit
        c.gate_mode = 1;
        c.limit = 0.0;
    }
    if x.below(3) == 0 {
        c.act2 = x.pick(format.allowed_act_dtypes());
    }
    for (stage, a) in [c.act, c.act2].into_iter().enumerate() {
        if a == ActDtype::Fp8PerTensor && x.below(2) == 0 {
            c.static_factor[stage] = Some(x.uniform(0.7, 2.0));
        }
    }
    c.prequantize = ActDtype::PREQUANTIZABLE.contains(&c.act);
    if format == WeightFormat::Int4PerChannel {
        // int4 weights have no fp8 flavour: fp8 activations are e4m3fn.
        c.fnuz = false;
    }
    c
}

/// A stacked weight's logical values and its stored bytes + scale tensor.
struct Weight {
    /// [E][rows (physical order)][cols] dequantized values; padded entries unused.
    values: Vec<f64>,
    stored: T,
    scale: Option<T>,
}

/// Random weight `[E, rows, cols]` (padded sizes) in `cfg`'s format and layouts. Entries
/// outside `real(row, col)` hold garbage bytes. `gate_up` rows are reordered per gate mode
/// (rows given in physical order already: `real` decides per physical row).
fn make_weight(
    r: &mut Rng,
    c: &Cfg,
    rows: usize,
    cols: usize,
    real: &dyn Fn(usize, usize) -> bool,
) -> Weight {
    let e = c.e;
    let f = c.format;
    let mut values = vec![0f64; e * rows * cols];
    // Storage codes per logical element (u16 for 16-bit, u8 otherwise; fp4 a nibble).
    let mut codes = vec![0u16; e * rows * cols];
    // Scales per physical row/col as the format defines them.
    let n_blk = rows.div_ceil(128);
    let k_blk = cols.div_ceil(128);
    let sc_tensor: Vec<f32> = (0..e).map(|_| r.uniform(0.002, 0.01) as f32).collect();
    let sc_channel: Vec<f32> = (0..e * rows)
        .map(|_| r.uniform(0.002, 0.01) as f32)
        .collect();
    let sc_block: Vec<f32> = (0..e * n_blk * k_blk)
        .map(|_| r.uniform(0.002, 0.01) as f32)
        .collect();
    let k32 = cols / 32;
    let sc_mx: Vec<u8> = (0..e * rows * k32.max(1))
        .map(|_| 118 + r.below(7) as u8)
        .collect();
    // int4 group scales: bf16 values, [E, rows, K/32].
    let sc_i4: Vec<u16> = if f == WeightFormat::Int4Group32 {
        (0..e * rows * k32.max(1))
            .map(|_| half::bf16::from_f64(r.uniform(0.002, 0.05)).to_bits())
            .collect()
    } else {
        Vec::new()
    };
    for x in 0..e {
        for n in 0..rows {
            for k in 0..cols {
                let idx = (x * rows + n) * cols + k;
                if !real(n, k) {
                    codes[idx] = r.next_u64() as u16; // garbage, NaN included
                    if f.is_int4() {
                        codes[idx] &= 15;
                    }
                    continue;
                }
                let (code, v) = match f {
                    WeightFormat::Bf16 => {
                        let b = half::bf16::from_f64(r.nonzero(0.2));
                        (b.to_bits(), b.to_f64())
                    }
                    WeightFormat::Fp16 => {
                        let b = half::f16::from_f64(r.nonzero(0.2));
                        (b.to_bits(), b.to_f64())
                    }
                    WeightFormat::Mxfp4 => {
                        let nib = r.below(16) as u8;
                        (nib as u16, fp4_decode(nib))
                    }
                    WeightFormat::Int4Group32 | WeightFormat::Int4PerChannel => {
                        // Two's complement nibble: -8..7.
                        let nib = r.below(16) as u8;
                        (nib as u16, ((nib ^ 8) as f64) - 8.0)
                    }
                    _ => {
                        // Any fp8 code but NaN.
                        let mut b = r.next_u64() as u8;
                        while (c.fnuz && b == 0x80) || (!c.fnuz && b & 0x7F == 0x7F) {
                            b = r.next_u64() as u8;
                        }
                        (b as u16, fp8_decode(b, c.fnuz))
                    }
                };
                let s = match f {
                    WeightFormat::Fp8PerTensor => sc_tensor[x] as f64,
                    WeightFormat::Fp8PerChannel | WeightFormat::Int4PerChannel => {
                        sc_channel[x * rows + n] as f64
                    }
                    WeightFormat::Fp8Block128 => {
                        sc_block[(x * n_blk + n / 128) * k_blk + k / 128] as f64
                    }
                    WeightFormat::Mxfp4 | WeightFormat::Mxfp8 => {
                        2f64.powi(sc_mx[(x * rows + n) * k32 + k / 32] as i32 - 127)
                    }
                    WeightFormat::Int4Group32 => {
                        half::bf16::from_bits(sc_i4[(x * rows + n) * k32 + k / 32]).to_f64()
                    }
                    _ => 1.0,
                };
                codes[idx] = code;
                values[idx] = v * s;
            }
        }
    }
    // Bytes in PLAIN order, then the recorded weight layout.
    let (bytes, elem, per): (Vec<u8>, usize, usize) = match f {
        WeightFormat::Bf16 | WeightFormat::Fp16 => {
            (codes.iter().flat_map(|c| c.to_le_bytes()).collect(), 2, 1)
        }
        WeightFormat::Mxfp4 => (
            codes
                .chunks_exact(2)
                .map(|p| (p[0] as u8 & 15) | ((p[1] as u8 & 15) << 4))
                .collect(),
            1,
            2,
        ),
        // Packed below, from the codes.
        WeightFormat::Int4Group32 => (Vec::new(), 1, 2),
        WeightFormat::Int4PerChannel => (Vec::new(), 4, 8),
        _ => (codes.iter().map(|&c| c as u8).collect(), 1, 1),
    };
    let bytes = if f == WeightFormat::Int4Group32 {
        // AITER's definition: shuffle_weight (16, 16) of the int8-held values (aiter_16x16),
        // then pack_int8_to_packed_int4 (runs of 8: byte j = v[j] | v[j+4] << 4).
        let held: Vec<u8> = codes.iter().map(|&c| c as u8).collect();
        let held = if c.weight_layout == 2 {
            shuffle_f1(&held, e, rows, cols, 1)
        } else {
            held
        };
        held.chunks_exact(8)
            .flat_map(|v| (0..4).map(move |j| v[j] | (v[j + 4] << 4)))
            .collect()
    } else if f == WeightFormat::Int4PerChannel {
        // AITER's definition: shuffle_weight (16, 16, use_int4) of the int8-held values
        // (aiter_16x16: 16 rows x 32 values per pack), then convert_int8_to_uint32_int4 +
        // rearrange_4bit_elements (value j of each run of 8 in nibble [0,4,1,5,2,6,3,7][j]).
        let held: Vec<u8> = codes.iter().map(|&c| c as u8).collect();
        let held = if c.weight_layout == 2 {
            shuffle_f1_int4(&held, e, rows, cols)
        } else {
            held
        };
        held.chunks_exact(8)
            .flat_map(|v| {
                let nib = [0, 4, 1, 5, 2, 6, 3, 7];
                let w = (0..8).fold(0u32, |w, j| w | ((v[j] & 15) as u32) << (4 * nib[j]));
                w.to_le_bytes()
            })
            .collect()
    } else if c.weight_layout == 2 {
        shuffle_f1(&bytes, e, rows, cols / per, elem)
    } else {
        bytes
    };
    let dtype = match f {
        WeightFormat::Bf16 => BF16,
        WeightFormat::Fp16 => F16,
        WeightFormat::Mxfp4 => {
            if r.below(2) == 0 {
                FP4
            } else {
                U8
            }
        }
        WeightFormat::Int4Group32 => {
            if r.below(2) == 0 {
                I8
            } else {
                U8
            }
        }
        WeightFormat::Int4PerChannel => {
            if r.below(2) == 0 {
                I32
            } else {
                U32
            }
        }
        _ if c.fnuz => FP8_FNUZ,
        _ => {
            if r.below(3) == 0 {
                U8 // uint8 fp8 weights are read as e4m3fn
            } else {
                FP8_FN
            }
        }
    };
    // uint8 fp4 carries the byte shape, {17, 4} the logical one.
    let last = if dtype == U8 || dtype == I8 || dtype == U32 || dtype == I32 {
        cols / per
    } else {
        cols
    };
    let stored = T::new(bytes, &[e, rows, last], dtype);
    let scale = match f {
        WeightFormat::Bf16 | WeightFormat::Fp16 => None,
        WeightFormat::Fp8PerTensor => Some(if r.below(2) == 0 {
            T::f32s(&sc_tensor, &[e])
        } else {
            T::f32s(&sc_tensor, &[e, 1])
        }),
        WeightFormat::Fp8PerChannel | WeightFormat::Int4PerChannel => Some(if r.below(2) == 0 {
            T::f32s(&sc_channel, &[e, rows])
        } else {
            T::f32s(&sc_channel, &[e, rows, 1])
        }),
        WeightFormat::Fp8Block128 => Some(T::f32s(&sc_block, &[e, n_blk, k_blk])),
        WeightFormat::Int4Group32 => {
            let bytes = |v: &[u16]| v.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>();
            Some(match (c.scale_layout, r.below(2)) {
                (1, 0) => T::new(bytes(&sc_i4), &[e, rows, k32], BF16),
                (1, _) => T::new(bytes(&sc_i4), &[e * rows, k32], BF16),
                (_, flat) => {
                    // shuffle_scale_for_int4 of AITER's [E, K/32, N]: [E, K/64, N, 2].
                    let mut out = vec![0u16; sc_i4.len()];
                    for x in 0..e {
                        for n in 0..rows {
                            for g in 0..k32 {
                                out[((x * (k32 / 2) + g / 2) * rows + n) * 2 + g % 2] =
                                    sc_i4[(x * rows + n) * k32 + g];
                            }
                        }
                    }
                    let shape: Vec<usize> = if flat == 1 {
                        vec![out.len()]
                    } else {
                        vec![e, k32 / 2, rows, 2]
                    };
                    T::new(bytes(&out), &shape, BF16)
                }
            })
        }
        _ => {
            let sn = k32.div_ceil(8) * 8;
            Some(match c.scale_layout {
                1 => T::new(sc_mx, &[e * rows, k32], E8M0),
                2 => {
                    let s = shuffle_f3(&sc_mx, e * rows, k32, 256, 0x7F);
                    T::new(s, &[(e * rows).div_ceil(256) * 256, sn], U8)
                }
                _ => {
                    let s: Vec<u8> = (0..e)
                        .flat_map(|x| {
                            shuffle_f3(
                                &sc_mx[x * rows * k32..(x + 1) * rows * k32],
                                rows,
                                k32,
                                32,
                                0,
                            )
                        })
                        .collect();
                    T::new(s, &[e, rows.div_ceil(32), sn * 32], E8M0)
                }
            })
        }
    };
    Weight {
        values,
        stored,
        scale,
    }
}

/// Build the launch and the reference output `[m, h]` for one configuration.
fn build(r: &mut Rng, extra: &mut Rng, c: &Cfg) -> (Launch, Vec<f64>) {
    let (e, m, k, h, i, hp, ip) = (c.e, c.m, c.topk, c.h, c.i, c.hp, c.ip);
    let gm = c.gate_mode;
    // NONE is not gated: w13 holds the up rows only, row j of the up projection at row j.
    let gated = c.activation != 5;
    let w13_rows = if gated { 2 * ip } else { ip };
    let halves: &[usize] = if gated { &[0, 1] } else { &[1] };
    let phys = |g: usize, j: usize| if gated { phys_row(gm, g, j, ip) } else { j };
    // Physical rows of w13 that are real: (half, j) with j < i.
    let real_rows = |rows: usize, halves: &[usize], phys: &dyn Fn(usize, usize) -> usize| {
        let mut v = vec![false; rows];
        for &g in halves {
            for j in 0..i {
                v[phys(g, j)] = true;
            }
        }
        v
    };
    // `r` draws a gated w13 in every case (as many draws as before NONE existed, so the
    // cases after a NONE one keep their values); NONE's own w13 comes from `extra`.
    let gated_real = real_rows(2 * ip, &[0, 1], &|g, j| phys_row(gm, g, j, ip));
    let w13 = make_weight(r, c, 2 * ip, hp, &|n, kk| gated_real[n] && kk < h);
    let w13 = if gated {
        w13
    } else {
        let real_row = real_rows(ip, halves, &phys);
        make_weight(extra, c, ip, hp, &|n, kk| real_row[n] && kk < h)
    };
    let w2 = make_weight(r, c, hp, ip, &|n, kk| n < h && kk < i);
    let in_dtype = if c.in_fp16 { F16 } else { BF16 };
    let out_dtype = if c.out_fp16 { F16 } else { BF16 };
    let cast_in = |v: f64| if c.in_fp16 { f16(v) } else { bf16(v) };
    let cast_out = |v: f64| if c.out_fp16 { f16(v) } else { bf16(v) };
    let hcols = if c.hidden_padded { hp } else { h };
    let mut x = vec![0f64; m * h];
    let mut hidden_bits = vec![0u16; m * hcols];
    for t in 0..m {
        for col in 0..hcols {
            let bits = if col < h {
                let v = cast_in(r.nonzero(1.0));
                x[t * h + col] = v;
                if c.in_fp16 {
                    half::f16::from_f64(v).to_bits()
                } else {
                    half::bf16::from_f64(v).to_bits()
                }
            } else {
                0x7FC0 // NaN in the padded columns: must be skipped
            };
            hidden_bits[t * hcols + col] = bits;
        }
    }
    let ids: Vec<i32> = (0..m * k)
        .map(|_| r.below(c.e_global + 2) as i32 - 1)
        .collect();
    let tw: Vec<f32> = (0..m * k).map(|_| r.uniform(0.1, 1.0) as f32).collect();
    // Mask: exactly e experts on, in global-id order.
    let mask: Option<Vec<i32>> = c.mask.then(|| {
        let mut mk = vec![0i32; c.e_global];
        let mut on = 0;
        while on < e {
            let g = r.below(c.e_global);
            if mk[g] == 0 {
                mk[g] = 1;
                on += 1;
            }
        }
        mk
    });
    let local = |gid: i32| -> Option<usize> {
        if gid < 0 {
            return None;
        }
        let gid = gid as usize;
        match &mask {
            None => (gid < e).then_some(gid),
            Some(mk) => (gid < mk.len() && mk[gid] == 1)
                .then(|| mk[..gid].iter().filter(|&&v| v == 1).count()),
        }
    };
    // Drawn for a gated w13 (the prefix serves NONE), as w13 above.
    let b13: Vec<f32> = (0..e * 2 * ip).map(|_| r.nonzero(0.5) as f32).collect();
    let b2: Vec<f32> = (0..e * hp).map(|_| r.nonzero(0.5) as f32).collect();
    let n_tok = c.nlt.map(|n| n.min(m)).unwrap_or(m);

    // Reference.
    let alpha = if c.alpha == 0.0 {
        1.702
    } else {
        c.alpha as f64
    };
    let limit = match (c.activation, c.limit) {
        (3, l) if l == 0.0 => Some(7.0),
        (_, l) if l == 0.0 => None,
        (_, l) => Some(l as f64),
    };
    let w13v = |x: usize, n: usize, kk: usize| w13.values[(x * w13_rows + n) * hp + kk];
    let w2v = |x: usize, n: usize, kk: usize| w2.values[(x * hp + n) * ip + kk];
    let mut xq = x[..n_tok * h].to_vec();
    let fmax = fp8_max(c.fnuz) as f32;
    let static_of = |stage: usize, v: &[f64]| {
        c.static_factor[stage].map(|f| {
            let amax = v.iter().fold(0f64, |m, a| m.max(a.abs())) as f32;
            ((amax / fmax).max(1e-6) as f64 * f) as f32
        })
    };
    let static1 = static_of(0, &xq);
    quant_rows(&mut xq, h, c.act, c.fnuz, static1.map(f64::from));
    let mut a2 = vec![0f64; m * k * i];
    let mut routed = vec![None; m * k];
    for t in 0..n_tok {
        for s in 0..k {
            let slot = t * k + s;
            let Some(el) = local(ids[slot]) else { continue };
            routed[slot] = Some(el);
            for j in 0..i {
                let mut gu = [0f64; 2];
                for &g in halves {
                    let v = &mut gu[g];
                    let p = phys(g, j);
                    let mut acc: f64 = (0..h).map(|kk| xq[t * h + kk] * w13v(el, p, kk)).sum();
                    if c.rwoi {
                        acc *= tw[slot] as f64;
                    }
                    if c.bias {
                        acc += b13[el * w13_rows + p] as f64;
                    }
                    *v = acc;
                }
                a2[slot * i + j] = cast_out(act_f64(c.activation, gu[0], gu[1], alpha, limit));
            }
        }
    }
    let static2 = static_of(1, &a2);
    quant_rows(&mut a2, i, c.act2, c.fnuz, static2.map(f64::from));
    let mut want = vec![0f64; m * h];
    for slot in 0..m * k {
        let Some(el) = routed[slot] else { continue };
        let w = if c.rwoi { 1.0 } else { tw[slot] as f64 };
        for n in 0..h {
            let mut y: f64 = (0..i).map(|j| a2[slot * i + j] * w2v(el, n, j)).sum();
            if c.bias {
                y += b2[el * hp + n] as f64;
            }
            want[(slot / k) * h + n] += w * y;
        }
    }

    let launch = Launch {
        layout: layout(
            c.format as i32,
            gm,
            c.weight_layout,
            c.scale_layout,
            e,
            [h, i, hp, ip],
            c.bias,
        ),
        activation: c.activation,
        alpha: c.alpha,
        limit: c.limit,
        act_dtype: c.act as i32,
        flags: if c.rwoi { 1 << 3 } else { 0 },
        hidden: T::u16s(&hidden_bits, &[m, hcols], in_dtype),
        hidden_scale: None,
        w13: w13.stored,
        w13_scale: w13.scale,
        w13_bias: c
            .bias
            .then(|| T::f32s(&b13[..e * w13_rows], &[e, w13_rows])),
        w2: w2.stored,
        w2_scale: w2.scale,
        w2_bias: c.bias.then(|| T::f32s(&b2, &[e, hp])),
        topk_weights: T::f32s(&tw, &[m, k]),
        topk_ids: T::i32s(&ids, &[m, k]),
        expert_mask: mask.map(|mk| T::i32s(&mk, &[c.e_global])),
        num_local_tokens: c.nlt.map(|n| T::i32s(&[n as i32], &[1])),
        output: {
            // Poison the output: every element must be written.
            let mut o = T::zeros(&[m, if c.output_padded { hp } else { h }], out_dtype);
            o.bytes.iter_mut().for_each(|b| *b = 0x7F);
            o
        },
        // A [1] or a 0-dim scale.
        stage1_act_scale: static1
            .map(|s| T::f32s(&[s], if extra.below(2) == 0 { &[1] } else { &[] })),
        stage2_act_scale: static2.map(|s| T::f32s(&[s], &[1])),
        stage2_act_dtype: if c.act2 != c.act || extra.below(2) == 0 {
            c.act2 as i32
        } else {
            0
        },
    };
    (launch, want)
}

/// `launch` with its 16-bit hidden_states replaced by the codes and scales of moeplug's own
/// activation quantizer for act dtype `c.act` (over every column given, padding included),
/// in one of the dtypes a caller may use.
fn prequantized(r: &mut Rng, c: &Cfg, launch: &Launch) -> Launch {
    let mut l = launch.clone();
    let (m, given) = (
        launch.hidden.shape[0] as usize,
        launch.hidden.shape[1] as usize,
    );
    // Packed fp4 rows hold an even number of values: an odd H is passed as H padded.
    let cols = if c.act == ActDtype::Mxfp4 && given % 2 == 1 {
        c.hp
    } else {
        given
    };
    let given_values = launch.hidden.values();
    let mut values = vec![0f64; m * cols];
    for t in 0..m {
        values[t * cols..t * cols + given]
            .copy_from_slice(&given_values[t * given..(t + 1) * given]);
    }
    // The fp8 flavour follows the weights: e4m3fnuz only with e4m3fnuz weights.
    let fnuz = c.fnuz && !matches!(c.format, WeightFormat::Mxfp4);
    let kind = if fnuz {
        Fp8Kind::E4m3fnuz
    } else {
        Fp8Kind::E4m3fn
    };
    let (groups, scale_bytes) = row_scales(c.act, cols).expect("a pre-quantizable act dtype");
    let row_codes = code_bytes(c.act, cols);
    let mut codes = vec![0u8; m * row_codes];
    let mut scales = vec![0u8; m * groups * scale_bytes];
    for t in 0..m {
        let row: Vec<f32> = values[t * cols..(t + 1) * cols]
            .iter()
            .map(|&v| v as f32)
            .collect();
        quantize_row(
            &row,
            c.act,
            kind,
            &mut codes[t * row_codes..(t + 1) * row_codes],
            &mut scales[t * groups * scale_bytes..(t + 1) * groups * scale_bytes],
        )
        .expect("quantizable");
    }
    let byte_dtype = r.below(3) == 0;
    l.hidden = match c.act {
        ActDtype::Mxfp4 if byte_dtype => T::new(codes, &[m, row_codes], U8),
        ActDtype::Mxfp4 => T::new(codes, &[m, cols], FP4),
        _ if byte_dtype && !fnuz => T::new(codes, &[m, cols], U8),
        _ if fnuz => T::new(codes, &[m, cols], FP8_FNUZ),
        _ => T::new(codes, &[m, cols], FP8_FN),
    };
    l.hidden_scale = Some(match c.act {
        ActDtype::Fp8PerToken if r.below(2) == 0 => T::new(scales, &[m], F32),
        ActDtype::Fp8PerToken => T::new(scales, &[m, 1], F32),
        ActDtype::Fp8Block128 => T::new(scales, &[m, groups], F32),
        _ if byte_dtype => T::new(scales, &[m, groups], U8),
        _ => T::new(scales, &[m, groups], E8M0),
    });
    l
}

fn describe(c: &Cfg) -> String {
    format!(
        "format {} act {} gate {} activation {} wl {} sl {} fnuz {} E {}/{} k {} M {} H {}/{} I {}/{} \
         bias {} rwoi {} mask {} nlt {:?} out_fp16 {} in_fp16 {} alpha {} limit {} act2 {} \
         static {:?}",
        c.format.label(),
        c.act.label(),
        c.gate_mode,
        c.activation,
        c.weight_layout,
        c.scale_layout,
        c.fnuz,
        c.e,
        c.e_global,
        c.topk,
        c.m,
        c.h,
        c.hp,
        c.i,
        c.ip,
        c.bias,
        c.rwoi,
        c.mask,
        c.nlt,
        c.out_fp16,
        c.in_fp16,
        c.alpha,
        c.limit,
        c.act2.label(),
        c.static_factor
    )
}

#[test]
fn random_configurations_agree_with_the_f64_reference() {
    agree_with_the_f64_reference(Rng(0x5EED_0F_00E), Rng(0x110F_7105), FORMATS_1_0, 400);
}

/// INT4_GROUP32 (a16wi4): plain or AITER-shuffled packed weights (the test packs with its own
/// `pack_int8_to_packed_int4` after its own F1 of the int8 values), bf16 scales plain or in
/// `shuffle_scale_for_int4` order (4-D or flattened), int8 or uint8 storage.
#[test]
fn int4_configurations_agree_with_the_f64_reference() {
    agree_with_the_f64_reference(
        Rng(0x1A74_0032),
        Rng(0x1A74_7105),
        &[WeightFormat::Int4Group32],
        200,
    );
}

/// INT4_PER_CHANNEL (a8w4 int4, Quark int4-fp8): plain or AITER-shuffled uint32/int32 words
/// (the test's own F1 of the int8 values with use_int4 and its own word packing), fp32 row
/// scales `[E, N]` or `[E, N, 1]`, every act dtype of the format in both stages.
#[test]
fn int4_per_channel_configurations_agree_with_the_f64_reference() {
    agree_with_the_f64_reference(
        Rng(0x1A74_00C4),
        Rng(0x1A74_F8F8),
        &[WeightFormat::Int4PerChannel],
        // One act dtype in four is pre-quantizable (fp8_per_token): enough cases for 50.
        260,
    );
}

/// AITER's `shuffle_weight(x, (16, 16), use_int4=True)` of int8 values `[batch, n, k]`: tiles
/// of 16 rows x 32 values, written from docs/layouts.md §2.1.
fn shuffle_f1_int4(src: &[u8], batch: usize, n: usize, k: usize) -> Vec<u8> {
    assert!(
        n % 16 == 0 && k % 32 == 0,
        "F1 use_int4 needs N%16 and K%32"
    );
    let mut out = Vec::with_capacity(src.len());
    for b in 0..batch {
        for n0 in (0..n).step_by(16) {
            for k0 in (0..k).step_by(32) {
                for r in n0..n0 + 16 {
                    let at = (b * n + r) * k + k0;
                    out.extend_from_slice(&src[at..at + 32]);
                }
            }
        }
    }
    out
}

fn agree_with_the_f64_reference(mut r: Rng, mut x: Rng, formats: &[WeightFormat], cases: usize) {
    let (mut worst, mut flips, mut others, mut totals) =
        ([0f64; 2], [0usize; 2], [0usize; 2], [0usize; 2]);
    let mut prequantized_cases = 0;
    for case in 0..cases {
        let c = random_cfg(&mut r, &mut x, formats);
        let (mut launch, want) = build(&mut r, &mut x, &c);
        let mut pre = c.prequantize.then(|| prequantized(&mut x, &c, &launch));
        if let Err(e) = launch.run() {
            panic!("case {case}: {}: {e:?}", describe(&c));
        }
        if let Some(pre) = &mut pre {
            if let Err(e) = pre.run() {
                panic!("case {case}: pre-quantized: {}: {e:?}", describe(&c));
            }
            assert!(
                pre.output.bytes == launch.output.bytes,
                "case {case}: the pre-quantized launch's output differs from the \
                 self-quantized one: {}",
                describe(&c)
            );
            prequantized_cases += 1;
        }
        let cols = if c.output_padded { c.hp } else { c.h };
        let got_all = launch.output.values();
        let mut got = vec![0f64; c.m * c.h];
        for t in 0..c.m {
            for n in 0..cols {
                let v = got_all[t * cols + n];
                if n < c.h {
                    got[t * c.h + n] = v;
                } else {
                    assert_eq!(v, 0.0, "case {case}: padded output column {n} of row {t}");
                }
            }
        }
        let quantized = c.act.is_quantized() || c.act2.is_quantized();
        if want.iter().all(|&v| v == 0.0) {
            assert!(
                got.iter().all(|&v| v == 0.0),
                "case {case}: expected all zero"
            );
            continue;
        }
        // The kernel's output is 16-bit: compare with the reference rounded the same way.
        // f32 (kernel) and f64 (reference) sums may land on either side of a rounding
        // boundary, so single elements may differ by one output ulp; those are counted.
        let (mant, min_exp, cast): (i32, i32, fn(f64) -> f64) = if c.out_fp16 {
            (10, -14, f16)
        } else {
            (7, -126, bf16)
        };
        let want_r: Vec<f64> = want.iter().map(|&v| cast(v)).collect();
        let ulp = |v: f64| {
            let e = (v.abs().max(1e-300).log2().floor() as i32).max(min_exp);
            2f64.powi(e - mant)
        };
        let mut off_by_one = 0;
        let mut beyond = 0;
        for (g, w) in got.iter().zip(&want_r) {
            if g != w {
                if (g - w).abs() <= ulp(*w) * 1.000_001 {
                    off_by_one += 1;
                } else {
                    beyond += 1;
                }
            }
        }
        // Infinite outputs (fp16 overflow) were compared above; the error is over the rest.
        let finite: (Vec<f64>, Vec<f64>) = got
            .iter()
            .zip(&want_r)
            .filter(|(_, w)| w.is_finite())
            .map(|(g, w)| (*g, *w))
            .unzip();
        let err = rel_l2(&finite.0, &finite.1);
        let idx = quantized as usize;
        worst[idx] = worst[idx].max(err);
        flips[idx] += off_by_one;
        others[idx] += beyond;
        totals[idx] += got.len();
        if c.format.is_int4() {
            // int4 weights spread wider than the other formats' (integers to ±8 times the
            // group scale), so a stage-1 value the f32 kernel rounds to the other side of a
            // 16-bit boundary than the f64 reference (AITER's cast) shows up in a whole row
            // of outputs, sometimes by more than one ulp where stage 2 cancels: judged by rel
            // L2 as the quantized activations are.
            assert!(
                err <= 1e-3 && beyond * 100 <= got.len().max(100),
                "case {case}: rel L2 {err:.3e} > 1e-3 or {beyond} elements beyond one ulp: {}",
                describe(&c)
            );
        } else if quantized {
            assert!(
                err <= 1e-3,
                "case {case}: rel L2 {err:.3e} > 1e-3: {}",
                describe(&c)
            );
        } else if c.activation >= 4 {
            // The 1.1 activations (GELU_TANH, NONE) are held to the whole-error bound of
            // quantized activations: a 16-bit intermediate that rounds to the other side of
            // a boundary (f32 vs f64 sums) moves an output that cancels to near zero by
            // more than one of its ulps, which the per-element rule below counts as a
            // failure (seen in several of ~60 such cases at rel L2 1e-8 to 1e-4).
            assert!(
                err <= 1e-3,
                "case {case}: rel L2 {err:.3e} > 1e-3: {}",
                describe(&c)
            );
        } else {
            assert!(
                beyond == 0 && off_by_one * 50 <= got.len().max(50),
                "case {case}: {beyond} elements beyond one ulp, {off_by_one} one-ulp flips \
                 (rel L2 {err:.3e}): {}",
                describe(&c)
            );
        }
    }
    println!(
        "16-bit activations: worst rel L2 {:.3e}, one-ulp flips {}/{} elements, larger {}; \
         quantized activations: worst rel L2 {:.3e}, one-ulp flips {}, larger {} of {}; \
         {prequantized_cases} pre-quantized launches bit-identical",
        worst[0], flips[0], totals[0], others[0], worst[1], flips[1], others[1], totals[1]
    );
    // Formats with quantized act dtypes draw pre-quantized launches often enough to count.
    let quantizable = formats
        .iter()
        .any(|f| f.allowed_act_dtypes().iter().any(|a| a.is_quantized()));
    assert!(
        !quantizable || prequantized_cases >= 50,
        "only {prequantized_cases} pre-quantized cases"
    );
}

/// What DETERMINISTIC promises for the CPU backend (caps feature, docs/determinism.md): the
/// output bytes of a launch do not depend on the worker thread count (1, 2, 7) nor on the
/// run, for every weight format with each of its activation dtypes. Outputs are poisoned
/// before every run.
#[test]
fn cpu_output_bytes_do_not_depend_on_threads_or_repeats() {
    use moeplug::capi::moeplug_set_num_threads;
    let mut r = Rng(0xDE7E_2A11);
    let mut extra = Rng(0x0DE7_E2A1);
    for &format in WeightFormat::ALL {
        for &act in format.allowed_act_dtypes() {
            // A random configuration of this format and act dtype, with enough tokens and
            // experts that every thread count splits the work differently.
            let mut c = random_cfg(&mut r, &mut extra, &[format]);
            while c.format != format || c.act != act {
                c = random_cfg(&mut r, &mut extra, &[format]);
            }
            c.m = 37 + r.below(40);
            c.nlt = c.nlt.map(|_| r.below(c.m));
            let (mut launch, _) = build(&mut r, &mut extra, &c);
            let mut first: Option<Vec<u8>> = None;
            for threads in [1u32, 2, 7, 7, 1] {
                assert_eq!(moeplug_set_num_threads(threads) as i32, 0);
                launch.output.bytes.fill(0xA5);
                if let Err(e) = launch.run() {
                    panic!("{}: {e:?}", describe(&c));
                }
                match &first {
                    None => first = Some(launch.output.bytes.clone()),
                    Some(f) => assert!(
                        f == &launch.output.bytes,
                        "{} threads gave other bytes than 1 thread: {}",
                        threads,
                        describe(&c)
                    ),
                }
            }
        }
    }
    // Back to the default (every core).
    moeplug_set_num_threads(0);
}
