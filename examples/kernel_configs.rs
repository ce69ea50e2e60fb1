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

use moeplug::backend::gpu::hip::hiprtc_options;
use moeplug::backend::gpu::kernel_configs::{headers, hip_exclusion, UNITS};
use moeplug::backend::gpu::spec::Family;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
