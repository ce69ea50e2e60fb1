//! AITER's `moe_sorting` contract (docs/layouts.md §6): group the (token, slot) pairs by expert in
//! blocks of `block_size`. The GPU kernels produce these arrays on the device (the golden
//! tests hold this function to AITER's bytes); the CPU kernel groups slots without packing.

use crate::error::{Error, Result};

/// Bits of the token index in a packed entry `(slot << 24) | token`.
pub const PACKED_TOKEN_BITS: u32 = 24;
/// Most rows a packed routing can index: tokens and the sentinel token `M` fit 24 bits.
pub const PACKED_MAX_TOKENS: usize = (1 << PACKED_TOKEN_BITS) - 1;
/// Most slots per token a packed routing can index: slots (and the sentinel slot `topk`,
/// read as unsigned) fit the 8 bits above the token.
pub const PACKED_MAX_TOPK: usize = 1 << (31 - PACKED_TOKEN_BITS);

/// `(slot << 24) | token` as AITER's int32 (bit 31 set only by the sentinel of topk = 128).
fn pack(slot: usize, token: usize) -> i32 {
    ((slot as u32) << PACKED_TOKEN_BITS | token as u32) as i32
}

/// The sorted routing. Entries are `(slot << 24) | token`; padding is the sentinel
/// `(topk << 24) | M`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sorted {
    pub sorted_token_ids: Vec<i32>,
    /// topk_weights aligned with the ids, 0.0 at padding.
    pub sorted_weights: Vec<f32>,
    /// Local expert id of each block (−1 past the valid blocks).
    pub sorted_expert_ids: Vec<i32>,
    /// [total padded length, number of tokens counted].
    pub num_valid_ids: [i32; 2],
}

/// Routing inputs, already validated for shape: `topk_ids`/`topk_weights` are `[m, topk]`
/// row-major; `expert_mask` (if any) holds 0/1 per global expert id.
pub struct Routing<'a> {
    pub topk_ids: &'a [i32],
    pub topk_weights: &'a [f32],
    pub m: usize,
    pub topk: usize,
    /// Global expert count (the mask's length when a mask is given).
    pub num_experts: usize,
    pub expert_mask: Option<&'a [i32]>,
    /// Tokens counted: rows ≥ this are ignored (num_local_tokens, else m).
    pub num_tokens: usize,
}

/// Sort as AITER does. Ids outside `[0, num_experts)` and masked-off experts are dropped.
/// UNSUPPORTED beyond what the packing indexes ([`PACKED_MAX_TOKENS`], [`PACKED_MAX_TOPK`]).
pub fn moe_sorting(r: &Routing, block_size: usize) -> Result<Sorted> {
    if r.m > PACKED_MAX_TOKENS || r.topk > PACKED_MAX_TOPK {
        return Err(Error::unsupported(format!(
            "topk_ids: AITER's packed routing indexes at most {PACKED_MAX_TOKENS} tokens and \
             {PACKED_MAX_TOPK} slots per token, got shape [{}, {}]",
            r.m, r.topk
        )));
    }
    let bs = block_size.max(1);
    let e_count = r.num_experts;
    let tokens = r.num_tokens.min(r.m);
    // Local id of each global expert: cumsum(mask) − 1, or the id itself without a mask.
    let mut local = vec![-1i32; e_count];
    let mut next = 0;
    for (e, l) in local.iter_mut().enumerate() {
        let on = r.expert_mask.map(|m| m[e] != 0).unwrap_or(true);
        if on {
            *l = next;
            next += 1;
        }
    }
    let mut per_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e_count];
    for t in 0..tokens {
        for s in 0..r.topk {
            let id = r.topk_ids[t * r.topk + s];
            if id >= 0 && (id as usize) < e_count && local[id as usize] >= 0 {
                per_expert[id as usize].push((t, s));
            }
        }
    }
    let max_padded = (r.m * r.topk + e_count * bs).saturating_sub(r.topk);
    let sentinel = pack(r.topk, r.m);
    let mut ids = Vec::with_capacity(max_padded);
    let mut weights = Vec::with_capacity(max_padded);
    let mut experts = Vec::new();
    for (e, pairs) in per_expert.iter().enumerate() {
        if pairs.is_empty() {
            continue;
        }
        for &(t, s) in pairs {
            ids.push(pack(s, t));
            weights.push(r.topk_weights[t * r.topk + s]);
        }
        let padded = pairs.len().div_ceil(bs) * bs;
        for _ in pairs.len()..padded {
            ids.push(sentinel);
            weights.push(0.0);
        }
        experts.extend(std::iter::repeat(local[e]).take(padded / bs));
    }
    let valid = ids.len();
    ids.resize(max_padded.max(valid), sentinel);
    weights.resize(max_padded.max(valid), 0.0);
    experts.resize(max_padded.div_ceil(bs).max(experts.len()), -1);
    Ok(Sorted {
        sorted_token_ids: ids,
        sorted_weights: weights,
        sorted_expert_ids: experts,
        num_valid_ids: [valid as i32, tokens as i32],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worked_example_of_the_spec() {
        // docs/layouts.md §6: E=6, topk=3, bs=4.
        let ids = [0, 3, 5, 2, 3, 5, 1, 3, 5, 1, 2, 3, 1, 3, 5];
        let w: Vec<f32> = (0..15).map(|i| i as f32).collect();
        let r = Routing {
            topk_ids: &ids,
            topk_weights: &w,
            m: 5,
            topk: 3,
            num_experts: 6,
            expert_mask: None,
            num_tokens: 5,
        };
        let s = moe_sorting(&r, 4).unwrap();
        assert_eq!(s.num_valid_ids, [24, 5]);
        assert_eq!(&s.sorted_expert_ids[..6], &[0, 1, 2, 3, 3, 5]);
        let p = |s: i32, t: i32| (s << 24) | t;
        let sen = p(3, 5);
        assert_eq!(&s.sorted_token_ids[..4], &[p(0, 0), sen, sen, sen]);
        assert_eq!(&s.sorted_token_ids[8..12], &[p(0, 1), p(1, 3), sen, sen]);
        assert_eq!(s.sorted_token_ids.len(), 5 * 3 + 6 * 4 - 3);
    }

    #[test]
    fn the_packing_refuses_what_it_cannot_index() {
        let ids = vec![0; PACKED_MAX_TOPK + 1];
        let w = vec![1.0; PACKED_MAX_TOPK + 1];
        let r = |topk: usize| Routing {
            topk_ids: &ids[..topk],
            topk_weights: &w[..topk],
            m: 1,
            topk,
            num_experts: 1,
            expert_mask: None,
            num_tokens: 1,
        };
        let s = moe_sorting(&r(PACKED_MAX_TOPK), 1).unwrap();
        assert_eq!(s.sorted_token_ids[127], 127 << 24);
        let e = moe_sorting(&r(PACKED_MAX_TOPK + 1), 1).unwrap_err();
        assert_eq!(e.status, crate::error::Status::Unsupported);
        assert!(
            e.message.contains("at most 16777215 tokens and 128 slots"),
            "{}",
            e.message
        );
    }
}
