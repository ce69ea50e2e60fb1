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
         #define MOEPLUG_ABI_VERSION 0x10000u\n"
    ));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(manifest.join(VOCAB))
        .with_src(manifest.join(CAPI_ROOT))
        .generate()
        .expect("cbindgen failed to generate include/moeplug.h");
    let generated = out_dir.join("moeplug.h");
    bindings.write_to_file(&generated);
    println!(
        "cargo:rustc-env=MOEPLUG_GENERATED_HEADER={}",
        generated.display()
    );
    let committed = manifest.join("include/moeplug.h");
    if env::var("MOEPLUG_UPDATE_HEADER").as_deref() == Ok("1") || !committed.exists() {
        fs::create_dir_all(committed.parent().unwrap()).unwrap();
        fs::copy(&generated, &committed).unwrap();
    }

    // ELF symbol versions: every export carries a `.symver name, name@@MOEPLUG_1.0` directive
    // (see `capi::panic::symver!`); this script only declares the node for the linker. Every
    // artefact that links the crate's objects needs the node, not only the cdylib.
    let map = out_dir.join("moeplug.map");
    fs::write(&map, "MOEPLUG_1.0 { };\n").unwrap();
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        // The soname follows the ABI major version, not the crate version.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmoeplug.so.1");
        println!(
            "cargo:rustc-link-arg=-Wl,--version-script={}",
            map.display()
        );
    }

    let profile = env::var("PROFILE").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let hip = if env::var("CARGO_FEATURE_HIP_LINK").is_ok() {
        ", hip-link"
    } else {
        ""
    };
    println!("cargo:rustc-env=MOEPLUG_VERSION_STRING={version} ({profile}, {arch}{hip}, abi 1.0)");
}
