// moeplug weight preparation on the device (API.md §4): the three writers of src/prep/rows.rs
// (plain rows, F1 tile transpose, F3 e8m0 shuffle) driven by the row maps of
// src/prep/steps.rs, and the MX quantizer of src/quant.rs, bit for bit.
//
// Every output byte is computed from the same index maps as the host code; no kernel reads
// what another writes, so the launches of one call may run in any order on one stream.
#include "moeplug_port.h"

#define PREP_THREADS 256

// Mirrors `RowMap` in src/prep/steps.rs (all u64).
struct RowMap {
  u64 group_rows, groups, src_group_rows, half_out, half_in, mode, block;
};

// `StepParams` in src/backend/gpu/prep.rs is checked against this struct by a test that reads
// this file (prep::tests::params_match_the_kernel_source). Writer arguments a, b, c:
// rows: row_bytes, fill_len, fill (little-endian bytes); tile: row_bytes, tile_rows, pack;
// f3: sn, col_pad, row_pad.
struct StepParams {
  u64 dst, src, units, src_row_bytes, a, b, c;
  RowMap map;
};

// Source row of physical output row p, or -1 for a padding row (RowMap::source_row).
__device__ __forceinline__ i64 source_row(const RowMap& m, u64 p) {
  u64 x = p / m.group_rows, q = p - x * m.group_rows;
  if (x >= m.groups) return -1;
  u64 r;
  if (m.mode == 0) {
    if (q >= m.half_in) return -1;
    r = q;
  } else if (m.mode == 4) {
    u64 bl = m.block, pair = q / (2 * bl), w = q % (2 * bl), g = w / bl;
    r = g * m.half_in + pair * bl + w % bl;
  } else {
    u64 g = q / m.half_out, j = q % m.half_out;
    if (j >= m.half_in) return -1;
    if (m.mode == 1)
      r = g * m.half_in + j;
    else if (m.mode == 2)
      r = (j / 16) * 32 + g * 16 + j % 16;
    else
      r = 2 * j + g;
  }
  return (i64)(x * m.src_group_rows + r);
}

__device__ __forceinline__ bool aligned16(const void* a, const void* b) {
  return ((((u64)a) | ((u64)b)) & 15) == 0;
}

// Plain rows: unit = a 16-byte chunk of an output row. Missing bytes repeat the fill.
MP_KERNEL void __launch_bounds__(PREP_THREADS) prep_rows(StepParams p) {
  const u64 row_bytes = p.a, fill_len = p.b, fill = p.c;
  const u64 chunks = (row_bytes + 15) / 16;
  u8* dst = (u8*)p.dst;
  const u8* src = (const u8*)p.src;
  for (u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x; u < p.units;
       u += (u64)gridDim.x * blockDim.x) {
    u64 row = u / chunks, col0 = (u - row * chunks) * 16;
    u64 n = row_bytes - col0 < 16 ? row_bytes - col0 : 16;
    i64 r = source_row(p.map, row);
    u8* d = dst + row * row_bytes + col0;
    const u8* s = r >= 0 ? src + (u64)r * p.src_row_bytes + col0 : (const u8*)0;
    if (s && n == 16 && col0 + 16 <= p.src_row_bytes && aligned16(d, s)) {
      *(uint4*)d = *(const uint4*)s;
      continue;
    }
    for (u64 i = 0; i < n; ++i) {
      u64 col = col0 + i;
      d[i] = (s && col < p.src_row_bytes) ? s[i] : (u8)(fill >> (8 * (col % fill_len)));
    }
  }
}

// F1 tile transpose: unit = one `pack`-byte piece (one tile row); missing bytes are 0.
MP_KERNEL void __launch_bounds__(PREP_THREADS) prep_tile(StepParams p) {
  const u64 row_bytes = p.a, tile_rows = p.b, pack = p.c;
  const u64 tile = tile_rows * pack, block = tile_rows * row_bytes;
  u8* dst = (u8*)p.dst;
  const u8* src = (const u8*)p.src;
  for (u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x; u < p.units;
       u += (u64)gridDim.x * blockDim.x) {
    u64 o = u * pack;
    u64 blk = o / block, w = o - blk * block;
    u64 c = w / tile, r = (w - c * tile) / pack;
    u64 col0 = c * pack;
    i64 sr = source_row(p.map, blk * tile_rows + r);
    u8* d = dst + o;
    const u8* s = sr >= 0 ? src + (u64)sr * p.src_row_bytes + col0 : (const u8*)0;
    if (s && pack % 16 == 0 && col0 + pack <= p.src_row_bytes && aligned16(d, s)) {
      for (u64 i = 0; i < pack; i += 16) *(uint4*)(d + i) = *(const uint4*)(s + i);
      continue;
    }
    for (u64 i = 0; i < pack; ++i) d[i] = (s && col0 + i < p.src_row_bytes) ? s[i] : (u8)0;
  }
}

// F3 e8m0 shuffle: unit = one 4-byte word. In a 32x8 block, byte (cl*64 + rl*4 + ch*2 + rh)
// holds (row rh*16 + rl, column ch*4 + cl).
MP_KERNEL void __launch_bounds__(PREP_THREADS) prep_f3(StepParams p) {
  const u64 sn = p.a;
  const u8 col_pad = (u8)p.b, row_pad = (u8)p.c;
  u8* dst = (u8*)p.dst;
  const u8* src = (const u8*)p.src;
  for (u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x; u < p.units;
       u += (u64)gridDim.x * blockDim.x) {
    u64 o = u * 4;
    u64 grp = o / (32 * sn), w = o - grp * 32 * sn;
    u64 c0 = w / 256, i = w % 256;
    u64 cl = i / 64, rl = (i % 64) / 4;
    u32 word = 0;
    for (u32 j = 0; j < 4; ++j) {
      u64 row = grp * 32 + (j & 1) * 16 + rl;
      u64 col = c0 * 8 + (j >> 1) * 4 + cl;
      i64 r = source_row(p.map, row);
      u8 v = r < 0 ? row_pad
                   : (col < p.src_row_bytes ? src[(u64)r * p.src_row_bytes + col] : col_pad);
      word |= (u32)v << (8 * j);
    }
    u8* d = dst + o;
    if ((((u64)d) & 3) == 0) {
      *(u32*)d = word;
    } else {
      for (u32 j = 0; j < 4; ++j) d[j] = (u8)(word >> (8 * j));
    }
  }
}

// ---------------------------------------------------------------------------------------
// MX quantization (src/quant.rs): per 32-element block, e8m0 scale from the amax under the
// round mode, values divided (IEEE, round to nearest) by the scale and encoded with
// round-to-nearest-even, saturating. NaN rules as on the host (see mx_value).

// Mirrors `QuantParams` in src/backend/gpu/prep.rs.
struct QuantParams {
  u64 src, q, scale, blocks, ks, sn;
  u32 src_type;  // 0 f32, 1 bf16, 2 f16
  u32 dtype;     // 0 e2m1, 1 e4m3fn, 2 e4m3fnuz
  u32 mode;      // 1 down, 2 up, 3 even, 4 ceil
  u32 pad0;
};

__device__ __forceinline__ float div_rn(float a, float b) {
#ifdef MP_HIP
  return a / b;
#else
  return __fdiv_rn(a, b);
#endif
}

__device__ __forceinline__ bool is_nan(float x) {
  return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u;
}

// f16 bits → f32, exact, NaN sign kept (the host's `half` conversion).
__device__ __forceinline__ float f16_bits_to_f32(u32 h) {
  u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0));
  if (e == 0) {
    if (m == 0) return __uint_as_float(sign);
    // Subnormal: m * 2^-24, exact in f32.
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ u32 exp_field(float v) { return (__float_as_uint(v) >> 23) & 0xffu; }

// The code of a small float format for a finite a >= 0, round to nearest even, unsaturated.
__device__ __forceinline__ u32 small_float_code(float a, int mbits, int bias) {
  int e = (int)exp_field(a) - 127;
  if (e < 1 - bias) e = 1 - bias;
  float ulp = __uint_as_float((u32)(e - mbits + 127) << 23);
  u32 q = (u32)rintf(div_rn(a, ulp));
  return ((u32)(e + bias - 1) << mbits) + q;
}

__device__ __forceinline__ u32 encode(float x, u32 dtype) {
  bool neg = (__float_as_uint(x) >> 31) != 0;
  if (dtype == 0) {
    if (is_nan(x)) return 3;
    float a = fabsf(x);
    u32 c = a >= 6.0f ? 7u : min(small_float_code(a, 1, 1), 7u);
    return neg ? (c | 8u) : c;
  }
  if (dtype == 1) {
    if (is_nan(x)) return neg ? 0xffu : 0x7fu;
    float a = fabsf(x);
    u32 c = a >= 448.0f ? 0x7eu : min(small_float_code(a, 3, 7), 0x7eu);
    return neg ? (c | 0x80u) : c;
  }
  if (is_nan(x)) return 0x80u;
  float a = fabsf(x);
  u32 c = a >= 240.0f ? 0x7fu : min(small_float_code(a, 3, 8), 0x7fu);
  return (neg && c != 0) ? (c | 0x80u) : c;
}

__device__ __forceinline__ u32 ceil_exp(float v) {
  u32 e = exp_field(v), m = __float_as_uint(v) & 0x7fffffu;
  return (e + ((m != 0 && e < 255) ? 1u : 0u)) & 0xffu;
}

__device__ __forceinline__ u32 e8m0_from_amax(float amax, u32 mode, u32 dtype) {
  const float max_pos = dtype == 0 ? 6.0f : dtype == 1 ? 448.0f : 240.0f;
  const int target = dtype == 0 ? 2 : dtype == 1 ? 8 : 7;
  const u32 mbits = dtype == 0 ? 1 : 3;
  const float pow2 = __uint_as_float((u32)(target + 127) << 23);
  bool finite = (__float_as_uint(amax) & 0x7f800000u) != 0x7f800000u;
  switch (mode) {
    case 2: return finite ? ceil_exp(div_rn(amax, max_pos)) : 255u;
    case 4: return finite ? ceil_exp(div_rn(amax, pow2)) : 255u;
    case 1: return exp_field(div_rn(amax, pow2));
    default: {
      u32 u = (__float_as_uint(amax) + (1u << (22 - mbits))) & 0xff800000u;
      return exp_field(div_rn(__uint_as_float(u), pow2));
    }
  }
}

// A scaled value as the host computes it: x86 division propagates a NaN dividend (sign
// kept), and a NaN divisor gives a positive NaN; only the sign of a NaN matters to encode.
__device__ __forceinline__ float mx_value(float v, float scale) {
  return is_nan(v) ? v : div_rn(v, scale);
}

__device__ __forceinline__ float load_value(const QuantParams& p, u64 i) {
  if (p.src_type == 0) return ((const float*)p.src)[i];
  u32 h = ((const u16*)p.src)[i];
  return p.src_type == 1 ? __uint_as_float(h << 16) : f16_bits_to_f32(h);
}

// F3 byte offset of scale (r, c) for sn columns (maps::f3_offset).
__device__ __forceinline__ u64 f3_offset(u64 r, u64 c, u64 sn) {
  return (r / 32) * (32 * sn) + (c / 8) * 256 + (c % 4) * 64 + (r % 16) * 4 + ((c / 4) % 2) * 2 +
         (r / 16) % 2;
}

// One thread per 32-element block.
MP_KERNEL void __launch_bounds__(PREP_THREADS) prep_quant_mx(QuantParams p) {
  for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < p.blocks;
       b += (u64)gridDim.x * blockDim.x) {
    float x[32];
    bool nan = false;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      x[i] = load_value(p, b * 32 + i);
      if (is_nan(x[i])) nan = true;
      else amax = fmaxf(amax, fabsf(x[i]));
    }
    if (nan) amax = __uint_as_float(0x7fc00000u);
    u32 sb = e8m0_from_amax(amax, p.mode, p.dtype);
    float scale = mp_e8m0_to_f32(sb);
    if (p.dtype == 0) {
      u8* q = (u8*)p.q + b * 16;
      u32 w[4] = {0, 0, 0, 0};
      for (int i = 0; i < 16; ++i) {
        u32 lo = encode(mx_value(x[2 * i], scale), 0);
        u32 hi = encode(mx_value(x[2 * i + 1], scale), 0);
        w[i / 4] |= ((lo & 15u) | (hi << 4)) << (8 * (i % 4));
      }
      if ((((u64)q) & 15) == 0) {
        *(uint4*)q = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        for (int i = 0; i < 16; ++i) q[i] = (u8)(w[i / 4] >> (8 * (i % 4)));
      }
    } else {
      u8* q = (u8*)p.q + b * 32;
      u32 w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int i = 0; i < 32; ++i) w[i / 4] |= encode(mx_value(x[i], scale), p.dtype) << (8 * (i % 4));
      if ((((u64)q) & 15) == 0) {
        *(uint4*)q = make_uint4(w[0], w[1], w[2], w[3]);
        *(uint4*)(q + 16) = make_uint4(w[4], w[5], w[6], w[7]);
      } else {
        for (int i = 0; i < 32; ++i) q[i] = (u8)(w[i / 4] >> (8 * (i % 4)));
      }
    }
    u8* s = (u8*)p.scale;
    if (p.sn == 0) {
      s[b] = (u8)sb;
    } else {
      u64 r = b / p.ks, c = b - r * p.ks;
      s[f3_offset(r, c, p.sn)] = (u8)sb;
    }
  }
}

// Zero the padding bytes of a shuffled scale output ([sm, sn] F3 of a [rows, ks] scale);
// prep_quant_mx writes every other byte. units = sm * sn; `ks` = columns, `blocks` = rows.
MP_KERNEL void __launch_bounds__(PREP_THREADS) prep_f3_pad(QuantParams p) {
  const u64 total = ((p.blocks + 255) / 256) * 256 * p.sn;
  u8* s = (u8*)p.scale;
  for (u64 o = (u64)blockIdx.x * blockDim.x + threadIdx.x; o < total;
       o += (u64)gridDim.x * blockDim.x) {
    u64 grp = o / (32 * p.sn), w = o - grp * 32 * p.sn;
    u64 c0 = w / 256, i = w % 256;
    u64 r = grp * 32 + (i % 2) * 16 + (i % 64) / 4;
    u64 c = c0 * 8 + ((i % 4) / 2) * 4 + i / 64;
    if (r >= p.blocks || c >= p.ks) s[o] = 0;
  }
}
