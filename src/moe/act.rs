//! Gated activations (docs/abi.md §2, docs/layouts.md §7), in f32 as the torch reference computes.

use crate::types::Activation;

/// A resolved activation: which one, its alpha and optional clamp limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedAct {
    pub activation: Activation,
    pub alpha: f32,
    pub limit: Option<f32>,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// erf with |error| < 1.2e-7 (W. J. Cody's rational approximations are overkill here; this
/// is the complementary-error-function series of Numerical Recipes `erfcc`, accurate to f32).
fn erf(x: f32) -> f32 {
    let z = (x as f64).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = 1.0 - t * poly.exp();
    (if x >= 0.0 { r } else { -r }) as f32
}

/// Exact (erf) GELU.
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU with the tanh approximation (torch's `gelu(approximate="tanh")`):
/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), evaluated in f64 and rounded once, as
/// [`gelu`]'s erf is: the reference should not add f32 rounding of its own.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
    (0.5 * x * (1.0 + inner.tanh())) as f32
}

impl GatedAct {
    /// act(gate, up). SILU/GELU/GELU_TANH clamp only when a limit was given (gate from
    /// above, up both ways); SWIGLU_OAI always has one (default 7). NONE is not gated: the
    /// result is `u` (the launch check refuses a limit with it).
    #[inline]
    pub fn apply(&self, g: f32, u: f32) -> f32 {
        let (g, u) = match self.limit {
            Some(l) => (g.min(l), u.clamp(-l, l)),
            None => (g, u),
        };
        match self.activation {
            Activation::Silu => g * sigmoid(g) * u,
            Activation::Gelu => gelu(g) * u,
            Activation::SwigluOai => g * sigmoid(self.alpha * g) * (u + 1.0),
            Activation::GeluTanh => gelu_tanh(g) * u,
            Activation::NoActivation => u,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_accurate() {
        // Reference values of erf.
        let cases = [
            (0.0, 0.0),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
            (3.0, 0.999_977_9),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 3e-7, "erf({x}) = {}", erf(x));
        }
    }
}
