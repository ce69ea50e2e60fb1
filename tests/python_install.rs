//! The Python package as a user installs it: `pip install ./python` into a fresh venv builds
//! the library with cargo and bundles it in the package; from another folder, with no
//! MOEPLUG_LIBRARY or PYTHONPATH, `import moeplug` loads the bundled copy and
//! `python -m moeplug info --json` reports it. The wheel is tagged py3-none-<platform>.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A command that sees nothing of the build tree's Python setup.
fn clean(program: &Path, cwd: &Path) -> Command {
    let mut c = Command::new(program);
    c.current_dir(cwd)
        .env_remove("MOEPLUG_LIBRARY")
        .env_remove("PYTHONPATH")
        .env_remove("VIRTUAL_ENV")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    c
}

fn fresh_venv(dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    run(Command::new(python_interpreter())
        .args(["-m", "venv"])
        .arg(&venv));
    venv.join("bin/python")
}

#[test]
fn pip_install_bundles_the_library_and_imports_from_anywhere() {
    let dir = scratch("python_install");
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let python = fresh_venv(&dir);
    run(clean(&python, &elsewhere)
        .args(["-m", "pip", "install", "-q"])
        .arg(root().join("python")));

    let site = run(clean(&python, &elsewhere).args([
        "-c",
        "import moeplug, sys; c = moeplug.get_caps('cpu'); \
         print(moeplug.library_path()); print(sorted(c.weight_formats)); \
         print(moeplug.version()); print(moeplug.fused_moe_workspace_size.__name__)",
    ]));
    let lines: Vec<&str> = site.lines().collect();
    assert_eq!(lines.len(), 4, "{site}");
    let lib = Path::new(lines[0]);
    assert!(
        lib.starts_with(dir.join("venv")) && lib.ends_with("site-packages/moeplug/libmoeplug.so"),
        "not the bundled copy: {site}"
    );
    assert_eq!(
        lines[1],
        "['bf16', 'fp16', 'fp8_block128', 'fp8_per_channel', 'fp8_per_tensor', 'int4_group32', 'int4_per_channel', 'mxfp4', 'mxfp8']"
    );
    assert!(lines[2].starts_with(env!("CARGO_PKG_VERSION")), "{site}");

    let json = run(clean(&python, &elsewhere).args(["-m", "moeplug", "info", "--json"]));
    let info: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(info["abi_version"], "1.1", "{json}");
    assert_eq!(info["library"], lines[0], "{json}");
    assert_eq!(info["devices"]["cpu"]["available"], true, "{json}");
    assert_eq!(info["devices"]["cpu"]["backend"], "cpu", "{json}");
    let cuda = &info["devices"]["cuda:0"];
    assert!(
        cuda["available"] == true || cuda["status"] == "MOEPLUG_BACKEND_UNAVAILABLE",
        "{json}"
    );

    let bad = clean(&python, &elsewhere)
        .args(["-m", "moeplug", "info", "--jsn"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unrecognized arguments: --jsn"));
}

#[test]
fn the_wheel_is_tagged_py3_none_platform_and_holds_the_library() {
    let dir = scratch("python_wheel");
    let python = python_interpreter();
    let wheels = dir.join("wheels");
    run(clean(&python, &dir)
        .args(["-m", "pip", "wheel", "-q", "--no-deps", "-w"])
        .arg(&wheels)
        .arg(root().join("python")));
    let names: Vec<String> = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let arch = std::env::consts::ARCH;
    let want = format!(
        "moeplug-{}-py3-none-linux_{arch}.whl",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(names, vec![want.clone()]);
    let listing = run(clean(&python, &dir).arg("-c").arg(format!(
        "import zipfile; z = zipfile.ZipFile({:?}); print('\\n'.join(z.namelist())); \
         print(z.read('moeplug-{v}.dist-info/WHEEL').decode()); \
         print(z.read('moeplug-{v}.dist-info/METADATA').decode())",
        wheels.join(&want),
        v = env!("CARGO_PKG_VERSION")
    )));
    for needed in [
        "moeplug/__init__.py",
        "moeplug/__main__.py",
        "moeplug/libmoeplug.so",
        "Root-Is-Purelib: false",
        &format!("Tag: py3-none-linux_{arch}"),
        "Requires-Dist: numpy",
        "Requires-Dist: ml_dtypes",
    ] {
        assert!(listing.contains(needed), "wheel lacks {needed}:\n{listing}");
    }
}
