//! Runs the Python package's tests (pytest) against the library this `cargo test` built, so
//! one command runs every test. The interpreter is $MOEPLUG_PYTHON, else ./.venv/bin/python,
//! else python3; it needs numpy, ml_dtypes and pytest (README: setup). Without them the test
//! says so and fails when MOEPLUG_REQUIRE_PYTHON=1 (as CI sets), else it is skipped loudly.

mod common;

use std::process::Command;

use common::*;

#[test]
fn python_package_tests() {
    let python = python_interpreter();
    let probe = Command::new(&python)
        .args(["-c", "import numpy, ml_dtypes, pytest"])
        .output();
    let usable = matches!(&probe, Ok(o) if o.status.success());
    if !usable {
        let why = format!(
            "{} cannot import numpy, ml_dtypes and pytest",
            python.display()
        );
        if std::env::var("MOEPLUG_REQUIRE_PYTHON").as_deref() == Ok("1") {
            panic!("{why} (MOEPLUG_REQUIRE_PYTHON=1)");
        }
        eprintln!("SKIPPED python_package_tests: {why}; see README (setup)");
        return;
    }
    let mut dirs = vec![root().join("python/tests")];
    if root().join("tests/gpu").exists() {
        dirs.push(root().join("tests/gpu"));
    }
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(&dirs)
        .env("MOEPLUG_LIBRARY", library())
        .env("PYTHONPATH", root().join("python"))
        .current_dir(root())
        .output()
        .expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest failed:\n{text}");
}
