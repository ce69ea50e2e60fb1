//! int4 preparation. INT4_GROUP32 (AITER a16wi4): `pack_int8_to_packed_int4` and the
//! `shuffle_scale_for_int4` scale layout (aiter/ops/shuffle.py @e4048607). INT4_PER_CHANNEL
//! (AITER a8w4 int4, Quark int4-fp8): the uint32 words of `convert_int8_to_uint32_int4` +
//! `rearrange_4bit_elements` (aiter/int4_utils.py); its fp32 row scales are prepared like
//! FP8_PER_CHANNEL's.
//!
//! AITER prepares a16wi4 weights as `pack_int8_to_packed_int4(shuffle_weight(w_i8, (16, 16)))`.
//! F1 on int8 moves whole 16-value packs and the pack works on 8-value runs, so the two
//! commute: the result is F1 over the *packed* bytes with 8-byte packs. moeplug's plain int4
//! storage is therefore the pack of the unshuffled values, and every int4 layout step is an
//! ordinary [`Writer::Tile`] (the device runs it too); only int8-held checkpoints need
//! [`pack_int8_to_packed_int4`] first.

use super::steps::{RowMap, Step, Writer};
use crate::moe::check::{F1_ROWS, INT4_F1_PACK_BYTES, INT4_GROUP};

/// AITER `pack_int8_to_packed_int4`: each run of 8 values v0..v7 (low 4 bits kept) → 4 bytes
/// `(v[j+4] << 4) | v[j]`, j = 0..3. `src.len()` is a multiple of 8; `dst` half as long.
pub fn pack_int8_to_packed_int4(src: &[u8], dst: &mut [u8]) {
    assert!(src.len() % 8 == 0 && dst.len() * 2 == src.len());
    for (out, v) in dst.chunks_exact_mut(4).zip(src.chunks_exact(8)) {
        for j in 0..4 {
            out[j] = (v[j] & 0xF) | (v[j + 4] << 4);
        }
    }
}

/// The nibble (0 = lowest) of an INT4_PER_CHANNEL uint32 word that holds value j of its run
/// of 8 along K: AITER's `rearrange_4bit_elements` of `convert_int8_to_uint32_int4` puts
/// values [0, 2, 4, 6, 1, 3, 5, 7] in nibbles 0..7 (tests/golden/aiter_int4_per_channel.json).
pub const A8W4_NIBBLE_OF_VALUE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// AITER's a8w4 int4 words from int8-held values: each run of 8 values (low 4 bits kept) →
/// one little-endian uint32, value j in nibble [`A8W4_NIBBLE_OF_VALUE`]`[j]`. `src.len()` is
/// a multiple of 8; `dst` half as long.
pub fn pack_int8_to_a8w4_words(src: &[u8], dst: &mut [u8]) {
    assert!(src.len() % 8 == 0 && dst.len() * 2 == src.len());
    for (out, v) in dst.chunks_exact_mut(4).zip(src.chunks_exact(8)) {
        let mut word = 0u32;
        for (j, &x) in v.iter().enumerate() {
            word |= ((x & 0xF) as u32) << (4 * A8W4_NIBBLE_OF_VALUE[j]);
        }
        out.copy_from_slice(&word.to_le_bytes());
    }
}

/// What AITER's a8w4 int4 layout needs of K (values): `shuffle_weight(.., use_int4=True)`
/// tiles the int8-held values 32 wide (one 16-byte pack of words once packed).
pub const PER_CHANNEL_K_ALIGN: usize = 32;

/// The int4 values an int8-held checkpoint may hold: AITER's quantizer writes [-7, 7],
/// its pack keeps any signed nibble.
pub const INT4_MIN: i8 = -8;
pub const INT4_MAX: i8 = 7;

/// The first int8 outside [-8, 7], as (index, value).
pub fn first_out_of_range(src: &[u8]) -> Option<(usize, i8)> {
    src.iter()
        .map(|&b| b as i8)
        .enumerate()
        .find(|&(_, v)| !(INT4_MIN..=INT4_MAX).contains(&v))
}

/// F1 (16, 16) of packed int4 rows (`pack_int8_to_packed_int4` ∘ `shuffle_weight`): tiles of
/// 16 rows × 8 bytes over rows of `row_bytes` (K/2) bytes.
pub fn weight_writer(row_bytes: usize) -> Writer {
    Writer::Tile {
        row_bytes,
        tile_rows: F1_ROWS,
        pack: INT4_F1_PACK_BYTES,
    }
}

/// Bytes of one bf16 scale.
pub const SCALE_BYTES: usize = 2;

/// `shuffle_scale_for_int4` from row-major scales: source rows are the bf16 scales of one
/// weight row (`groups_in` of them, through `map`), output per expert `[groups/2, rows, 2]`
/// with `rows` = `map.group_rows`. With the two scales of a group pair as one 4-byte element
/// this is a transpose of each expert's `[rows, groups/2]`, i.e. F1 with one tile per expert
/// and 4-byte packs. Padding rows and groups are zero.
pub fn scale_step(map: RowMap, groups_in: usize, groups: usize) -> Step {
    debug_assert!(groups % 2 == 0);
    let rows = map.group_rows as usize;
    Step {
        writer: Writer::Tile {
            row_bytes: groups * SCALE_BYTES,
            tile_rows: rows,
            pack: 2 * SCALE_BYTES,
        },
        map,
        src_row_bytes: groups_in * SCALE_BYTES,
        dst_bytes: map.groups as usize * rows * groups * SCALE_BYTES,
    }
}

/// Output shape of [`scale_step`]: `[E, groups/2, rows, 2]`.
pub fn scale_shape(e: usize, rows: usize, groups: usize) -> Vec<usize> {
    vec![e, groups / 2, rows, 2]
}

/// Scale groups along K of `k` values.
pub fn groups(k: usize) -> usize {
    k / INT4_GROUP
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prep::maps::f1_offset;
    use crate::prep::steps::run_host;

    /// The pack commutes with F1: packing the F1-shuffled int8 values equals F1 over the
    /// packed rows with 8-byte packs (why every int4 layout is a Tile step).
    #[test]
    fn pack_commutes_with_f1() {
        let (n, k) = (32, 128);
        let vals: Vec<u8> = (0..n * k).map(|i| ((i * 7 + i / 5) % 16) as u8).collect();
        let mut shuffled = vec![0u8; n * k];
        for r in 0..n {
            for c in 0..k {
                shuffled[f1_offset(r, c, k, 16, 16)] = vals[r * k + c];
            }
        }
        let mut want = vec![0u8; n * k / 2];
        pack_int8_to_packed_int4(&shuffled, &mut want);
        let mut plain = vec![0u8; n * k / 2];
        pack_int8_to_packed_int4(&vals, &mut plain);
        let step = Step {
            writer: weight_writer(k / 2),
            map: RowMap::plain(1, n, n, n),
            src_row_bytes: k / 2,
            dst_bytes: n * k / 2,
        };
        let mut got = vec![0u8; n * k / 2];
        run_host(&step, &plain, &mut got);
        assert_eq!(got, want);
    }

    /// The a8w4 word order, spelled out: value j at nibble [0, 4, 1, 5, 2, 6, 3, 7][j].
    #[test]
    fn a8w4_words_hold_values_in_aiters_nibble_order() {
        let src: Vec<u8> = (0..8u8).map(|v| v + 1).collect();
        let mut dst = [0u8; 4];
        pack_int8_to_a8w4_words(&src, &mut dst);
        assert_eq!(u32::from_le_bytes(dst), 0x8642_7531);
    }

    #[test]
    fn out_of_range_values_are_found() {
        assert_eq!(first_out_of_range(&[0, 7, 0xF8, 3]), None);
        assert_eq!(first_out_of_range(&[0, 8, 0xF8]), Some((1, 8)));
        assert_eq!(first_out_of_range(&[0xF7]), Some((0, -9)));
    }
}
