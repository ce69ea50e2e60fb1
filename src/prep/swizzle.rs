//! MX scale swizzles of other kernel families (docs/layouts.md §3.4).
//!
//! CDNA4 (triton_kernels `CDNA4MXScaleLayout`, F5): the checkpoint scale `[E, N, K/32]` is
//! stored as `[E, ⌈N/32⌉, ⌈(K/32)/8⌉·8·32]`, which per expert is exactly F3 with rows padded
//! to 32 (not 256) and zero padding.

use super::steps::{run_host, RowMap, Step, Writer};

/// Output shape of the CDNA4 swizzle of a `[e, n, ks]` scale.
pub fn cdna4_shape(e: usize, n: usize, ks: usize) -> [usize; 3] {
    [e, n.div_ceil(32), ks.div_ceil(8) * 8 * 32]
}

/// F5: `src` `[e, n, ks]` bytes → `dst` of [`cdna4_shape`].
pub fn swizzle_cdna4(src: &[u8], e: usize, n: usize, ks: usize, dst: &mut [u8]) {
    run_host(&cdna4_step(e, n, ks), src, dst);
}

/// [`swizzle_cdna4`] as a [`Step`].
pub fn cdna4_step(e: usize, n: usize, ks: usize) -> Step {
    let n32 = n.div_ceil(32) * 32;
    let sn = ks.div_ceil(8) * 8;
    Step {
        writer: Writer::F3 {
            sn,
            col_pad: 0,
            row_pad: 0,
        },
        map: RowMap::plain(e, n32.max(1), n, n),
        src_row_bytes: ks,
        dst_bytes: e * n32 * sn,
    }
}
