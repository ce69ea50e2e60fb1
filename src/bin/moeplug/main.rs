//! The `moeplug` command: `info` (version, ABI, what every backend here can run) and `demo`
//! (a gpt-oss-like layer prepared and run end to end on a chosen device, checked against
//! float64); `--help` for each, `--version`.

mod cli;
mod cuda;
mod demo;

use std::process::ExitCode;

use moeplug::backend::{self, Caps};
use moeplug::tensor::DeviceKind;
use moeplug::types::{
    feature, ActDtype, Activation, GateMode, ScaleLayout, WeightFormat, WeightLayout,
};

use cli::Cli;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cli::parse(&args) {
        Ok(Cli::Help(usage)) => {
            print!("{usage}");
            ExitCode::SUCCESS
        }
        Ok(Cli::Version) => {
            println!("moeplug {}", moeplug::version());
            ExitCode::SUCCESS
        }
        Ok(Cli::Info) => {
            info();
            ExitCode::SUCCESS
        }
        Ok(Cli::Demo(device)) => match demo::run(device) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("moeplug demo: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprint!("moeplug: {}\n\n{}", e.message, e.usage);
            ExitCode::from(2)
        }
    }
}

fn labels<T: Copy>(all: Vec<T>, label: fn(T) -> &'static str) -> String {
    if all.is_empty() {
        "-".to_string()
    } else {
        all.into_iter().map(label).collect::<Vec<_>>().join(", ")
    }
}

fn features(mask: u32) -> String {
    let names: Vec<&str> = feature::NAMES
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        "-".to_string()
    } else {
        names.join(", ")
    }
}

fn print_caps(device: &str, caps: &Caps) {
    let rows = [
        (
            "backend",
            caps.backend.map(|b| b.label()).unwrap_or("?").to_string(),
        ),
        ("arch", caps.arch.clone()),
        ("runtime", caps.runtime_version.clone()),
        (
            "weight formats",
            labels(
                WeightFormat::from_mask(caps.weight_formats),
                WeightFormat::label,
            ),
        ),
        (
            "act dtypes",
            labels(ActDtype::from_mask(caps.act_dtypes), ActDtype::label),
        ),
        (
            "gate modes",
            labels(GateMode::from_mask(caps.gate_modes), GateMode::label),
        ),
        (
            "activations",
            labels(Activation::from_mask(caps.activations), Activation::label),
        ),
        (
            "weight layouts",
            labels(
                WeightLayout::from_mask(caps.weight_layouts),
                WeightLayout::label,
            ),
        ),
        (
            "scale layouts",
            labels(
                ScaleLayout::from_mask(caps.scale_layouts),
                ScaleLayout::label,
            ),
        ),
        ("features", features(caps.features)),
    ];
    println!("{device}");
    for (k, v) in rows {
        println!("  {k:<15} {v}");
    }
    if caps.weight_formats == 0 {
        println!(
            "  {:<15} fused_moe is not available on this backend yet",
            "note"
        );
    }
}

fn info() {
    println!("moeplug {}", moeplug::version());
    let abi = moeplug::capi::moeplug_abi_version();
    let (major, minor) = (abi >> 16, abi & 0xFFFF);
    println!(
        "ABI     {major}.{minor} (symbols @@MOEPLUG_1.0 to @@MOEPLUG_{major}.{minor}, soname libmoeplug.so.{major})"
    );
    println!();
    let devices = [
        ("cpu", DeviceKind::Cpu),
        ("cuda:0", DeviceKind::Cuda),
        ("rocm:0", DeviceKind::Rocm),
    ];
    for (name, kind) in devices {
        match backend::for_device(kind, 0) {
            Ok(b) => print_caps(name, &b.caps()),
            Err(e) => println!("{name}\n  {:<15} unavailable: {}", "backend", e.message),
        }
        println!();
    }
    println!("GPU kernels (compiled at run time, cached on disk)");
    for line in backend::gpu::describe().lines() {
        println!("  {line}");
    }
}
