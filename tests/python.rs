//! Runs the Python package's tests (pytest) against the library this `cargo test` built, so
//! one command runs every test. The interpreter is $MOEPLUG_PYTHON, else ./.venv/bin/python,
//! else python3; it needs numpy, ml_dtypes and pytest, which `scripts/test.sh` installs into
//! ./.venv. Without them this test fails: a suite that cannot run is never reported as passed.
//! With $MOEPLUG_PYTEST_JUNIT set, pytest writes its per-test results there (scripts/test.sh
//! adds them to its total).

mod common;

use std::process::Command;

use common::*;

#[test]
fn python_package_tests() {
    let python = python_interpreter();
    let probe = Command::new(&python)
        .args(["-c", "import numpy, ml_dtypes, pytest"])
        .output();
    if !matches!(&probe, Ok(o) if o.status.success()) {
        panic!(
            "{} cannot import numpy, ml_dtypes and pytest: the Python suite cannot run. \
             scripts/test.sh creates ./.venv with them (or set MOEPLUG_PYTHON).",
            python.display()
        );
    }
    let mut dirs = vec![root().join("python/tests")];
    if root().join("tests/gpu").exists() {
        dirs.push(root().join("tests/gpu"));
    }
    let mut pytest = Command::new(&python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(&dirs)
        .env("MOEPLUG_LIBRARY", library())
        .env("PYTHONPATH", root().join("python"))
        .current_dir(root());
    if let Ok(junit) = std::env::var("MOEPLUG_PYTEST_JUNIT") {
        pytest.arg(format!("--junitxml={junit}"));
    }
    let out = pytest.output().expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest failed:\n{text}");
}
