//! libFuzzer target over every export of libmoeplug (see ../harness.rs for what is varied
//! and checked). Run: `cargo +nightly fuzz run exports` from the repository root.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
