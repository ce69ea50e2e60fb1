//! Build script: generates the C header with cbindgen, declares the ELF version node and
//! the soname, and records version info.
//!
//! The header is always generated into OUT_DIR (the tests compare it with the committed
//! `include/moeplug.h`); the committed file is rewritten only when MOEPLUG_UPDATE_HEADER=1
//! or when it does not exist yet.

use std::env;
use std::fs;
use std::path::PathBuf;

/// The C surface: cbindgen reads this module and the modules it declares, not the whole crate.
const CAPI_ROOT: &str = "src/capi/mod.rs";
/// The ABI's enums and flags, shared by the core and the C surface.
const VOCAB: &str = "src/vocab.rs";
/// The ABI version (src/capi/mod.rs has the same; `moeplug_abi_version()` is checked against
/// the header's MOEPLUG_ABI_VERSION by tests/abi.rs): one symbol version node per minor.
const ABI_MAJOR: u32 = 1;
const ABI_MINOR: u32 = 1;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let version = env::var("CARGO_PKG_VERSION").unwrap();
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let minor = env::var("CARGO_PKG_VERSION_MINOR").unwrap();
    let patch = env::var("CARGO_PKG_VERSION_PATCH").unwrap();

    println!("cargo:rerun-if-changed=src/capi");
    println!("cargo:rerun-if-changed={VOCAB}");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=MOEPLUG_UPDATE_HEADER");

    // Header.
    let mut config =
        cbindgen::Config::from_file(manifest.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(format!(
        "\n#define MOEPLUG_VERSION_MAJOR {major}\n#define MOEPLUG_VERSION_MINOR {minor}\n\
         #define MOEPLUG_VERSION_PATCH {patch}\n#define MOEPLUG_VERSION \"{version}\"\n\
         /** ABI version this header describes: (major << 16) | minor. */\n\
         #define MOEPLUG_ABI_VERSION 0x{ABI_MAJOR:x}{ABI_MINOR:04x}u\n"
    ));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(manifest.join(VOCAB))
        .with_src(manifest.join(CAPI_ROOT))
        .generate()
        .expect("cbindgen failed to generate include/moeplug.h");
    let mut text = Vec::new();
    bindings.write(&mut text);
    let text = with_function_pointer_typedefs(String::from_utf8(text).unwrap());
    let generated = out_dir.join("moeplug.h");
    fs::write(&generated, text).unwrap();
    println!(
        "cargo:rustc-env=MOEPLUG_GENERATED_HEADER={}",
        generated.display()
    );
    let committed = manifest.join("include/moeplug.h");
    if env::var("MOEPLUG_UPDATE_HEADER").as_deref() == Ok("1") || !committed.exists() {
        fs::create_dir_all(committed.parent().unwrap()).unwrap();
        fs::copy(&generated, &committed).unwrap();
    }

    // ELF symbol versions: every export carries a `.symver name, name@@MOEPLUG_1.x` directive
    // (see `capi::panic::symver!`); this script only declares the nodes for the linker, each
    // minor inheriting the one before. Every artefact that links the crate's objects needs
    // the nodes, not only the cdylib.
    let map = out_dir.join("moeplug.map");
    let mut nodes = String::from("MOEPLUG_1.0 { };\n");
    for minor in 1..=ABI_MINOR {
        nodes.push_str(&format!(
            "MOEPLUG_1.{minor} {{ }} MOEPLUG_1.{};\n",
            minor - 1
        ));
    }
    fs::write(&map, nodes).unwrap();
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        // The soname follows the ABI major version, not the crate version.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmoeplug.so.1");
        println!(
            "cargo:rustc-link-arg=-Wl,--version-script={}",
            map.display()
        );
    }

    link_soname_in_build_tree(&out_dir);

    let profile = env::var("PROFILE").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let hip = if env::var("CARGO_FEATURE_HIP_LINK").is_ok() {
        ", hip-link"
    } else {
        ""
    };
    println!("cargo:rustc-env=MOEPLUG_VERSION_STRING={version} ({profile}, {arch}{hip}, abi {ABI_MAJOR}.{ABI_MINOR})");
}

/// The header plus `typedef RET (*NAME_fn)(ARGS);` for every function it declares, inside
/// its `extern "C"` block, so dlopen/dlvsym users never spell a signature themselves.
fn with_function_pointer_typedefs(header: String) -> String {
    let mut out = String::from(
        "/* Function-pointer types of every export, for dlvsym(handle, name, \"MOEPLUG_1.0\") (the\n * calls marked ABI 1.1: \"MOEPLUG_1.1\"). */\n",
    );
    let mut decl = String::new();
    // A declaration starts at column 0 with `RET moeplug_NAME(` (doc comments, fields and
    // enumerators are indented or start with '/', '*', '#').
    let begins = |l: &str| match l.find('(') {
        Some(open) => {
            let head = &l[..open];
            !l.starts_with([' ', '#', '/', '*', '}'])
                && !head.starts_with("typedef")
                && head
                    .rsplit([' ', '*'])
                    .next()
                    .is_some_and(|n| n.starts_with("moeplug_"))
        }
        None => false,
    };
    for line in header.lines() {
        if decl.is_empty() && !begins(line) {
            continue;
        }
        decl.push_str(line.trim());
        decl.push(' ');
        if !line.trim_end().ends_with(';') {
            continue;
        }
        let open = decl.find('(').unwrap();
        let head = &decl[..open];
        let name_at = head.rfind("moeplug_").unwrap();
        let (ret, name) = (head[..name_at].trim_end(), &head[name_at..]);
        let params = decl[open..].trim_end().trim_end_matches(';');
        out.push_str(&format!("typedef {ret} (*{name}_fn){params};\n"));
        decl.clear();
    }
    out.push('\n');
    let close = header
        .rfind("#ifdef __cplusplus\n}")
        .expect("the header closes its extern \"C\" block");
    format!("{}{out}{}", &header[..close], &header[close..])
}

/// The linker records the soname `libmoeplug.so.1`, so programs linked against the build
/// tree look for that name at run time: give the profile folder (target/<profile>, three
/// levels above OUT_DIR) a relative `libmoeplug.so.1 -> libmoeplug.so` link. It may dangle
/// until the library is linked; failing to make it is not an error (scripts/install.sh
/// makes the same link).
fn link_soname_in_build_tree(out_dir: &std::path::Path) {
    #[cfg(unix)]
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let link = profile_dir.join("libmoeplug.so.1");
        if fs::symlink_metadata(&link).is_err() {
            let _ = std::os::unix::fs::symlink("libmoeplug.so", &link);
        }
    }
}
