//! Reading `moeplug_fused_moe_args` into the core's `MoeConfig` / `MoeLaunch`.

use std::sync::Arc;

use super::args::{enum_or, optional_tensor, read_struct, tensor};
use super::types::{moeplug_fused_moe_args, moeplug_layout, moeplug_moe_flag};
use crate::backend::{self, Backend};
use crate::error::{Error, Result};
use crate::layout::{Layout, PreparedLayout, FLAG_AITER_TARGET};
use crate::moe::check::{check_config, check_launch, check_record};
use crate::moe::{MoeConfig, MoeLaunch};
use crate::tensor::ElemType;
use crate::types::{ActDtype, Activation};

/// `moeplug_fused_moe_args.flags` bit.
pub(crate) const FLAG_ROUTER_WEIGHT_ON_INPUT: u32 = moeplug_moe_flag::RouterWeightOnInput as u32;

/// A record for moeplug's launches: one prepared for an AITER kernel path is refused.
///
/// # Safety
/// `ptr` is NULL or a readable `moeplug_layout` of `struct_size` bytes.
pub unsafe fn read_layout(ptr: *const moeplug_layout, name: &str) -> Result<PreparedLayout> {
    let (prepared, aiter) = read_record(ptr, name)?;
    if aiter {
        return Err(Error::mismatch(format!(
            "{name}.flags: AITER_TARGET: these weights were prepared for an AITER kernel path \
             (prepare_moe target), whose layout moeplug's kernels do not read; prepare them \
             with target 0"
        )));
    }
    Ok(prepared)
}

/// A record of any target, and whether it was prepared for an AITER kernel path.
///
/// # Safety
/// As [`read_layout`].
pub unsafe fn read_record(
    ptr: *const moeplug_layout,
    name: &str,
) -> Result<(PreparedLayout, bool)> {
    let l = read_struct(ptr, name)?;
    let aiter = l.flags & FLAG_AITER_TARGET != 0;
    let layout = Layout::new(
        l.weight_format,
        l.gate_mode,
        l.weight_layout,
        l.scale_layout,
        l.num_experts as i64,
        [
            l.hidden_size,
            l.intermediate_size,
            l.hidden_padded,
            l.intermediate_padded,
        ],
        l.flags & !FLAG_AITER_TARGET,
    )?;
    let prepared = PreparedLayout::new(layout, l.act_dtype, l.reserved1, l.prep_fingerprint)?;
    Ok((prepared, aiter))
}

/// Which optional inputs a launch passes (non-NULL pointers), for the configuration.
struct Present {
    expert_mask: bool,
    num_local_tokens: bool,
    hidden_scale: bool,
    act_scale: [bool; 2],
}

impl Present {
    fn of(a: &moeplug_fused_moe_args) -> Present {
        Present {
            expert_mask: !a.expert_mask.is_null(),
            num_local_tokens: !a.num_local_tokens.is_null(),
            hidden_scale: !a.hidden_scale.is_null(),
            act_scale: [!a.stage1_act_scale.is_null(), !a.stage2_act_scale.is_null()],
        }
    }
}

fn resolve_config(
    a: &moeplug_fused_moe_args,
    prepared: PreparedLayout,
    input_is_fp16: bool,
    has: Present,
) -> Result<MoeConfig> {
    let layout = prepared.layout;
    let activation = enum_or(a.activation, Activation::Silu, |v| {
        Activation::from_raw("activation", v)
    })?;
    let act_dtype = enum_or(
        a.act_dtype,
        prepared.default_act_dtype(input_is_fp16),
        |v| ActDtype::from_raw("act_dtype", v),
    )?;
    prepared.check_act_dtype(act_dtype)?;
    let stage2_act_dtype = enum_or(a.stage2_act_dtype, act_dtype, |v| {
        ActDtype::from_raw("stage2_act_dtype", v)
    })?;
    if a.reserved0 != 0 {
        return Err(Error::invalid(format!(
            "reserved0: must be zero, got {:#x}",
            a.reserved0
        )));
    }
    if !a.alpha.is_finite() || !a.limit.is_finite() || a.limit < 0.0 {
        return Err(Error::invalid(format!(
            "alpha/limit: expected finite values with limit >= 0, got alpha {} limit {}",
            a.alpha, a.limit
        )));
    }
    let unknown = a.flags & !FLAG_ROUTER_WEIGHT_ON_INPUT;
    if unknown != 0 {
        return Err(Error::unsupported(format!(
            "flags: unknown bits {unknown:#x}"
        )));
    }
    let config = MoeConfig {
        layout,
        activation,
        alpha: activation.resolve_alpha(a.alpha),
        limit: activation.resolve_limit(a.limit),
        act_dtype,
        stage2_act_dtype,
        prequantized_input: has.hidden_scale,
        static_act_scale: has.act_scale,
        router_weight_on_input: a.flags & FLAG_ROUTER_WEIGHT_ON_INPUT != 0,
        has_expert_mask: has.expert_mask,
        has_num_local_tokens: has.num_local_tokens,
    };
    check_config(&config)?;
    Ok(config)
}

/// The configuration alone (for `moeplug_check_fused_moe`): tensors may be NULL.
///
/// # Safety
/// `ptr` is NULL or a readable `moeplug_fused_moe_args` of `struct_size` bytes whose non-NULL
/// pointers are valid.
pub unsafe fn read_config(ptr: *const moeplug_fused_moe_args) -> Result<MoeConfig> {
    let a = read_struct(ptr, "args")?;
    let layout = read_layout(a.layout, "args.layout")?;
    // No tensors to look at: the record is compared with its fingerprint at once.
    layout.check_fingerprint()?;
    let hidden = optional_tensor(a.hidden_states, "hidden_states")?;
    let fp16 = hidden.map(|h| h.elem == ElemType::F16).unwrap_or(false);
    resolve_config(&a, layout, fp16, Present::of(&a))
}

/// Configuration and tensors of a launch (the workspace query reads the same).
///
/// # Safety
/// As [`read_config`].
pub unsafe fn read_launch(ptr: *const moeplug_fused_moe_args) -> Result<MoeLaunch> {
    let a = read_struct(ptr, "args")?;
    let layout = read_layout(a.layout, "args.layout")?;
    let hidden_states = tensor(a.hidden_states, "hidden_states")?;
    let expert_mask = optional_tensor(a.expert_mask, "expert_mask")?;
    let num_local_tokens = optional_tensor(a.num_local_tokens, "num_local_tokens")?;
    let config = resolve_config(
        &a,
        layout,
        hidden_states.elem == ElemType::F16,
        Present::of(&a),
    )?;
    let workspace = optional_tensor(a.workspace, "workspace")?;
    let launch = MoeLaunch {
        config,
        hidden_states,
        hidden_scale: optional_tensor(a.hidden_scale, "hidden_scale")?,
        w13: tensor(a.w13, "w13")?,
        w13_scale: optional_tensor(a.w13_scale, "w13_scale")?,
        w13_bias: optional_tensor(a.w13_bias, "w13_bias")?,
        w2: tensor(a.w2, "w2")?,
        w2_scale: optional_tensor(a.w2_scale, "w2_scale")?,
        w2_bias: optional_tensor(a.w2_bias, "w2_bias")?,
        topk_weights: tensor(a.topk_weights, "topk_weights")?,
        topk_ids: tensor(a.topk_ids, "topk_ids")?,
        expert_mask,
        num_local_tokens,
        output: tensor(a.output, "output")?,
        workspace,
        stream: a.stream as usize,
        stage1_act_scale: optional_tensor(a.stage1_act_scale, "stage1_act_scale")?,
        stage2_act_scale: optional_tensor(a.stage2_act_scale, "stage2_act_scale")?,
    };
    // Tensors that disagree with the record are reported by the backend's launch check as
    // for a record without fingerprint; a record the tensors agree with is then compared
    // with what preparation produced (a gate mode or layout the shapes cannot show).
    let tensors_agree = check_record(&launch.config.layout)
        .and_then(|_| check_launch(&launch))
        .is_ok();
    if tensors_agree {
        layout.check_fingerprint()?;
    }
    Ok(launch)
}

/// The backend that owns the launch's memory: all tensors must live on one device.
pub fn backend_of(launch: &MoeLaunch) -> Result<Arc<dyn Backend>> {
    let dev = (launch.hidden_states.device, launch.hidden_states.device_id);
    for t in launch.tensors() {
        if t.device.is_host() != dev.0.is_host()
            || (!dev.0.is_host() && (t.device, t.device_id) != dev)
        {
            return Err(Error::invalid(format!(
                "{}: on device {}:{}, but hidden_states is on {}:{} (all tensors of a launch share one device)",
                t.name,
                t.device.name(),
                t.device_id,
                dev.0.name(),
                dev.1
            )));
        }
    }
    backend::for_device(dev.0, dev.1)
}
