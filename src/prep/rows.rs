//! The three writers every preparation step is built from. All read the source through a
//! "row source": physical output row `p` → the bytes of the source row that lands there
//! (`None` = a padding row). A source row shorter than the output row is padded. This way
//! re-ordering gate/up rows and padding happen while writing the layout, in one pass.

use super::maps::f3_offset;
use super::parallel::parallel_chunks;

/// Physical output row → source row bytes, or `None` for a padding row.
pub type RowSource<'a> = dyn Fn(usize) -> Option<&'a [u8]> + Sync + 'a;

/// Plain row-major rows of `row_bytes` bytes; missing bytes (short or absent source rows)
/// are filled with the repeating `fill` pattern (one element's bytes).
pub fn write_rows(dst: &mut [u8], row_bytes: usize, rows: &RowSource<'_>, fill: &[u8]) {
    if row_bytes == 0 || dst.is_empty() {
        return;
    }
    debug_assert!(fill.is_empty() || row_bytes % fill.len() == 0);
    parallel_chunks(dst, row_bytes, |first, chunk| {
        for (i, out) in chunk.chunks_exact_mut(row_bytes).enumerate() {
            let src = rows(first + i).unwrap_or(&[]);
            let n = src.len().min(row_bytes);
            out[..n].copy_from_slice(&src[..n]);
            fill_pattern(&mut out[n..], n, fill);
        }
    });
}

/// Fill `out` with `fill` repeated, where `out` starts at byte `offset` of the pattern's
/// period (so element boundaries stay aligned).
fn fill_pattern(out: &mut [u8], offset: usize, fill: &[u8]) {
    if fill.iter().all(|&b| b == 0) {
        out.fill(0);
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = fill[(offset + i) % fill.len()];
    }
}

/// AITER's weight tile transpose (F1 canonical form, docs/layouts.md §2.1, which F2 reduces to):
/// rows of `row_bytes` bytes cut into tiles of `tile_rows` rows × `pack` bytes; tiles in
/// row-block-major then column-chunk order, each tile row-major. Missing source bytes are 0.
/// `dst.len()` must be a multiple of `tile_rows · row_bytes`, `row_bytes` of `pack`.
pub fn tile_transpose(
    dst: &mut [u8],
    row_bytes: usize,
    tile_rows: usize,
    pack: usize,
    rows: &RowSource<'_>,
) {
    if dst.is_empty() {
        return;
    }
    let block = tile_rows * row_bytes;
    assert!(row_bytes % pack == 0 && dst.len() % block == 0);
    parallel_chunks(dst, block, |first_block, chunk| {
        // One row block at a time: its source rows fetched once, then written column chunk
        // by column chunk (the output is sequential, the reads are `tile_rows` streams).
        let mut src_rows: Vec<&[u8]> = Vec::with_capacity(tile_rows);
        for (bi, out) in chunk.chunks_exact_mut(block).enumerate() {
            let row0 = (first_block + bi) * tile_rows;
            src_rows.clear();
            src_rows.extend((0..tile_rows).map(|r| rows(row0 + r).unwrap_or(&[])));
            match pack {
                16 => transpose_block::<16>(out, &src_rows, row_bytes),
                32 => transpose_block::<32>(out, &src_rows, row_bytes),
                _ => transpose_block_any(out, &src_rows, row_bytes, pack),
            }
        }
    });
}

/// One row block with a compile-time pack size (the hot path: 16 bytes).
fn transpose_block<const P: usize>(out: &mut [u8], src_rows: &[&[u8]], row_bytes: usize) {
    let tile_rows = src_rows.len();
    for (c, tile) in out.chunks_exact_mut(tile_rows * P).enumerate() {
        let col = c * P;
        for (piece, row) in tile.chunks_exact_mut(P).zip(src_rows) {
            match row.get(col..col + P) {
                Some(s) => {
                    let s: &[u8; P] = s.try_into().unwrap();
                    let d: &mut [u8; P] = piece.try_into().unwrap();
                    *d = *s;
                }
                None => copy_partial(piece, row, col),
            }
        }
    }
    debug_assert_eq!(out.len(), tile_rows * row_bytes);
}

fn transpose_block_any(out: &mut [u8], src_rows: &[&[u8]], row_bytes: usize, pack: usize) {
    let tile_rows = src_rows.len();
    for (c, tile) in out.chunks_exact_mut(tile_rows * pack).enumerate() {
        for (piece, row) in tile.chunks_exact_mut(pack).zip(src_rows) {
            copy_partial(piece, row, c * pack);
        }
    }
    debug_assert_eq!(out.len(), tile_rows * row_bytes);
}

/// `piece` = row[col..col + len], zero where the row ends.
fn copy_partial(piece: &mut [u8], row: &[u8], col: usize) {
    let avail = row.len().saturating_sub(col).min(piece.len());
    if avail > 0 {
        piece[..avail].copy_from_slice(&row[col..col + avail]);
    }
    piece[avail..].fill(0);
}

/// AITER's e8m0 scale shuffle (F3, docs/layouts.md §3.1) of a byte matrix of `sn` columns:
/// `dst` holds `dst.len() / sn` rows (a multiple of 32) in 32×8 blocks of 256 bytes.
/// Columns a source row lacks get `col_pad`, padding rows (`None`) get `row_pad`.
pub fn f3_shuffle(dst: &mut [u8], sn: usize, rows: &RowSource<'_>, col_pad: u8, row_pad: u8) {
    if dst.is_empty() {
        return;
    }
    let group = 32 * sn;
    assert!(sn % 8 == 0 && dst.len() % group == 0);
    parallel_chunks(dst, group, |first_group, chunk| {
        let mut src_rows: [Option<&[u8]>; 32] = [None; 32];
        for (gi, out) in chunk.chunks_exact_mut(group).enumerate() {
            let row0 = (first_group + gi) * 32;
            for (r, slot) in src_rows.iter_mut().enumerate() {
                *slot = rows(row0 + r);
            }
            for (c0, block) in out.chunks_exact_mut(256).enumerate() {
                f3_block(block, &src_rows, c0 * 8, col_pad, row_pad);
            }
        }
    });
}

/// One 32-row × 8-column block of F3 (256 bytes). In-block byte (cl·64 + rl·4 + ch·2 + rh)
/// holds (row rh·16 + rl, column c + ch·4 + cl), so each 4-byte word takes two columns of two
/// rows 16 apart: built from whole 8-byte row pieces when all 32 rows are complete.
fn f3_block(block: &mut [u8], src_rows: &[Option<&[u8]>; 32], c: usize, col_pad: u8, row_pad: u8) {
    let full = src_rows.iter().all(|r| r.is_some_and(|r| r.len() >= c + 8));
    if full {
        let mut piece = [0u64; 32];
        for (p, r) in piece.iter_mut().zip(src_rows) {
            let r = r.unwrap();
            *p = u64::from_le_bytes(r[c..c + 8].try_into().unwrap());
        }
        let byte = |v: u64, i: usize| (v >> (8 * i)) as u8;
        for cl in 0..4 {
            for rl in 0..16 {
                let (lo, hi) = (piece[rl], piece[16 + rl]);
                let o = cl * 64 + rl * 4;
                block[o..o + 4].copy_from_slice(&[
                    byte(lo, cl),
                    byte(hi, cl),
                    byte(lo, 4 + cl),
                    byte(hi, 4 + cl),
                ]);
            }
        }
        return;
    }
    for (r, src) in src_rows.iter().enumerate() {
        for cc in 0..8 {
            let v = match src {
                Some(s) => s.get(c + cc).copied().unwrap_or(col_pad),
                None => row_pad,
            };
            block[f3_offset(r, cc, 8)] = v;
        }
    }
}
