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

/// A program compiled against the frozen 1.0 header (tests/c/frozen/moeplug_1_0.h, a copy of
/// the header as released, never edited) and linked like an engine links (soname, symbol
/// versions), run against this library: caps, every prep call and a CPU fused_moe.
#[test]
fn program_built_against_the_1_0_header_runs_on_this_library() {
    let dir = scratch("frozen_1_0");
    // What an installed library looks like: libmoeplug.so for the linker, .so.1 for the loader.
    for name in ["libmoeplug.so", "libmoeplug.so.1"] {
        std::os::unix::fs::symlink(library(), dir.join(name)).unwrap();
    }
    let exe = dir.join("frozen_1_0");
    run(Command::new(c_compiler())
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(root().join("tests/c/frozen"))
        .arg(root().join("tests/c/frozen_1_0.c"))
        .arg(format!("-L{}", dir.display()))
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .args(["-lmoeplug", "-lm"]));
    // The binary asks for the 1.0 symbol versions, as every engine built today does.
    let needed = run(Command::new("readelf")
        .args(["--dyn-syms", "--wide"])
        .arg(&exe));
    assert!(
        needed.contains("moeplug_fused_moe@MOEPLUG_1.0"),
        "not linked against the versioned symbols:\n{needed}"
    );
    let out = run(&mut Command::new(&exe));
    assert!(out.contains("all checks passed"), "{out}");
}

/// The frozen sizes the current header declares are the sizes of the frozen 1.0 header's
/// structs, and every 1.0 struct that starts with `struct_size` has one.
#[test]
fn frozen_sizes_are_the_1_0_header_sizes() {
    let dir = scratch("frozen_sizes");
    let structs = [
        ("moeplug_caps", "MOEPLUG_CAPS_SIZE_V1_0"),
        ("moeplug_layout", "MOEPLUG_LAYOUT_SIZE_V1_0"),
        ("moeplug_fused_moe_args", "MOEPLUG_FUSED_MOE_ARGS_SIZE_V1_0"),
        (
            "moeplug_shuffle_weight_args",
            "MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_0",
        ),
        (
            "moeplug_shuffle_scale_args",
            "MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_0",
        ),
        (
            "moeplug_pad_weights_args",
            "MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_0",
        ),
        (
            "moeplug_swizzle_scale_args",
            "MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_0",
        ),
        (
            "moeplug_quantize_mx_args",
            "MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_0",
        ),
        (
            "moeplug_prepare_moe_args",
            "MOEPLUG_PREPARE_MOE_ARGS_SIZE_V1_0",
        ),
        (
            "moeplug_prepare_moe_sizes_out",
            "MOEPLUG_PREPARE_MOE_SIZES_OUT_SIZE_V1_0",
        ),
    ];
    let header = std::fs::read_to_string(include_dir().join("moeplug.h")).unwrap();
    let frozen = std::fs::read_to_string(root().join("tests/c/frozen/moeplug_1_0.h")).unwrap();
    // Every struct of the frozen header that starts with struct_size has a frozen size.
    let extensible = frozen.matches("typedef struct moeplug_").count()
        - ["moeplug_device", "moeplug_dtype", "moeplug_tensor"].len();
    assert_eq!(extensible, structs.len(), "a struct without a frozen size");
    // The 1.0 names in a translation unit of their own, compared with the frozen values.
    let mut src =
        String::from("#include <stdio.h>\n#include \"moeplug_1_0.h\"\nint main(void) {\n");
    for (s, _) in structs {
        src += &format!("  printf(\"{s} %zu\\n\", sizeof({s}));\n");
    }
    src += "  return 0;\n}\n";
    std::fs::write(dir.join("sizes.c"), src).unwrap();
    let exe = dir.join("sizes");
    run(Command::new(c_compiler())
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(root().join("tests/c/frozen"))
        .arg(dir.join("sizes.c")));
    let out = run(&mut Command::new(&exe));
    for (s, constant) in structs {
        let size = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{s} ")))
            .unwrap_or_else(|| panic!("{s} missing in {out}"));
        assert!(
            header.contains(&format!("#define {constant} {size}\n")),
            "{constant} is not sizeof({s}) of the 1.0 header ({size})"
        );
    }
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

/// The exports of ABI 1.0: their symbol version is MOEPLUG_1.0 forever.
const EXPORTS_1_0: [&str; 15] = [
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
];

/// The additions of ABI 1.1 (threads, log, progress, config resolver, AITER arguments,
/// layout fragments), versioned MOEPLUG_1.1.
const EXPORTS_1_1: [&str; 7] = [
    "moeplug_set_num_threads",
    "moeplug_num_threads",
    "moeplug_set_log_callback",
    "moeplug_set_progress_callback",
    "moeplug_resolve_config",
    "moeplug_aiter_args",
    "moeplug_layout_from_fragments",
];

/// `name@@MOEPLUG_1.x` for every export of every ABI minor, in the order above.
fn expected_exports() -> Vec<String> {
    let v0 = EXPORTS_1_0.iter().map(|n| format!("{n}@@MOEPLUG_1.0"));
    let v1 = EXPORTS_1_1.iter().map(|n| format!("{n}@@MOEPLUG_1.1"));
    v0.chain(v1).collect()
}

#[test]
fn every_export_is_a_versioned_moeplug_symbol() {
    let symbols = defined_dynamic_symbols();
    // The version nodes themselves are absolute symbols named after the node.
    let mut exports: Vec<String> = symbols
        .iter()
        .filter(|s| !s.starts_with("MOEPLUG_1."))
        .cloned()
        .collect();
    exports.sort();
    let mut want = expected_exports();
    want.sort();
    assert_eq!(exports, want, "exports and their versions");
    // The library defines exactly the nodes 1.0 and 1.1 (the parent link the version script
    // gives 1.1 is informational; rustc's LLD does not record it).
    let out = run(Command::new("readelf").arg("-V").arg(library()));
    let defined: Vec<&str> = out
        .split("Version needs section")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split("Name: ").nth(1))
        .map(str::trim)
        .collect();
    assert_eq!(
        defined,
        ["libmoeplug.so.1", "MOEPLUG_1.0", "MOEPLUG_1.1"],
        "{out}"
    );
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
    let expected = expected_exports();
    for name in &declared {
        let versioned = expected
            .iter()
            .find(|e| e.split_once("@@").unwrap().0 == *name)
            .unwrap_or_else(|| panic!("{name} declared but not in the export lists"));
        assert!(
            symbols.contains(versioned),
            "{name} declared but not exported as {versioned}"
        );
    }
    assert_eq!(declared.len(), expected.len(), "{declared:?}");
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

/// Structs (with field names) and enums (with constant names) of a header, read from its text.
struct HeaderItems {
    structs: Vec<(String, Vec<String>)>,
    enums: Vec<(String, Vec<String>)>,
    frozen_sizes: Vec<(String, String)>,
}

fn header_items(header: &str) -> HeaderItems {
    let lines: Vec<&str> = header.lines().collect();
    let mut items = HeaderItems {
        structs: vec![],
        enums: vec![],
        frozen_sizes: vec![],
    };
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if let Some(name) = line
            .strip_prefix("typedef struct ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            let mut fields = vec![];
            i += 1;
            while !lines[i].starts_with('}') {
                let l = lines[i].trim();
                if let Some(decl) = l.strip_suffix(';').filter(|_| !l.starts_with('*')) {
                    let decl = decl.split('[').next().unwrap();
                    let field = decl.rsplit([' ', '*']).next().unwrap();
                    fields.push(field.to_string());
                }
                i += 1;
            }
            items.structs.push((name.to_string(), fields));
        } else if let Some(name) = line.strip_prefix("enum moeplug_") {
            let mut constants = vec![];
            while !lines[i].starts_with("};") {
                let l = lines[i].trim();
                if let Some((c, _)) = l.split_once(" = ").filter(|_| l.starts_with("MOEPLUG_")) {
                    constants.push(c.to_string());
                }
                i += 1;
            }
            items.enums.push((format!("moeplug_{name}"), constants));
        } else if let Some(rest) = line.strip_prefix("#define ") {
            if let Some((m, _)) = rest.split_once(' ') {
                for version in ["V1_0", "V1_1"] {
                    if let Some(s) = m.strip_suffix(&format!("_SIZE_{version}")) {
                        let line = format!("{} {}", version.to_lowercase(), s.to_lowercase());
                        items.frozen_sizes.push((line, m.to_string()));
                    }
                }
            }
        }
        i += 1;
    }
    items
}

/// The header as the C compiler sees it, in the format of `_abi.describe_mirror()`.
fn header_facts(dir: &std::path::Path) -> Vec<String> {
    let header = std::fs::read_to_string(include_dir().join("moeplug.h")).unwrap();
    let items = header_items(&header);
    assert!(
        items.structs.len() >= 13 && items.enums.len() >= 14,
        "header parse"
    );
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"moeplug.h\"\nint main(void) {\n",
    );
    for (s, fields) in &items.structs {
        src += &format!("  printf(\"struct {s} size %zu\\n\", sizeof({s}));\n");
        for f in fields {
            src += &format!(
                "  printf(\"field {s}.{f} offset %zu size %zu\\n\", offsetof({s}, {f}), \
                 sizeof((({s} *)0)->{f}));\n"
            );
        }
    }
    for (e, constants) in &items.enums {
        for c in constants {
            src += &format!("  printf(\"enum {e} {c} %lld\\n\", (long long){c});\n");
        }
    }
    for (s, m) in &items.frozen_sizes {
        src += &format!("  printf(\"{s} %lld\\n\", (long long){m});\n");
    }
    src += "  return 0;\n}\n";
    std::fs::write(dir.join("probe.c"), src).unwrap();
    let exe = dir.join("probe");
    run(Command::new(c_compiler())
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(include_dir())
        .arg(dir.join("probe.c")));
    run(&mut Command::new(&exe))
        .lines()
        .map(str::to_string)
        .collect()
}

/// The Python package's ctypes mirror (python/moeplug/_abi.py) equals the header: every
/// struct's size, every field's offset and size, every enum constant's value, every frozen
/// size. `_abi.py` needs only the standard library, so any python3 runs this.
#[test]
fn python_mirror_matches_the_header_field_by_field() {
    let dir = scratch("python_mirror");
    let mut want = header_facts(&dir);
    let python = std::env::var("MOEPLUG_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let script = "import importlib.util, sys\n\
                  spec = importlib.util.spec_from_file_location('abi', sys.argv[1])\n\
                  m = importlib.util.module_from_spec(spec)\n\
                  spec.loader.exec_module(m)\n\
                  print('\\n'.join(m.describe_mirror()))\n";
    let mut got: Vec<String> = run(Command::new(python)
        .args(["-c", script])
        .arg(root().join("python/moeplug/_abi.py")))
    .lines()
    .map(str::to_string)
    .collect();
    want.sort();
    got.sort();
    let missing: Vec<&String> = want.iter().filter(|l| !got.contains(l)).collect();
    let extra: Vec<&String> = got.iter().filter(|l| !want.contains(l)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "python/moeplug/_abi.py differs from include/moeplug.h\n  header only: {missing:#?}\n  \
         mirror only: {extra:#?}"
    );
}

/// Every struct the library writes (docs/abi.md §5, "Output structs") is, as a C compiler lays
/// it out, nothing but fields: each starts where the previous one ends and the last ends at
/// `sizeof`. Padding would be bytes the library never writes, which reach engines that hash
/// or compare records (the Rust side proves the same at compile time: `output!` in
/// src/capi/args.rs).
#[test]
fn output_structs_have_no_implicit_padding() {
    let facts = header_facts(&scratch("output_padding"));
    for s in [
        "moeplug_caps",
        "moeplug_layout",
        "moeplug_layout_fragment",
        "moeplug_prepare_moe_sizes_out",
    ] {
        let size: usize = facts
            .iter()
            .find_map(|l| l.strip_prefix(&format!("struct {s} size ")))
            .unwrap_or_else(|| panic!("{s} missing"))
            .parse()
            .unwrap();
        // "field S.f offset O size N", in declaration order.
        let mut end = 0;
        for l in facts
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("field {s}.")))
        {
            let w: Vec<&str> = l.split(' ').collect();
            let (offset, len): (usize, usize) = (w[2].parse().unwrap(), w[4].parse().unwrap());
            assert_eq!(
                offset,
                end,
                "{s}: {} bytes of padding before {}",
                offset - end,
                w[0]
            );
            end = offset + len;
        }
        assert_eq!(end, size, "{s}: {} bytes of tail padding", size - end);
    }
}
