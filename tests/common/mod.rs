//! Helpers shared by the integration tests: where the built library is, running tools.
#![allow(dead_code, unused_imports)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

/// Repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The profile folder the test binary runs from (target/<profile>), where cargo puts
/// libmoeplug.so.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf() // .../deps/<test> -> ...
}

/// The shared library built for this test run. `cargo test` builds it in deps/ and does not
/// always refresh the copy in the profile folder, so deps/ comes first.
pub fn library() -> PathBuf {
    let fresh = profile_dir().join("deps/libmoeplug.so");
    let lib = if fresh.exists() {
        fresh
    } else {
        profile_dir().join("libmoeplug.so")
    };
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

/// A scratch folder for this test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = profile_dir().join("test-scratch").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Run a command; panic with its output unless it succeeds. Returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

pub fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

pub fn cxx_compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

/// The Python the tests use: $MOEPLUG_PYTHON, else ./.venv/bin/python (scripts/test.sh makes
/// it), else python3.
pub fn python_interpreter() -> PathBuf {
    if let Ok(p) = std::env::var("MOEPLUG_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = root().join(".venv/bin/python");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

pub fn include_dir() -> PathBuf {
    root().join("include")
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

mod prep_helpers;
#[allow(unused_imports)]
pub use prep_helpers::*;

mod moe_helpers;
#[allow(unused_imports)]
pub use moe_helpers::*;

/// Deterministic test randomness without a dependency (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn next(&mut self) -> u64 {
        self.next_u64()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in ±[0.1, 1)·scale: never zero.
    pub fn nonzero(&mut self, scale: f64) -> f64 {
        let v = self.uniform(0.1, 1.0) * scale;
        if self.next_u64() & 1 == 0 {
            v
        } else {
            -v
        }
    }
    pub fn pick<C: Copy>(&mut self, items: &[C]) -> C {
        items[self.below(items.len())]
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}
