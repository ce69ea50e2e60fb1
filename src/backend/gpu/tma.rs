//! Tensor maps (TMA descriptors) of the wgmma family's weight tiles. AITER 16x16 weights
//! (16-byte chunk c of row r at group (r / 16), chunk c, row r % 16) are described as a 5-D
//! tensor of bytes: (byte of a group's chunk column: its 16 rows x 16 bytes, contiguous; a
//! dimension of 1; group; gate/up half; chunk along K). A box of one K step then lands in
//! shared memory as [chunk][row][16 bytes]: the core-matrix layout without swizzle that
//! `wgmma_desc_plain` (kernels/mma_sm90.cuh) reads, gate rows first, then the up rows of the
//! same columns (stage 1).
//!
//! Why the innermost dimension is 256 bytes: the TMA asks the L2 for each innermost row of a
//! box separately. With (16 bytes, 16 rows) as two dimensions every request was 16 bytes,
//! and ncu on the H200 counted 126 M L2 requests for Qwen3's stage 1 at M = 4096 (1.3
//! sectors each, the L2's tag lookups at 91 % of peak) against 10 M for the peer's kernel
//! (bench/NOTES.md, session 11). The second dimension (1) keeps the kernel's 5-D copy.

use std::ffi::c_void;

use crate::error::{Error, Result};
use crate::types::GateMode;

use super::driver::Api;

/// A `CUtensorMap`: 128 opaque bytes, 64-byte aligned, passed to the kernel by value.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct TensorMap(pub [u64; 16]);

/// The weights of one stage as the kernel's TMA reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightTensor {
    pub address: u64,
    pub experts: usize,
    /// Stored rows per expert (stage 1: 2 * intermediate_padded; stage 2: hidden_padded).
    pub rows: usize,
    /// Bytes of one stored row (the padded K times the element size).
    pub row_bytes: usize,
    /// Bytes of a row that are real columns (the logical K times the element size): the map
    /// ends there, so a box's chunks past it are zero-filled, not read (the padding's content
    /// is undefined: API.md, "padded rows and columns are skipped").
    pub k_bytes: usize,
    /// Stage 1: `Some(gate mode, intermediate_padded)`, the rows come as gate/up halves.
    pub gated: Option<(GateMode, usize)>,
    /// Weight rows of one box: one warpgroup's MMA rows (`wgmma_n`; stage 1: half gate, half
    /// up). A block of two warpgroups with rows of their own (64-row tiles) copies two boxes.
    pub box_rows: usize,
}

/// The sizes of a launch that its two tensor maps describe.
#[derive(Debug, Clone, Copy)]
pub struct StageShapes {
    pub experts: usize,
    pub hidden: usize,
    pub hidden_padded: usize,
    pub intermediate: usize,
    pub intermediate_padded: usize,
    /// Bytes of one weight element.
    pub elem_bytes: usize,
    pub gate_mode: GateMode,
}

/// The stage-1 (w13) and stage-2 (w2) weights at `addresses` as the kernel's TMA reads them,
/// in boxes of `box_rows` rows.
pub fn stage_weights(s: &StageShapes, addresses: [u64; 2], box_rows: usize) -> [WeightTensor; 2] {
    let b = s.elem_bytes;
    [
        WeightTensor {
            address: addresses[0],
            experts: s.experts,
            rows: 2 * s.intermediate_padded,
            row_bytes: s.hidden_padded * b,
            k_bytes: s.hidden * b,
            gated: Some((s.gate_mode, s.intermediate_padded)),
            box_rows,
        },
        WeightTensor {
            address: addresses[1],
            experts: s.experts,
            rows: s.hidden_padded,
            row_bytes: s.intermediate_padded * b,
            k_bytes: s.intermediate * b,
            gated: None,
            box_rows,
        },
    ]
}

/// Bytes of K one box covers (one 128-byte operand row per wgmma step).
const K_STEP_BYTES: usize = 128;
/// Bytes of one 16-byte chunk column of a 16-row group (contiguous in AITER 16x16): the map's
/// innermost dimension, the most a box row may hold (256 elements of one byte).
const GROUP_CHUNK_BYTES: usize = 16 * 16;

/// globalDim, globalStrides (dims 1..4, bytes) and boxDim of the map, innermost first.
pub fn geometry(w: &WeightTensor) -> Result<([u64; 5], [u64; 4], [u32; 5])> {
    let wrow = w.row_bytes as u64;
    let chunks = w.k_bytes / 16;
    if w.row_bytes % 16 != 0 || w.k_bytes % 16 != 0 || w.k_bytes > w.row_bytes {
        return Err(Error::internal(
            "TMA weights: rows or their real columns are not whole 16-byte chunks",
        ));
    }
    let (groups, group_stride, halves, half_stride, box_groups) = match w.gated {
        // A gate group g is read with its up group g + ip / 16 (the half stride): g stops one
        // half before the end, so no in-bounds coordinate addresses past the tensor. A block
        // whose rows pass the last expert's gate half (ip not a multiple of its half rows)
        // gets those rows zero-filled, not read from past the allocation.
        Some((GateMode::Separated, ip)) => (
            (w.experts * w.rows - ip) / 16,
            16 * wrow,
            2,
            ip as u64 * wrow,
            w.box_rows / 32,
        ),
        // 16 gate rows, then the 16 up rows of the same columns: a group is a pair.
        Some((GateMode::Interleave, _)) => (
            w.experts * w.rows / 32,
            32 * wrow,
            2,
            16 * wrow,
            w.box_rows / 32,
        ),
        Some(_) => return Err(Error::internal("TMA weights: gate mode not covered")),
        None => (
            w.experts * w.rows / 16,
            16 * wrow,
            1,
            16 * wrow,
            w.box_rows / 16,
        ),
    };
    let dims = [
        GROUP_CHUNK_BYTES as u64,
        1,
        groups as u64,
        halves,
        chunks as u64,
    ];
    let strides = [GROUP_CHUNK_BYTES as u64, group_stride, half_stride, 256];
    let boxes = [
        GROUP_CHUNK_BYTES as u32,
        1,
        box_groups as u32,
        halves as u32,
        (K_STEP_BYTES / 16) as u32,
    ];
    Ok((dims, strides, boxes))
}

/// Encode the map of `w` with the driver.
pub fn weight_map(api: &Api, w: &WeightTensor) -> Result<TensorMap> {
    let Some(encode) = api.cuTensorMapEncodeTiled else {
        return Err(Error::unavailable(
            "the driver has no cuTensorMapEncodeTiled (TMA weight tiles)",
        ));
    };
    let (dims, strides, boxes) = geometry(w)?;
    let ones = [1u32; 5];
    let mut map = TensorMap([0; 16]);
    const UINT8: i32 = 0; // CU_TENSOR_MAP_DATA_TYPE_UINT8
    const NONE: i32 = 0; // no interleave, no swizzle, zero fill out of bounds
    const L2_PROMOTE_128B: i32 = 2;
    // SAFETY: `encode` is cuTensorMapEncodeTiled; every array holds `rank` (strides rank - 1)
    // entries and `map` is 64-byte aligned and 128 bytes.
    let code = unsafe {
        encode(
            &mut map as *mut TensorMap as *mut c_void,
            UINT8,
            5,
            w.address as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            ones.as_ptr(),
            NONE,
            NONE,
            L2_PROMOTE_128B,
            NONE,
        )
    };
    api.check(code, "cuTensorMapEncodeTiled(wgmma weights)")?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3_stage1(gate: GateMode) -> WeightTensor {
        WeightTensor {
            address: 0,
            experts: 128,
            rows: 2 * 768,
            row_bytes: 2048 * 2,
            k_bytes: 2048 * 2,
            gated: Some((gate, 768)),
            box_rows: 128,
        }
    }

    #[test]
    fn separated_gate_and_up_halves_are_intermediate_padded_rows_apart() {
        let (dims, strides, boxes) = geometry(&qwen3_stage1(GateMode::Separated)).unwrap();
        assert_eq!(dims, [256, 1, (128 * 1536 - 768) / 16, 2, 4096 / 16]);
        assert_eq!(strides, [256, 16 * 4096, 768 * 4096, 256]);
        // 64 gate rows (4 groups) and their 64 up rows, one 128-byte K step.
        assert_eq!(boxes, [256, 1, 4, 2, 8]);
    }

    #[test]
    fn interleaved_groups_pair_gate_and_up() {
        let (dims, strides, boxes) = geometry(&qwen3_stage1(GateMode::Interleave)).unwrap();
        assert_eq!(dims[2], 128 * 1536 / 32);
        assert_eq!(strides, [256, 32 * 4096, 16 * 4096, 256]);
        assert_eq!(boxes, [256, 1, 4, 2, 8]);
    }

    #[test]
    fn stage2_has_one_half() {
        let w = WeightTensor {
            address: 0,
            experts: 128,
            rows: 2048,
            row_bytes: 768 * 2,
            k_bytes: 768 * 2,
            gated: None,
            box_rows: 128,
        };
        let (dims, strides, boxes) = geometry(&w).unwrap();
        assert_eq!(dims, [256, 1, 128 * 2048 / 16, 1, 768 * 2 / 16]);
        assert_eq!(strides[1], 16 * 768 * 2);
        assert_eq!(boxes, [256, 1, 8, 1, 8]);
    }

    /// The largest byte offset any in-bounds coordinate of the map reaches.
    fn last_byte(w: &WeightTensor) -> u64 {
        let (dims, strides, _) = geometry(w).unwrap();
        let strides = [1, strides[0], strides[1], strides[2], strides[3]];
        dims.iter().zip(strides).map(|(d, s)| (d - 1) * s).sum()
    }

    #[test]
    fn no_coordinate_in_bounds_addresses_past_the_tensor() {
        // ip = 160: the last 64-row block of a gate half passes it (the H200's memcheck found
        // the separated map reading past the w13 allocation there).
        for (ip, hp, k_bytes) in [
            (160usize, 320usize, 320usize),
            (768, 2048, 4096),
            (256, 512, 448),
        ] {
            for gated in [
                Some((GateMode::Separated, ip)),
                Some((GateMode::Interleave, ip)),
                None,
            ] {
                let rows = if gated.is_some() { 2 * ip } else { hp };
                let w = WeightTensor {
                    address: 0,
                    experts: 8,
                    rows,
                    row_bytes: k_bytes.next_multiple_of(128),
                    k_bytes,
                    gated,
                    box_rows: 128,
                };
                let size = (w.experts * w.rows * w.row_bytes) as u64;
                assert!(
                    last_byte(&w) < size,
                    "{gated:?} ip={ip}: {} of {size}",
                    last_byte(&w)
                );
            }
        }
    }

    #[test]
    fn every_gate_group_of_every_expert_is_in_bounds() {
        let w = qwen3_stage1(GateMode::Separated);
        let (dims, _, _) = geometry(&w).unwrap();
        // The last expert's last gate group: (E - 1) * 2 ip / 16 + ip / 16 - 1.
        assert_eq!(dims[2], (127 * 1536 / 16 + 768 / 16 - 1) + 1);
    }

    #[test]
    fn the_map_ends_at_the_real_columns_of_a_padded_k() {
        // 224 real fp8 columns of 256 stored: 14 chunks in the map, rows still 256 bytes apart.
        let w = WeightTensor {
            address: 0,
            experts: 4,
            rows: 512,
            row_bytes: 256,
            k_bytes: 224,
            gated: None,
            box_rows: 128,
        };
        let (dims, strides, _) = geometry(&w).unwrap();
        assert_eq!(dims[4], 14);
        assert_eq!(strides[1], 16 * 256);
        let odd = WeightTensor { k_bytes: 232, ..w };
        assert!(geometry(&odd).is_err());
    }
}
