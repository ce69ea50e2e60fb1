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
//! same way and every CUDA configuration of the mma.sync families (`tile32`, `stream`) the
//! heuristics can select on each arch (with moe_reduce, the default, in place of the opt-in
//! fused combine) is printed with its fp32-family twin (same options,
//! FAMILY_FP32), each with the grid facts the host emulator launches by:
//!
//!   emulate <TAB> arch <TAB> family <TAB> defines... <TAB> fp32 twin defines...
//!
//! usage: cargo run --release --example kernel_configs -- --emulate DIR sm_80 sm_89 sm_90

use moeplug::backend::gpu::compile_check::selectable_specs;
use moeplug::backend::gpu::hip::hiprtc_options;
use moeplug::backend::gpu::kernel_configs::{headers, hip_exclusion, UNITS};
use moeplug::backend::gpu::spec::{Family, KernelSpec};

/// A spec's defines plus what the emulator's launches need from the host: the columns one
/// block of stage 1 / stage 2 covers and the GEMM block's threads (src/backend/gpu/mod.rs).
fn emulated_defines(spec: &KernelSpec) -> String {
    let (n1, n2) = spec.block_columns();
    let mut d: Vec<String> = spec.defines().iter().map(|d| format!("-D{d}")).collect();
    d.push(format!("-DEMU_N1={n1}"));
    d.push(format!("-DEMU_N2={n2}"));
    d.push(format!("-DEMU_THREADS={}", spec.gemm_threads()));
    d.join(" ")
}

/// The CUDA configurations of the mma.sync families, with their fp32 twins.
fn print_emulated(archs: &[String]) {
    for arch in archs {
        let Some(sm) = arch.strip_prefix("sm_").and_then(|s| s.parse::<u32>().ok()) else {
            eprintln!("kernel_configs --emulate: {arch} is not a CUDA arch (sm_NN)");
            std::process::exit(2);
        };
        for spec in selectable_specs(sm) {
            if !matches!(spec.family, Family::Tile32 | Family::Stream) {
                continue;
            }
            // The default launch path (the fused combine is opt-in, MOEPLUG_FUSED_COMBINE=1,
            // and its arrival counters are not emulated).
            let spec = KernelSpec {
                fused_combine: false,
                ..spec
            };
            let twin = KernelSpec {
                family: Family::Fp32,
                ..spec.clone()
            };
            println!(
                "emulate\t{arch}\t{}\t{}\t{}",
                spec.family.name(),
                emulated_defines(&spec),
                emulated_defines(&twin)
            );
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
