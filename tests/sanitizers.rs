//! The C tests (tests/c/abi_test.c: every generic error path; tests/c/moe_run.c: a real
//! fused_moe against a float64 reference; tests/c/fragments.c: prep by primitives, the
//! assembled record and a launch; tests/c/frozen_1_0.c: a program of the 1.0 header) built with
//! AddressSanitizer + UBSan on the C side, and run under valgrind memcheck (which also watches
//! the library's own accesses and leaks).
//! A missing tool skips loudly, and fails when MOEPLUG_REQUIRE_SANITIZERS=1 (as CI sets, after
//! installing valgrind: .ci/run).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// A C test program: its source `tests/c/<name>.c`, the folder of the header it includes, and
/// whether it loads the library by the path given as its argument (dlopen) or is linked
/// against it as an engine links (soname, symbol versions, found through its rpath).
struct Program {
    name: &'static str,
    include: &'static str,
    linked: bool,
}

const PROGRAMS: [Program; 4] = [
    Program {
        name: "abi_test",
        include: "include",
        linked: false,
    },
    Program {
        name: "moe_run",
        include: "include",
        linked: false,
    },
    Program {
        name: "fragments",
        include: "include",
        linked: true,
    },
    Program {
        name: "frozen_1_0",
        include: "tests/c/frozen",
        linked: true,
    },
];

fn missing(tool: &str, why: &str) {
    if std::env::var("MOEPLUG_REQUIRE_SANITIZERS").as_deref() == Ok("1") {
        panic!("{tool} is required (MOEPLUG_REQUIRE_SANITIZERS=1) but {why}");
    }
    eprintln!("SKIPPED: {tool} is not usable here ({why}); install it (see .ci/run)");
}

/// Build `p` in `dir` with `flags`; returns the command that runs it.
fn build(p: &Program, dir: &Path, flags: &[&str]) -> Command {
    let exe = dir.join(p.name);
    let mut cc = Command::new(c_compiler());
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg("-I")
        .arg(root().join(p.include))
        .arg(root().join(format!("tests/c/{}.c", p.name)));
    if p.linked {
        // What an installed library looks like: .so for the linker, .so.1 for the loader.
        for link in ["libmoeplug.so", "libmoeplug.so.1"] {
            if !dir.join(link).exists() {
                std::os::unix::fs::symlink(library(), dir.join(link)).unwrap();
            }
        }
        cc.arg(format!("-L{}", dir.display()))
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lmoeplug");
    }
    run(cc.args(["-ldl", "-lm"]));
    let mut cmd = Command::new(exe);
    if !p.linked {
        cmd.arg(library());
    }
    cmd
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
    for p in &PROGRAMS {
        let out = run(build(p, &dir, &flags)
            .env(
                "ASAN_OPTIONS",
                "detect_leaks=1:abort_on_error=0:exitcode=86",
            )
            .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1"));
        assert!(
            out.contains("all checks passed"),
            "{} under ASan: {out}",
            p.name
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
    for p in &PROGRAMS {
        let program = build(p, &dir, &[]);
        let out = run(Command::new("valgrind")
            .args([
                "-q",
                "--error-exitcode=99",
                "--leak-check=full",
                "--errors-for-leak-kinds=definite,indirect",
                "--show-possibly-lost=no",
            ])
            .arg(program.get_program())
            .args(program.get_args()));
        assert!(
            out.contains("all checks passed"),
            "{} under valgrind: {out}",
            p.name
        );
    }
}
