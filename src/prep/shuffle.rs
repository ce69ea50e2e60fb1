//! AITER `shuffle_weight` (docs/layouts.md §2.1 F1, §2.2 F2) over host byte slices.
//!
//! Shapes are in storage elements (bytes for fp4x2). Both paths are a tile transpose; they
//! differ in the tile width (F1: 16 bytes or 32 int8 with use_int4; F2: `layout_k` elements)
//! and in F2's optional 16-row gate/up interleave. The shuffle is one [`Step`] ([`step`]).

use super::maps::f1_pack;
use super::steps::{run_host, RowMap, Step, Writer};
use crate::error::{Error, Result};
use crate::tensor::format_shape;

/// The knobs of AITER's `shuffle_weight`, defaults resolved (`layout` (16, 16)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffleWeightParams {
    pub layout_n: usize,
    pub layout_k: usize,
    pub use_int4: bool,
    pub is_guinterleave: bool,
    pub gate_up: bool,
    /// 0 = no K padding.
    pub pad_k_to: usize,
}

impl Default for ShuffleWeightParams {
    fn default() -> Self {
        ShuffleWeightParams {
            layout_n: 16,
            layout_k: 16,
            use_int4: false,
            is_guinterleave: false,
            gate_up: false,
            pad_k_to: 0,
        }
    }
}

/// A checked shuffle: geometry of one `shuffle_weight` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightShufflePlan {
    pub in_shape: Vec<usize>,
    pub out_shape: Vec<usize>,
    pub elem_size: usize,
    /// Matrices `[N, K]` in the leading dimensions.
    pub batch: usize,
    pub n: usize,
    pub k_in: usize,
    /// K after `pad_k_to` (storage elements).
    pub k_out: usize,
    /// Tile rows and tile width in bytes.
    pub tile_rows: usize,
    pub pack_bytes: usize,
    /// F2 gate_up: rows are re-ordered in `tile_rows` blocks g, u, g, u first.
    pub interleave_gate_up: bool,
}

/// Validate `shape` (storage elements of `elem_size` bytes) against `p` and describe the
/// shuffle. Errors are INVALID_ARGUMENT naming `name` (the tensor) or the parameter.
pub fn plan_shuffle_weight(
    name: &str,
    shape: &[usize],
    elem_size: usize,
    p: &ShuffleWeightParams,
) -> Result<WeightShufflePlan> {
    if !(elem_size == 1 || elem_size == 2) {
        crate::bail!(
            invalid,
            "{name}: element size must be 1 or 2 bytes, got {elem_size}"
        );
    }
    if p.layout_n == 0 || p.layout_k == 0 {
        crate::bail!(
            invalid,
            "layout: expected positive (layout_n, layout_k), got ({}, {})",
            p.layout_n,
            p.layout_k
        );
    }
    let nd = shape.len();
    if p.is_guinterleave {
        if nd != 3 {
            crate::bail!(
                invalid,
                "{name}: is_guinterleave needs a 3-D [E, N, K] tensor, got shape {}",
                format_shape(shape)
            );
        }
        if p.use_int4 {
            crate::bail!(invalid, "use_int4: cannot be combined with is_guinterleave");
        }
        if p.pad_k_to != 0 {
            crate::bail!(
                invalid,
                "pad_k_to: must be 0 with is_guinterleave, got {}",
                p.pad_k_to
            );
        }
    } else {
        if nd < 2 {
            crate::bail!(
                invalid,
                "{name}: expected at least 2 dimensions [..., N, K], got shape {}",
                format_shape(shape)
            );
        }
        if p.gate_up {
            crate::bail!(
                invalid,
                "gate_up: only meaningful with is_guinterleave (AITER ignores it otherwise)"
            );
        }
        if p.use_int4 && p.pad_k_to != 0 {
            crate::bail!(
                invalid,
                "pad_k_to: must be 0 with use_int4, got {}",
                p.pad_k_to
            );
        }
        if p.use_int4 && elem_size != 1 {
            crate::bail!(
                invalid,
                "{name}: use_int4 needs 1-byte (int8) elements, got {elem_size}-byte elements"
            );
        }
    }
    let n = shape[nd - 2];
    let k_in = shape[nd - 1];
    let batch: usize = shape[..nd - 2].iter().product();

    let (tile_rows, tile_elems, k_out) = if p.is_guinterleave {
        // F2: tiles of NL rows × KP elements; KL = 64 / NL only adds K % (KL·KP) == 0.
        let nl = p.layout_n;
        let kp = p.layout_k;
        if nl > 64 {
            crate::bail!(
                invalid,
                "layout_n: must be at most 64 with is_guinterleave (KLane = 64 / layout_n), got {nl}"
            );
        }
        let kl = 64 / nl;
        if k_in % (kl * kp) != 0 {
            crate::bail!(
                invalid,
                "{name}: K = {k_in} storage elements must be a multiple of {} \
                 ((64/layout_n)*layout_k)",
                kl * kp
            );
        }
        if p.gate_up {
            if n % (2 * nl) != 0 {
                crate::bail!(
                    invalid,
                    "{name}: N = {n} must be a multiple of {} (2*layout_n: gate and up halves \
                     of layout_n-row blocks)",
                    2 * nl
                );
            }
        } else if n % nl != 0 {
            crate::bail!(
                invalid,
                "{name}: N = {n} must be a multiple of {nl} (layout_n)"
            );
        }
        (nl, kp, k_in)
    } else {
        let bn = p.layout_n;
        let bk = 2 * p.layout_k;
        let pack = f1_pack(elem_size, p.use_int4);
        if bk % pack != 0 {
            crate::bail!(
                invalid,
                "layout_k: 2*layout_k = {bk} must be a multiple of the {pack}-element pack"
            );
        }
        let k_out = if p.pad_k_to > 0 {
            k_in.div_ceil(p.pad_k_to) * p.pad_k_to
        } else {
            k_in
        };
        if n % bn != 0 {
            crate::bail!(
                invalid,
                "{name}: N = {n} must be a multiple of {bn} (layout_n)"
            );
        }
        if k_out % bk != 0 {
            let what = if k_out != k_in {
                format!("K padded to {k_out} (pad_k_to {})", p.pad_k_to)
            } else {
                format!("K = {k_in}")
            };
            crate::bail!(
                invalid,
                "{name}: {what} storage elements must be a multiple of {bk} (2*layout_k)"
            );
        }
        (bn, pack, k_out)
    };
    let mut out_shape = shape.to_vec();
    out_shape[nd - 1] = k_out;
    Ok(WeightShufflePlan {
        in_shape: shape.to_vec(),
        out_shape,
        elem_size,
        batch,
        n,
        k_in,
        k_out,
        tile_rows,
        pack_bytes: tile_elems * elem_size,
        interleave_gate_up: p.is_guinterleave && p.gate_up,
    })
}

impl WeightShufflePlan {
    pub fn in_bytes(&self) -> usize {
        self.batch * self.n * self.k_in * self.elem_size
    }
    pub fn out_bytes(&self) -> usize {
        self.batch * self.n * self.k_out * self.elem_size
    }
}

/// Run a planned shuffle: `src` holds `plan.in_bytes()`, `dst` `plan.out_bytes()`.
pub fn shuffle_weight(plan: &WeightShufflePlan, src: &[u8], dst: &mut [u8]) -> Result<()> {
    if src.len() != plan.in_bytes() || dst.len() != plan.out_bytes() {
        return Err(Error::invalid(format!(
            "shuffle_weight: buffers of {} and {} bytes, expected {} and {}",
            src.len(),
            dst.len(),
            plan.in_bytes(),
            plan.out_bytes()
        )));
    }
    run_host(&step(plan), src, dst);
    Ok(())
}

/// The planned shuffle as a [`Step`] (what [`shuffle_weight`] and the device run).
pub fn step(plan: &WeightShufflePlan) -> Step {
    let map = if plan.interleave_gate_up {
        RowMap::interleave16_out(plan.batch, plan.n, plan.tile_rows)
    } else {
        RowMap::plain(plan.batch, plan.n, plan.n, plan.n)
    };
    Step {
        writer: Writer::Tile {
            row_bytes: plan.k_out * plan.elem_size,
            tile_rows: plan.tile_rows,
            pack: plan.pack_bytes,
        },
        map,
        src_row_bytes: plan.k_in * plan.elem_size,
        dst_bytes: plan.out_bytes(),
    }
}

/// Where `shuffle_weight` put source element (b, n, k): the storage offset (in elements) in
/// the output. The inverse map, for tests and readers of the layout.
pub fn shuffled_offset(plan: &WeightShufflePlan, b: usize, n: usize, k: usize) -> usize {
    let pack = plan.pack_bytes / plan.elem_size;
    let row = if plan.interleave_gate_up {
        // Inverse of the 16-row block interleave: logical row n → physical row.
        let (half, bl) = (plan.n / 2, plan.tile_rows);
        let (g, i) = (n / half, n % half);
        (i / bl) * 2 * bl + g * bl + i % bl
    } else {
        n
    };
    b * plan.n * plan.k_out + super::maps::f1_offset(row, k, plan.k_out, plan.tile_rows, pack)
}
