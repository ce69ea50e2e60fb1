//! Prints every kernel configuration the HIP backend can select, with the exact hipRTC
//! options it would compile it with, for `scripts/hip_compile_check.sh`:
//!
//!   compile <TAB> family <TAB> kernels/<stem>.cu <TAB> arch <TAB> option option ...
//!   exclude <TAB> family <TAB> reason
//!
//! usage: cargo run --release --example kernel_configs -- gfx942 gfx950

use moeplug::backend::gpu::kernel_configs::{rtc_options, HipSupport, FAMILIES};
use moeplug::backend::gpu::Vendor;

fn main() {
    let archs: Vec<String> = std::env::args().skip(1).collect();
    if archs.is_empty() {
        eprintln!("usage: kernel_configs ARCH... (e.g. gfx942 gfx950)");
        std::process::exit(2);
    }
    for family in FAMILIES {
        if let HipSupport::Excluded(why) = family.hip {
            println!("exclude\t{}\t{why}", family.name);
            continue;
        }
        for arch in &archs {
            for defines in (family.configs)() {
                let options = rtc_options(Vendor::Hip, arch, &defines);
                println!(
                    "compile\t{}\tkernels/{}.cu\t{arch}\t{}",
                    family.name,
                    family.stem,
                    options.join(" ")
                );
            }
        }
    }
}
