//! Every kernel configuration the heuristics can select on an arch, for the compile check
//! (`tests/kernel_compile.rs` runs it with NVRTC alone, no GPU): each (family, format, act
//! dtype, weight layout, scale layout, gate mode) the device could run, with the options
//! (activation, biases, router weight on input, mask, fp16 in/out, fnuz) rotated so that
//! every value of each option is compiled in every family.

use super::heuristics::{route_quant1_unsupported, selectable, STREAM_TILE_ROWS};
use super::spec::{Family, KernelSpec, Pdl, StreamPrefetch};
use crate::types::{ActDtype, Activation, GateMode, ScaleLayout, WeightFormat, WeightLayout};

pub fn selectable_specs(sm: u32) -> Vec<KernelSpec> {
    specs_where(|spec| selectable(sm, spec))
}

/// The activations rotated over the configurations (GELU_TANH rides along with GELU).
const ROTATED: [Activation; 3] = [Activation::Silu, Activation::Gelu, Activation::SwigluOai];

/// The same enumeration for any selection rule (the HIP backend's:
/// [`super::kernel_configs::hip_specs`]).
pub fn specs_where(keep: impl Fn(&KernelSpec) -> bool) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    let mut n = 0usize; // rotates the options over candidates
    let mut short_tiles_made = 0usize; // rotates the 64-row TMA variants' kernel
    for family in Family::ALL {
        let mut chosen = 0usize; // rotates the activation over this family's configurations
        for &wf in WeightFormat::ALL {
            let scale_layouts: Vec<Option<ScaleLayout>> = if !wf.scale_layouts().is_empty() {
                wf.scale_layouts().iter().copied().map(Some).collect()
            } else {
                vec![None]
            };
            for &act in wf.allowed_act_dtypes() {
                for &wl in WeightLayout::ALL {
                    for sl in &scale_layouts {
                        for &gm in GateMode::ALL {
                            let fp8 = matches!(
                                wf,
                                WeightFormat::Fp8PerTensor
                                    | WeightFormat::Fp8PerChannel
                                    | WeightFormat::Fp8Block128
                                    | WeightFormat::Mxfp8
                            );
                            let bit = |k: usize| (n >> k) & 1 == 1;
                            // 16-bit activations take the input dtype that matches them.
                            let in_f16 = match act {
                                ActDtype::Fp16 => true,
                                ActDtype::Bf16 => false,
                                _ => bit(4),
                            };
                            let mut spec = KernelSpec {
                                family,
                                weight_format: wf,
                                weight_layout: wl,
                                scale_layout: *sl,
                                gate_mode: gm,
                                activation: ROTATED[chosen % ROTATED.len()],
                                act_dtype: act,
                                stage2_act_dtype: act,
                                in_f16,
                                out_f16: bit(3),
                                has_bias: bit(0),
                                router_weight_on_input: bit(1),
                                has_mask: bit(2),
                                fp8_fnuz: fp8 && bit(5),
                                // every split the heuristics can pick, rotated over stages
                                split_k: [[8, 4, 2, 1][n % 4], [8, 4, 2, 1][(n / 4) % 4]],
                                stream_bm: STREAM_TILE_ROWS[0], // the default; 32 below
                                stream_prefetch: StreamPrefetch::Off, // the default; others below
                                stream_ahead: 1,                // MXFP4 and fp8's; two steps below
                                stream_x_shared: false,         // the default; staged below
                                stream_bias_prefetch: false,    // the default; below
                                pdl: Pdl::Off,                  // sm_90's default below
                                // both tile heights and widths meet every format
                                wgmma_n: [128, 256][chosen % 2],
                                wgmma_bm: [128, 64][(chosen / 2) % 2],
                                wgmma_blocks: [1, 2][(chosen / 4) % 2],
                                wgmma_tma: (chosen / 8) % 2 == 0,
                                wgmma_ws: (chosen / 16) % 2 == 0,
                                wgmma_rs: false,     // the default; the opt-in below
                                wgmma_group: 0, // ungrouped (MOEPLUG_WGMMA_GROUP=0); grouped below
                                wgmma_ksplit: false, // the K-split variant below
                                wgmma_decoders: 0, // the decoding warpgroups below
                                wgmma_pack_copies: false, // the MXFP4 pack copies below
                                wgmma_bulk_packs: false, // the swap-AB bulk copies below
                                // the default where the family has it (heuristics)
                                fused_combine: family.fuses_combine(),
                                fused_quant2: false, // MOEPLUG_FUSED_QUANT2=0; the default below
                                route_quant1: false, // MOEPLUG_ROUTE_QUANT1=0; the default below
                                partials_16: family == Family::Wgmma, // the family's
                            };
                            n += 1;
                            if !keep(&spec) && spec.fused_combine {
                                spec.fused_combine = false; // not on every vendor
                            }
                            if !keep(&spec) && spec.fp8_fnuz {
                                spec.fp8_fnuz = false; // fnuz is not on every family
                            }
                            if !keep(&spec) && spec.wgmma_blocks != 1 {
                                spec.wgmma_blocks = 1; // two blocks do not fit every shape
                            }
                            if !keep(&spec) && spec.wgmma_n != 128 {
                                spec.wgmma_n = 128; // 256 rows do not fit every tile
                            }
                            // MXFP4 fills 128 x 128 blocks only; 64-row TMA tiles come as
                            // their own variant below, so the rotation keeps the 128-row TMA
                            // kernels (the default) it always had.
                            if (!keep(&spec) || spec.wgmma_tma) && spec.wgmma_bm != 128 {
                                spec.wgmma_bm = 128;
                            }
                            if !keep(&spec) && spec.wgmma_tma {
                                spec.wgmma_tma = false; // TMA takes AITER 16x16 weights only
                            }
                            if !keep(&spec) && spec.wgmma_ws {
                                spec.wgmma_ws = false; // the producer starts TMA copies
                            }
                            // programmatic dependent launch where the arch has it (the
                            // stream and wgmma families' default on sm_90)
                            let on = KernelSpec {
                                pdl: Pdl::Early.for_family(family),
                                ..spec.clone()
                            };
                            if matches!(family, Family::Stream | Family::Wgmma) && keep(&on) {
                                spec = on;
                            }
                            if keep(&spec) {
                                // MOEPLUG_FUSED_COMBINE=0 brings back moe_reduce: that variant
                                // of every 16th configuration.
                                let unfused = (spec.fused_combine && chosen % 16 == 0)
                                    .then(|| KernelSpec {
                                        fused_combine: false,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(unfused);
                                // MOEPLUG_STREAM_BM=32 (the stream family's 32-row tiles, an
                                // opt-in): that variant of every other stream configuration.
                                let tall = (family == Family::Stream && chosen % 2 == 1)
                                    .then(|| KernelSpec {
                                        stream_bm: STREAM_TILE_ROWS[1],
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(tall);
                                // Two weight steps in flight per warp (16-bit weights' default
                                // in 16-row tiles; MOEPLUG_STREAM_AHEAD=1 keeps one): that
                                // variant of every stream configuration that takes it.
                                let ahead = (family == Family::Stream && spec.stream_ahead == 1)
                                    .then(|| KernelSpec {
                                        stream_ahead: 2,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(ahead);
                                // The activation ring in shared memory
                                // (MOEPLUG_STREAM_X_SHARED=1): that variant of every stream
                                // configuration that takes it.
                                let staged = (family == Family::Stream)
                                    .then(|| KernelSpec {
                                        stream_x_shared: true,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(staged);
                                // The bias lines asked for before the K walk
                                // (MOEPLUG_STREAM_PREFETCH_BIAS=1): that variant of every
                                // fourth stream configuration with a bias.
                                let bias_lines = (family == Family::Stream && chosen % 4 == 0)
                                    .then(|| KernelSpec {
                                        stream_bias_prefetch: true,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(bias_lines);
                                // MOEPLUG_WGMMA_GROUP (the grouped work order, an opt-in):
                                // that variant of every other wgmma configuration, in groups
                                // of 3 tiles, so that the host emulation's 5-7 tiles make a
                                // full and a partial group (docs/emulation.md).
                                let grouped = (family == Family::Wgmma && chosen % 2 == 1)
                                    .then(|| KernelSpec {
                                        wgmma_group: 3,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(grouped);
                                // 128 x 256 blocks (the default where warp-specialised,
                                // else MOEPLUG_WGMMA_N=256): that variant of every wgmma
                                // configuration that takes it, TMA and warp specialisation
                                // as they are.
                                let wide = (family == Family::Wgmma && spec.wgmma_n == 128)
                                    .then(|| KernelSpec {
                                        wgmma_n: 256,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(wide);
                                // The warp-specialised kernel (TMA weights), the default
                                // wherever it covers a configuration (fp8 block-128 at
                                // M >= 1024 runs it): that variant of every configuration
                                // without it.
                                let specialised = (family == Family::Wgmma && !spec.wgmma_ws)
                                    .then(|| KernelSpec {
                                        wgmma_tma: true,
                                        wgmma_ws: true,
                                        wgmma_bm: 128,
                                        wgmma_blocks: 1,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(specialised);
                                // MXFP4's warp-specialised kernel with two decoding
                                // warpgroups (an opt-in, MOEPLUG_WGMMA_DECODERS=2): that
                                // variant of every configuration with it.
                                let decoders = (family == Family::Wgmma
                                    && spec.wgmma_ws
                                    && spec.weight_format == WeightFormat::Mxfp4)
                                    .then(|| KernelSpec {
                                        wgmma_decoders: 2,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(decoders);
                                // The MXFP4 tile kernel's packs by cp.async (an opt-in,
                                // MOEPLUG_WGMMA_PACK_COPIES=1): that variant of every
                                // configuration with the tile kernel.
                                let pack_copies = (family == Family::Wgmma
                                    && !spec.wgmma_ws
                                    && !spec.wgmma_rs
                                    && spec.weight_format == WeightFormat::Mxfp4)
                                    .then(|| KernelSpec {
                                        wgmma_pack_copies: true,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(pack_copies);
                                // The TMA kernels on 64-row tiles (two TMA boxes a stage, one
                                // per warpgroup's weight rows; the default for fp8 block-128
                                // and for few pairs per expert): that variant of every other
                                // configuration, warp-specialised, every third one per tile.
                                let short_tiles = (family == Family::Wgmma && chosen % 2 == 0)
                                    .then(|| KernelSpec {
                                        wgmma_tma: true,
                                        wgmma_ws: short_tiles_made % 3 != 2,
                                        wgmma_bm: 64,
                                        wgmma_n: 128,
                                        wgmma_blocks: 1,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                short_tiles_made += short_tiles.is_some() as usize;
                                out.extend(short_tiles);
                                // The warpgroups splitting K on 64-row tiles (an opt-in,
                                // MOEPLUG_WGMMA_KSPLIT=1): that variant of every other
                                // configuration.
                                let ksplit = (family == Family::Wgmma && chosen % 2 == 1)
                                    .then(|| KernelSpec {
                                        wgmma_tma: true,
                                        wgmma_ws: true,
                                        wgmma_ksplit: true,
                                        wgmma_bm: 64,
                                        wgmma_n: 128,
                                        wgmma_blocks: 1,
                                        fused_quant2: false,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(ksplit);
                                // The route kernel quantizing stage 1's activations (the
                                // default, MOEPLUG_ROUTE_QUANT1): that variant of every other
                                // configuration it takes.
                                let route_quant1 = (chosen % 2 == 1
                                    && route_quant1_unsupported(&spec).is_none())
                                .then(|| KernelSpec {
                                    route_quant1: true,
                                    ..spec.clone()
                                })
                                .filter(&keep);
                                out.extend(route_quant1);
                                // Stage 2's quantization without moe_quant2 (the default,
                                // MOEPLUG_FUSED_QUANT2) where it applies: the stream
                                // configuration itself; wgmma (fp8 1x128 on 64-row tiles) on
                                // the default warp-specialised kernel and on the cp.async one.
                                let stream_quant2 = (family == Family::Stream)
                                    .then(|| KernelSpec {
                                        fused_quant2: true,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(stream_quant2);
                                for ws in [true, false] {
                                    let quant2 = (family == Family::Wgmma)
                                        .then(|| KernelSpec {
                                            fused_quant2: true,
                                            wgmma_tma: ws,
                                            wgmma_ws: ws,
                                            wgmma_bm: 64,
                                            wgmma_n: 128,
                                            wgmma_blocks: 1,
                                            ..spec.clone()
                                        })
                                        .filter(&keep);
                                    out.extend(quant2);
                                }
                                // MXFP4 weights as the register operand (an opt-in,
                                // MOEPLUG_WGMMA_RS=1) on 128- and 64-row tiles, in the default's
                                // grouped order (groups of 3, as above): those variants of
                                // every configuration they take.
                                for rows in [128, 64] {
                                    let register_weights = (family == Family::Wgmma)
                                        .then(|| KernelSpec {
                                            wgmma_rs: true,
                                            wgmma_ws: false,
                                            wgmma_bm: rows,
                                            wgmma_n: rows,
                                            wgmma_group: 3,
                                            ..spec.clone()
                                        })
                                        .filter(&keep);
                                    out.extend(register_weights);
                                }
                                // MXFP4 on the swap-AB kernel (the default, MOEPLUG_WGMMA_SWAP)
                                // on 64-row tiles, and on 128 for every other configuration:
                                // those variants of every configuration it takes.
                                for rows in [64, 128] {
                                    let swap = (family == Family::Wgmma
                                        && (rows == 64 || chosen % 2 == 0))
                                        .then(|| KernelSpec {
                                            wgmma_rs: true,
                                            wgmma_ws: true,
                                            wgmma_tma: false,
                                            wgmma_bm: rows,
                                            wgmma_n: rows,
                                            wgmma_blocks: 1,
                                            wgmma_decoders: 0,
                                            wgmma_pack_copies: false,
                                            ..spec.clone()
                                        })
                                        .filter(&keep);
                                    // and its packs by bulk copies (an opt-in,
                                    // MOEPLUG_WGMMA_BULK_PACKS=1) where it takes them
                                    let bulk = swap.clone().map(|s| KernelSpec {
                                        wgmma_bulk_packs: true,
                                        ..s
                                    });
                                    out.extend(swap);
                                    out.extend(bulk.filter(&keep));
                                }
                                // MOEPLUG_STREAM_PREFETCH (opt-in) on the other stream
                                // configurations, rotated: one step with K split 2 (the host
                                // emulation's K, 256 / 96, then reaches past the distance in
                                // both stages for 16-bit weights, so a prefetch address that
                                // misses the split shows there, docs/emulation.md), the whole
                                // tile (sm_90 only), four steps (the steps before the loop).
                                let prefetched = (family == Family::Stream && chosen % 2 == 0)
                                    .then(|| {
                                        let mut s = spec.clone();
                                        match (chosen / 2) % 3 {
                                            0 => {
                                                s.stream_prefetch = StreamPrefetch::Steps(1);
                                                s.split_k = [2, 2];
                                            }
                                            1 => s.stream_prefetch = StreamPrefetch::Tile,
                                            _ => s.stream_prefetch = StreamPrefetch::Steps(4),
                                        }
                                        s
                                    })
                                    .filter(&keep);
                                out.extend(prefetched);
                                // MOEPLUG_PDL=0 (sm_90's plain launches) and =wait (every
                                // kernel waits first): each on every fourth configuration.
                                let other_pdl = match chosen % 4 {
                                    3 => Some(Pdl::Off),
                                    1 => Some(Pdl::Wait),
                                    _ => None,
                                };
                                let other = other_pdl
                                    .filter(|&pdl| spec.pdl.on() && pdl != spec.pdl)
                                    .map(|pdl| KernelSpec {
                                        pdl,
                                        ..spec.clone()
                                    })
                                    .filter(&keep);
                                out.extend(other);
                                // GELU_TANH differs from GELU in the epilogue's one call:
                                // it is compiled wherever GELU is.
                                let tanh =
                                    (spec.activation == Activation::Gelu).then(|| KernelSpec {
                                        activation: Activation::GeluTanh,
                                        ..spec.clone()
                                    });
                                // NONE (a non-gated stage 1, SEPARATED records only) on every
                                // other configuration where SILU meets SEPARATED (on every
                                // SEPARATED one of the stream family's few), and a separate
                                // stage-2 act dtype on every fourth (it changes one cast of the
                                // stage-1 epilogue): a third more compiles in all.
                                let none = (gm == GateMode::Separated
                                    && (family == Family::Stream
                                        || spec.activation == Activation::Silu && chosen % 2 == 0))
                                    .then(|| KernelSpec {
                                        activation: Activation::NoActivation,
                                        ..spec.clone()
                                    });
                                let stage2 = stage2_variant(&spec, n).filter(|_| chosen % 4 == 0);
                                out.push(spec);
                                out.extend(tanh);
                                out.extend(none.into_iter().chain(stage2).filter(&keep));
                                chosen += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The stage-1 module of a launch whose stage-2 act dtype differs from `spec`'s, where that
/// compiles other code than `spec` (the intermediate stored in the other 16-bit type: the
/// stage-2 module is a configuration of one act dtype, enumerated as such), or None. `n`
/// rotates the choice among the weight format's act dtypes that do so.
fn stage2_variant(spec: &KernelSpec, n: usize) -> Option<KernelSpec> {
    let others: Vec<KernelSpec> = spec
        .weight_format
        .allowed_act_dtypes()
        .iter()
        .map(|&a| KernelSpec {
            stage2_act_dtype: a,
            ..spec.clone()
        })
        .filter(|v| v.separate_stage2() && v.inter_f16() != spec.inter_f16())
        .collect();
    (!others.is_empty()).then(|| others[n % others.len()].clone())
}

/// Registers, spill bytes and shared memory per kernel from a `--ptxas-options=-v` log.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelUsage {
    pub name: String,
    pub registers: u32,
    pub spill_bytes: u32,
    pub stack_bytes: u32,
}

/// Parse ptxas' report: "Compiling entry function 'moe_stage1' for 'sm_90'", then
/// "N bytes stack frame, N bytes spill stores, N bytes spill loads" and "Used N registers".
pub fn parse_ptxas_log(log: &str) -> Vec<KernelUsage> {
    let num_before = |line: &str, word: &str| -> u32 {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == ',')
            .collect();
        words
            .iter()
            .position(|w| *w == word)
            .and_then(|i| words[..i].iter().rev().find_map(|w| w.parse().ok()))
            .unwrap_or(0)
    };
    let mut out: Vec<KernelUsage> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(KernelUsage {
                name,
                ..Default::default()
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("spill stores") {
                k.stack_bytes = num_before(line, "stack");
                k.spill_bytes = num_before(line, "stores") + num_before(line, "loads");
            } else if line.contains("Used") && line.contains("registers") {
                k.registers = num_before(line, "registers");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_and_format_is_covered() {
        let specs = selectable_specs(90);
        for f in [Family::Tile32, Family::Stream] {
            assert!(specs.iter().any(|s| s.family == f), "{f:?}");
        }
        assert!(
            !specs
                .iter()
                .any(|s| matches!(s.family, Family::Fp32 | Family::Mfma)
                    && !s.weight_format.is_int4())
        );
        for &wf in WeightFormat::ALL {
            // int4 is decoded by the fp32 family only (heuristics::choose).
            let family = if wf.is_int4() {
                Family::Fp32
            } else {
                Family::Tile32
            };
            assert!(specs
                .iter()
                .any(|s| s.family == family && s.weight_format == wf));
        }
        // Each option value appears in each family.
        for f in [Family::Tile32, Family::Stream] {
            let fam: Vec<&KernelSpec> = specs.iter().filter(|s| s.family == f).collect();
            for v in [false, true] {
                assert!(fam.iter().any(|s| s.has_bias == v), "{f:?} bias {v}");
                assert!(fam.iter().any(|s| s.has_mask == v), "{f:?} mask {v}");
                assert!(
                    fam.iter().any(|s| s.router_weight_on_input == v),
                    "{f:?} rwoi {v}"
                );
                assert!(fam.iter().any(|s| s.out_f16 == v), "{f:?} out {v}");
            }
            for &a in super::super::GPU_ACTIVATIONS {
                assert!(fam.iter().any(|s| s.activation == a), "{f:?} {a:?}");
            }
        }
        // No fp8 MMA before sm_89; only the fp32 family before sm_80.
        assert!(!selectable_specs(80)
            .iter()
            .any(|s| s.family == Family::Stream && s.weight_format == WeightFormat::Fp8Block128));
        assert!(selectable_specs(75)
            .iter()
            .all(|s| s.family == Family::Fp32));
    }

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : Compiling entry function 'moe_stage1' for 'sm_90'\n\
                   ptxas info    : Function properties for moe_stage1\n\
                   \x20   16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 128 registers, used 1 barriers, 35968 bytes smem\n\
                   ptxas info    : Compiling entry function 'moe_reduce' for 'sm_90'\n\
                   \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 18 registers\n";
        let k = parse_ptxas_log(log);
        assert_eq!(k.len(), 2);
        assert_eq!(
            k[0],
            KernelUsage {
                name: "moe_stage1".into(),
                registers: 128,
                spill_bytes: 12,
                stack_bytes: 16
            }
        );
        assert_eq!((k[1].registers, k[1].spill_bytes), (18, 0));
    }
}
