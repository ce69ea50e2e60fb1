//! moeplug: Mixture-of-Experts weight preparation and fused MoE launch behind a stable,
//! versioned C ABI (`include/moeplug.h`).
//!
//! The safe core (`types`, `tensor`, `layout`, `quant`, `prep`, `moe`, `backend`) knows
//! nothing of C; `capi` is the thin surface that validates, converts and maps errors.
//! `vocab` holds the ABI's numbers (enum values, status codes, flag bits) once, for both.

pub mod aiter;
pub mod backend;
pub mod capi;
pub mod error;
pub mod layout;
pub mod moe;
pub mod prep;
pub mod quant;
pub mod runtime;
pub mod tensor;
pub mod types;
mod vocab;

pub use error::{Error, Result, Status};

/// "0.1.0 (git abc1234, release, x86_64)" as a C string.
pub(crate) static VERSION_C: &std::ffi::CStr = {
    match std::ffi::CStr::from_bytes_with_nul(
        concat!(env!("MOEPLUG_VERSION_STRING"), "\0").as_bytes(),
    ) {
        Ok(s) => s,
        Err(_) => panic!("version string has an interior NUL"),
    }
};

/// The version string (same as `moeplug_version()`).
pub fn version() -> &'static str {
    env!("MOEPLUG_VERSION_STRING")
}
