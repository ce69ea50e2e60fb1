//! The C surface: every `extern "C"` function of libmoeplug. Each one reads and validates its
//! arguments (`args`), calls the safe core, and maps the result to a status (`panic::guard`).
//! Nothing here computes.
//!
//! The safety contract of every `unsafe extern "C"` function is the header's: pointers are
//! NULL or valid for the documented sizes, tensors describe memory that stays alive for the
//! call (and, on a device, until the stream is done).
#![allow(clippy::missing_safety_doc)]

pub mod args;
mod dispatch;
pub use self::dispatch::*;
mod fragment;
pub use self::fragment::*;
mod moe;
pub mod panic;
mod prep;
pub use self::prep::*;
mod runtime;
pub use self::runtime::*;
pub mod types;

use libc::c_char;

use self::args::{out_struct_size, write_struct};
use self::panic::{guard, guard_value, last_error_ptr, symver};
use self::types::*;
use crate::backend::{self, Caps};
use crate::error::Status;
use crate::tensor::DeviceKind;

/// ABI major version: incompatible changes add a new symbol version node.
pub(crate) const ABI_MAJOR: u32 = 1;
/// ABI minor version: compatible additions (1.1: threads, log and progress callbacks, in
/// the MOEPLUG_1.1 symbol version node). build.rs writes the same into MOEPLUG_ABI_VERSION.
pub(crate) const ABI_MINOR: u32 = 1;

pub(crate) fn status(s: Status) -> moeplug_status {
    s.to_c()
}

/// The message of the last failed call on this thread, or "" if the last call succeeded.
/// Valid until the next moeplug call on this thread; owned by the library, never NULL.
#[no_mangle]
pub extern "C" fn moeplug_last_error() -> *const c_char {
    guard_value(c"".as_ptr(), last_error_ptr)
}

/// The name of a status code ("MOEPLUG_OK", "MOEPLUG_INVALID_ARGUMENT", ...), or "UNKNOWN".
/// Static storage, never NULL, thread-safe; does not touch the last error.
#[no_mangle]
pub extern "C" fn moeplug_status_name(status: i32) -> *const c_char {
    guard_value(c"UNKNOWN".as_ptr(), || match Status::from_code(status) {
        Some(s) => status_name_c(s),
        None => c"UNKNOWN".as_ptr(),
    })
}

fn status_name_c(s: Status) -> *const c_char {
    s.c_name().as_ptr()
}

/// `(major << 16) | minor` of the ABI this library implements (1.1 → 0x10001).
#[no_mangle]
pub extern "C" fn moeplug_abi_version() -> u32 {
    (ABI_MAJOR << 16) | ABI_MINOR
}

/// "0.1.0 (...build info...)". Static storage, never NULL.
#[no_mangle]
pub extern "C" fn moeplug_version() -> *const c_char {
    crate::VERSION_C.as_ptr()
}

/// Fill `out` with what the backend of `(device_type, device_id)` can run.
/// `out->struct_size` must be set by the caller (at least MOEPLUG_CAPS_SIZE_V1_0); written
/// only on success, and only up to `out->struct_size` bytes (docs/abi.md). CPU (1) always
/// answers; CUDA (2) / ROCm (10) answer BACKEND_UNAVAILABLE with the reason when the driver
/// or runtime cannot be loaded. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn moeplug_get_caps(
    device_type: i32,
    device_id: i32,
    out: *mut moeplug_caps,
) -> moeplug_status {
    status(guard("moeplug_get_caps", || {
        let size = out_struct_size(out, "out")?;
        let device = DeviceKind::from_raw("device_type", device_type)?;
        let caps = backend::for_device(device, device_id)?.caps();
        write_struct(out, &caps_record(&caps, device_type, device_id), size);
        Ok(())
    }))
}

fn caps_record(caps: &Caps, device_type: i32, device_id: i32) -> moeplug_caps {
    let mut c = moeplug_caps {
        struct_size: 0, // set by write_struct
        abi_version: moeplug_abi_version(),
        device_type,
        device_id,
        backend: caps.backend.map(|b| b as i32).unwrap_or(0),
        arch: [0; 32],
        runtime_version: [0; 32],
        weight_formats: caps.weight_formats,
        act_dtypes: caps.act_dtypes,
        gate_modes: caps.gate_modes,
        activations: caps.activations,
        weight_layouts: caps.weight_layouts,
        scale_layouts: caps.scale_layouts,
        features: caps.features,
        max_tokens: caps.limits.max_tokens,
        max_topk: caps.limits.max_topk,
    };
    copy_c_string(&mut c.arch, &caps.arch);
    copy_c_string(&mut c.runtime_version, &caps.runtime_version);
    c
}

fn copy_c_string(dst: &mut [c_char; 32], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().take(31)) {
        *d = b as c_char;
    }
}

/// Can `(device_type, device_id)` run exactly this configuration? Tensors in `args` are
/// optional here (only their presence matters: biases, expert_mask, num_local_tokens).
/// OK, or UNSUPPORTED with the reason in `moeplug_last_error`; INVALID_ARGUMENT for a bad
/// struct or enum value. Engines call this once at start-up.
#[no_mangle]
pub unsafe extern "C" fn moeplug_check_fused_moe(
    device_type: i32,
    device_id: i32,
    args: *const moeplug_fused_moe_args,
) -> moeplug_status {
    status(guard("moeplug_check_fused_moe", || {
        let device = DeviceKind::from_raw("device_type", device_type)?;
        let config = moe::read_config(args)?;
        backend::for_device(device, device_id)?.check(&config)
    }))
}

/// Scratch bytes `moeplug_fused_moe` needs for these arguments (tensors required as for the
/// launch, `workspace` ignored). Written to `*bytes` on success.
#[no_mangle]
pub unsafe extern "C" fn moeplug_fused_moe_workspace_size(
    args: *const moeplug_fused_moe_args,
    bytes: *mut usize,
) -> moeplug_status {
    status(guard("moeplug_fused_moe_workspace_size", || {
        args::non_null(bytes as *const usize, "bytes")?;
        let launch = moe::read_launch(args)?;
        let n = moe::backend_of(&launch)?.workspace_size(&launch)?;
        std::ptr::write_unaligned(bytes, n);
        Ok(())
    }))
}

/// Run fused MoE: `output[t] = Σ_s w[t,s] · (act(x_t W13[e]ᵀ + b13[e]) W2[e]ᵀ + b2[e])` with
/// e = topk_ids[t, s] (docs/abi.md §9), on the backend that owns the tensors' memory: host tensors
/// run synchronously on the CPU worker pool, device tensors asynchronously on `args->stream`.
/// A launch never allocates device memory, never synchronizes and never reads device memory
/// from the host (graph-capturable).
///
/// Tensors (borrowed for the call; for device work keep them alive until the stream is done):
/// `hidden_states` `[M, H]` or `[M, H_pad]` bf16/fp16 (padded columns ignored); `output`
/// `[M, H]` or `[M, H_pad]` bf16/fp16 (padded columns and rows >= num_local_tokens written as
/// zero); `w13` `[E, 2·I_pad, H_pad]`, `w2` `[E, H_pad, I_pad]` as recorded in `args->layout`
/// (packed fp4 as `{17,4,1}` or uint8 with the last dimension halved; fp8 as e4m3fn/e4m3fnuz,
/// uint8 = e4m3fn); scales per format; fp32 biases `[E, 2·I_pad]`, `[E, H_pad]` present exactly
/// when the record has HAS_BIAS; `topk_weights` fp32 and `topk_ids` int32 `[M, k]` (ids
/// outside the experts, or masked off, contribute nothing); optional `expert_mask` int32
/// `[E_global]` / `[E_global + 1]` of 0/1 with E ones, `num_local_tokens` int32 `[1]`
/// (clamped to [0, M]); `workspace` uint8, at least `moeplug_fused_moe_workspace_size` bytes
/// (NULL when that is 0).
///
/// Errors: INVALID_ARGUMENT (NULL or malformed argument), LAYOUT_MISMATCH (a tensor disagrees
/// with the record, or the record with what the backend reads), UNSUPPORTED (the backend
/// cannot run this configuration: `moeplug_check_fused_moe` says so up front; or M / k above
/// the backend's `moeplug_caps.max_tokens` / `max_topk`), BUFFER_TOO_SMALL (workspace),
/// OUT_OF_MEMORY (the CPU backend's bounded host scratch could not be allocated),
/// BACKEND_UNAVAILABLE / DEVICE_ERROR / COMPILE_ERROR (GPU). Every tensor's `data +
/// byte_offset + bytes` must lie below 2^57 (the user address space), else INVALID_ARGUMENT.
/// `output` is written only on success for host tensors.
#[no_mangle]
pub unsafe extern "C" fn moeplug_fused_moe(args: *const moeplug_fused_moe_args) -> moeplug_status {
    status(guard("moeplug_fused_moe", || {
        let launch = moe::read_launch(args)?;
        moe::backend_of(&launch)?.fused_moe(&launch)
    }))
}

symver!(
    moeplug_last_error,
    moeplug_status_name,
    moeplug_abi_version,
    moeplug_version,
    moeplug_get_caps,
    moeplug_check_fused_moe,
    moeplug_fused_moe_workspace_size,
    moeplug_fused_moe,
);
