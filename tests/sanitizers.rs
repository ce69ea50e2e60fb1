//! The C tests (tests/c/abi_test.c: every generic error path; tests/c/moe_run.c: a real
//! fused_moe against a float64 reference) built with AddressSanitizer + UBSan on the C side,
//! and run under valgrind memcheck (which also watches the library's own accesses and leaks).
//! A missing tool skips loudly, and fails when MOEPLUG_REQUIRE_SANITIZERS=1 (as CI sets, after
//! installing valgrind: .ci/run).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const PROGRAMS: [&str; 2] = ["abi_test", "moe_run"];

fn missing(tool: &str, why: &str) {
    if std::env::var("MOEPLUG_REQUIRE_SANITIZERS").as_deref() == Ok("1") {
        panic!("{tool} is required (MOEPLUG_REQUIRE_SANITIZERS=1) but {why}");
    }
    eprintln!("SKIPPED: {tool} is not usable here ({why}); install it (see .ci/run)");
}

fn build(name: &str, dir: &Path, flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    run(Command::new(c_compiler())
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg("-I")
        .arg(include_dir())
        .arg(root().join(format!("tests/c/{name}.c")))
        .args(["-ldl", "-lm"]));
    exe
}

#[test]
fn c_tests_under_address_sanitizer() {
    let dir = scratch("asan");
    let flags = [
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
    ];
    // A toolchain without libasan fails to link even an empty program.
    let probe = dir.join("probe.c");
    std::fs::write(&probe, "int main(void) { return 0; }\n").unwrap();
    let linked = Command::new(c_compiler())
        .args(flags)
        .arg("-o")
        .arg(dir.join("probe"))
        .arg(&probe)
        .output();
    if !matches!(&linked, Ok(o) if o.status.success()) {
        return missing(
            "AddressSanitizer",
            "the C compiler cannot link -fsanitize=address",
        );
    }
    for name in PROGRAMS {
        let exe = build(name, &dir, &flags);
        let out = run(Command::new(&exe)
            .arg(library())
            .env(
                "ASAN_OPTIONS",
                "detect_leaks=1:abort_on_error=0:exitcode=86",
            )
            .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1"));
        assert!(
            out.contains("all checks passed"),
            "{name} under ASan: {out}"
        );
    }
}

#[test]
fn c_tests_under_valgrind() {
    let works = Command::new("valgrind").arg("--version").output();
    if !matches!(&works, Ok(o) if o.status.success()) {
        return missing("valgrind", "`valgrind --version` does not run");
    }
    let dir = scratch("valgrind");
    for name in PROGRAMS {
        let exe = build(name, &dir, &[]);
        let out = run(Command::new("valgrind")
            .args([
                "-q",
                "--error-exitcode=99",
                "--leak-check=full",
                "--errors-for-leak-kinds=definite,indirect",
                "--show-possibly-lost=no",
            ])
            .arg(&exe)
            .arg(library()));
        assert!(
            out.contains("all checks passed"),
            "{name} under valgrind: {out}"
        );
    }
}
