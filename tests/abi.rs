//! The C ABI as a C program sees it: header freshness and hygiene, struct layout, dlopen +
//! error paths, exported symbols and their versions.

mod common;

use std::process::Command;

use common::*;

#[test]
fn header_is_fresh() {
    let generated = std::fs::read_to_string(env!("MOEPLUG_GENERATED_HEADER")).unwrap();
    let committed = std::fs::read_to_string(include_dir().join("moeplug.h")).unwrap();
    assert!(
        generated == committed,
        "include/moeplug.h differs from a fresh cbindgen run: regenerate with \
         `MOEPLUG_UPDATE_HEADER=1 cargo build --release` and commit it"
    );
}

#[test]
fn header_compiles_as_c99_and_cxx17() {
    let dir = scratch("header");
    for std in ["-std=c99", "-std=c11"] {
        run(Command::new(c_compiler())
            .args([
                std,
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-fsyntax-only",
                "-x",
                "c",
            ])
            .arg(include_dir().join("moeplug.h")));
    }
    run(Command::new(cxx_compiler())
        .args([
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-c",
            "-o",
        ])
        .arg(dir.join("header_cpp.o"))
        .arg("-I")
        .arg(include_dir())
        .arg(root().join("tests/c/header_cpp.cpp")));
}

#[test]
fn c_program_dlopens_the_library_and_sees_every_error_path() {
    let dir = scratch("abi_test");
    let exe = dir.join("abi_test");
    run(Command::new(c_compiler())
        // No -pedantic: POSIX dlsym returns object pointers that become function pointers.
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(include_dir())
        .arg(root().join("tests/c/abi_test.c"))
        .arg("-ldl"));
    let out = run(Command::new(&exe).arg(library()));
    assert!(out.contains("all checks passed"), "{out}");
}

/// Dynamic symbols defined by the library, as `name@version` (or `name` when unversioned).
fn defined_dynamic_symbols() -> Vec<String> {
    let out = run(Command::new("readelf")
        .args(["--dyn-syms", "--wide"])
        .arg(library()));
    out.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            if cols.len() < 8 || !cols[0].ends_with(':') || cols[6] == "UND" || cols[6] == "Ndx" {
                return None;
            }
            if cols[3] == "SECTION" || cols[3] == "FILE" {
                return None;
            }
            Some(cols[7].to_string())
        })
        .collect()
}

#[test]
fn every_export_is_a_versioned_moeplug_symbol() {
    let symbols = defined_dynamic_symbols();
    let exports: Vec<&String> = symbols
        .iter()
        .filter(|s| !s.starts_with("MOEPLUG_1.0"))
        .collect();
    assert!(exports.len() >= 15, "too few exports: {symbols:?}");
    for s in &exports {
        let (name, version) = s.split_once('@').unwrap_or((s.as_str(), ""));
        assert!(name.starts_with("moeplug_"), "unexpected export {s}");
        assert_eq!(
            version, "@MOEPLUG_1.0",
            "{name} is not versioned MOEPLUG_1.0 (default): {s}"
        );
    }
    for needed in [
        "moeplug_last_error",
        "moeplug_status_name",
        "moeplug_abi_version",
        "moeplug_version",
        "moeplug_get_caps",
        "moeplug_check_fused_moe",
        "moeplug_fused_moe",
        "moeplug_fused_moe_workspace_size",
        "moeplug_shuffle_weight",
        "moeplug_shuffle_scale",
        "moeplug_pad_weights",
        "moeplug_swizzle_scale",
        "moeplug_quantize_mx",
        "moeplug_prepare_moe",
        "moeplug_prepare_moe_sizes",
    ] {
        assert!(
            exports
                .iter()
                .any(|s| s.starts_with(&format!("{needed}@@"))),
            "{needed} is not exported"
        );
    }
}

#[test]
fn soname_and_no_vendor_libraries() {
    let out = run(Command::new("readelf").arg("-d").arg(library()));
    assert!(out.contains("Library soname: [libmoeplug.so.1]"), "{out}");
    for line in out.lines().filter(|l| l.contains("(NEEDED)")) {
        for vendor in [
            "libcuda",
            "libnvrtc",
            "libamdhip64",
            "libhiprtc",
            "libcudart",
        ] {
            assert!(!line.contains(vendor), "links a vendor library: {line}");
        }
    }
}

#[test]
fn every_header_function_is_exported() {
    let header = std::fs::read_to_string(include_dir().join("moeplug.h")).unwrap();
    let symbols = defined_dynamic_symbols();
    let declared: Vec<&str> = header
        .lines()
        .filter_map(|l| {
            let head = &l[..l.find('(')?];
            let name = &head[head.rfind("moeplug_")?..];
            (l.starts_with("moeplug_status ")
                || l.starts_with("const char *")
                || l.starts_with("uint32_t "))
            .then_some(name)
        })
        .collect();
    assert!(declared.len() >= 15, "{declared:?}");
    for name in declared {
        assert!(
            symbols.iter().any(|s| s == &format!("{name}@@MOEPLUG_1.0")),
            "{name} declared but not exported"
        );
    }
}

#[test]
fn header_version_macros_match_cargo_toml() {
    let header = std::fs::read_to_string(include_dir().join("moeplug.h")).unwrap();
    let want = env!("CARGO_PKG_VERSION");
    assert!(
        header.contains(&format!("#define MOEPLUG_VERSION \"{want}\"")),
        "MOEPLUG_VERSION is not {want}"
    );
    let parts: Vec<&str> = want.split('.').collect();
    for (name, value) in ["MAJOR", "MINOR", "PATCH"].iter().zip(parts) {
        assert!(
            header.contains(&format!("#define MOEPLUG_VERSION_{name} {value}\n")),
            "MOEPLUG_VERSION_{name}"
        );
    }
}

/// Every function the header declares has a `NAME_fn` pointer typedef of the same signature
/// (dlopen users resolve through those), and nothing else is typedef'd that way.
#[test]
fn header_has_a_function_pointer_typedef_for_every_export() {
    let header = std::fs::read_to_string(include_dir().join("moeplug.h")).unwrap();
    let flat: String = header
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with(['*', '#']) && !l.starts_with("/*") && !l.starts_with("extern \"C\"")
        })
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" ");
    let decls: Vec<(String, String, String)> = flat
        .split(';')
        .filter_map(|d| {
            let d = d.trim();
            let open = d.find('(')?;
            let head = &d[..open];
            let name = head.rsplit([' ', '*']).next()?;
            if !name.starts_with("moeplug_") || head.contains("typedef") || head.contains('{') {
                return None;
            }
            let ret = head[..head.len() - name.len()].trim().to_string();
            Some((ret, name.to_string(), d[open..].to_string()))
        })
        .collect();
    assert!(decls.len() >= 15, "{decls:?}");
    for (ret, name, params) in &decls {
        let want = format!("typedef {ret} (*{name}_fn){params};");
        assert!(header.contains(&want), "missing: {want}");
    }
    assert_eq!(header.matches("_fn)(").count(), decls.len());
}
