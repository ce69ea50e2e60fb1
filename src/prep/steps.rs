//! Preparation as data: every prep call is one or more [`Step`]s, each "write this output
//! with one of the three writers of [`super::rows`], reading source rows through this
//! [`RowMap`]". This is the only description of the prep layouts: the host runs a step with
//! the writers of `rows` ([`run_host`]; `shuffle`, `scale`, `pad`, `swizzle` and `prepare`
//! only build steps and call it), the GPU backend (`backend::gpu::prep`) ships the same
//! plain-data step to a kernel that computes the same map per output byte. The unit tests
//! here check the host writers against that per-byte reading of a step.

use super::maps::{interleave16_source_row, w13_source_row};
use super::rows::{f3_shuffle, tile_transpose, write_rows};
use crate::types::GateMode;

/// How a physical output row finds its source row. Output rows come in groups of
/// `group_rows` (one per expert / matrix); groups at or beyond `groups` are padding. Within a
/// group, row `q` maps to a source row of the group (`src_group_rows` rows each) by `mode`:
///
/// - [`RowMap::PLAIN`]: row `q` if `q < half_in`, else padding.
/// - [`RowMap::HALVES_SEPARATED`] / `_INTERLEAVE` / `_INTERLEAVE_ROWS`: the group is two halves
///   of `half_out` rows (gate, up); row `j` of half `g` is padding when `j >= half_in`, else
///   the source row holding row `j` of half `g` in that gate mode with `half_in` rows per half.
/// - [`RowMap::INTERLEAVE16_OUT`]: the output interleaves the separated source halves
///   (`half_in` rows each) in `block`-row blocks g, u, g, u (AITER's gate_up shuffles).
///
/// With a halves mode, `block` is the output's row order: 0 writes the halves one after the
/// other (SEPARATED), `b` > 0 in `b`-row blocks g, u, g, u of the padded halves (16:
/// INTERLEAVE, 1: INTERLEAVE_ROWS; AITER-target preparation only: the device prep kernels
/// read `block` 0, so those jobs run on the host).
///
/// `#[repr(C)]`, all `u64`: the kernels in `kernels/prep.cu` read it as is.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowMap {
    pub group_rows: u64,
    pub groups: u64,
    pub src_group_rows: u64,
    pub half_out: u64,
    pub half_in: u64,
    pub mode: u64,
    pub block: u64,
}

impl RowMap {
    pub const PLAIN: u64 = 0;
    pub const HALVES_SEPARATED: u64 = 1;
    pub const HALVES_INTERLEAVE: u64 = 2;
    pub const HALVES_INTERLEAVE_ROWS: u64 = 3;
    pub const INTERLEAVE16_OUT: u64 = 4;

    /// `groups` groups of `group_rows` output rows; the first `valid` rows of each come from
    /// a source group of `src_rows` rows, the rest are padding.
    pub fn plain(groups: usize, group_rows: usize, src_rows: usize, valid: usize) -> RowMap {
        RowMap {
            group_rows: group_rows as u64,
            groups: groups as u64,
            src_group_rows: src_rows as u64,
            half_in: valid as u64,
            mode: Self::PLAIN,
            ..Default::default()
        }
    }

    /// Gate/up rows of `e` experts, `inter` rows per half in `mode` order, written SEPARATED
    /// with each half padded to `inter_pad` rows (rows past `e` experts are padding too).
    pub fn gate_up(e: usize, inter: usize, inter_pad: usize, mode: GateMode) -> RowMap {
        RowMap {
            group_rows: 2 * inter_pad as u64,
            groups: e as u64,
            src_group_rows: 2 * inter as u64,
            half_out: inter_pad as u64,
            half_in: inter as u64,
            mode: match mode {
                GateMode::Separated => Self::HALVES_SEPARATED,
                GateMode::Interleave => Self::HALVES_INTERLEAVE,
                GateMode::InterleaveRows => Self::HALVES_INTERLEAVE_ROWS,
            },
            block: 0,
        }
    }

    /// As [`RowMap::gate_up`], written in `out` row order (padded halves of `inter_pad` rows
    /// interleaved in 16-row blocks, or row by row).
    pub fn gate_up_to(
        e: usize,
        inter: usize,
        inter_pad: usize,
        mode: GateMode,
        out: GateMode,
    ) -> RowMap {
        RowMap {
            block: match out {
                GateMode::Separated => 0,
                GateMode::Interleave => 16,
                GateMode::InterleaveRows => 1,
            },
            ..RowMap::gate_up(e, inter, inter_pad, mode)
        }
    }

    /// `groups` groups of `n` rows whose output interleaves the two separated halves in
    /// `block`-row blocks.
    pub fn interleave16_out(groups: usize, n: usize, block: usize) -> RowMap {
        RowMap {
            group_rows: n as u64,
            groups: groups as u64,
            src_group_rows: n as u64,
            half_in: (n / 2) as u64,
            mode: Self::INTERLEAVE16_OUT,
            block: block as u64,
            ..Default::default()
        }
    }

    /// Source row (global index) of physical output row `p`, or None for a padding row.
    #[inline]
    pub fn source_row(&self, p: usize) -> Option<usize> {
        let gr = self.group_rows as usize;
        // Skips the division for the first group (all rows of a one-group map such as a plain
        // F3 shuffle, where it was measurable with short rows).
        let (x, q) = if p < gr { (0, p) } else { (p / gr, p % gr) };
        if x >= self.groups as usize {
            return None;
        }
        let half_in = self.half_in as usize;
        let r = match self.mode {
            Self::PLAIN => {
                if q >= half_in {
                    return None;
                }
                q
            }
            Self::INTERLEAVE16_OUT => interleave16_source_row(q, half_in, self.block as usize),
            m => {
                let half_out = self.half_out as usize;
                let (g, j) = match self.block as usize {
                    0 => (q / half_out, q % half_out),
                    b => ((q % (2 * b)) / b, q / (2 * b) * b + q % b),
                };
                if j >= half_in {
                    return None;
                }
                let mode = match m {
                    Self::HALVES_SEPARATED => GateMode::Separated,
                    Self::HALVES_INTERLEAVE => GateMode::Interleave,
                    _ => GateMode::InterleaveRows,
                };
                w13_source_row(mode, g, j, half_in)
            }
        };
        Some(x * self.src_group_rows as usize + r)
    }
}

/// Which writer a step uses (see [`super::rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// [`write_rows`]: rows of `row_bytes`; missing bytes repeat `fill[..fill_len]`.
    Rows {
        row_bytes: usize,
        fill: [u8; 8],
        fill_len: usize,
    },
    /// [`tile_transpose`]: F1 tiles of `tile_rows` rows × `pack` bytes over rows of
    /// `row_bytes`; missing bytes are 0.
    Tile {
        row_bytes: usize,
        tile_rows: usize,
        pack: usize,
    },
    /// [`f3_shuffle`] with `sn` columns; short rows get `col_pad`, padding rows `row_pad`.
    F3 { sn: usize, col_pad: u8, row_pad: u8 },
}

impl Writer {
    /// A [`Writer::Rows`] with `fill` (one element's bytes, at most 8; empty = zeros).
    pub fn rows(row_bytes: usize, fill: &[u8]) -> Writer {
        let mut f = [0u8; 8];
        let len = fill.len().clamp(1, 8);
        f[..fill.len().min(8)].copy_from_slice(&fill[..fill.len().min(8)]);
        Writer::Rows {
            row_bytes,
            fill: f,
            fill_len: len,
        }
    }
}

/// One output written from one source: `dst_bytes` bytes of output; source rows are
/// `src_row_bytes` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub writer: Writer,
    pub map: RowMap,
    pub src_row_bytes: usize,
    pub dst_bytes: usize,
}

impl Step {
    /// A byte-for-byte copy of `bytes` bytes.
    pub fn copy(bytes: usize) -> Step {
        Step {
            writer: Writer::rows(bytes.max(1), &[0]),
            map: RowMap::plain(1, 1, 1, 1),
            src_row_bytes: bytes,
            dst_bytes: bytes,
        }
    }

    /// Bytes of source the step reads: every row of every group the map names.
    pub fn src_bytes(&self) -> usize {
        (self.map.groups * self.map.src_group_rows) as usize * self.src_row_bytes
    }
}

/// Run a step over host bytes: `src` holds [`Step::src_bytes`], `dst` `step.dst_bytes`.
pub fn run_host(step: &Step, src: &[u8], dst: &mut [u8]) {
    assert_eq!(src.len(), step.src_bytes(), "step input length");
    assert_eq!(dst.len(), step.dst_bytes, "step output length");
    if dst.is_empty() {
        return;
    }
    let (map, srb) = (step.map, step.src_row_bytes);
    let rows = move |p: usize| map.source_row(p).map(|r| &src[r * srb..(r + 1) * srb]);
    match step.writer {
        Writer::Rows {
            row_bytes,
            fill,
            fill_len,
        } => write_rows(dst, row_bytes, &rows, &fill[..fill_len]),
        Writer::Tile {
            row_bytes,
            tile_rows,
            pack,
        } => tile_transpose(dst, row_bytes, tile_rows, pack, &rows),
        Writer::F3 {
            sn,
            col_pad,
            row_pad,
        } => f3_shuffle(dst, sn, &rows, col_pad, row_pad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_up_map_matches_the_prepare_row_rule() {
        let m = RowMap::gate_up(2, 3, 4, GateMode::InterleaveRows);
        // Expert 0: gate rows 0..3 → source 0, 2, 4; row 3 padding; up rows → 1, 3, 5.
        let got: Vec<_> = (0..8).map(|p| m.source_row(p)).collect();
        assert_eq!(
            got,
            [
                Some(0),
                Some(2),
                Some(4),
                None,
                Some(1),
                Some(3),
                Some(5),
                None
            ]
        );
        assert_eq!(m.source_row(8), Some(6));
        assert_eq!(m.source_row(16), None); // past the experts
    }

    /// A small deterministic generator (no zeros-only inputs).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8 | 1).collect()
        }
    }

    /// `step` read byte by byte, the way the device kernels read it: every output position
    /// of the writer's layout (through the index maps of `maps`) → its source byte or padding.
    /// Each output byte must be named exactly once.
    fn per_byte(step: &Step, src: &[u8]) -> Vec<u8> {
        use crate::prep::maps::{f1_offset, f3_offset};
        type Offset = Box<dyn Fn(usize, usize) -> usize>;
        // Per writer: bytes per output row, where (row, column) goes, and the padding byte
        // of a column past the source row (`true`) or of a padding row (`false`).
        let (cols, offset, pad): (usize, Offset, Box<dyn Fn(usize, bool) -> u8>) = match step.writer
        {
            Writer::Rows {
                row_bytes,
                fill,
                fill_len,
            } => (
                row_bytes,
                Box::new(move |p, c| p * row_bytes + c),
                Box::new(move |c, _| fill[c % fill_len]),
            ),
            Writer::Tile {
                row_bytes,
                tile_rows,
                pack,
            } => (
                row_bytes,
                Box::new(move |p, c| f1_offset(p, c, row_bytes, tile_rows, pack)),
                Box::new(|_, _| 0),
            ),
            Writer::F3 {
                sn,
                col_pad,
                row_pad,
            } => (
                sn,
                Box::new(move |p, c| f3_offset(p, c, sn)),
                Box::new(move |_, in_row| if in_row { col_pad } else { row_pad }),
            ),
        };
        let mut d: Vec<Option<u8>> = vec![None; step.dst_bytes];
        let srb = step.src_row_bytes;
        for p in 0..step.dst_bytes.checked_div(cols).unwrap_or(0) {
            let row = step.map.source_row(p);
            for c in 0..cols {
                let v = match row {
                    Some(r) if c < srb => src[r * srb + c],
                    Some(_) => pad(c, true),
                    None => pad(c, false),
                };
                let o = offset(p, c);
                assert!(d[o].is_none(), "output byte {o} written twice");
                d[o] = Some(v);
            }
        }
        d.into_iter()
            .enumerate()
            .map(|(o, v)| v.unwrap_or_else(|| panic!("output byte {o} not written")))
            .collect()
    }

    /// [`run_host`] (the fast writers) equals [`per_byte`], whatever `dst` held before.
    fn check(step: &Step, src: &[u8], what: &str) {
        let want = per_byte(step, src);
        for init in [0x00, 0xFF] {
            let mut d = vec![init; step.dst_bytes];
            run_host(step, src, &mut d);
            assert!(d == want, "{what}: {step:?}");
        }
    }

    #[test]
    fn shuffle_weight_steps_run_as_read() {
        use crate::prep::shuffle::*;
        let mut g = Lcg(1);
        let mut ran = 0;
        for _ in 0..200 {
            let es = 1 + g.below(2);
            let gui = g.below(3) == 0;
            let p = if gui {
                let nl = [4, 8, 16, 32][g.below(4)];
                ShuffleWeightParams {
                    layout_n: nl,
                    layout_k: [8, 16, 32][g.below(3)],
                    is_guinterleave: true,
                    gate_up: g.below(2) == 0,
                    ..Default::default()
                }
            } else {
                ShuffleWeightParams {
                    layout_n: [16, 32][g.below(2)],
                    layout_k: 16,
                    use_int4: es == 1 && g.below(4) == 0,
                    pad_k_to: [0, 0, 96, 256][g.below(4)],
                    ..Default::default()
                }
            };
            let p = if p.use_int4 {
                ShuffleWeightParams { pad_k_to: 0, ..p }
            } else {
                p
            };
            let shape = vec![
                1 + g.below(3),
                (1 + g.below(3)) * 64,
                (1 + g.below(4)) * 64 + if p.pad_k_to > 0 { 32 } else { 0 },
            ];
            let Ok(plan) = plan_shuffle_weight("src", &shape, es, &p) else {
                continue;
            };
            let src = g.bytes(plan.in_bytes());
            check(&step(&plan), &src, &format!("{p:?} {shape:?}"));
            ran += 1;
        }
        assert!(ran > 100, "only {ran} shuffles were valid");
    }

    #[test]
    fn scale_steps_run_as_read() {
        use crate::prep::{scale, swizzle};
        let mut g = Lcg(2);
        for _ in 0..100 {
            let (m, n) = (1 + g.below(600), 1 + g.below(40));
            check(&scale::f3_step(m, n), &g.bytes(m * n), "f3");

            let ne = 1 + g.below(4);
            let per = 32 * (1 + g.below(3));
            let gate_up = g.below(2) == 0;
            let m = ne * per;
            let step = scale::gui_step(m, n, ne, gate_up);
            check(&step, &g.bytes(m * n), "f4");

            let (e, nn, ks) = (1 + g.below(3), 1 + g.below(100), 1 + g.below(20));
            let step = swizzle::cdna4_step(e, nn, ks);
            check(&step, &g.bytes(e * nn * ks), "cdna4");
        }
    }

    #[test]
    fn pad_and_copy_steps_run_as_read() {
        use crate::prep::pad;
        let mut g = Lcg(3);
        for _ in 0..200 {
            let es = [1, 2, 4, 8][g.below(4)];
            let gate_up = g.below(2) == 0;
            let e = 1 + g.below(3);
            let (n, k) = (2 * g.below(20), g.below(20));
            let (n2, k2) = (n + 2 * g.below(5), k + g.below(5));
            let fill: Vec<u8> = if g.below(2) == 0 {
                vec![0; es]
            } else {
                g.bytes(es)
            };
            let step = pad::step([e, n, k], [e, n2, k2], gate_up, &fill);
            check(&step, &g.bytes(e * n * k * es), "pad");
        }
        for bytes in [0, 1, 4, 100] {
            check(&Step::copy(bytes), &g.bytes(bytes), "copy");
        }
    }

    #[test]
    fn prepare_steps_run_as_read() {
        use crate::prep::prepare::*;
        use crate::types::WeightFormat as F;
        let mut g = Lcg(4);
        let formats = [
            F::Bf16,
            F::Fp16,
            F::Fp8PerTensor,
            F::Fp8PerChannel,
            F::Fp8Block128,
            F::Mxfp4,
            F::Mxfp8,
            F::Int4Group32,
            F::Int4PerChannel,
        ];
        for round in 0..48 {
            let format = formats[round % formats.len()];
            let mode = [
                GateMode::Separated,
                GateMode::Interleave,
                GateMode::InterleaveRows,
            ][(round / 7) % 3];
            let mode = if format == F::Fp8Block128 {
                GateMode::Separated
            } else {
                mode
            };
            let e = 1 + g.below(3);
            let unit = if format == F::Fp8Block128 { 128 } else { 32 };
            let h = unit * (1 + g.below(3));
            let i = unit * (1 + g.below(3));
            let vpe = crate::moe::check::values_per_elem(format);
            let (s13, s2) = match ScaleKind::of(format) {
                ScaleKind::None => (None, None),
                ScaleKind::Mx | ScaleKind::Int4Group => {
                    (Some(vec![e, 2 * i, h / 32]), Some(vec![e * h, i / 32]))
                }
                ScaleKind::PerTensor => (Some(vec![e]), Some(vec![e, 1])),
                ScaleKind::PerChannel => (Some(vec![e, 2 * i]), Some(vec![e, h, 1])),
                ScaleKind::Block128 => (
                    Some(vec![e, 2 * i / 128, h.div_ceil(128)]),
                    Some(vec![e, h.div_ceil(128), i / 128]),
                ),
            };
            let bias = round % 2 == 0;
            let spec = PrepareSpec {
                format,
                target: None,
                gate_mode_in: mode,
                hidden_align: [0, 64, 96][g.below(3)],
                intermediate_align: [0, 64, 160][g.below(3)],
                w13: vec![e, 2 * i, h / vpe],
                w2: vec![e, h, i / vpe],
                w13_scale: s13.clone(),
                w2_scale: s2.clone(),
                w13_bias: bias.then(|| vec![e, 2 * i]),
                w2_bias: bias.then(|| vec![e, h]),
                int4_unpacked: false,
            };
            let shapes = plan(&spec).unwrap();
            let (es, ses) = (weight_elem_size(format), ScaleKind::of(format).elem_size());
            let numel = |s: &Option<Vec<usize>>| s.as_ref().map_or(0, |s| s.iter().product());
            for (part, step) in steps(&shapes) {
                // Each step reads exactly its checkpoint tensor.
                let src_bytes = match part {
                    Part::W13 => e * 2 * i * h / vpe * es,
                    Part::W2 => e * h * i / vpe * es,
                    Part::W13Scale => numel(&s13) * ses,
                    Part::W2Scale => numel(&s2) * ses,
                    Part::W13Bias => e * 2 * i * 4,
                    Part::W2Bias => e * h * 4,
                };
                assert_eq!(step.src_bytes(), src_bytes, "{format:?} {part:?}");
                let what = format!("{format:?} {mode:?} {part:?}");
                check(&step, &g.bytes(src_bytes), &what);
            }
        }
    }
}
