//! `pad_weights`: `[E, N, K]` → `[E, N', K']` with a fill value; with `gate_up` the gate and
//! up halves of the rows are padded separately (up rows start at N'/2), the row order every
//! AITER kernel expects of padded `w13`. Works for any element size (weights, e8m0 scales,
//! fp32 biases as `[E, N, 1]`). The padding is one [`Step`] ([`step`]).

use super::steps::{run_host, RowMap, Step, Writer};
use crate::error::Result;
use crate::tensor::format_shape;
use crate::types::GateMode;

/// Check a padding of `[e, n, k]` to `[e, n_out, k_out]`.
pub fn plan_pad(src_shape: [usize; 3], dst_shape: [usize; 3], gate_up: bool) -> Result<()> {
    let [e, n, k] = src_shape;
    let [e2, n2, k2] = dst_shape;
    let (s, d) = (format_shape(&src_shape), format_shape(&dst_shape));
    if e2 != e {
        crate::bail!(
            invalid,
            "dst: expected {e} experts like src {s}, got shape {d}"
        );
    }
    if n2 < n || k2 < k {
        crate::bail!(
            invalid,
            "dst: shape {d} must be at least src shape {s} in every dimension"
        );
    }
    if gate_up && (n % 2 != 0 || n2 % 2 != 0) {
        crate::bail!(
            invalid,
            "gate_up: rows of src ({n}) and dst ({n2}) must both be even (gate and up halves)"
        );
    }
    Ok(())
}

/// Pad `src` `[e, n, k]` (elements of `fill.len()` bytes) into `dst` `[e, n_out, k_out]`.
/// Call [`plan_pad`] first.
pub fn pad_weights(
    src: &[u8],
    src_shape: [usize; 3],
    dst: &mut [u8],
    dst_shape: [usize; 3],
    gate_up: bool,
    fill: &[u8],
) {
    run_host(&step(src_shape, dst_shape, gate_up, fill), src, dst);
}

/// [`pad_weights`] as a [`Step`] (after [`plan_pad`]).
pub fn step(src_shape: [usize; 3], dst_shape: [usize; 3], gate_up: bool, fill: &[u8]) -> Step {
    let [e, n, k] = src_shape;
    let [_, n_out, k_out] = dst_shape;
    let es = fill.len();
    let map = if gate_up {
        RowMap::gate_up(e, n / 2, n_out / 2, GateMode::Separated)
    } else {
        RowMap::plain(e, n_out.max(1), n, n)
    };
    Step {
        writer: Writer::rows(k_out * es, fill),
        map,
        src_row_bytes: k * es,
        dst_bytes: e * n_out * k_out * es,
    }
}
