//! Runs the Python package's tests (pytest) against the library this `cargo test` built, so
//! one command runs every test. The interpreter is $MOEPLUG_PYTHON, else ./.venv/bin/python,
//! else python3; it needs numpy, ml_dtypes and pytest, which `scripts/test.sh` installs into
//! ./.venv. Without them this test fails: a suite that cannot run is never reported as passed.
//! With $MOEPLUG_PYTEST_JUNIT set, pytest writes its per-test results there (scripts/test.sh
//! adds them to its total).

mod common;

use std::path::PathBuf;
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

/// The interpreter for the expert-parallel example (examples/ep), which needs torch with
/// gloo: $MOEPLUG_TORCH_PYTHON, else the first of the one above and Debian's python3 (with
/// python3-torch, as .ci/run installs it) that imports torch, torch.distributed's gloo and
/// numpy.
fn torch_interpreter() -> Result<PathBuf, String> {
    let probe = "import numpy, torch, torch.distributed as d; assert d.is_gloo_available()";
    let candidates = match std::env::var("MOEPLUG_TORCH_PYTHON") {
        Ok(p) => vec![PathBuf::from(p)],
        Err(_) => vec![python_interpreter(), PathBuf::from("/usr/bin/python3")],
    };
    for python in &candidates {
        let ok = Command::new(python).args(["-c", probe]).output();
        if matches!(&ok, Ok(o) if o.status.success()) {
            return Ok(python.clone());
        }
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "none of {} imports torch with gloo and numpy (Debian: apt-get install \
         --no-install-recommends python3-torch)",
        tried.join(", ")
    ))
}

fn run_ep(python: &PathBuf, args: &[&str]) -> (bool, String) {
    let out = Command::new(python)
        .arg(root().join("examples/ep/run.py"))
        .args(["--backend", "gloo"])
        .args(args)
        .env("MOEPLUG_LIBRARY", library())
        .env("PYTHONPATH", root().join("python"))
        .current_dir(root())
        .output()
        .expect("run examples/ep/run.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Expert parallelism through torch.distributed (gloo, CPU tensors, moeplug's CPU backend) on
/// 2, 3 (uneven expert split) and 4 processes (with the timing table): every EP output matches the single-process
/// run of the whole layer (examples/ep/run.py says what is compared). A deliberately wrong
/// expert mask must fail the same check.
#[test]
fn expert_parallel_example_on_gloo() {
    let python = match torch_interpreter() {
        Ok(p) => p,
        Err(why) => {
            if std::env::var("MOEPLUG_REQUIRE_PYTHON").as_deref() == Ok("1") {
                panic!("{why} (MOEPLUG_REQUIRE_PYTHON=1)");
            }
            eprintln!("SKIPPED expert_parallel_example_on_gloo: {why}");
            return;
        }
    };
    for world in ["2", "3", "4"] {
        let mut args = vec!["--world", world];
        if world == "4" {
            // The timing path the GPU run uses (timer, per-rank table), on even batches.
            args.extend(["--bench", "--iters", "2", "--warmup", "1"]);
        }
        let (ok, text) = run_ep(&python, &args);
        println!("{text}");
        assert!(ok, "EP on {world} ranks failed:\n{text}");
        // 2 layers × 2 dispatch paths.
        let passed = text.lines().filter(|l| l.starts_with("PASS ")).count();
        assert_eq!(passed, 4, "{text}");
        assert!(
            text.contains(&format!("ep: every check matched (R={world}")),
            "{text}"
        );
        if world == "4" {
            let rows = text
                .lines()
                .filter(|l| l.starts_with("| gpt-oss-like ") || l.starts_with("| deepseek-like "))
                .count();
            assert_eq!(
                rows,
                2 * 2 * 4,
                "one timing row per layer, path and rank:\n{text}"
            );
        }
    }
    let (ok, text) = run_ep(
        &python,
        &[
            "--world",
            "2",
            "--only",
            "gpt-oss-like",
            "--path",
            "a2a",
            "--fault",
            "shifted-mask",
        ],
    );
    assert!(
        !ok && text.contains("FAIL gpt-oss-like"),
        "the shifted mask was not caught:\n{text}"
    );
}
