//! The layout record: the contract between preparation and launch, produced in `prep` and
//! checked by the launch. Pads are derived from the sizes, never passed separately.

use crate::error::{Error, Result};
use crate::types::{ActDtype, GateMode, ScaleLayout, WeightFormat, WeightLayout};

/// Core form of `moeplug_layout`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub weight_format: WeightFormat,
    pub gate_mode: GateMode,
    pub weight_layout: WeightLayout,
    /// Present for MX formats only.
    pub scale_layout: Option<ScaleLayout>,
    pub num_experts: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub hidden_padded: usize,
    pub intermediate_padded: usize,
    pub has_bias: bool,
}

/// Largest `num_experts` a record may hold.
pub const MAX_NUM_EXPERTS: usize = 1 << 20;
/// Largest hidden / intermediate size (logical or padded) a record may hold.
pub const MAX_SIZE: usize = 1 << 31;

/// `moeplug_layout.flags` bit.
pub const FLAG_HAS_BIAS: u32 = crate::vocab::moeplug_layout_flag::HasBias as u32;
/// `moeplug_layout.flags` bit of a record prepared for an AITER kernel path (read by
/// `capi::moe::read_record`, never part of [`Layout`]).
pub const FLAG_AITER_TARGET: u32 = crate::vocab::moeplug_layout_flag::AiterTarget as u32;

impl Layout {
    /// Check the record on its own: known enums, positive sizes, pads not negative, a scale
    /// layout exactly when the format has block scales.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        weight_format: i32,
        gate_mode: i32,
        weight_layout: i32,
        scale_layout: i32,
        num_experts: i64,
        sizes: [i64; 4],
        flags: u32,
    ) -> Result<Layout> {
        let weight_format = WeightFormat::from_raw("layout.weight_format", weight_format)?;
        let gate_mode = GateMode::from_raw("layout.gate_mode", gate_mode)?;
        let weight_layout = WeightLayout::from_raw("layout.weight_layout", weight_layout)?;
        let scale_layout = if weight_format.is_mx() {
            Some(ScaleLayout::from_raw("layout.scale_layout", scale_layout)?)
        } else if scale_layout != 0 {
            return Err(Error::invalid(format!(
                "layout.scale_layout: expected 0 for weight_format {} (no e8m0 block scales), got {scale_layout}",
                weight_format.label()
            )));
        } else {
            None
        };
        let names = [
            "hidden_size",
            "intermediate_size",
            "hidden_padded",
            "intermediate_padded",
        ];
        let mut v = [0usize; 4];
        for (i, (&s, name)) in sizes.iter().zip(names).enumerate() {
            if s <= 0 || s > MAX_SIZE as i64 {
                return Err(Error::invalid(format!(
                    "layout.{name}: expected 1..=2^31, got {s}"
                )));
            }
            v[i] = s as usize;
        }
        if num_experts <= 0 || num_experts > MAX_NUM_EXPERTS as i64 {
            return Err(Error::invalid(format!(
                "layout.num_experts: expected 1..=2^20, got {num_experts}"
            )));
        }
        if v[2] < v[0] {
            return Err(Error::invalid(format!(
                "layout.hidden_padded: expected >= hidden_size {}, got {}",
                v[0], v[2]
            )));
        }
        if v[3] < v[1] {
            return Err(Error::invalid(format!(
                "layout.intermediate_padded: expected >= intermediate_size {}, got {}",
                v[1], v[3]
            )));
        }
        let unknown = flags & !FLAG_HAS_BIAS;
        if unknown != 0 {
            return Err(Error::unsupported(format!(
                "layout.flags: unknown bits {unknown:#x}"
            )));
        }
        Ok(Layout {
            weight_format,
            gate_mode,
            weight_layout,
            scale_layout,
            num_experts: num_experts as usize,
            hidden_size: v[0],
            intermediate_size: v[1],
            hidden_padded: v[2],
            intermediate_padded: v[3],
            has_bias: flags & FLAG_HAS_BIAS != 0,
        })
    }

    pub fn flags(&self) -> u32 {
        if self.has_bias {
            FLAG_HAS_BIAS
        } else {
            0
        }
    }
    /// Trailing zero columns of w13 / rows of w2.
    pub fn hidden_pad(&self) -> usize {
        self.hidden_padded - self.hidden_size
    }
    /// Trailing zero rows per half of w13 / columns of w2.
    pub fn intermediate_pad(&self) -> usize {
        self.intermediate_padded - self.intermediate_size
    }
}

/// What one preparation primitive established about the bytes it wrote; `None` where the
/// call cannot know (a shuffle does not know whether its tensor is w13 or w2). A record is
/// assembled from the fragments of every call that produced its tensors ([`Fragment::merge`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fragment {
    pub weight_format: Option<WeightFormat>,
    pub weight_layout: Option<WeightLayout>,
    pub scale_layout: Option<ScaleLayout>,
    pub gate_mode: Option<GateMode>,
    pub num_experts: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub hidden_padded: Option<usize>,
    pub intermediate_padded: Option<usize>,
    pub has_bias: Option<bool>,
    /// The activation dtype the preparation was made for, where it changes the layout.
    pub act_dtype: Option<ActDtype>,
}

impl Fragment {
    /// Every field of a complete record (what `prepare_moe` produces).
    pub fn of_layout(l: &Layout) -> Fragment {
        Fragment {
            weight_format: Some(l.weight_format),
            weight_layout: Some(l.weight_layout),
            scale_layout: l.scale_layout,
            gate_mode: Some(l.gate_mode),
            num_experts: Some(l.num_experts),
            hidden_size: Some(l.hidden_size),
            intermediate_size: Some(l.intermediate_size),
            hidden_padded: Some(l.hidden_padded),
            intermediate_padded: Some(l.intermediate_padded),
            has_bias: Some(l.has_bias),
            act_dtype: None,
        }
    }
}

/// `moeplug_layout.prep_fingerprint`: what preparation produced, sealed into the record so
/// that the launch can tell a record that contradicts it. 64 bits, decodable field by field:
///
/// | bits  | field |
/// |-------|-------|
/// | 0–3   | weight_format (0 = not produced) |
/// | 4–5   | gate_mode |
/// | 6–7   | weight_layout |
/// | 8–9   | scale_layout |
/// | 10–13 | act_dtype |
/// | 14–15 | has_bias (a `moeplug_fragment_bias` code: 0 = not produced, 1 = no, 2 = yes) |
/// | 16–55 | 8-bit digests of num_experts, hidden_size, intermediate_size, hidden_padded, intermediate_padded (0 = not produced) |
/// | 56–59 | zero |
/// | 60–63 | encoding version, 1 |
///
/// A whole value of zero is "no fingerprint" (a 1.0 record, or one filled by hand).
pub mod fingerprint {
    use super::{Fragment, SIZE_NAMES};
    use crate::error::{Error, Result};
    use crate::types::{ActDtype, GateMode, ScaleLayout, WeightFormat, WeightLayout};

    const VERSION: u64 = 1;

    /// 1..=255 for a size (0 marks "not produced"): a changed size goes unnoticed with
    /// probability 1/255.
    pub fn digest(v: usize) -> u64 {
        // splitmix64's finalizer: every input bit moves every output bit.
        let mut z = (v as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        1 + z % 255
    }

    /// The fingerprint of a fragment; 0 only for an empty one.
    pub fn encode(f: &Fragment) -> u64 {
        let e = |v: Option<i32>| v.map_or(0, |v| v as u64);
        let mut x = e(f.weight_format.map(|v| v as i32))
            | e(f.gate_mode.map(|v| v as i32)) << 4
            | e(f.weight_layout.map(|v| v as i32)) << 6
            | e(f.scale_layout.map(|v| v as i32)) << 8
            | e(f.act_dtype.map(|v| v as i32)) << 10
            | (super::bias_code(f.has_bias) as u64) << 14;
        for (i, s) in f.sizes().iter().enumerate() {
            x |= s.map_or(0, digest) << (16 + 8 * i);
        }
        if x == 0 {
            return 0;
        }
        x | VERSION << 60
    }

    /// What a fingerprint says was produced: enums in full, sizes as digests
    /// (`[num_experts, hidden_size, intermediate_size, hidden_padded, intermediate_padded]`,
    /// 0 = not produced). INVALID_ARGUMENT for a value no version of moeplug writes.
    pub fn decode(x: u64) -> Result<(Fragment, [u64; 5])> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "layout.prep_fingerprint: {x:#018x} is not a moeplug fingerprint ({why}); \
                 write 0 in a record filled by hand"
            ))
        };
        if x >> 60 != VERSION {
            return Err(bad("unknown encoding version"));
        }
        if (x >> 56) & 0xF != 0 {
            return Err(bad("reserved bits set"));
        }
        let field = |shift: u32, bits: u32| ((x >> shift) & ((1 << bits) - 1)) as i32;
        fn opt<T>(raw: i32, parse: impl FnOnce(i32) -> Result<T>) -> Result<Option<T>> {
            if raw == 0 {
                Ok(None)
            } else {
                parse(raw).map(Some)
            }
        }
        let name = "layout.prep_fingerprint";
        let f = Fragment {
            weight_format: opt(field(0, 4), |r| WeightFormat::from_raw(name, r))?,
            gate_mode: opt(field(4, 2), |r| GateMode::from_raw(name, r))?,
            weight_layout: opt(field(6, 2), |r| WeightLayout::from_raw(name, r))?,
            scale_layout: opt(field(8, 2), |r| ScaleLayout::from_raw(name, r))?,
            act_dtype: opt(field(10, 4), |r| ActDtype::from_raw(name, r))?,
            has_bias: super::bias_of_code(field(14, 2)).ok_or_else(|| bad("has_bias code 3"))?,
            ..Fragment::default()
        };
        let mut digests = [0u64; 5];
        for (i, d) in digests.iter_mut().enumerate() {
            *d = (x >> (16 + 8 * i)) & 0xFF;
        }
        Ok((f, digests))
    }

    /// LAYOUT_MISMATCH naming the first field of `record` that contradicts the fingerprint
    /// `x` (0: nothing to check). `record` is the record as read, its act_dtype included.
    pub fn check(record: &Fragment, x: u64) -> Result<()> {
        if x == 0 {
            return Ok(());
        }
        let (made, digests) = decode(x)?;
        fn same<T: PartialEq + Copy>(
            name: &str,
            made: Option<T>,
            got: Option<T>,
            label: impl Fn(Option<T>) -> String,
        ) -> Result<()> {
            if made.is_some() && made != got {
                return Err(Error::mismatch(format!(
                    "layout.{name}: the record says {}, but preparation produced {} \
                     (layout.prep_fingerprint)",
                    label(got),
                    label(made)
                )));
            }
            Ok(())
        }
        let l = |o: Option<&'static str>| o.unwrap_or("none").to_string();
        same(
            "weight_format",
            made.weight_format,
            record.weight_format,
            |v| l(v.map(|v| v.label())),
        )?;
        same("gate_mode", made.gate_mode, record.gate_mode, |v| {
            l(v.map(|v| v.label()))
        })?;
        same(
            "weight_layout",
            made.weight_layout,
            record.weight_layout,
            |v| l(v.map(|v| v.label())),
        )?;
        same(
            "scale_layout",
            made.scale_layout,
            record.scale_layout,
            |v| l(v.map(|v| v.label())),
        )?;
        same("act_dtype", made.act_dtype, record.act_dtype, |v| {
            l(v.map(|v| v.label()))
        })?;
        same("flags", made.has_bias, record.has_bias, |v| match v {
            Some(true) => "HAS_BIAS".to_string(),
            Some(false) => "no HAS_BIAS".to_string(),
            None => "none".to_string(),
        })?;
        for ((name, want), got) in SIZE_NAMES.iter().zip(digests).zip(record.sizes()) {
            if want != 0 && got.map(digest) != Some(want) {
                return Err(Error::mismatch(format!(
                    "layout.{name}: {} differs from the size preparation produced \
                     (layout.prep_fingerprint)",
                    got.map_or("none".to_string(), |v| v.to_string())
                )));
            }
        }
        Ok(())
    }
}

impl Fragment {
    /// Combine what two calls produced; a field both set differently is INVALID_ARGUMENT
    /// naming it (the two calls prepared for different layouts).
    pub fn merge(self, other: Fragment) -> Result<Fragment> {
        let conflict = self
            .labels()
            .into_iter()
            .zip(other.labels())
            .find(|((_, a), (_, b))| a.is_some() && b.is_some() && a != b);
        if let Some(((name, Some(a)), (_, Some(b)))) = conflict {
            return Err(Error::invalid(format!(
                "layout.{name}: one preparation produced {a}, another {b}"
            )));
        }
        let or = |a: Fragment, b: Fragment| Fragment {
            weight_format: a.weight_format.or(b.weight_format),
            weight_layout: a.weight_layout.or(b.weight_layout),
            scale_layout: a.scale_layout.or(b.scale_layout),
            gate_mode: a.gate_mode.or(b.gate_mode),
            num_experts: a.num_experts.or(b.num_experts),
            hidden_size: a.hidden_size.or(b.hidden_size),
            intermediate_size: a.intermediate_size.or(b.intermediate_size),
            hidden_padded: a.hidden_padded.or(b.hidden_padded),
            intermediate_padded: a.intermediate_padded.or(b.intermediate_padded),
            has_bias: a.has_bias.or(b.has_bias),
            act_dtype: a.act_dtype.or(b.act_dtype),
        };
        Ok(or(self, other))
    }

    /// Every field by its record name, as a message shows it (None = not produced). Labels
    /// are distinct per value, so two fragments agree on a field exactly when its labels do.
    fn labels(&self) -> [(&'static str, Option<String>); 11] {
        fn s<T>(v: Option<T>, f: impl Fn(T) -> String) -> Option<String> {
            v.map(f)
        }
        let n = |v: Option<usize>| s(v, |v| v.to_string());
        [
            ("weight_format", s(self.weight_format, |v| v.label().into())),
            ("gate_mode", s(self.gate_mode, |v| v.label().into())),
            ("weight_layout", s(self.weight_layout, |v| v.label().into())),
            ("scale_layout", s(self.scale_layout, |v| v.label().into())),
            ("act_dtype", s(self.act_dtype, |v| v.label().into())),
            ("num_experts", n(self.num_experts)),
            ("hidden_size", n(self.hidden_size)),
            ("intermediate_size", n(self.intermediate_size)),
            ("hidden_padded", n(self.hidden_padded)),
            ("intermediate_padded", n(self.intermediate_padded)),
            (
                "has_bias",
                s(self.has_bias, |b| {
                    if b { "biases" } else { "no biases" }.into()
                }),
            ),
        ]
    }

    /// The fields a record holds (`act_dtype` as recorded, None = any).
    pub fn of_record(l: &Layout, act_dtype: Option<ActDtype>) -> Fragment {
        Fragment {
            act_dtype,
            ..Fragment::of_layout(l)
        }
    }
}

/// `moeplug_fragment_bias` code of a fragment's `has_bias` (the fingerprint's bits 14–15).
fn bias_code(b: Option<bool>) -> i32 {
    use crate::vocab::moeplug_fragment_bias as code;
    match b {
        None => code::Unknown as i32,
        Some(false) => code::Absent as i32,
        Some(true) => code::Present as i32,
    }
}

/// The `has_bias` a `moeplug_fragment_bias` code stands for; None for an unknown code.
fn bias_of_code(c: i32) -> Option<Option<bool>> {
    (0..3)
        .map(|b| [None, Some(false), Some(true)][b])
        .find(|&b| bias_code(b) == c)
}

/// `moeplug_layout_fragment` as integers: 0 where nothing was established.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawFragment {
    pub weight_format: i32,
    pub gate_mode: i32,
    pub weight_layout: i32,
    pub scale_layout: i32,
    pub act_dtype: i32,
    /// num_experts, hidden_size, intermediate_size, hidden_padded, intermediate_padded.
    pub sizes: [i64; 5],
    /// A `moeplug_fragment_bias` code.
    pub has_bias: i32,
    pub reserved0: u32,
}

const SIZE_NAMES: [&str; 5] = [
    "num_experts",
    "hidden_size",
    "intermediate_size",
    "hidden_padded",
    "intermediate_padded",
];

impl Fragment {
    fn sizes(&self) -> [Option<usize>; 5] {
        [
            self.num_experts,
            self.hidden_size,
            self.intermediate_size,
            self.hidden_padded,
            self.intermediate_padded,
        ]
    }

    /// The integers a primitive writes into its `out_fragment`.
    pub fn to_raw(&self) -> RawFragment {
        let e = |v: Option<i32>| v.unwrap_or(0);
        RawFragment {
            weight_format: e(self.weight_format.map(|v| v as i32)),
            gate_mode: e(self.gate_mode.map(|v| v as i32)),
            weight_layout: e(self.weight_layout.map(|v| v as i32)),
            scale_layout: e(self.scale_layout.map(|v| v as i32)),
            act_dtype: e(self.act_dtype.map(|v| v as i32)),
            sizes: self.sizes().map(|v| v.map_or(0, |v| v as i64)),
            has_bias: bias_code(self.has_bias),
            reserved0: 0,
        }
    }

    /// A fragment passed back by a caller (`name` is how messages call it): known enum
    /// values, sizes in the ranges a record holds, 0 for "not established".
    pub fn from_raw(name: &str, r: RawFragment) -> Result<Fragment> {
        fn opt<T>(raw: i32, parse: impl FnOnce(i32) -> Result<T>) -> Result<Option<T>> {
            if raw == 0 {
                Ok(None)
            } else {
                parse(raw).map(Some)
            }
        }
        let field = |f: &str| format!("{name}.{f}");
        let mut sizes = [None; 5];
        for (i, (&v, f)) in r.sizes.iter().zip(SIZE_NAMES).enumerate() {
            let (max, spelled) = if i == 0 {
                (MAX_NUM_EXPERTS as i64, "2^20")
            } else {
                (MAX_SIZE as i64, "2^31")
            };
            if !(0..=max).contains(&v) {
                return Err(Error::invalid(format!(
                    "{}: expected 0 (not established) or 1..={spelled}, got {v}",
                    field(f)
                )));
            }
            sizes[i] = (v > 0).then_some(v as usize);
        }
        let has_bias = bias_of_code(r.has_bias).ok_or_else(|| {
            Error::invalid(format!(
                "{}: expected 0 unknown, 1 absent or 2 present, got {}",
                field("has_bias"),
                r.has_bias
            ))
        })?;
        if r.reserved0 != 0 {
            return Err(Error::invalid(format!(
                "{}: must be zero, got {:#x}",
                field("reserved0"),
                r.reserved0
            )));
        }
        Ok(Fragment {
            weight_format: opt(r.weight_format, |v| {
                WeightFormat::from_raw(&field("weight_format"), v)
            })?,
            gate_mode: opt(r.gate_mode, |v| GateMode::from_raw(&field("gate_mode"), v))?,
            weight_layout: opt(r.weight_layout, |v| {
                WeightLayout::from_raw(&field("weight_layout"), v)
            })?,
            scale_layout: opt(r.scale_layout, |v| {
                ScaleLayout::from_raw(&field("scale_layout"), v)
            })?,
            act_dtype: opt(r.act_dtype, |v| ActDtype::from_raw(&field("act_dtype"), v))?,
            num_experts: sizes[0],
            hidden_size: sizes[1],
            intermediate_size: sizes[2],
            hidden_padded: sizes[3],
            intermediate_padded: sizes[4],
            has_bias,
        })
    }

    /// What the calls of one preparation established together (`parts[i]` is called
    /// `fragments[i]` in messages). Two fragments that set a field differently are
    /// INVALID_ARGUMENT naming both: they describe different layouts.
    pub fn assemble(parts: &[Fragment]) -> Result<Fragment> {
        let mut first: [Option<(usize, String)>; 11] = Default::default();
        for (i, p) in parts.iter().enumerate() {
            for (slot, (name, value)) in first.iter_mut().zip(p.labels()) {
                let Some(value) = value else { continue };
                match slot {
                    Some((j, seen)) if *seen != value => {
                        return Err(Error::invalid(format!(
                            "fragments[{i}].{name}: {value}, but fragments[{j}] established \
                             {seen} (the calls prepared different layouts)"
                        )))
                    }
                    Some(_) => {}
                    None => *slot = Some((i, value)),
                }
            }
        }
        parts
            .iter()
            .try_fold(Fragment::default(), |acc, p| acc.merge(*p))
    }

    /// The record these fields make: every field a record needs must have been established
    /// (`scale_layout` for MX formats only); HAS_BIAS is clear unless established.
    pub fn record(&self) -> Result<Layout> {
        fn need<T>(name: &str, v: Option<T>) -> Result<T> {
            v.ok_or_else(|| {
                Error::invalid(format!(
                    "fragments: none establishes {name}, which a record needs (docs/abi.md \
                     §8 says which call establishes which field; declare the others in a \
                     fragment of your own)"
                ))
            })
        }
        let format = need("weight_format", self.weight_format)?;
        let scale_layout = match self.scale_layout {
            None if format.is_mx() => need("scale_layout", None::<ScaleLayout>)? as i32,
            s => s.map_or(0, |s| s as i32),
        };
        let mut sizes = [0i64; 5];
        for ((out, v), name) in sizes.iter_mut().zip(self.sizes()).zip(SIZE_NAMES) {
            *out = need(name, v)? as i64;
        }
        let flags = if self.has_bias == Some(true) {
            FLAG_HAS_BIAS
        } else {
            0
        };
        Layout::new(
            format as i32,
            need("gate_mode", self.gate_mode)? as i32,
            need("weight_layout", self.weight_layout)? as i32,
            scale_layout,
            sizes[0],
            [sizes[1], sizes[2], sizes[3], sizes[4]],
            flags,
        )
    }
}

/// A record as the launch reads it: the layout, the activation dtype it was prepared for,
/// and its fingerprint checked against the fields ([`fingerprint::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedLayout {
    pub layout: Layout,
    pub act_dtype: Option<ActDtype>,
    /// `prep_fingerprint` as read, checked by [`PreparedLayout::check_fingerprint`].
    pub fingerprint: u64,
}

impl PreparedLayout {
    /// Read the 1.1 fields of a record (zero in a 1.0 one: nothing to check).
    pub fn new(
        layout: Layout,
        act_dtype: i32,
        reserved1: u32,
        prep_fingerprint: u64,
    ) -> Result<PreparedLayout> {
        let act_dtype = match act_dtype {
            0 => None,
            r => Some(ActDtype::from_raw("layout.act_dtype", r)?),
        };
        if reserved1 != 0 {
            return Err(Error::invalid(format!(
                "layout.reserved1: must be zero, got {reserved1:#x}"
            )));
        }
        let prepared = PreparedLayout {
            layout,
            act_dtype,
            fingerprint: prep_fingerprint,
        };
        if prep_fingerprint != 0 {
            // A value no moeplug writes is refused at once; the fields are compared by
            // `check_fingerprint`, which the launch calls after the tensors' own evidence.
            fingerprint::decode(prep_fingerprint)?;
        }
        Ok(prepared)
    }

    /// LAYOUT_MISMATCH naming the first field that contradicts the fingerprint.
    pub fn check_fingerprint(&self) -> Result<()> {
        let record = Fragment::of_record(&self.layout, self.act_dtype);
        fingerprint::check(&record, self.fingerprint)
    }

    /// The launch's act_dtype when the caller leaves it 0: the prepared one, else the
    /// format's default.
    pub fn default_act_dtype(&self, input_is_fp16: bool) -> ActDtype {
        self.act_dtype
            .unwrap_or_else(|| ActDtype::default_for(self.layout.weight_format, input_is_fp16))
    }

    /// A launch with another activation dtype than the one the weights were prepared for is
    /// LAYOUT_MISMATCH.
    pub fn check_act_dtype(&self, act: ActDtype) -> Result<()> {
        match self.act_dtype {
            Some(p) if p != act => Err(Error::mismatch(format!(
                "layout.act_dtype: the weights were prepared for {}, the launch uses {}",
                p.label(),
                act.label()
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    fn whole() -> Fragment {
        Fragment {
            weight_format: Some(WeightFormat::Mxfp4),
            weight_layout: Some(WeightLayout::Aiter16x16),
            scale_layout: Some(ScaleLayout::AiterE8m0),
            gate_mode: Some(GateMode::Separated),
            num_experts: Some(8),
            hidden_size: Some(2880),
            intermediate_size: Some(2880),
            hidden_padded: Some(3072),
            intermediate_padded: Some(3072),
            has_bias: Some(true),
            act_dtype: Some(ActDtype::Bf16),
        }
    }

    #[test]
    fn a_fragment_survives_its_c_form() {
        for f in [whole(), Fragment::default()] {
            assert_eq!(Fragment::from_raw("f", f.to_raw()).unwrap(), f);
        }
        assert_eq!(Fragment::default().to_raw(), RawFragment::default());
    }

    #[test]
    fn the_bias_codes_are_the_vocabulary_and_the_fingerprint_bits() {
        use crate::vocab::moeplug_fragment_bias as code;
        assert_eq!(bias_code(None), code::Unknown as i32);
        assert_eq!(bias_code(Some(false)), code::Absent as i32);
        assert_eq!(bias_code(Some(true)), code::Present as i32);
        assert_eq!(bias_of_code(3), None);
        for b in [None, Some(false), Some(true)] {
            assert_eq!(bias_of_code(bias_code(b)), Some(b));
            let f = Fragment {
                has_bias: b,
                num_experts: Some(1),
                ..Fragment::default()
            };
            let x = fingerprint::encode(&f);
            assert_eq!((x >> 14) & 3, bias_code(b) as u64);
            assert_eq!(fingerprint::decode(x).unwrap().0.has_bias, b);
        }
    }

    #[test]
    fn assembly_is_the_merge_of_every_part_and_names_a_conflict() {
        let w = whole();
        let parts = [
            Fragment {
                weight_format: w.weight_format,
                scale_layout: w.scale_layout,
                ..Fragment::default()
            },
            Fragment {
                act_dtype: w.act_dtype,
                ..w
            },
        ];
        assert_eq!(Fragment::assemble(&parts).unwrap(), w);
        let mut other = parts[0];
        other.scale_layout = Some(ScaleLayout::Cdna4Swizzle);
        let e = Fragment::assemble(&[parts[0], parts[1], other]).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert_eq!(
            e.message,
            "fragments[2].scale_layout: cdna4_swizzle, but fragments[0] established aiter_e8m0 \
             (the calls prepared different layouts)"
        );
        let e = parts[0].merge(other).unwrap_err();
        assert_eq!(
            e.message,
            "layout.scale_layout: one preparation produced aiter_e8m0, another cdna4_swizzle"
        );
    }

    #[test]
    fn a_record_needs_every_field_but_bias_and_act_dtype() {
        let l = whole().record().unwrap();
        assert_eq!(
            Fragment::of_layout(&l),
            Fragment {
                act_dtype: None,
                ..whole()
            }
        );
        let no_bias = Fragment {
            has_bias: None,
            act_dtype: None,
            ..whole()
        };
        assert!(!no_bias.record().unwrap().has_bias);
        let missing = Fragment {
            intermediate_padded: None,
            ..whole()
        };
        let e = missing.record().unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(
            e.message.starts_with(
                "fragments: none establishes intermediate_padded, which a record needs"
            ),
            "{}",
            e.message
        );
        // A format without block scales needs no scale layout.
        let bf16 = Fragment {
            weight_format: Some(WeightFormat::Bf16),
            scale_layout: None,
            ..whole()
        };
        assert_eq!(bf16.record().unwrap().scale_layout, None);
    }
}
