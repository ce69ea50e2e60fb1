//! Layout fragments through the C ABI (docs/abi.md §8, ABI 1.1): the `out_fragment` each
//! primitive writes, and `moeplug_layout_from_fragments`, which assembles a sealed record
//! from them. The rules (what each call establishes, how fragments combine, what a record
//! needs) are the core's, in `crate::layout`.

use super::args::{non_null, out_struct_size, read_struct, write_struct};
use super::panic::{guard, symver};
use super::prep::layout_record;
use super::status;
use super::types::*;
use crate::error::{Error, Result};
use crate::layout::{Fragment, RawFragment};

/// Most fragments one assembly takes: far more than any preparation makes, few enough that
/// a wrong count fails before the array is read.
const MAX_FRAGMENTS: usize = 256;

fn to_c(f: &Fragment) -> moeplug_layout_fragment {
    let r = f.to_raw();
    moeplug_layout_fragment {
        struct_size: 0, // set by write_struct
        weight_format: r.weight_format,
        gate_mode: r.gate_mode,
        weight_layout: r.weight_layout,
        scale_layout: r.scale_layout,
        act_dtype: r.act_dtype,
        num_experts: r.sizes[0],
        hidden_size: r.sizes[1],
        intermediate_size: r.sizes[2],
        hidden_padded: r.sizes[3],
        intermediate_padded: r.sizes[4],
        has_bias: r.has_bias,
        reserved0: 0,
    }
}

/// # Safety
/// `ptr` is NULL or a readable `moeplug_layout_fragment` of `struct_size` bytes.
unsafe fn read_fragment(ptr: *const moeplug_layout_fragment, name: &str) -> Result<Fragment> {
    let f = read_struct(ptr, name)?;
    Fragment::from_raw(
        name,
        RawFragment {
            weight_format: f.weight_format,
            gate_mode: f.gate_mode,
            weight_layout: f.weight_layout,
            scale_layout: f.scale_layout,
            act_dtype: f.act_dtype,
            sizes: [
                f.num_experts,
                f.hidden_size,
                f.intermediate_size,
                f.hidden_padded,
                f.intermediate_padded,
            ],
            has_bias: f.has_bias,
            reserved0: f.reserved0,
        },
    )
}

/// A primitive's optional `out_fragment` (NULL: a 1.0 caller's struct reads it as NULL),
/// checked before the call does any work and written once the work is done (or queued).
pub(crate) struct OutFragment {
    ptr: *mut moeplug_layout_fragment,
    size: usize,
}

impl OutFragment {
    /// # Safety
    /// `ptr` is NULL or points to a fragment of at least `struct_size` bytes.
    pub(crate) unsafe fn new(ptr: *mut moeplug_layout_fragment) -> Result<OutFragment> {
        let size = if ptr.is_null() {
            0
        } else {
            out_struct_size(ptr, "out_fragment")?
        };
        Ok(OutFragment { ptr, size })
    }

    /// Write what the call established (nothing when NULL).
    ///
    /// # Safety
    /// As [`OutFragment::new`]; call it on success only.
    pub(crate) unsafe fn write(self, f: &Fragment) {
        if !self.ptr.is_null() {
            write_struct(self.ptr, &to_c(f), self.size);
        }
    }
}

/// Assemble the layout record of weights prepared with the primitives: `fragments` holds
/// `num_fragments` (1 to 256) pointers, each to a fragment a primitive wrote through its
/// `out_fragment` or one the caller filled for what no primitive establishes (an fp8
/// `weight_format`, biases, `act_dtype`, sizes it did not pad). Two fragments that set a
/// field differently are INVALID_ARGUMENT naming both (`fragments[2].hidden_padded: 576, but
/// fragments[0] established 512 ...`); a field a record needs that no fragment sets is
/// INVALID_ARGUMENT naming it. On success `*out_layout` (caller sets `struct_size`) is the
/// record, sealed in `prep_fingerprint`: a launch refuses it with LAYOUT_MISMATCH naming the
/// field once a field is edited. ABI 1.1.
#[no_mangle]
pub unsafe extern "C" fn moeplug_layout_from_fragments(
    fragments: *const *const moeplug_layout_fragment,
    num_fragments: usize,
    out_layout: *mut moeplug_layout,
) -> moeplug_status {
    status(guard("moeplug_layout_from_fragments", || {
        let size = out_struct_size(out_layout, "out_layout")?;
        if !(1..=MAX_FRAGMENTS).contains(&num_fragments) {
            return Err(Error::invalid(format!(
                "num_fragments: expected 1 to {MAX_FRAGMENTS}, got {num_fragments}"
            )));
        }
        let fragments = non_null(fragments, "fragments")?;
        let mut parts = Vec::with_capacity(num_fragments);
        for i in 0..num_fragments {
            let ptr = std::ptr::read_unaligned(fragments.add(i));
            parts.push(read_fragment(ptr, &format!("fragments[{i}]"))?);
        }
        let merged = Fragment::assemble(&parts)?;
        let layout = merged.record()?;
        // The primitives lay weights out for moeplug's kernels: never an AITER target.
        write_struct(out_layout, &layout_record(&layout, &merged, false), size);
        Ok(())
    }))
}

symver!("MOEPLUG_1.1": moeplug_layout_from_fragments);
