//! What an engine asks once at start-up (ABI 1.1, symbol version MOEPLUG_1.1): the resolved
//! configuration of a launch without M (`moeplug_resolve_config`), and the AITER `fused_moe`
//! keyword values of a layout record (`moeplug_aiter_args`).

use libc::c_char;

use super::args::{enum_or, out_struct_size, write_struct};
use super::moe::{read_config, read_record};
use super::panic::{guard, symver};
use super::status;
use super::types::*;
use crate::aiter;
use crate::backend;
use crate::tensor::DeviceKind;
use crate::types::Activation;

/// A NUL-terminated copy of `s` (the spellings are all shorter than the field).
fn text<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// The activation dtypes, activation parameters and layouts a launch of `args` on the device
/// will use, for any M: the launch check of `moeplug_check_fused_moe` (same statuses and
/// messages; tensors may be NULL, hidden_states only decides DEFAULT for 16-bit weights). A
/// CUDA or ROCm device whose runtime cannot be loaded is answered from the rules that backend
/// applies (its capability masks do not depend on the device). Written to `*out` (caller
/// sets `struct_size`) on success. ABI 1.1.
#[no_mangle]
pub unsafe extern "C" fn moeplug_resolve_config(
    device_type: i32,
    device_id: i32,
    args: *const moeplug_fused_moe_args,
    out: *mut moeplug_resolved_config,
) -> moeplug_status {
    status(guard("moeplug_resolve_config", || {
        let size = out_struct_size(out, "out")?;
        let device = DeviceKind::from_raw("device_type", device_type)?;
        let c = read_config(args)?;
        let backend = backend::check_offline(device, device_id, &c)?;
        let l = &c.layout;
        let resolved = moeplug_resolved_config {
            struct_size: 0, // set by write_struct
            backend: backend as i32,
            act_dtype: c.act_dtype as i32,
            act_dtype_stage2: c.stage2_act_dtype as i32,
            activation: c.activation as i32,
            alpha: c.alpha,
            limit: c.limit.unwrap_or(0.0),
            reserved0: 0,
            weight_format: l.weight_format as i32,
            gate_mode: l.gate_mode as i32,
            weight_layout: l.weight_layout as i32,
            scale_layout: l.scale_layout.map_or(0, |s| s as i32),
        };
        write_struct(out, &resolved, size);
        Ok(())
    }))
}

/// AITER's `fused_moe` keyword values for `record` (any target, AITER_TARGET or not) running
/// `activation` (0 → SILU): docs/aiter.md "Arguments". Written to `*out` (caller sets
/// `struct_size`) on success. ABI 1.1.
#[no_mangle]
pub unsafe extern "C" fn moeplug_aiter_args(
    record: *const moeplug_layout,
    activation: i32,
    out: *mut moeplug_aiter_args_out,
) -> moeplug_status {
    status(guard("moeplug_aiter_args", || {
        let size = out_struct_size(out, "out")?;
        let (prepared, _aiter) = read_record(record, "record")?;
        prepared.check_fingerprint()?;
        let activation = enum_or(activation, Activation::Silu, |v| {
            Activation::from_raw("activation", v)
        })?;
        let a = aiter::fused_moe_args(&prepared.layout, prepared.act_dtype, activation)?;
        write_struct(out, &spelled(&a), size);
        Ok(())
    }))
}

fn spelled(a: &aiter::FusedMoeArgs) -> moeplug_aiter_args_out {
    moeplug_aiter_args_out {
        struct_size: 0, // set by write_struct
        is_shuffled: a.is_shuffled as i32,
        scale_swizzled: a.scale_swizzled as i32,
        reserved0: 0,
        hidden_pad: a.hidden_pad,
        intermediate_pad: a.intermediate_pad,
        gate_mode: text(a.gate_mode),
        quant_type: text(a.quant_type),
        quant_type_a: text(a.quant_type_a),
        quant_dtype_a: text(a.quant_dtype_a),
        quant_dtype_a2: text(a.quant_dtype_a2),
        activation: text(a.activation),
    }
}

symver!(
    "MOEPLUG_1.1":
    moeplug_resolve_config,
    moeplug_aiter_args,
);
