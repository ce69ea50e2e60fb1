// One fused_moe launch of one kernel configuration (the -D set of the HIP or CUDA backend,
// FAMILY included) run on the host under gpu_emulator.h, on inputs made from a fixed seed, so that
// two families compiled from the same configuration see the same inputs. Writes the f32 stage-2
// rows (y) of routed pairs and the output (as f32) to the file named by argv[1]. Launch order
// and grids are the backend's (src/backend/gpu/mod.rs); the block's columns and threads come
// from the host's spec (EMU_N1, EMU_N2, EMU_THREADS: examples/kernel_configs.rs --emulate).
#include "gpu_emulator.h"

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <tuple>
#include <thread>
#include <vector>

thread_local emu_uint3 threadIdx, blockIdx;
std::barrier<>* emu_block_barrier;
std::barrier<>* emu_group_barrier[EMU_MAX_GROUPS];
int emu_block_count;

// The 128-byte lines (byte address / 128) the stream family prefetched and loaded, keyed by
// the block, and for a warp's own prefetches (one line) by the warp too: a line a warp asks
// for must be read by that warp, a range the block asks for (bulk) by the block's warps.
using EmuLine = std::tuple<unsigned, unsigned, int, uintptr_t>;  // block x, y, warp or -1, line
static std::mutex emu_lines_mutex;
static std::set<EmuLine> emu_prefetched, emu_loaded;
void emu_note_prefetch_line(const void* p) {
  std::lock_guard<std::mutex> g(emu_lines_mutex);
  emu_prefetched.insert({blockIdx.x, blockIdx.y, (int)(threadIdx.x / EMU_LANES), (uintptr_t)p >> 7});
}
void emu_note_prefetch_range(const void* p, unsigned long bytes) {
  std::lock_guard<std::mutex> g(emu_lines_mutex);
  for (uintptr_t a = (uintptr_t)p; a < (uintptr_t)p + bytes; a += 16)
    emu_prefetched.insert({blockIdx.x, blockIdx.y, -1, a >> 7});
}
void emu_note_stream_load(const void* p) {
  std::lock_guard<std::mutex> g(emu_lines_mutex);
  int warp = (int)(threadIdx.x / EMU_LANES);
  emu_loaded.insert({blockIdx.x, blockIdx.y, warp, (uintptr_t)p >> 7});
  emu_loaded.insert({blockIdx.x, blockIdx.y, -1, (uintptr_t)p >> 7});
}
// After a stage: every prefetched line was loaded (exits 3 otherwise); prints the counts.
static void check_prefetch(const char* stage) {
  size_t unread = 0;
  for (const EmuLine& l : emu_prefetched) unread += !emu_loaded.count(l);
  if (!emu_prefetched.empty())
    fprintf(stderr, "emulate_fused_moe: %s: %zu prefetched lines, %zu of them never read by the "
            "warp or block that asked\n", stage, emu_prefetched.size(), unread);
  if (unread) exit(3);
  emu_prefetched.clear();
  emu_loaded.clear();
}
#ifdef EMU_CUDA
EmuWarp emu_warps[EMU_MAX_GROUPS];
#else
EmuWave emu_waves[EMU_MAX_GROUPS];
#endif

#include "fused_moe.cu"

// Problem size: padded K in both stages (I < Ip); expert 0 gets several tiles (below).
#if EMU_WG_SHAPES
// The wgmma family and its fp32 twin (examples/kernel_configs.rs): expert 0 gets more than
// one full 128-row tile (checked below), K spans several 128-byte steps in both stages (16-bit
// stage 1: 8, more than the ring's stages; fp8: 4 and 2; stage 2's last one partial) and
// stage 1's last column block is partial.
static const int M = 192, TOPK = 2, E_GLOBAL = 4, H = 512, HP = 512, I = 224, IP = 256;
#else
static const int M = 53, TOPK = 2, E_GLOBAL = 4, H = 256, HP = 256, I = 96, IP = 128;
#endif

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static unsigned rnd() {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (unsigned)(rng_state >> 11);
}
static float uniform() { return (rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }  // [-1, 1)

static u16 act16(float v, bool f16) { return f16 ? (u16)__builtin_bit_cast(u16, (_Float16)v) : mp_f32_to_bf16(v); }

static bool fp8_nan(unsigned c) { return FP8_FNUZ ? c == 0x80u : (c & 0x7fu) == 0x7fu; }

// Weights of an [E, N, K] matrix: codes of the format (padded columns k >= Kl random too,
// NaN included: the kernels must ignore them).
static std::vector<u8> weights(int E, int N, int K, int Kl) {
  bool mx4 = WFMT == WF_MXFP4, w16 = WFMT == WF_BF16 || WFMT == WF_FP16;
  size_t elems = (size_t)E * N * K, bytes = mx4 ? elems / 2 : w16 ? elems * 2 : elems;
  std::vector<u8> w(bytes);
  for (int e = 0; e < E; ++e)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        // Storage position: the layout's (the same function the kernels read through).
        i64 off = (i64)e * N * K;
        bool pad = k >= Kl;
        if (w16) {
          u16 v = pad ? (u16)(rnd() | 0x7f80u) : act16(uniform() * 0.25f, WFMT == WF_FP16);
          i64 at = off + w_offset(n, k, K, 8);
          memcpy(&w[at * 2], &v, 2);
        } else if (mx4) {
          i64 at = off / 2 + w_offset(n, k >> 1, K / 2, 16);
          unsigned c = rnd() & 15u;
          w[at] = (u8)((k & 1) ? (w[at] & 0x0f) | c << 4 : (w[at] & 0xf0) | c);
        } else {
          unsigned c;
          do c = rnd() & 255u; while (!pad && fp8_nan(c));
          w[off + w_offset(n, k, K, 16)] = (u8)c;
        }
      }
  return w;
}

// Weight scales of an [E, N, K] matrix, over-allocated for every scale layout.
static std::vector<u8> scales(int E, int N, int K) {
  std::vector<u8> s;
  if (WFMT == WF_MXFP4 || WFMT == WF_MXFP8) {
    size_t sn = ((K / 32) + 7) & ~7, rows = ((size_t)E * N + 31) / 32 * 32 + 32 * E;
    s.resize(rows * sn);
    // 2^-9 .. 2^-2, and in the first eighth of the bytes (some rows' scales, whichever
    // layout) MXFP4 scales of 4 .. 16: above 2 the bf16 decode needs a second multiply
    // (kernels/mx_bf16.cuh), and the GPU suite's scales never get there.
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = (u8)(WFMT == WF_MXFP4 && i < s.size() / 8 ? 129 + rnd() % 3 : 118 + rnd() % 8);
  } else {
    size_t n = (size_t)E * ((N + 127) / 128) * ((K + 127) / 128) + (size_t)E * N + E;
    std::vector<float> f(n);
    for (auto& v : f) v = 0.01f + 0.02f * (rnd() % 100) / 100.0f;
    s.resize(n * 4);
    memcpy(s.data(), f.data(), s.size());
  }
  return s;
}

template <typename F>
static void launch(F kernel, const Params& p, int gx, int gy, int threads,
                   unsigned dyn_bytes = 0) {
  std::barrier<> block(threads);
  emu_block_barrier = &block;
  int groups = threads / EMU_LANES;
  if (threads % EMU_LANES || groups > EMU_MAX_GROUPS) {
    fprintf(stderr, "emulate_fused_moe: %d threads are not whole warps of %d (at most %d)\n",
            threads, EMU_LANES, EMU_MAX_GROUPS);
    exit(2);
  }
  for (int w = 0; w < groups; ++w) emu_group_barrier[w] = new std::barrier<>(EMU_LANES);
  // Warpgroups (wgmma) and the dynamic shared memory (gpu_emulator.h).
  for (int g = 0; g < groups / 4; ++g) emu_wg_barrier[g] = new std::barrier<>(4 * EMU_LANES);
#if FAMILY == FAMILY_WGMMA
  std::barrier<> consumers(WG_CONSUMER_THREADS);
  emu_consumers_barrier = &consumers;
#endif
  std::vector<unsigned char> dyn(dyn_bytes);
  gridDim = {(unsigned)gx, (unsigned)gy, 1};
  emu_dyn_shared = dyn.data(), emu_dyn_bytes = dyn_bytes;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      threadIdx = {(unsigned)t, 0, 0};
      for (int y = 0; y < gy; ++y)
        for (int x = 0; x < gx; ++x) {
          blockIdx = {(unsigned)x, (unsigned)y, 0};
          if (dyn_bytes) {  // what the last block left is not this block's data
            if (t == 0) memset(dyn.data(), 0xff, dyn_bytes);
            __syncthreads();
          }
          kernel(p);
          if (emu_async_pending) emu_fail("left a block with asynchronous operations pending", emu_async_pending);
          __syncthreads();  // the next block starts after every thread left this one
        }
    });
  for (auto& t : ts) t.join();
#if FAMILY == FAMILY_WGMMA
  emu_mbar_check_drained();
#endif
  for (int w = 0; w < groups; ++w) delete emu_group_barrier[w];
  for (int g = 0; g < groups / 4; ++g) delete emu_wg_barrier[g];
}

#if ACT_Q && QG
// quant_row_block on rows longer than the fused_moe problem's (several passes of the block,
// a partial last group), by moe_quant1's 256 threads and by the route kernel's 1024, against
// the definition written out here: each group's amax, group_scale, act_encode of each value
// over the scale. Bit for bit; exits 4 on the first difference.
static void quant_block_route(const Params& p) {
  __shared__ float red[SCAN_THREADS];
  quant_row_block<1, SCAN_THREADS>(p, blockIdx.x, red);
}
static void check_quant_rows() {
  const unsigned long long seed = rng_state;  // the problem's inputs stay those of the seed
  const int rows = 3;
  for (int K : {2 * 1024 + 160, 4096 + 1184}) {
    int cols = K + 8, ng = (K + QG - 1) / QG;
    std::vector<u16> x((size_t)rows * cols);
    for (size_t i = 0; i < x.size(); ++i) {
      float v = uniform() * (i % 977 == 0 ? 300.0f : 2.0f);  // a few large values
      x[i] = act16(i / cols == 1 && i % cols < (size_t)QG ? 0.0f : v, IN_F16);  // a zero group
    }
    for (int threads : {THREADS, SCAN_THREADS}) {
      std::vector<u8> codes((size_t)rows * K, 0xa5);
      std::vector<float> scales((size_t)rows * ng, -1.0f);
      Params p{};
      p.x = (u64)(uintptr_t)x.data(), p.xq = (u64)(uintptr_t)codes.data();
      p.xs = (u64)(uintptr_t)scales.data();
      p.M = rows, p.H = K, p.x_cols = cols, p.ng1 = ng;
      if (threads == THREADS)
        launch(moe_quant1, p, rows, 1, threads);
      else
        launch(quant_block_route, p, rows, 1, threads);
      for (int r = 0; r < rows; ++r)
        for (int g = 0; g < ng; ++g) {
          const u16* src = x.data() + (size_t)r * cols;
          int k0 = g * QG, k1 = k0 + QG < K ? k0 + QG : K;
          float amax = 0.0f;
          for (int k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(quant_src<1>(src, k)));
          float scale = group_scale(amax);
          bool ok = memcmp(&scale, &scales[(size_t)r * ng + g], 4) == 0;
          for (int k = k0; ok && k < k1; ++k)
            ok = codes[(size_t)r * K + k] == act_encode(quant_src<1>(src, k) / scale);
          if (!ok) {
            fprintf(stderr, "emulate_fused_moe: quant_row_block (%d threads, K = %d): row %d "
                    "group %d differs from the definition\n", threads, K, r, g);
            exit(4);
          }
        }
    }
  }
  rng_state = seed;
}
#endif

// moe_route's outputs against the definition written out here (both families of a check run
// the same route kernel, so their comparison cannot see it): each pair's local expert
// (the mask's numbering; -1 unrouted), ceil(count / BM) tiles per expert in expert order,
// -1 past the last tile, and each expert's rows at the start of its first tile, each routed
// pair once, then -1. Exits 5 on the first difference.
static void check_route(const std::vector<int>& ids, const std::vector<int>& mask, int E,
                        int total, const std::vector<int>& pair_local,
                        const std::vector<int>& tile_expert, const std::vector<int>& rows) {
  auto fail = [](const char* what, int at) {
    fprintf(stderr, "emulate_fused_moe: moe_route: %s (at %d) differs from the definition\n",
            what, at);
    exit(5);
  };
  std::vector<int> local(E_GLOBAL, -1), count(E, 0);
  for (int g = 0, n = 0; g < E_GLOBAL; ++g)
    if (!HAS_MASK || mask[g]) local[g] = n++;
  for (int q = 0; q < (int)ids.size(); ++q) {
    int id = ids[q], lid = id >= 0 && id < E_GLOBAL ? local[id] : -1;
    if (lid >= E) lid = -1;
    if (pair_local[q] != lid) fail("pair_local", q);
    if (lid >= 0) ++count[lid];
  }
  int t = 0;
  for (int e = 0; e < E; ++e) {
    int tiles = (count[e] + BM - 1) / BM;
    std::vector<int> seen;
    for (int j = 0; j < tiles * BM; ++j) {
      int q = rows[(size_t)t * BM + j];
      if (j < count[e] ? q < 0 || pair_local[q] != e : q != -1) fail("sorted_rows", t * BM + j);
      if (q >= 0) seen.push_back(q);
    }
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) fail("a repeated pair", e);
    for (int i = 0; i < tiles; ++i, ++t)
      if (tile_expert[t] != e) fail("tile_expert", t);
  }
  if (total != t) fail("total_tiles", total);
  for (int i = t; i < (int)tile_expert.size(); ++i)
    if (tile_expert[i] != -1) fail("tile_expert past the last tile", i);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: emulate_fused_moe OUT\n");
    return 2;
  }
#if ACT_Q && QG
  check_quant_rows();
#endif
  // Experts: with a mask, global expert 1 is not local.
  std::vector<int> mask = {1, 0, 1, 1};
  int E = HAS_MASK ? 3 : E_GLOBAL;
  std::vector<u8> w13 = weights(E, 2 * IP, HP, H), w2 = weights(E, HP, IP, I);
  std::vector<u8> s13 = scales(E, 2 * IP, HP), s2 = scales(E, HP, IP);
  std::vector<float> b13(E * 2 * IP), b2(E * HP);
  for (auto& v : b13) v = uniform() * 0.1f;
  for (auto& v : b2) v = uniform() * 0.1f;
  int x_cols = H + 8;  // a row stride wider than H
  std::vector<u16> x((size_t)M * x_cols);
  for (auto& v : x) v = act16(uniform() * 2.0f, IN_F16);
  std::vector<int> ids(M * TOPK);
  std::vector<float> tw(M * TOPK);
  for (int t = 0; t < M; ++t)
    for (int s = 0; s < TOPK; ++s) {
      int id;
      // Slot 0 mostly on expert 0: it gets more than one tile.
      do id = s == 0 && t % 4 != 3 ? 0 : rnd() % E_GLOBAL;
      while (s == 1 && id == ids[t * TOPK]);
      if (t % 11 == 5) id = -1;  // an unrouted slot
      ids[t * TOPK + s] = id;
      tw[t * TOPK + s] = 0.25f + 0.5f * (rnd() % 100) / 100.0f;
    }

#if EMU_WG_SHAPES
  int rows0 = 0;
  for (int id : ids) rows0 += id == 0;
  // ... and its last tile holds at most 64, so that on 128-row tiles warpgroup 1 has only
  // padding there (wg_has_rows: it skips its MMAs).
  if (rows0 <= 128 || rows0 % 128 > 64) {
    fprintf(stderr, "emulate_fused_moe: expert 0 has %d rows, not 129-192\n", rows0);
    return 2;
  }
#endif
  // Routing outputs (moe_route fills them): at most one partial tile per expert.
  int pairs = M * TOPK, total = 0;
  int max_tiles = E + (pairs + BM - 1) / BM;
  std::vector<int> pair_local(pairs), tile_expert(max_tiles), rows((size_t)max_tiles * BM);

  int ng1 = QG ? (H + QG - 1) / QG : 1, ng2 = QG ? (I + QG - 1) / QG : 1;  // launch::scale_groups
  std::vector<u16> inter((size_t)pairs * I);
  std::vector<float> y((size_t)pairs * H, 0.0f), xs(M * ng1), as(pairs * ng2);
  std::vector<u8> xq((size_t)M * H), aq((size_t)pairs * I);
  std::vector<u16> out((size_t)M * H);
  u32 amax[2] = {0, 0};
  auto u = [](const void* v) { return (u64)(uintptr_t)v; };
  Params p{};
  p.x = u(x.data());
  p.w13 = u(w13.data());
  p.w13_scale = u(s13.data());
  p.w13_bias = HAS_BIAS ? u(b13.data()) : 0;
  p.w2 = u(w2.data());
  p.w2_scale = u(s2.data());
  p.w2_bias = HAS_BIAS ? u(b2.data()) : 0;
  p.topk_weights = u(tw.data());
  p.topk_ids = u(ids.data());
  p.expert_mask = HAS_MASK ? u(mask.data()) : 0;
  p.num_local_tokens = 0;
  p.out = u(out.data());
  p.total_tiles = u(&total);
  p.tile_expert = u(tile_expert.data());
  p.sorted_rows = u(rows.data());
  p.pair_local = u(pair_local.data());
  p.inter = u(inter.data());
  p.y = u(y.data());
  p.amax = u(amax);
  p.xq = u(xq.data());
  p.xs = u(xs.data());
  p.aq = u(aq.data());
  p.as = u(as.data());
  p.M = M, p.topk = TOPK, p.E = E, p.E_global = E_GLOBAL, p.H = H, p.Hp = HP, p.I = I,
  p.Ip = IP;
  p.x_cols = x_cols, p.out_cols = H, p.max_tiles = max_tiles, p.ng1 = ng1, p.ng2 = ng2;
  p.alpha = 1.702f, p.limit = 7.0f, p.has_limit = ACT == AF_SWIGLU_OAI;

#ifdef EMU_N1
  const int n1 = EMU_N1, n2 = EMU_N2, gemm_threads = EMU_THREADS;
#else
  // 64 columns per block: the narrowest of the HIP families (a wider block past the last
  // column only skips its stores).
  const int n1 = 64, n2 = 64, gemm_threads = THREADS;
#endif
#ifdef EMU_DYN_SHARED
  const unsigned dyn = EMU_DYN_SHARED;  // the GEMM blocks' dynamic shared memory (spec)
#else
  const unsigned dyn = 0;
#endif
  // QUANT1_IN_ROUTE: blocks 1 .. M of the route kernel quantize the rows moe_quant1 would.
  launch(moe_route, p, 1 + (QUANT1_IN_ROUTE ? M : 0), 1, SCAN_THREADS);
  check_route(ids, mask, E, total, pair_local, tile_expert, rows);
  if (ACT_Q == AD_FP8_PER_TENSOR) launch(moe_amax1, p, M, 1, THREADS);
  if (ACT_Q && !QUANT1_IN_ROUTE) launch(moe_quant1, p, M, 1, THREADS);
#if FAMILY == FAMILY_WGMMA && WG_TMA
  // The weights' tensor maps from the host's geometry (tma.rs, printed by kernel_configs for
  // this problem: EMU_TMA1 / EMU_TMA2 = globalDim[5], globalStrides[4], boxDim[5]).
  WgTmaMap map1, map2;
  {
    const u64 g1[14] = {EMU_TMA1}, g2[14] = {EMU_TMA2};
    const unsigned b1[5] = {(unsigned)g1[9], (unsigned)g1[10], (unsigned)g1[11],
                            (unsigned)g1[12], (unsigned)g1[13]};
    const unsigned b2[5] = {(unsigned)g2[9], (unsigned)g2[10], (unsigned)g2[11],
                            (unsigned)g2[12], (unsigned)g2[13]};
    // The geometry was computed for this problem: its K chunks are the real columns', its
    // group strides the padded rows'.
    if (g1[4] != (u64)H * WG_ESIZE / 16 || g2[4] != (u64)I * WG_ESIZE / 16 ||
        g1[6] != 16ull * HP * WG_ESIZE * (GATE == GM_INTERLEAVE ? 2 : 1) ||
        g2[6] != 16ull * IP * WG_ESIZE) {
      fprintf(stderr, "emulate_fused_moe: EMU_TMA1/2 are not of this problem's shapes\n");
      return 2;
    }
    emu_tma_map(map1.words, (u64)(uintptr_t)w13.data(), g1, g1 + 5, b1);
    emu_tma_map(map2.words, (u64)(uintptr_t)w2.data(), g2, g2 + 5, b2);
  }
  auto stage1 = [&](const Params& q) { moe_stage1(q, map1); };
  auto stage2 = [&](const Params& q) { moe_stage2(q, map2); };
#else
  auto stage1 = [](const Params& q) { moe_stage1(q); };
  auto stage2 = [](const Params& q) { moe_stage2(q); };
#endif
#if FAMILY == FAMILY_WGMMA && WG_WS
  // Persistent: one block per SM walks every (tile, column block); a few SMs, so that each
  // block takes several work items.
  const int sms = 3;
  auto grid = [&](int gx, int gy, int& x, int& y) { x = gx * gy < sms ? gx * gy : sms, y = 1; };
#else
  auto grid = [](int gx, int gy, int& x, int& y) { x = gx, y = gy; };
#endif
  int gx, gy;
  grid(max_tiles, (I + n1 - 1) / n1, gx, gy);
  launch(stage1, p, gx, gy, gemm_threads, dyn);
  check_prefetch("stage 1");
  if (ACT_Q == AD_FP8_PER_TENSOR) launch(moe_amax2, p, pairs, 1, THREADS);
#ifndef FUSED_QUANT2
#define FUSED_QUANT2 0
#endif
  if (ACT_Q && !FUSED_QUANT2) launch(moe_quant2, p, pairs, 1, THREADS);  // else stage 1 did
  p.ncb2 = (H + n2 - 1) / n2;
  grid(max_tiles, p.ncb2, gx, gy);
  launch(stage2, p, gx, gy, gemm_threads, dyn);
  check_prefetch("stage 2");
  launch(moe_reduce, p, M, (H + THREADS - 1) / THREADS, THREADS);

  FILE* f = fopen(argv[1], "wb");
  if (!f) return 1;
  // y of routed pairs only (unrouted rows are never written), as f32 (PARTIALS_16: stored in
  // the output's 16-bit type).
  for (int q = 0; q < pairs; ++q) {
    if (pair_local[q] < 0) continue;
#if PARTIALS_16
    const u16* row = (const u16*)y.data() + (size_t)q * H;
    for (int n = 0; n < H; ++n) {
      float v = OUT_F16 ? mp_f16_to_f32(row[n]) : mp_bf16_to_f32(row[n]);
      fwrite(&v, 4, 1, f);
    }
#else
    fwrite(&y[(size_t)q * H], 4, H, f);
#endif
  }
  for (u16 o : out) {
    float v = OUT_F16 ? mp_f16_to_f32(o) : mp_bf16_to_f32(o);
    fwrite(&v, 4, 1, f);
  }
  fclose(f);
  return 0;
}
