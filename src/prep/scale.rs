//! AITER `shuffle_scale` / `e8m0_shuffle` (docs/layouts.md §3.1 F3, §3.2 F4) over host bytes.
//!
//! Padding bytes: F3 pads rows to 256 and columns to 8 where AITER leaves `torch.empty`
//! garbage; moeplug writes 0x00 there (deterministic; e8m0 0x00 = 2^-127). F4 pads columns
//! with 0x7F (e8m0 1.0) exactly as AITER does, and has no row padding. Each shuffle is one
//! [`Step`] ([`f3_step`], [`gui_step`]).

use super::steps::{run_host, RowMap, Step, Writer};
use crate::error::Result;

/// Byte written into F3's padding rows and columns.
pub const F3_PAD: u8 = 0x00;
/// Byte AITER writes into F4's padding columns (e8m0 1.0).
pub const F4_PAD: u8 = 0x7F;

/// Output shape of F3 for a `[m, n]` scale: `[⌈m/256⌉·256, ⌈n/8⌉·8]`.
pub fn f3_shape(m: usize, n: usize) -> [usize; 2] {
    [m.div_ceil(256) * 256, n.div_ceil(8) * 8]
}

/// F3: `src` `[m, n]` bytes → `dst` of [`f3_shape`].
pub fn shuffle_scale(src: &[u8], m: usize, n: usize, dst: &mut [u8]) {
    run_host(&f3_step(m, n), src, dst);
}

/// Check the F4 (`is_guinterleave`) arguments and return the output shape `[m, ⌈n/8⌉·8]`.
pub fn plan_shuffle_scale_gui(
    name: &str,
    m: usize,
    n: usize,
    num_experts: usize,
) -> Result<[usize; 2]> {
    if num_experts == 0 {
        crate::bail!(
            invalid,
            "num_experts: required (> 0) with is_guinterleave, got 0"
        );
    }
    if m % num_experts != 0 {
        crate::bail!(
            invalid,
            "{name}: {m} rows are not a whole number of rows per expert for num_experts = {num_experts}"
        );
    }
    let per_expert = m / num_experts;
    if per_expert % 32 != 0 {
        crate::bail!(
            invalid,
            "{name}: rows per expert N = {per_expert} must be a multiple of 32 with is_guinterleave"
        );
    }
    Ok([m, n.div_ceil(8) * 8])
}

/// F4: `src` `[E·N, n]` → `dst` `[E·N, ⌈n/8⌉·8]`; with `gate_up` each expert's rows are first
/// interleaved in 16-row blocks (gate rows 0..N/2, up rows N/2..N). Call
/// [`plan_shuffle_scale_gui`] first.
pub fn shuffle_scale_gui(
    src: &[u8],
    m: usize,
    n: usize,
    num_experts: usize,
    gate_up: bool,
    dst: &mut [u8],
) {
    run_host(&gui_step(m, n, num_experts, gate_up), src, dst);
}

/// [`shuffle_scale`] as a [`Step`].
pub fn f3_step(m: usize, n: usize) -> Step {
    let [sm, sn] = f3_shape(m, n);
    Step {
        writer: Writer::F3 {
            sn,
            col_pad: F3_PAD,
            row_pad: F3_PAD,
        },
        map: RowMap::plain(1, sm.max(1), m, m),
        src_row_bytes: n,
        dst_bytes: sm * sn,
    }
}

/// [`shuffle_scale_gui`] as a [`Step`] (after [`plan_shuffle_scale_gui`]).
pub fn gui_step(m: usize, n: usize, num_experts: usize, gate_up: bool) -> Step {
    let per_expert = m / num_experts;
    let sn = n.div_ceil(8) * 8;
    let map = if gate_up {
        RowMap::interleave16_out(num_experts, per_expert, 16)
    } else {
        RowMap::plain(num_experts, per_expert, per_expert, per_expert)
    };
    Step {
        writer: Writer::F3 {
            sn,
            col_pad: F4_PAD,
            row_pad: F4_PAD,
        },
        map,
        src_row_bytes: n,
        dst_bytes: m * sn,
    }
}
