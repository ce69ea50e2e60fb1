// kernels/mma_sm90.cuh's instructions on the host, and the asynchronous shared-memory copies of
// kernels/moe_gemm_wgmma.cuh and moe_gemm_stream.cuh (SW_XSHARED), for scripts/emulate_check.sh
// cuda (included by mma_sm90.cuh and moe_gemm_stream.cuh under MP_HOST; gpu_emulator.h
// provides the threads, the warpgroup barriers and the block's dynamic shared memory).
// Written from the PTX ISA, independently of the kernel's indexing:
//
// wgmma.mma_async.sync.aligned.m64nNkK.f32.T.T d, a-desc, b-desc, scale-d, 1, 1[, 0, 0]
//   D (64 x N, f32) = A (64 x K) * B (K x N) + (scale-d ? D : 0), both operands in shared
//   memory, K-major (trans-a = trans-b = 0): row m of A and column n of B hold their K values
//   contiguously. K = 16 (bf16, f16: 2 bytes) or 32 (e4m3: 1 byte): 32 bytes of each row.
// Matrix descriptor (64 bits): bits 0-13 start address >> 4, 16-29 leading dimension byte
//   offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 base offset, 62-63 swizzle
//   (0 none, 1 128B, 2 64B, 3 32B). Canonical K-major layouts, rows grouped by 8 into core
//   matrices (8 rows x 16 bytes):
//   - no swizzle: a core matrix is 128 contiguous bytes (row r of it at 16 r); core matrices
//     adjacent along K are LBO bytes apart, along M / N SBO bytes apart;
//   - 128B swizzle: a swizzle atom is 8 rows of 128 bytes (row r at 128 r, K contiguous in the
//     row), atoms adjacent along M / N SBO bytes apart (LBO unused: one instruction's 32 bytes
//     of K lie in one row); the 16-byte chunk bits [4:6] of the address are XORed with its
//     row bits [7:9]. Only base offset 0 with a start address at row 0 of an atom (address
//     bits [7:9] zero) is emulated: where those differ the ISA's variants would disagree.
// The register-operand form ... d, {a0, a1, a2, a3}, b-desc, scale-d, 1, 1, 0 (16-bit A from
//   registers, no A transpose): element (m, k) of A is half k % 2 of register
//   (m % 16) / 8 + 2 ((k % 16) / 8) of thread 32 (m / 16) + 4 (m % 8) + (k % 8) / 2 (ISA
//   "Register fragment for matrix A", the m16n8k16 A fragment on each warp's 16 rows).
// Accumulator fragment (ISA "Matrix Fragments for wgmma .m64nNk16 / .m64nNk32", the same for
//   both): thread t of the warpgroup, warp w = t / 32, lane = t % 32 = 4 gid + tig, holds
//   d[i] = D[16 w + gid + 8 ((i % 4) / 2)][8 (i / 4) + 2 tig + (i % 2)], i < N / 2.
// Asynchrony: an operation completes at the latest point the ISA allows, so that a kernel which
//   reads before it waits, or overwrites before the reader is done, reads the wrong bytes:
//   - cp.async (16 bytes, src-size bytes copied, the rest zero-filled) completes when
//     cp.async.wait_group N leaves at most N of the thread's committed groups pending; the
//     copy reads its global source then;
//   - wgmma.mma_async reads its operands and writes d when wgmma.wait_group N leaves at most N
//     of the thread's groups pending, after all 128 threads of the warpgroup reached that wait
//     (which also checks that they issued the same descriptors, kinds and scale-d); A from
//     registers is read then too, from the registers every thread named at issue, so a
//     kernel that rewrites them before the wait gets the wrong products;
//   - wgmma.fence, fence.proxy.async: no-ops (one proxy, no reordering here).
// Products are summed in double and rounded once: the hardware's fp32 sums differ from it by
// rounding only, far inside the check's tolerance.
#pragma once
#include <deque>
#include <vector>

// ---- cp.async.{cg,ca}.shared.global [dst], [src], cp-size, src-size -----------------------
struct EmuCopy {
  unsigned dst;
  const void* src;
  int bytes;  // src-size: the rest of the cp-size bytes are zeros
  int size;   // cp-size
};
inline thread_local std::vector<EmuCopy> emu_cp_open;                // not yet committed
inline thread_local std::deque<std::vector<EmuCopy>> emu_cp_groups;  // committed, pending

static inline void emu_cp_async_n(unsigned dst, const void* src, int cp_size, int src_size) {
  if (dst % cp_size) emu_fail("cp.async: shared address not aligned to the cp-size", dst);
  if (src_size < 0 || src_size > cp_size) emu_fail("cp.async: src-size past cp-size", src_size);
  if (src_size && (uintptr_t)src % cp_size) emu_fail("cp.async: global address not aligned", (uintptr_t)src);
  emu_shared_ptr(dst, cp_size);  // in bounds at issue
  emu_cp_open.push_back({dst, src, src_size, cp_size});
  ++emu_async_pending;
}
static inline void emu_cp_async(unsigned dst, const void* src, int src_size) {
  emu_cp_async_n(dst, src, 16, src_size);
}
static inline void emu_cp_run(const std::vector<EmuCopy>& copies);
static inline void emu_cp_commit() {
  emu_cp_groups.push_back(std::move(emu_cp_open));
  emu_cp_open.clear();
}
static inline void emu_cp_wait(int n) {
  while ((int)emu_cp_groups.size() > n) {
    emu_cp_run(emu_cp_groups.front());
    emu_async_pending -= (int)emu_cp_groups.front().size();
    emu_cp_groups.pop_front();
  }
}
// st.shared.v4.u32 [addr], {v0, v1, v2, v3}
static inline void emu_st_shared_v4(unsigned addr, const unsigned v[4]) {
  if (addr % 16) emu_fail("st.shared.v4: address not 16-byte aligned", addr);
  memcpy(emu_shared_ptr(addr, 16), v, 16);
}

// ---- wgmma ----------------------------------------------------------------------------------
enum EmuWgKind { EMU_WG_BF16, EMU_WG_F16, EMU_WG_E4M3 };
struct EmuWgmma {
  float* d;
  u64 da, db;
  int scale_d, kind, n;
  const unsigned* a;  // the register-operand form: this thread's A registers, else null
  bool operator!=(const EmuWgmma& o) const {
    return (a ? o.a == nullptr : da != o.da || o.a != nullptr) || db != o.db ||
           scale_d != o.scale_d || kind != o.kind || n != o.n;
  }
};
inline thread_local std::vector<EmuWgmma> emu_wg_open;
inline thread_local std::deque<std::vector<EmuWgmma>> emu_wg_groups;
// Each warpgroup thread's operations completing at the wait the warpgroup is meeting in.
inline std::vector<EmuWgmma> emu_wg_done[EMU_MAX_WARPGROUPS][128];

// The shared-state-space address of element (row, k) of a K-major operand (row: m of A, n of
// B) of `esize`-byte elements, from its descriptor.
static inline unsigned emu_desc_addr(u64 desc, int row, int k, int esize) {
  unsigned start = (unsigned)(desc & 0x3FFF) << 4;
  unsigned lbo = (unsigned)((desc >> 16) & 0x3FFF) << 4;
  unsigned sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
  unsigned base_offset = (unsigned)(desc >> 49) & 7, mode = (unsigned)(desc >> 62);
  unsigned kb = (unsigned)(k * esize);  // byte of the row's K values
  unsigned r8 = (unsigned)row % 8, g = (unsigned)row / 8;
  if (mode == 0) return start + g * sbo + (kb / 16) * lbo + r8 * 16 + kb % 16;
  if (mode == 1) {
    if (base_offset != 0 || ((start >> 7) & 7) != 0)
      emu_fail("wgmma: 128B swizzle with a start off an atom's row 0 (not emulated)", desc);
    unsigned a = start + g * sbo + r8 * 128 + kb;
    return a ^ (((a >> 7) & 7) << 4);
  }
  emu_fail("wgmma: swizzle mode not emulated (32B / 64B)", mode);
}

static inline float emu_wg_element(unsigned addr, int kind) {
  if (kind == EMU_WG_E4M3) return emu_fp8(*emu_shared_ptr(addr, 1), false);
  u16 h;
  memcpy(&h, emu_shared_ptr(addr, 2), 2);
  return kind == EMU_WG_F16 ? emu_f16(h) : emu_bf16(h);
}

// Element (m, k) of a register A operand: the registers thread t' of warpgroup wg named in its
// op-th operation of the completing groups.
static inline float emu_wg_register_a(int wg, size_t op, int m, int k, int kind) {
  int t = 32 * (m / 16) + 4 * (m % 8) + (k % 8) / 2;
  unsigned r = emu_wg_done[wg][t][op].a[(m % 16) / 8 + 2 * ((k % 16) / 8)];
  u16 h = (u16)(r >> (16 * (k % 2)));
  return kind == EMU_WG_F16 ? emu_f16(h) : emu_bf16(h);
}

// This thread's fragment of one wgmma (the op-th of those completing for warpgroup wg): rows
// 16 w + gid + 8 h of A (h = 0, 1) against columns 8 j + 2 tig + c of B (j < N / 8, c = 0, 1),
// each operand element decoded once.
static inline void emu_wgmma_run(const EmuWgmma& op, int wg, size_t index, int t) {
  int esize = op.kind == EMU_WG_E4M3 ? 1 : 2, K = 32 / esize;
  int w = t / 32, lane = t % 32, gid = lane / 4, tig = lane % 4;
  float a[2][32], b[64][32];
  if (op.a && esize != 2) emu_fail("wgmma: register A operand of 8-bit type (not emulated)", esize);
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < K; ++k)
      a[h][k] = op.a ? emu_wg_register_a(wg, index, 16 * w + gid + 8 * h, k, op.kind)
                     : emu_wg_element(emu_desc_addr(op.da, 16 * w + gid + 8 * h, k, esize), op.kind);
  for (int j = 0; j < op.n / 8; ++j)
    for (int c = 0; c < 2; ++c)
      for (int k = 0; k < K; ++k)
        b[2 * j + c][k] =
            emu_wg_element(emu_desc_addr(op.db, 8 * j + 2 * tig + c, k, esize), op.kind);
  for (int i = 0; i < op.n / 2; ++i) {
    // d[i] = D[16 w + gid + 8 ((i % 4) / 2)][8 (i / 4) + 2 tig + (i % 2)]
    const float* ar = a[(i % 4) / 2];
    const float* bc = b[2 * (i / 4) + i % 2];
    double s = 0.0;
    for (int k = 0; k < K; ++k) s += (double)ar[k] * (double)bc[k];
    op.d[i] = (float)(op.scale_d ? s + (double)op.d[i] : s);
  }
}

static inline void emu_wgmma(float* d, u64 da, u64 db, int scale_d, int kind, int n,
                             const unsigned* a = nullptr) {
  emu_wg_open.push_back({d, da, db, scale_d != 0, kind, n, a});
  ++emu_async_pending;
}
static inline void emu_wgmma_commit() {
  emu_wg_groups.push_back(std::move(emu_wg_open));
  emu_wg_open.clear();
}
static inline void emu_wgmma_wait(int n) {
  int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  std::vector<EmuWgmma>& done = emu_wg_done[wg][t];
  done.clear();
  while ((int)emu_wg_groups.size() > n) {
    for (const EmuWgmma& op : emu_wg_groups.front()) done.push_back(op);
    emu_wg_groups.pop_front();
  }
  emu_wg_barrier[wg]->arrive_and_wait();  // the whole warpgroup issued what completes here
  const std::vector<EmuWgmma>& first = emu_wg_done[wg][0];
  if (done.size() != first.size())
    emu_fail("wgmma: threads of a warpgroup complete different counts", done.size());
  for (size_t i = 0; i < done.size(); ++i)
    if (done[i] != first[i]) emu_fail("wgmma: operands differ across the warpgroup", i);
  for (size_t i = 0; i < done.size(); ++i) {
    emu_wgmma_run(done[i], wg, i, t);
    --emu_async_pending;
  }
  // The MMAs are complete (every thread's share of their operand reads done, as on the GPU,
  // where a thread past the wait may let the operands be overwritten), and every thread
  // compared against thread 0's list before it is rewritten.
  emu_wg_barrier[wg]->arrive_and_wait();
}

static inline void wgmma_fence() {}
static inline void wgmma_commit() { emu_wgmma_commit(); }
template <int N>
static inline void wgmma_wait() {
  emu_wgmma_wait(N);
}
#define EMU_WGMMA_FORM(name, kind, n)                                                   \
  static inline void wgmma_##name##_n##n(float* d, u64 da, u64 db, int accumulate) { \
    emu_wgmma(d, da, db, accumulate, kind, n);                                      \
  }
EMU_WGMMA_FORM(bf16, EMU_WG_BF16, 128)
EMU_WGMMA_FORM(f16, EMU_WG_F16, 128)
EMU_WGMMA_FORM(e4m3, EMU_WG_E4M3, 128)
EMU_WGMMA_FORM(bf16, EMU_WG_BF16, 256)
EMU_WGMMA_FORM(f16, EMU_WG_F16, 256)
EMU_WGMMA_FORM(e4m3, EMU_WG_E4M3, 256)
#undef EMU_WGMMA_FORM
#define EMU_WGMMA_RS_FORM(name, kind, n)                                                        \
  static inline void wgmma_##name##_rs_n##n(float* d, const u32* a, u64 db, int accumulate) { \
    emu_wgmma(d, 0, db, accumulate, kind, n, a);                                             \
  }
EMU_WGMMA_RS_FORM(bf16, EMU_WG_BF16, 32)
EMU_WGMMA_RS_FORM(bf16, EMU_WG_BF16, 64)
EMU_WGMMA_RS_FORM(bf16, EMU_WG_BF16, 128)
#undef EMU_WGMMA_RS_FORM

// ---- mbarrier, cp.async.bulk.tensor (TMA), cp.async.mbarrier.arrive.noinc ---------------------
// An mbarrier (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"):
// init(count) starts phase 0 with `count` pending arrivals and a transaction count of 0;
// arrive decrements the arrivals, expect_tx(b) adds b to the transaction count (then
// arrives), a TMA's complete_tx(b) subtracts b; the phase completes when both reach 0, and
// the next starts with `count` arrivals. try_wait.parity(P) is true once the phase of parity P
// has completed, i.e. the current phase's parity is not P (at init, P = 1 names the phase
// before phase 0: complete). The state is kept by the barrier's shared address.
// Asynchrony: a TMA copy and the arrival of a cp.async.mbarrier.arrive.noinc (with the copies
// it waits for) are attached to their barrier and carried out only when a thread waits on
// that barrier's phase and finds it incomplete: the latest point the ISA allows.
// The tensor map (CUtensorMap, opaque on the GPU) is the emulator's own encoding of the
// host's parameters (src/backend/gpu/tma.rs geometry: globalDim, globalStrides, boxDim;
// uint8, element strides 1, no interleave, no swizzle, zero fill out of bounds): emu_tma_map.
#include <map>
#include <thread>

#define EMU_TMA_MAGIC 0x454d55544d41ull  // "EMUTMA"
static inline void emu_tma_map(u64* words, u64 address, const u64 dims[5], const u64 strides[4],
                               const unsigned boxes[5]) {
  for (int i = 0; i < 16; ++i) words[i] = 0;
  words[0] = address;
  for (int i = 0; i < 5; ++i) words[1 + i] = dims[i], words[10 + i] = boxes[i];
  for (int i = 0; i < 4; ++i) words[6 + i] = strides[i];
  words[15] = EMU_TMA_MAGIC;
}

struct EmuTma {
  unsigned dst;
  u64 map[16];
  int c[5];
};
struct EmuMbar {
  int count = 0, pending = 0;
  long long tx = 0;
  unsigned phase = 0;
  std::vector<EmuTma> tma;                     // issued, not yet carried out
  std::vector<std::vector<EmuCopy>> arrivals;  // noinc arrivals with the copies they await
};
inline std::mutex emu_mbar_mu;
inline std::map<unsigned, EmuMbar> emu_mbars;

static inline EmuMbar& emu_mbar(unsigned bar) {  // emu_mbar_mu held
  if (bar % 8 || bar < EMU_STATIC_SHARED_ADDR || bar >= EMU_STATIC_SHARED_ADDR + 256 * EMU_STATIC_WINDOWS)
    emu_fail("mbarrier: not an 8-byte aligned static shared address", bar);
  auto it = emu_mbars.find(bar);
  if (it == emu_mbars.end() || it->second.count == 0) emu_fail("mbarrier: used before init", bar);
  return it->second;
}
static inline void emu_mbar_step(EmuMbar& m) {  // completes the phase when nothing is pending
  if (m.pending == 0 && m.tx == 0) ++m.phase, m.pending = m.count;
}
static inline void emu_mbar_arrive_locked(EmuMbar& m, unsigned bar) {
  if (m.pending <= 0) emu_fail("mbarrier: more arrivals than the count", bar);
  --m.pending;
  emu_mbar_step(m);
}

static inline void emu_mbar_init(unsigned bar, unsigned count) {
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  EmuMbar& m = emu_mbars[bar];
  if (!m.tma.empty() || !m.arrivals.empty())
    emu_fail("mbarrier: init with copies still attached", bar);
  if (count == 0) emu_fail("mbarrier: init with count 0", bar);
  m = EmuMbar{};
  m.count = m.pending = (int)count;
}
static inline void emu_mbar_arrive(unsigned bar) {
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  emu_mbar_arrive_locked(emu_mbar(bar), bar);
}
static inline void emu_mbar_expect_tx(unsigned bar, unsigned bytes) {
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  EmuMbar& m = emu_mbar(bar);
  m.tx += bytes;
  emu_mbar_arrive_locked(m, bar);
}

// mbarrier.expect_tx (no arrival): the transaction count grows, the arrivals do not.
static inline void emu_mbar_expect_tx_only(unsigned bar, unsigned bytes) {
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  emu_mbar(bar).tx += bytes;
}

// cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
//   [dst], [map, {c0..c4}], [bar]
static inline void emu_tma_load_5d(unsigned dst, const u64* map, int c0, int c1, int c2, int c3,
                                   int c4, unsigned bar) {
  if (map[15] != EMU_TMA_MAGIC) emu_fail("TMA: not a tensor map of the emulator", map[15]);
  if (dst % 128) emu_fail("TMA: shared destination not 128-byte aligned", dst);
  EmuTma t{dst, {}, {c0, c1, c2, c3, c4}};
  memcpy(t.map, map, sizeof t.map);
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  emu_mbar(bar).tma.push_back(t);
}
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar]:
// a one-dimensional TMA copy (a map of one row of `bytes`), carried out as those are.
static inline void emu_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  if (bytes % 16 || (uintptr_t)src % 16 || dst % 16)
    emu_fail("bulk copy: size or an address not a multiple of 16", bytes);
  EmuTma t{dst, {}, {0, 0, 0, 0, 0}};
  t.map[0] = (u64)(uintptr_t)src;
  for (int i = 0; i < 5; ++i) t.map[1 + i] = i ? 1 : bytes, t.map[10 + i] = i ? 1 : bytes;
  for (int i = 0; i < 4; ++i) t.map[6 + i] = 16 * (u64)bytes;
  t.map[15] = EMU_TMA_MAGIC;
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  emu_mbar(bar).tma.push_back(t);
}
// The box of one TMA copy, innermost dimension first, into shared memory in box order;
// elements past globalDim are zeros. Returns the bytes (the transaction count it completes).
static inline long long emu_tma_run(const EmuTma& t) {
  const u64* m = t.map;
  const unsigned char* g = (const unsigned char*)(uintptr_t)m[0];
  u64 dim[5], stride[5] = {1, m[6], m[7], m[8], m[9]};
  unsigned box[5];
  for (int i = 0; i < 5; ++i) dim[i] = m[1 + i], box[i] = (unsigned)m[10 + i];
  if ((box[0] % 16) || (uintptr_t)g % 16) emu_fail("TMA: box rows or address not 16-byte multiples", box[0]);
  for (int i = 1; i < 5; ++i)
    if (stride[i] % 16) emu_fail("TMA: global stride not a multiple of 16", stride[i]);
  long long bytes = (long long)box[0] * box[1] * box[2] * box[3] * box[4];
  unsigned char* d = emu_shared_ptr(t.dst, (unsigned)bytes);
  long long n = 0;
  for (unsigned b4 = 0; b4 < box[4]; ++b4)
    for (unsigned b3 = 0; b3 < box[3]; ++b3)
      for (unsigned b2 = 0; b2 < box[2]; ++b2)
        for (unsigned b1 = 0; b1 < box[1]; ++b1)
          for (unsigned b0 = 0; b0 < box[0]; ++b0, ++n) {
            long long c[5] = {(long long)t.c[0] + b0, (long long)t.c[1] + b1,
                              (long long)t.c[2] + b2, (long long)t.c[3] + b3,
                              (long long)t.c[4] + b4};
            bool in = true;
            u64 off = 0;
            for (int i = 0; i < 5; ++i) {
              in = in && c[i] >= 0 && (u64)c[i] < dim[i];
              off += (u64)c[i] * stride[i];
            }
            d[n] = in ? g[off] : 0;
          }
  return bytes;
}

static inline void emu_mbar_wait(unsigned bar, unsigned parity) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(emu_mbar_mu);
      EmuMbar& m = emu_mbar(bar);
      if ((m.phase & 1) != (parity & 1)) return;
      // Carry out what is attached, then look again.
      for (const EmuTma& t : m.tma) m.tx -= emu_tma_run(t);
      m.tma.clear();
      if (m.tx < 0) emu_fail("mbarrier: more bytes completed than expected", bar);
      for (const std::vector<EmuCopy>& a : m.arrivals) {
        emu_cp_run(a);
        emu_mbar_arrive_locked(m, bar);
      }
      m.arrivals.clear();
      emu_mbar_step(m);
      if ((m.phase & 1) != (parity & 1)) return;
    }
    std::this_thread::yield();
  }
}

// cp.async.mbarrier.arrive.noinc [bar]: the arrival comes after every cp.async this thread
// issued so far has completed (those copies leave the thread's groups).
static inline void emu_cp_run(const std::vector<EmuCopy>& copies) {
  for (const EmuCopy& c : copies) {
    unsigned char* d = emu_shared_ptr(c.dst, c.size);
    memcpy(d, c.src, c.bytes);
    memset(d + c.bytes, 0, c.size - c.bytes);
  }
}
static inline void emu_cp_async_arrive(unsigned bar) {
  std::vector<EmuCopy> all;
  for (const std::vector<EmuCopy>& g : emu_cp_groups) all.insert(all.end(), g.begin(), g.end());
  all.insert(all.end(), emu_cp_open.begin(), emu_cp_open.end());
  emu_async_pending -= (int)all.size();
  for (std::vector<EmuCopy>& g : emu_cp_groups) g.clear();  // the groups stay, now empty
  emu_cp_open.clear();
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  emu_mbar(bar).arrivals.push_back(std::move(all));
}

// After a launch: a TMA copy or noinc arrival nobody waited for is a kernel bug (its bytes
// would land, or its barrier complete, after the kernel).
static inline void emu_mbar_check_drained() {
  std::lock_guard<std::mutex> lock(emu_mbar_mu);
  for (const auto& [bar, m] : emu_mbars)
    if (!m.tma.empty() || !m.arrivals.empty())
      emu_fail("mbarrier: copies attached that no thread waited for", bar);
}
