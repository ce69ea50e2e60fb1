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

/// `moeplug_layout.flags` bit.
pub const FLAG_HAS_BIAS: u32 = crate::vocab::moeplug_layout_flag::HasBias as u32;

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
            if s <= 0 || s > (1 << 31) {
                return Err(Error::invalid(format!(
                    "layout.{name}: expected 1..=2^31, got {s}"
                )));
            }
            v[i] = s as usize;
        }
        if num_experts <= 0 || num_experts > 1 << 20 {
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
