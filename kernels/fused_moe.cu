// Fused MoE: route + sort on the device, stage-1 GEMM with in-kernel weight dequantization and
// the gated activation, stage-2 GEMM with the routing weight, and a per-token reduction in a
// fixed order (deterministic, no float atomics). The shared pieces are moe_common.cuh; the
// GEMM stages come from one family, chosen by the host (src/backend/gpu/heuristics.rs) and
// named by FAMILY (names from spec::abi_prelude):
//   FAMILY_FP32    fp32 FMA tiles: any device, any configuration (moe_gemm_fp32.cuh)
//   FAMILY_TILE32  mma.sync, 32 rows x 128 weight rows per block: sm_80+ (moe_gemm_tile32.cuh)
//   FAMILY_STREAM  swap-AB weight streaming for few tokens per expert: sm_80+, fp8 MMA on
//                  sm_89+ (moe_gemm_stream.cuh)
//   FAMILY_WGMMA   wgmma on 128-row tiles, cp.async ring: sm_90a (moe_gemm_wgmma.cuh)
//   FAMILY_MFMA    AMD matrix cores (MFMA, wave64), 32 rows x 128 weight rows per block:
//                  gfx942 / gfx950 (moe_gemm_mfma.cuh)
#include "moe_common.cuh"

#if FAMILY == FAMILY_FP32
#include "moe_gemm_fp32.cuh"
#elif FAMILY == FAMILY_TILE32
#include "moe_gemm_tile32.cuh"
#elif FAMILY == FAMILY_STREAM
#include "moe_gemm_stream.cuh"
#elif FAMILY == FAMILY_WGMMA
#include "moe_gemm_wgmma.cuh"
#elif FAMILY == FAMILY_MFMA
#include "moe_gemm_mfma.cuh"
#else
#error "unknown FAMILY"
#endif
// Every kernel of a PDL module must wait on its predecessor: the stream and wgmma families'
// stages do (spec::Pdl).
#if PDL && FAMILY != FAMILY_STREAM && FAMILY != FAMILY_WGMMA
#error "PDL: only the stream and wgmma families' stages call pdl_enter"
#endif
