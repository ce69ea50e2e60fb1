//! Fused MoE semantics shared by every backend: the launch configuration, the launch check,
//! AITER's sorting, activations and activation quantization.

pub mod act;
pub mod actquant;
pub mod check;
pub mod sort;

use crate::layout::Layout;
use crate::types::{ActDtype, Activation};

/// What a launch computes, independent of the tensors' addresses (the config check answers
/// for this alone).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub layout: Layout,
    pub activation: Activation,
    /// Resolved: never 0.
    pub alpha: f32,
    /// Resolved: None = no clamp.
    pub limit: Option<f32>,
    /// Resolved: never DEFAULT. The stage-1 input's act dtype.
    pub act_dtype: ActDtype,
    /// Resolved: the stage-2 input's act dtype (`act_dtype` unless the caller chose one).
    pub stage2_act_dtype: ActDtype,
    /// hidden_states arrive quantized in `act_dtype`, with `hidden_scale`.
    pub prequantized_input: bool,
    /// A static per-tensor scale is given for stage 1 / stage 2 (no amax).
    pub static_act_scale: [bool; 2],
    pub router_weight_on_input: bool,
    pub has_expert_mask: bool,
    pub has_num_local_tokens: bool,
}

use crate::tensor::Tensor;

/// A launch: the configuration and the caller's tensors, validated for presence and dtype
/// by the C surface, checked against the layout by [`crate::moe`]'s launch check.
#[derive(Debug, Clone)]
pub struct MoeLaunch {
    pub config: MoeConfig,
    pub hidden_states: Tensor,
    pub hidden_scale: Option<Tensor>,
    pub w13: Tensor,
    pub w13_scale: Option<Tensor>,
    pub w13_bias: Option<Tensor>,
    pub w2: Tensor,
    pub w2_scale: Option<Tensor>,
    pub w2_bias: Option<Tensor>,
    pub topk_weights: Tensor,
    pub topk_ids: Tensor,
    pub expert_mask: Option<Tensor>,
    pub num_local_tokens: Option<Tensor>,
    pub output: Tensor,
    pub workspace: Option<Tensor>,
    pub stream: usize,
    /// `[1]` / `[]` f32 static scales of the stage inputs (FP8_PER_TENSOR).
    pub stage1_act_scale: Option<Tensor>,
    pub stage2_act_scale: Option<Tensor>,
}

impl MoeLaunch {
    /// Every tensor the launch reads (all but `output` and `workspace`), present or not.
    pub fn inputs(&self) -> [Option<&Tensor>; 14] {
        [
            Some(&self.hidden_states),
            self.hidden_scale.as_ref(),
            Some(&self.w13),
            self.w13_scale.as_ref(),
            self.w13_bias.as_ref(),
            Some(&self.w2),
            self.w2_scale.as_ref(),
            self.w2_bias.as_ref(),
            Some(&self.topk_weights),
            Some(&self.topk_ids),
            self.expert_mask.as_ref(),
            self.num_local_tokens.as_ref(),
            self.stage1_act_scale.as_ref(),
            self.stage2_act_scale.as_ref(),
        ]
    }

    /// Every tensor of the launch that is present.
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        let written = [Some(&self.output), self.workspace.as_ref()];
        self.inputs().into_iter().chain(written).flatten()
    }
}
