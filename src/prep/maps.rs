//! The index maps of AITER's layouts, as pure functions from a logical position to a storage
//! offset. Writers (shuffles) and readers (the CPU kernels) both use these, so the two can
//! never disagree.

use crate::types::GateMode;

/// F1, canonical form (docs/layouts.md §2.1): `[N, K]` storage elements cut into tiles of `bn`
/// rows × `pack` elements (16 bytes; 32 int8 values with use_int4), tiles ordered row-block
/// major then column chunk, each tile row-major. Returns the storage offset of (n, k).
#[inline]
pub fn f1_offset(n: usize, k: usize, k_total: usize, bn: usize, pack: usize) -> usize {
    ((n / bn) * (k_total / pack) + k / pack) * (bn * pack) + (n % bn) * pack + k % pack
}

/// Elements per 16-byte pack of F1 for an element of `elem_size` bytes.
#[inline]
pub fn f1_pack(elem_size: usize, use_int4: bool) -> usize {
    if use_int4 {
        32
    } else {
        16 / elem_size
    }
}

/// F3 (docs/layouts.md §3.1): byte offset of scale (r, c) in the `[SM, SN]` e8m0 shuffle
/// (`SN` = columns rounded up to 8): 32×8 blocks of 256 bytes, row-group major.
#[inline]
pub fn f3_offset(r: usize, c: usize, sn: usize) -> usize {
    (r / 32) * (32 * sn)
        + (c / 8) * 256
        + (c % 4) * 64
        + (r % 16) * 4
        + ((c / 4) % 2) * 2
        + (r / 16) % 2
}

/// Row of a gate/up matrix after AITER's 16-row block interleave (INTERLEAVE gate mode):
/// physical row `p` of `[2H, K]` holds logical row (gate rows 0..H, then up rows H..2H).
#[inline]
pub fn interleave16_source_row(p: usize, half: usize, block: usize) -> usize {
    let (pair, within) = (p / (2 * block), p % (2 * block));
    let g = within / block;
    g * half + pair * block + within % block
}

/// Physical row of a checkpoint gate/up matrix (`[2·inter, K]` in gate mode `mode`) that
/// holds row `j` of half `g` (0 gate, 1 up).
#[inline]
pub fn w13_source_row(mode: GateMode, g: usize, j: usize, inter: usize) -> usize {
    match mode {
        GateMode::Separated => g * inter + j,
        GateMode::Interleave => (j / 16) * 32 + g * 16 + j % 16,
        GateMode::InterleaveRows => 2 * j + g,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f1_matches_the_worked_example() {
        // docs/layouts.md §2.1: byte dtype N=32, K=64.
        assert_eq!(f1_offset(0, 0, 64, 16, 16), 0);
        assert_eq!(f1_offset(1, 0, 64, 16, 16), 16);
        assert_eq!(f1_offset(15, 15, 64, 16, 16), 255);
        assert_eq!(f1_offset(0, 16, 64, 16, 16), 256);
        assert_eq!(f1_offset(15, 31, 64, 16, 16), 511);
        assert_eq!(f1_offset(0, 32, 64, 16, 16), 512);
        assert_eq!(f1_offset(16, 0, 64, 16, 16), 1024);
    }

    #[test]
    fn f3_matches_the_worked_example() {
        // docs/layouts.md §3.1: m=64, n=8.
        let inv = |o: usize| {
            (0..64)
                .flat_map(|r| (0..8).map(move |c| (r, c)))
                .find(|&(r, c)| f3_offset(r, c, 8) == o)
        };
        assert_eq!(inv(0), Some((0, 0)));
        assert_eq!(inv(1), Some((16, 0)));
        assert_eq!(inv(2), Some((0, 4)));
        assert_eq!(inv(3), Some((16, 4)));
        assert_eq!(inv(4), Some((1, 0)));
        assert_eq!(inv(64), Some((0, 1)));
        assert_eq!(inv(255), Some((31, 7)));
        assert_eq!(inv(256), Some((32, 0)));
    }

    #[test]
    fn interleave16_alternates_blocks() {
        let h = 32;
        assert_eq!(interleave16_source_row(0, h, 16), 0);
        assert_eq!(interleave16_source_row(16, h, 16), 32);
        assert_eq!(interleave16_source_row(32, h, 16), 16);
        assert_eq!(interleave16_source_row(63, h, 16), 63);
    }
}
