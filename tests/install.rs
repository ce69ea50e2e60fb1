//! The install layout as a C/C++ user meets it: `scripts/install.sh --prefix P` lays out the
//! library with its soname links, the header, pkg-config and CMake files; the README's C
//! example builds with `pkg-config --cflags --libs moeplug` and with CMake's
//! `find_package(moeplug)`, and runs with only the prefix's lib folder on the search path.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Install the library this test run built into a fresh prefix.
fn install(name: &str) -> PathBuf {
    let prefix = scratch(name).join("prefix");
    let out = run(Command::new("bash")
        .arg(root().join("scripts/install.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .arg("--library")
        .arg(library()));
    assert!(out.contains("installed moeplug"), "{out}");
    prefix
}

fn readme_c_example(dir: &Path) -> PathBuf {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("```c\n").expect("README has a C example") + 5;
    let code = &readme[start..start + readme[start..].find("```").unwrap()];
    let path = dir.join("example.c");
    std::fs::write(&path, code).unwrap();
    path
}

/// Run a program built against the prefix with nothing but PREFIX/lib on the search path.
fn run_against(exe: &Path, prefix: &Path) -> String {
    run(Command::new(exe)
        .env_remove("LD_LIBRARY_PATH")
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .env_remove("MOEPLUG_LIBRARY"))
}

/// What the README's example prints: the CPU caps, then the GPU's or why there is none.
fn assert_example_output(out: &str) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with(&format!("moeplug {}", env!("CARGO_PKG_VERSION")))
            && lines[0].ends_with(", ABI 1.1"),
        "{out}"
    );
    assert!(lines[1].starts_with("cpu: "), "{out}");
    assert!(lines[1].contains("MXFP4 yes, graph capture no"), "{out}");
    let gpu = lines[2]
        .strip_prefix("cuda:0: ")
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        gpu.starts_with("MOEPLUG_BACKEND_UNAVAILABLE: ")
            || gpu.contains("MXFP4 yes, graph capture yes"),
        "{out}"
    );
}

#[test]
fn install_lays_out_library_links_header_pkgconfig_and_cmake() {
    let prefix = install("install_layout");
    let lib = prefix.join("lib");
    let real = lib.join("libmoeplug.so.1.1.0");
    assert_eq!(
        std::fs::read(&real).unwrap(),
        std::fs::read(library()).unwrap(),
        "the installed library is the built one"
    );
    let link = |name: &str| std::fs::read_link(lib.join(name)).unwrap();
    assert_eq!(
        link("libmoeplug.so.1"),
        PathBuf::from("libmoeplug.so.1.1.0")
    );
    assert_eq!(link("libmoeplug.so"), PathBuf::from("libmoeplug.so.1"));
    assert_eq!(
        std::fs::read(prefix.join("include/moeplug.h")).unwrap(),
        std::fs::read(include_dir().join("moeplug.h")).unwrap()
    );
    let soname = run(Command::new("readelf").arg("-d").arg(&real));
    assert!(
        soname.contains("Library soname: [libmoeplug.so.1]"),
        "{soname}"
    );

    let pc = std::fs::read_to_string(lib.join("pkgconfig/moeplug.pc")).unwrap();
    assert!(
        pc.contains(&format!("prefix={}\n", prefix.display())),
        "{pc}"
    );
    assert!(
        pc.contains(&format!("Version: {}\n", env!("CARGO_PKG_VERSION"))),
        "{pc}"
    );
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "moeplug"])
        .env("PKG_CONFIG_PATH", lib.join("pkgconfig")));
    assert_eq!(
        flags.trim(),
        format!(
            "-I{}/include -L{}/lib -lmoeplug",
            prefix.display(),
            prefix.display()
        )
    );
    let cmake = lib.join("cmake/moeplug");
    let config = std::fs::read_to_string(cmake.join("moeplugConfig.cmake")).unwrap();
    assert!(
        config.contains("IMPORTED_SONAME \"libmoeplug.so.1\""),
        "{config}"
    );
    assert!(cmake.join("moeplugConfigVersion.cmake").exists());
}

#[test]
fn install_rejects_unknown_arguments_with_usage() {
    let out = Command::new("bash")
        .arg(root().join("scripts/install.sh"))
        .arg("--prefx=/tmp/x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown argument '--prefx=/tmp/x'"), "{err}");
    assert!(
        err.contains("usage: scripts/install.sh --prefix PREFIX"),
        "{err}"
    );
}

#[test]
fn readme_c_example_builds_with_pkg_config_and_runs() {
    let prefix = install("readme_c_pkgconfig");
    let dir = prefix.parent().unwrap().to_path_buf();
    let src = readme_c_example(&dir);
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "moeplug"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
    let exe = dir.join("example");
    run(Command::new(c_compiler())
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags.split_whitespace()));
    let needed = run(Command::new("readelf").arg("-d").arg(&exe));
    assert!(
        needed.contains("Shared library: [libmoeplug.so.1]"),
        "{needed}"
    );
    assert_example_output(&run_against(&exe, &prefix));
}

#[test]
fn cmake_find_package_builds_the_readme_example() {
    let prefix = install("readme_c_cmake");
    let dir = prefix.parent().unwrap().to_path_buf();
    let src = readme_c_example(&dir);
    let build = dir.join("build");
    let cmake = std::env::var("CMAKE").unwrap_or_else(|_| "cmake".into());
    run(Command::new(&cmake)
        .arg("-S")
        .arg(root().join("tests/cmake"))
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .arg(format!("-DEXAMPLE_SOURCE={}", src.display()))
        .env("CC", c_compiler()));
    run(Command::new(&cmake).arg("--build").arg(&build));
    assert_example_output(&run_against(&build.join("example"), &prefix));
}

/// The C++ consumer example: dlopen by soname, dlvsym at MOEPLUG_1.0, ABI and caps checks.
fn assert_consumer_output(out: &str) {
    assert!(
        out.starts_with(&format!("loaded moeplug {}", env!("CARGO_PKG_VERSION")))
            && out.contains(", ABI 1.1 (header 1.1)\n"),
        "{out}"
    );
    assert!(
        out.contains("device type 99: MOEPLUG_INVALID_ARGUMENT: moeplug_get_caps: device_type: unknown device_type 99"),
        "{out}"
    );
    assert!(
        out.contains(&format!("\ncpu: {}, runtime '", std::env::consts::ARCH))
            && out.contains("gpt-oss MXFP4 layer supported"),
        "{out}"
    );
    assert!(
        out.contains("\ncuda:0: unavailable (MOEPLUG_BACKEND_UNAVAILABLE: ")
            || out.contains("\ncuda:0: sm_"),
        "{out}"
    );
    assert!(out.trim_end().ends_with("consumer: OK"), "{out}");
}

#[test]
fn cpp_consumer_dlopens_the_soname_and_checks_abi_and_caps() {
    let prefix = install("cpp_consumer");
    let dir = prefix.parent().unwrap().to_path_buf();
    let cflags = run(Command::new("pkg-config")
        .args(["--cflags", "moeplug"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
    let exe = dir.join("consumer");
    run(Command::new(cxx_compiler())
        .args([
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-o",
        ])
        .arg(&exe)
        .args(cflags.split_whitespace())
        .arg(root().join("examples/cpp/consumer.cpp"))
        .arg("-ldl"));
    // Not linked: found by soname on the search path at run time.
    let needed = run(Command::new("readelf").arg("-d").arg(&exe));
    assert!(!needed.contains("libmoeplug"), "{needed}");
    assert_consumer_output(&run_against(&exe, &prefix));

    // Without the library on the search path it says so and fails.
    let out = Command::new(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("consumer: dlopen: libmoeplug.so.1: cannot open shared object file"),
        "{err}"
    );
}

#[test]
fn cpp_consumer_builds_with_cmake_headers_target() {
    let prefix = install("cpp_consumer_cmake");
    let build = prefix.parent().unwrap().join("build");
    let cmake = std::env::var("CMAKE").unwrap_or_else(|_| "cmake".into());
    run(Command::new(&cmake)
        .arg("-S")
        .arg(root().join("examples/cpp"))
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .env("CXX", cxx_compiler()));
    run(Command::new(&cmake).arg("--build").arg(&build));
    assert_consumer_output(&run_against(&build.join("consumer"), &prefix));
}
