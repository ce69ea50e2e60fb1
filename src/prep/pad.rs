//! `pad_weights`: `[E, N, K]` → `[E, N', K']` with a fill value; with `gate_up` the gate and
//! up halves of the rows are padded separately (up rows start at N'/2), the row order every
//! AITER kernel expects of padded `w13`. Works for any element size (weights, e8m0 scales,
//! fp32 biases as `[E, N, 1]`).

use super::rows::write_rows;
use super::steps::{RowMap, Step, Writer};
use crate::error::Result;
use crate::tensor::format_shape;

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

/// Source row of padded output row `p` (within one expert), or None for a padding row.
#[inline]
pub fn padded_source_row(p: usize, n: usize, n_out: usize, gate_up: bool) -> Option<usize> {
    if gate_up {
        let (h, h_out) = (n / 2, n_out / 2);
        let (g, j) = (p / h_out, p % h_out);
        (j < h).then_some(g * h + j)
    } else {
        (p < n).then_some(p)
    }
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
    let [e, n, k] = src_shape;
    let [_, n_out, k_out] = dst_shape;
    let es = fill.len();
    assert_eq!(src.len(), e * n * k * es);
    assert_eq!(dst.len(), e * n_out * k_out * es);
    let row_in = k * es;
    let rows = |p: usize| {
        let (x, q) = (p / n_out.max(1), p % n_out.max(1));
        padded_source_row(q, n, n_out, gate_up).map(|r| {
            let start = (x * n + r) * row_in;
            &src[start..start + row_in]
        })
    };
    write_rows(dst, k_out * es, &rows, fill);
}

/// [`pad_weights`] as a [`Step`] (after [`plan_pad`]).
pub fn step(src_shape: [usize; 3], dst_shape: [usize; 3], gate_up: bool, fill: &[u8]) -> Step {
    let [e, n, k] = src_shape;
    let [_, n_out, k_out] = dst_shape;
    let es = fill.len();
    let map = if gate_up {
        RowMap {
            half_out: (n_out / 2) as u64,
            half_in: (n / 2) as u64,
            mode: RowMap::HALVES_SEPARATED,
            ..RowMap::plain(e, n_out.max(1), n, n)
        }
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
