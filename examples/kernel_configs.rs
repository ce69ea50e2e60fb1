//! Writes every translation unit the HIP backend compiles (exactly as it hands them to
//! hipRTC, with the headers) into DIR and prints every configuration it can select, with the
//! exact hipRTC options, for `scripts/hip_compile_check.sh`:
//!
//!   compile <TAB> what <TAB> DIR/<unit> <TAB> arch <TAB> mfma <TAB> option option ...
//!
//! where `mfma` is the matrix-core instruction both GEMM kernels must contain, or `-`.
//!   exclude <TAB> family <TAB> reason
//!
//! usage: cargo run --release --example kernel_configs -- DIR gfx942 gfx950
//!
//! With `--emulate` first (for `scripts/emulate_check.sh cuda`), the sources are written the
//! same way and every CUDA configuration of the mma.sync families (`tile32`, `stream`) and of
//! `wgmma` (sm_90; as its cp.async kernel: WG_TMA=0, WG_WS=0) the heuristics can select on
//! each arch (with moe_reduce, the default, in place of the opt-in fused combine) is printed
//! with its fp32-family twin (same options, FAMILY_FP32), each with the grid facts the host
//! emulator launches by:
//!
//!   emulate <TAB> arch <TAB> family <TAB> defines... <TAB> fp32 twin defines...
//!
//! usage: cargo run --release --example kernel_configs -- --emulate DIR sm_80 sm_89 sm_90

use moeplug::backend::gpu::compile_check::selectable_specs;
use moeplug::backend::gpu::heuristics::selectable;
use moeplug::backend::gpu::hip::hiprtc_options;
use moeplug::backend::gpu::kernel_configs::{headers, hip_exclusion, UNITS};
use moeplug::backend::gpu::spec::{Family, KernelSpec};
use moeplug::backend::gpu::tma::{geometry, stage_weights, StageShapes};

/// A spec's defines plus what the emulator's launches need from the host: the columns one
/// block of stage 1 / stage 2 covers, the GEMM block's threads and dynamic shared memory
/// (src/backend/gpu/mod.rs), and `EMU_WG_SHAPES` (the larger problem of the wgmma family,
/// for the family and its twin alike: `wg_shapes`).
fn emulated_defines(spec: &KernelSpec, wg_shapes: bool) -> String {
    let (n1, n2) = spec.block_columns();
    let mut d: Vec<String> = spec.defines().iter().map(|d| format!("-D{d}")).collect();
    d.push(format!("-DEMU_N1={n1}"));
    d.push(format!("-DEMU_N2={n2}"));
    d.push(format!("-DEMU_THREADS={}", spec.gemm_threads()));
    d.push(format!("-DEMU_DYN_SHARED={}", spec.dynamic_shared_bytes()));
    d.push(format!("-DEMU_WG_SHAPES={}", wg_shapes as i32));
    if spec.family == Family::Wgmma && spec.wgmma_tma {
        for (i, g) in emulated_tma_geometry(spec).iter().enumerate() {
            d.push(format!("-DEMU_TMA{}={g}", i + 1));
        }
    }
    d.join(" ")
}

/// The emulator's problem under `EMU_WG_SHAPES` (scripts/emu/emulate_fused_moe.cpp, which
/// checks that the geometry below is of its shapes): hidden_size, hidden_padded,
/// intermediate_size, intermediate_padded, and the experts with and without the expert mask.
const EMU_WG_PROBLEM: [usize; 6] = [512, 512, 224, 256, 3, 4];

/// The tensor-map parameters (tma.rs `geometry`: globalDim, globalStrides, boxDim) of the
/// emulated problem's w13 and w2, as the launch describes them (launch::tma_weights), each as a
/// comma list for `-DEMU_TMA1` / `-DEMU_TMA2`.
fn emulated_tma_geometry(spec: &KernelSpec) -> [String; 2] {
    let [h, hp, i, ip, masked, all] = EMU_WG_PROBLEM;
    let shapes = StageShapes {
        experts: if spec.has_mask { masked } else { all },
        hidden: h,
        hidden_padded: hp,
        intermediate: i,
        intermediate_padded: ip,
        elem_bytes: if spec.act_dtype.is_quantized() { 1 } else { 2 },
        gate_mode: spec.gate_mode,
    };
    stage_weights(&shapes, [0, 0], spec.wgmma_box_rows()).map(|w| {
        let (dims, strides, boxes) = geometry(&w).expect("tensor map of the emulated problem");
        let all: Vec<String> = (dims.iter().chain(&strides).map(|v| v.to_string()))
            .chain(boxes.iter().map(|v| v.to_string()))
            .collect();
        all.join(",")
    })
}

/// The wgmma family's block shapes: (sorted rows per tile, weight rows per warpgroup MMA,
/// blocks per SM); (64, 64, 1): MXFP4 register-operand weights on 64-row tiles.
const WG_SHAPES: [(u32, u32, u32); 7] = [
    (128, 128, 1),
    (128, 128, 2),
    (128, 256, 1),
    (128, 256, 2),
    (64, 128, 1),
    (64, 256, 1),
    (64, 64, 1),
];

/// The CUDA configurations of the mma.sync families and of the wgmma family's cp.async
/// kernel (sm_90), with their fp32 twins.
fn print_emulated(archs: &[String]) {
    for arch in archs {
        let Some(sm) = arch.strip_prefix("sm_").and_then(|s| s.parse::<u32>().ok()) else {
            eprintln!("kernel_configs --emulate: {arch} is not a CUDA arch (sm_NN)");
            std::process::exit(2);
        };
        for spec in selectable_specs(sm) {
            if !matches!(spec.family, Family::Tile32 | Family::Stream | Family::Wgmma) {
                continue;
            }
            // The default launch path (the fused combine is opt-in, MOEPLUG_FUSED_COMBINE=1,
            // and its arrival counters are not emulated).
            let spec = KernelSpec {
                fused_combine: false,
                ..spec
            };
            let wg = spec.family == Family::Wgmma;
            // Wgmma with TMA weight tiles or warp specialisation (MXFP4's without TMA), as
            // listed.
            let listed = (wg && (spec.wgmma_tma || spec.wgmma_ws)).then(|| spec.clone());
            // Wgmma: the cp.async kernel, weight tiles without TMA and without warp
            // specialisation (the launch's fallback where the driver has no tensor-map encoder).
            let spec = KernelSpec {
                wgmma_tma: false,
                wgmma_ws: false,
                ..spec
            };
            // Wgmma: each block shape the heuristics can select for this configuration (the
            // list's rotation of them is undone by the TMA options it also rotates).
            let shapes: Vec<KernelSpec> = if wg {
                WG_SHAPES
                    .iter()
                    .map(|&(bm, n, blocks)| KernelSpec {
                        wgmma_bm: bm,
                        wgmma_n: n,
                        wgmma_blocks: blocks,
                        ..spec.clone()
                    })
                    .filter(|s| selectable(sm, s))
                    .collect()
            } else {
                vec![spec]
            };
            for spec in shapes.into_iter().chain(listed) {
                // The twin quantizes with moe_quant1 / moe_quant2, so a family's folded
                // quantizations are checked against the kernels they replace.
                let twin = KernelSpec {
                    family: Family::Fp32,
                    route_quant1: false,
                    fused_quant2: false,
                    ..spec.clone()
                };
                println!(
                    "emulate\t{arch}\t{}\t{}\t{}",
                    spec.family.name(),
                    emulated_defines(&spec, wg),
                    emulated_defines(&twin, wg)
                );
            }
        }
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let emulate = args.first().is_some_and(|a| a == "--emulate");
    if emulate {
        args.remove(0);
    }
    let Some((dir, archs)) = args.split_first().filter(|(_, a)| !a.is_empty()) else {
        eprintln!("usage: kernel_configs DIR ARCH... (e.g. /tmp/k gfx942 gfx950)");
        std::process::exit(2);
    };
    let dir = std::path::Path::new(dir);
    let write = |name: &str, text: &str| {
        if let Err(e) =
            std::fs::create_dir_all(dir).and_then(|_| std::fs::write(dir.join(name), text))
        {
            eprintln!(
                "kernel_configs: cannot write {}: {e}",
                dir.join(name).display()
            );
            std::process::exit(1);
        }
    };
    for (name, text) in headers() {
        write(name, text);
    }
    if emulate {
        for unit in UNITS {
            write(unit.file, &(unit.source)());
        }
        print_emulated(archs);
        return;
    }
    for unit in UNITS {
        write(unit.file, &(unit.source)());
        let path = dir.join(unit.file);
        for arch in archs {
            for c in (unit.configs)(arch) {
                let options = hiprtc_options(arch, &c.defines).join(" ");
                println!(
                    "compile\t{}\t{}\t{arch}\t{}\t{options}",
                    c.what,
                    path.display(),
                    c.mfma.unwrap_or("-")
                );
            }
        }
    }
    for f in Family::ALL {
        if let Some(why) = hip_exclusion(f) {
            println!("exclude\tfused_moe {}\t{why}", f.name());
        }
    }
}
