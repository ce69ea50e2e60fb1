//! The coverage-guided fuzzer's harness (fuzz/harness.rs) on stable, in the normal suite:
//! every input of the committed corpus (fuzz/corpus/exports, grown and minimized by
//! `cargo +nightly fuzz`, see tests/FUZZING.md), then a few seconds of random inputs.

#[path = "../fuzz/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

fn corpus() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/exports");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// `MOEPLUG_FUZZ_REPLAY=path cargo test --release --test fuzz_corpus replay -- --nocapture`
/// (with MOEPLUG_FUZZ_TRACE=1 to print the descriptors): one input, to triage a finding.
#[test]
fn replay_one_input() {
    if let Some(path) = std::env::var_os("MOEPLUG_FUZZ_REPLAY") {
        harness::run(&std::fs::read(path).unwrap());
    }
}

#[test]
fn the_committed_corpus_replays_clean() {
    let files = corpus();
    assert!(files.len() >= 50, "only {} corpus inputs", files.len());
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| harness::run(&data));
        assert!(r.is_ok(), "corpus input {} fails", f.display());
    }
    println!("{} corpus inputs replayed", files.len());
}

#[test]
fn random_inputs_for_a_few_seconds() {
    let mut seed = 0x5EED_F022u64;
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed() < Duration::from_secs(3) {
        let n = (seed % 400) as usize;
        let data: Vec<u8> = (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 32) as u8
            })
            .collect();
        harness::run(&data);
        runs += 1;
    }
    assert!(runs > 100, "only {runs} inputs in 3 s");
    println!("{runs} random inputs; (ok, calls) per export:");
    for (name, ok, all) in harness::OK_CALLS.lock().unwrap().iter() {
        println!("  {name}: {ok} / {all}");
    }
    // Valid calls reach the kernels, not only the argument checks.
    for f in [
        "moeplug_fused_moe",
        "moeplug_prepare_moe",
        "moeplug_shuffle_weight",
    ] {
        let (ok, all) = harness::ok_calls(f);
        assert!(
            ok * 20 >= all && ok > 0,
            "{f}: only {ok} of {all} calls succeeded"
        );
    }
}
