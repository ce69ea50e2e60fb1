//! Weight preparation exports (API.md §4).

use super::args::read_struct;
use super::panic::{guard, symver};
use super::status;
use super::types::*;
use crate::error::Error;

fn not_yet(what: &str) -> Error {
    Error::unsupported(format!(
        "{what} is not implemented in moeplug {} yet",
        env!("CARGO_PKG_VERSION")
    ))
}

/// AITER `shuffle_weight` (LAYOUTS.md F1/F2) from `args->src` into `args->dst`.
/// Host tensors run synchronously; `stream` is used for device tensors.
#[no_mangle]
pub unsafe extern "C" fn moeplug_shuffle_weight(
    args: *const moeplug_shuffle_weight_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    let _ = stream;
    status(guard("moeplug_shuffle_weight", || {
        read_struct(args, "args")?;
        Err(not_yet("shuffle_weight"))
    }))
}

/// AITER `shuffle_scale` / `e8m0_shuffle` (LAYOUTS.md F3/F4).
#[no_mangle]
pub unsafe extern "C" fn moeplug_shuffle_scale(
    args: *const moeplug_shuffle_scale_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    let _ = stream;
    status(guard("moeplug_shuffle_scale", || {
        read_struct(args, "args")?;
        Err(not_yet("shuffle_scale"))
    }))
}

/// Zero padding of `[E, N, K]` weights, e8m0 scales or `[E, N]` fp32 biases.
#[no_mangle]
pub unsafe extern "C" fn moeplug_pad_weights(
    args: *const moeplug_pad_weights_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    let _ = stream;
    status(guard("moeplug_pad_weights", || {
        read_struct(args, "args")?;
        Err(not_yet("pad_weights"))
    }))
}

/// MX scale swizzle (LAYOUTS.md F5).
#[no_mangle]
pub unsafe extern "C" fn moeplug_swizzle_scale(
    args: *const moeplug_swizzle_scale_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    let _ = stream;
    status(guard("moeplug_swizzle_scale", || {
        read_struct(args, "args")?;
        Err(not_yet("swizzle_scale"))
    }))
}

/// MXFP4 / MXFP8 quantization with e8m0 scales.
#[no_mangle]
pub unsafe extern "C" fn moeplug_quantize_mx(
    args: *const moeplug_quantize_mx_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    let _ = stream;
    status(guard("moeplug_quantize_mx", || {
        read_struct(args, "args")?;
        Err(not_yet("quantize_mx"))
    }))
}

/// Sizes of each output of `moeplug_prepare_moe` (tensors of `args` may have NULL data).
#[no_mangle]
pub unsafe extern "C" fn moeplug_prepare_moe_sizes(
    args: *const moeplug_prepare_moe_args,
    out: *mut moeplug_prepare_moe_sizes_out,
) -> moeplug_status {
    status(guard("moeplug_prepare_moe_sizes", || {
        read_struct(args, "args")?;
        super::args::check_out_struct(out, "out")?;
        Err(not_yet("prepare_moe_sizes"))
    }))
}

/// Pad, re-order, shuffle and swizzle checkpoint weights for the target; writes the layout.
#[no_mangle]
pub unsafe extern "C" fn moeplug_prepare_moe(
    args: *const moeplug_prepare_moe_args,
    stream: *mut libc::c_void,
) -> moeplug_status {
    let _ = stream;
    status(guard("moeplug_prepare_moe", || {
        read_struct(args, "args")?;
        Err(not_yet("prepare_moe"))
    }))
}

symver!(
    moeplug_shuffle_weight,
    moeplug_shuffle_scale,
    moeplug_pad_weights,
    moeplug_swizzle_scale,
    moeplug_quantize_mx,
    moeplug_prepare_moe_sizes,
    moeplug_prepare_moe,
);
