//! The MoE references of AITER's torch implementation (golden `moe_ref_*`, T=5, D=256, I=128,
//! E=4, topk=2) through the C ABI, with the weights in every layout the CPU backend reads.

mod common;
use common::*;

const T_: usize = 5;
const D: usize = 256;
const I: usize = 128;
const E: usize = 4;
const K: usize = 2;

struct Case {
    name: &'static str,
    /// weight_format: 1 BF16, 6 MXFP4.
    format: i32,
    activation: i32,
    act_dtype: i32,
    flags: u32,
    bias: bool,
}

const CASES: [Case; 5] = [
    Case {
        name: "moe_ref_a16w16_silu",
        format: 1,
        activation: 1,
        act_dtype: 1,
        flags: 0,
        bias: false,
    },
    Case {
        name: "moe_ref_a16w16_gelu_doweight_stage1",
        format: 1,
        activation: 2,
        act_dtype: 1,
        flags: 1 << 3,
        bias: false,
    },
    Case {
        name: "moe_ref_a16w4_swiglu_bias",
        format: 6,
        activation: 3,
        act_dtype: 1,
        flags: 0,
        bias: true,
    },
    Case {
        name: "moe_ref_a4w4_silu",
        format: 6,
        activation: 1,
        act_dtype: 6,
        flags: 0,
        bias: false,
    },
    Case {
        name: "moe_ref_a8w4_swiglu_bias",
        format: 6,
        activation: 3,
        act_dtype: 7,
        flags: 0,
        bias: true,
    },
];

/// (weight_layout, scale_layout, gate_mode) variants: the same weights, stored differently.
const VARIANTS: [(i32, i32, i32); 5] = [(1, 1, 1), (2, 2, 1), (2, 3, 2), (1, 2, 3), (2, 1, 3)];

fn launch_for(c: &Case, (wl, sl, gm): (i32, i32, i32)) -> Launch {
    let g = |s: &str| golden(&format!("{}.{s}.bin", c.name));
    let mx = c.format == 6;
    let (w1, w2, elem, per) = if mx {
        (g("input.w1_fp4"), g("input.w2_fp4"), 1, 2)
    } else {
        (g("input.w1"), g("input.w2"), 2, 1)
    };
    // Gate mode: reorder w13 rows (and its scale and bias rows) the same way.
    let w1 = reorder_gate_up(&w1, E, I, D / per * elem, gm);
    let (w1, w2) = if wl == 2 {
        (
            shuffle_f1(&w1, E, 2 * I, D / per, elem),
            shuffle_f1(&w2, E, D, I / per, elem),
        )
    } else {
        (w1, w2)
    };
    let wdtype = if mx { FP4 } else { BF16 };
    let mut l = Launch {
        layout: layout(
            c.format,
            gm,
            wl,
            if mx { sl } else { 0 },
            E,
            [D, I, D, I],
            c.bias,
        ),
        activation: c.activation,
        alpha: 0.0,
        limit: 0.0,
        act_dtype: c.act_dtype,
        flags: c.flags,
        hidden: T::new(g("input.hidden"), &[T_, D], BF16),
        hidden_scale: None,
        w13: T::new(w1, &[E, 2 * I, D], wdtype),
        w13_scale: None,
        w13_bias: None,
        w2: T::new(w2, &[E, D, I], wdtype),
        w2_scale: None,
        w2_bias: None,
        topk_weights: T::new(g("input.topk_weights"), &[T_, K], F32),
        topk_ids: T::new(g("input.topk_ids"), &[T_, K], I32),
        expert_mask: None,
        num_local_tokens: None,
        output: T::zeros(&[T_, D], BF16),
        stage1_act_scale: None,
        stage2_act_scale: None,
        stage2_act_dtype: 0,
    };
    if mx {
        let s1 = reorder_gate_up(&g("input.w1_scale_e8m0"), E, I, D / 32, gm);
        let s2 = g("input.w2_scale_e8m0");
        let scale = |s: Vec<u8>, n: usize, k32: usize| match sl {
            1 => T::new(s, &[E * n, k32], E8M0),
            2 => T::new(
                shuffle_f3(&s, E * n, k32, 256, 0),
                &[(E * n).div_ceil(256) * 256, 8],
                U8,
            ),
            _ => {
                let per_e: Vec<u8> = (0..E)
                    .flat_map(|e| shuffle_f3(&s[e * n * k32..(e + 1) * n * k32], n, k32, 32, 0))
                    .collect();
                T::new(per_e, &[E, n / 32, 8 * 32], E8M0)
            }
        };
        l.w13_scale = Some(scale(s1, 2 * I, D / 32));
        l.w2_scale = Some(scale(s2, D, I / 32));
    }
    if c.bias {
        let b1 = reorder_gate_up(&g("input.bias1"), E, I, 4, gm);
        l.w13_bias = Some(T::new(b1, &[E, 2 * I], F32));
        l.w2_bias = Some(T::new(g("input.bias2"), &[E, D], F32));
    }
    l
}

#[test]
fn golden_moe_references_match_in_every_layout() {
    for c in &CASES {
        let want = T::new(
            golden(&format!("{}.output.stage2.bin", c.name)),
            &[T_, D],
            BF16,
        )
        .values();
        let variants: &[(i32, i32, i32)] = if c.format == 6 {
            &VARIANTS
        } else {
            &VARIANTS[..2]
        };
        let variants: Vec<_> = variants
            .iter()
            .copied()
            .chain((c.format == 1).then_some((2, 1, 3)))
            .collect();
        for &v in &variants {
            let mut l = launch_for(c, v);
            l.run()
                .unwrap_or_else(|e| panic!("{} {v:?}: {e:?}", c.name));
            let err = rel_l2(&l.output.values(), &want);
            println!("{} layout/scale/gate {v:?}: rel L2 {err:.2e}", c.name);
            assert!(err <= 1e-2, "{} {v:?}: rel L2 {err}", c.name);
        }
        // Control: a different activation must not pass, so the comparison can fail.
        let mut wrong = launch_for(c, (1, 1, 1));
        wrong.activation = if c.activation == 2 { 1 } else { 2 };
        wrong.run().unwrap();
        let err = rel_l2(&wrong.output.values(), &want);
        assert!(
            err > 5e-2,
            "{}: a wrong activation still matched ({err})",
            c.name
        );
    }
}

#[test]
fn golden_sorting_cases() {
    use moeplug::moe::sort::{moe_sorting, Routing};
    let i32s = |b: Vec<u8>| -> Vec<i32> {
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let f32s = |b: Vec<u8>| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    for (name, m, k, e, bs, ep) in [
        ("sort_doc_example_m5_k3_e6_b4", 5, 3, 6, 4, false),
        ("sort_m64_k8_e32_b32", 64, 8, 32, 32, false),
        ("sort_ep_mask_nlt_m37_k4_e8_b16", 37, 4, 8, 16, true),
    ] {
        let g = |s: &str| golden(&format!("{name}.{s}.bin"));
        let ids = i32s(g("input.topk_ids"));
        let w = f32s(g("input.topk_weights"));
        let mask = ep.then(|| i32s(g("input.expert_mask")));
        let nlt = if ep {
            i32s(g("input.num_local_tokens"))[0] as usize
        } else {
            m
        };
        let s = moe_sorting(
            &Routing {
                topk_ids: &ids,
                topk_weights: &w,
                m,
                topk: k,
                num_experts: e,
                expert_mask: mask.as_deref(),
                num_tokens: nlt,
            },
            bs,
        )
        .unwrap();
        let valid = i32s(g("output.num_valid_ids"));
        assert_eq!(s.num_valid_ids.to_vec(), valid, "{name}");
        let n = valid[0] as usize;
        let want_ids = i32s(g("output.sorted_token_ids"));
        assert_eq!(s.sorted_token_ids.len(), want_ids.len(), "{name}");
        assert_eq!(&s.sorted_token_ids[..n], &want_ids[..n], "{name}");
        let defined = g("aux.sorted_weights_defined");
        let want_w = f32s(g("output.sorted_weights"));
        for j in 0..n {
            if defined[j] == 1 {
                assert_eq!(s.sorted_weights[j], want_w[j], "{name} weight {j}");
            }
        }
        let want_e = i32s(g("output.sorted_expert_ids"));
        assert_eq!(&s.sorted_expert_ids[..n / bs], &want_e[..n / bs], "{name}");
    }
}

#[test]
fn cdna4_scale_images_are_read_per_expert_f3_with_32_row_groups() {
    // The golden swizzle image equals the test's writer, which is what the reader assumes.
    for (name, e, n, k32) in [
        ("cdna4_swz_e2_n64_sk8", 2, 64, 8),
        ("cdna4_swz_e1_n40_sk5_padded", 1, 40, 5),
    ] {
        let src = golden(&format!("{name}.input.scale_checkpoint_ENK.bin"));
        let want = golden(&format!("{name}.output.swizzled_memory_image.bin"));
        let got: Vec<u8> = (0..e)
            .flat_map(|x| shuffle_f3(&src[x * n * k32..(x + 1) * n * k32], n, k32, 32, 0))
            .collect();
        assert_eq!(got, want, "{name}");
    }
}
