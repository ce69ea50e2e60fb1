//! The `moeplug` command: the README's main job (`demo`) and `info` run and say what they did.

use std::process::Command;

fn moeplug(arg: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moeplug"))
        .arg(arg)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn demo_prepares_runs_and_matches_float64() {
    let (ok, text) = moeplug("demo");
    assert!(ok, "{text}");
    for step in [
        "quantize_mx",
        "prepare_moe",
        "fused_moe",
        "relative L2 error vs float64",
    ] {
        assert!(text.contains(step), "demo output lacks {step}:\n{text}");
    }
    assert!(
        text.contains("hidden 704->768"),
        "the demo must exercise padding:\n{text}"
    );
    assert!(text.trim_end().ends_with("-> OK"), "{text}");
}

#[test]
fn info_lists_every_backend() {
    let (ok, text) = moeplug("info");
    assert!(ok, "{text}");
    for device in ["cpu", "cuda:0", "rocm:0", "kernel cache"] {
        assert!(text.contains(device), "info lacks {device}:\n{text}");
    }
    assert!(text.contains("mxfp4"), "the CPU runs MXFP4:\n{text}");
}

#[test]
fn unknown_command_is_an_error() {
    let (ok, text) = moeplug("frobnicate");
    assert!(!ok);
    assert!(text.contains("unknown command 'frobnicate'"), "{text}");
}
