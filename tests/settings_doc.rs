//! docs/settings.md lists every environment variable the library reads: each `MOEPLUG_*` name
//! passed to an environment read in src/ (`var`, `var_os`, `env_choice`, or a `*_ENV`
//! constant) must appear there as `NAME`, and the page names no variable the library does not
//! read.

use std::collections::BTreeSet;
use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `MOEPLUG_*` names right after one of `prefixes` in `text`.
fn names_after(text: &str, prefixes: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in prefixes {
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.starts_with("MOEPLUG_") {
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn every_environment_variable_the_library_reads_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let reads = [
        "var(\"",
        "var_os(\"",
        "env_choice(\"",
        "env_on_unless_zero(\"",
        "_ENV: &str = \"",
    ];
    let mut read = BTreeSet::new();
    for f in &files {
        read.extend(names_after(&std::fs::read_to_string(f).unwrap(), &reads));
    }
    assert!(
        read.contains("MOEPLUG_PDL") && read.contains("MOEPLUG_SELFTEST"),
        "{read:?}"
    );
    let doc = std::fs::read_to_string(root.join("docs/settings.md")).unwrap();
    let documented = names_after(&doc, &["`"]);
    let missing: Vec<_> = read.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "read but not in docs/settings.md: {missing:?}"
    );
    let stale: Vec<_> = documented.difference(&read).collect();
    assert!(
        stale.is_empty(),
        "in docs/settings.md but never read: {stale:?}"
    );
}
