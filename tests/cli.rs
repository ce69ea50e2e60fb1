//! The `moeplug` command: the README's main job (`demo`) and `info` run and say what they did.

use std::process::Command;

/// (exit code, stdout, stderr) of `moeplug ARGS`.
fn moeplug_with(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moeplug"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn moeplug(arg: &str) -> (bool, String) {
    let (code, stdout, stderr) = moeplug_with(&[arg]);
    (code == 0, format!("{stdout}{stderr}"))
}

#[test]
fn demo_prepares_runs_and_matches_float64() {
    let (ok, text) = moeplug("demo");
    assert!(ok, "{text}");
    assert!(text.contains(" on cpu ("), "{text}");
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
    let (code, stdout, stderr) = moeplug_with(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.starts_with("moeplug: unknown command 'frobnicate'\n\nusage: moeplug "),
        "{stderr}"
    );
}

#[test]
fn version_names_the_crate_version_and_abi() {
    let (code, stdout, _) = moeplug_with(&["--version"]);
    assert_eq!(code, 0);
    assert!(
        stdout.starts_with(&format!("moeplug {} (", env!("CARGO_PKG_VERSION")))
            && stdout.trim_end().ends_with("abi 1.1)"),
        "{stdout}"
    );
}

#[test]
fn every_command_has_help_that_does_not_run_it() {
    for (args, first) in [
        (
            &["--help"][..],
            "usage: moeplug [--version] [--help] <command>",
        ),
        (
            &["help"][..],
            "usage: moeplug [--version] [--help] <command>",
        ),
        (&["info", "--help"][..], "usage: moeplug info\n"),
        (&["help", "info"][..], "usage: moeplug info\n"),
        (
            &["demo", "--help"][..],
            "usage: moeplug demo [--device DEVICE]",
        ),
        (&["demo", "-h"][..], "usage: moeplug demo [--device DEVICE]"),
        (
            &["demo", "--device", "cuda:0", "--help"][..],
            "usage: moeplug demo",
        ),
    ] {
        let (code, stdout, stderr) = moeplug_with(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(stdout.starts_with(first), "{args:?}:\n{stdout}");
        assert!(!stdout.contains("relative L2"), "{args:?} ran the demo");
    }
}

#[test]
fn unknown_arguments_are_rejected_with_the_command_usage() {
    for (args, message, usage) in [
        (
            &["demo", "--fast"][..],
            "demo: unknown argument '--fast'",
            "usage: moeplug demo",
        ),
        (
            &["demo", "extra"][..],
            "demo: unknown argument 'extra'",
            "usage: moeplug demo",
        ),
        (
            &["demo", "--device"][..],
            "demo: --device needs a value",
            "usage: moeplug demo",
        ),
        (
            &["demo", "--device", "tpu:0"][..],
            "demo: device 'tpu:0': expected cpu, cuda:N or rocm:N",
            "usage: moeplug demo",
        ),
        (
            &["info", "--all"][..],
            "info: unknown argument '--all'",
            "usage: moeplug info",
        ),
        (
            &["--verbose"][..],
            "unknown option '--verbose'",
            "usage: moeplug [--version]",
        ),
        (&[][..], "no command given", "usage: moeplug [--version]"),
    ] {
        let (code, stdout, stderr) = moeplug_with(args);
        assert_eq!(code, 2, "{args:?}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(
            stderr.starts_with(&format!("moeplug: {message}\n\n{usage}")),
            "{args:?}:\n{stderr}"
        );
    }
}

/// On a GPU machine the demo runs there; elsewhere it fails at once with the library's
/// status and reason (never a silent fall-back to the CPU).
#[test]
fn demo_on_cuda_runs_there_or_says_why_not() {
    let (code, stdout, stderr) = moeplug_with(&["demo", "--device", "cuda:0"]);
    if code == 0 {
        assert!(stdout.contains(" on cuda:0 ("), "{stdout}");
        assert!(stdout.trim_end().ends_with("-> OK"), "{stdout}");
    } else {
        assert_eq!(code, 1, "{stdout}{stderr}");
        assert!(
            stderr.starts_with("moeplug demo: cuda:0: MOEPLUG_BACKEND_UNAVAILABLE: "),
            "{stderr}"
        );
        assert!(!stdout.contains("fused_moe"), "{stdout}");
    }
}

#[test]
fn demo_on_rocm_says_why_not() {
    let (code, _, stderr) = moeplug_with(&["demo", "--device=rocm:0"]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("moeplug demo: rocm:0: MOEPLUG_BACKEND_UNAVAILABLE: "),
        "{stderr}"
    );
}
