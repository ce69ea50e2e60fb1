/* A program built against the frozen 1.0 header (tests/c/frozen/moeplug_1_0.h, never edited)
 * and linked against the current library: the promise that every 1.x library keeps working
 * for it. It runs caps, every prep call and a CPU fused_moe with the struct sizes of 1.0, and
 * checks each result against a reference computed here from the layout definitions
 * (docs/layouts.md), plus guard bytes after every output struct.
 * Usage: frozen_1_0 (the library is found through the rpath it was linked with). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeplug_1_0.h"

static int failures = 0;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            failures++;                                          \
        }                                                        \
    } while (0)

#define OK(call)                                                                                \
    do {                                                                                        \
        moeplug_status st_ = (call);                                                            \
        CHECK(st_ == MOEPLUG_OK, "%s = %s: %s", #call, moeplug_status_name(st_), moeplug_last_error()); \
    } while (0)

#define GUARD 0xA5

/* An output struct followed by guard bytes that must survive the call. */
#define GUARDED(type, name)            \
    struct {                           \
        type v;                        \
        unsigned char guard[64];       \
    } name;                            \
    memset(&name, GUARD, sizeof name); \
    name.v.struct_size = sizeof(type)

static int guard_intact(const unsigned char *g, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (g[i] != GUARD) return 0;
    return 1;
}

static moeplug_tensor host(void *data, const int64_t *shape, int32_t ndim, uint8_t code, uint8_t bits) {
    moeplug_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = MOEPLUG_DEVICE_TYPE_CPU;
    t.ndim = ndim;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* Deterministic values in [-1, 1). */
static float value(unsigned i, unsigned seed) {
    return (float)(((i * 2654435761u + seed) >> 8) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
}

static void fill_bf16(uint16_t *p, size_t n, unsigned seed, float scale) {
    for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(scale * value((unsigned)i, seed));
}

/* AITER shuffle_weight (16, 16) of [batch, n, k] elements of `elem` bytes:
 * o = [n0|N/16][k0|K/32][k1|32/P][n1|16][k2|P], P = 16 / elem. */
static void shuffle_f1(const unsigned char *src, unsigned char *out, int batch, int n, int k, int elem) {
    int p = 16 / elem;
    for (int b = 0; b < batch; b++) {
        size_t mat = (size_t)n * k * elem, o = 0;
        for (int n0 = 0; n0 < n / 16; n0++)
            for (int k0 = 0; k0 < k / 32; k0++)
                for (int k1 = 0; k1 < 32 / p; k1++)
                    for (int n1 = 0; n1 < 16; n1++)
                        for (int k2 = 0; k2 < p; k2++, o++) {
                            size_t row = n0 * 16 + n1, col = k0 * 32 + k1 * p + k2;
                            memcpy(out + b * mat + o * elem, src + b * mat + (row * k + col) * elem, elem);
                        }
    }
}

/* AITER e8m0_shuffle of [m, n] bytes into [ceil(m/256)*256, ceil(n/8)*8], padding 0x00. */
static void shuffle_f3(const unsigned char *src, unsigned char *out, int m, int n) {
    int sm = (m + 255) / 256 * 256, sn = (n + 7) / 8 * 8;
    size_t o = 0;
    for (int r0 = 0; r0 < sm / 32; r0++)
        for (int c0 = 0; c0 < sn / 8; c0++)
            for (int cl = 0; cl < 4; cl++)
                for (int rl = 0; rl < 16; rl++)
                    for (int ch = 0; ch < 2; ch++)
                        for (int rh = 0; rh < 2; rh++, o++) {
                            int r = r0 * 32 + rh * 16 + rl, c = c0 * 8 + ch * 4 + cl;
                            out[o] = (r < m && c < n) ? src[r * n + c] : 0;
                        }
}

static void test_caps(void) {
    GUARDED(moeplug_caps, caps);
    OK(moeplug_get_caps(MOEPLUG_DEVICE_TYPE_CPU, 0, &caps.v));
    CHECK(guard_intact(caps.guard, sizeof caps.guard), "get_caps wrote past struct_size");
    CHECK(caps.v.struct_size == sizeof(moeplug_caps), "caps.struct_size = %u", caps.v.struct_size);
    CHECK((caps.v.abi_version >> 16) == 1, "caps.abi_version = %#x", caps.v.abi_version);
    CHECK(caps.v.backend == MOEPLUG_BACKEND_CPU, "caps.backend = %d", caps.v.backend);
    CHECK(caps.v.weight_formats & (1u << MOEPLUG_WEIGHT_FORMAT_BF16), "CPU lacks bf16");
    CHECK((moeplug_abi_version() >> 16) == 1 && moeplug_abi_version() >= MOEPLUG_ABI_VERSION,
          "abi_version %#x is not a 1.x at least the header's", moeplug_abi_version());
}

static void test_shuffle_weight(void) {
    enum { B = 2, N = 32, K = 64 };
    static uint16_t src[B * N * K], dst[B * N * K], want[B * N * K];
    fill_bf16(src, B * N * K, 1, 1.0f);
    int64_t shape[3] = {B, N, K};
    moeplug_tensor s = host(src, shape, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16), d = host(dst, shape, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16);
    moeplug_shuffle_weight_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.src = &s;
    a.dst = &d;
    OK(moeplug_shuffle_weight(&a, NULL));
    shuffle_f1((const unsigned char *)src, (unsigned char *)want, B, N, K, 2);
    CHECK(memcmp(dst, want, sizeof want) == 0, "shuffle_weight differs from the (16, 16) map");
}

static void test_shuffle_scale(void) {
    enum { M = 40, NS = 6 };
    static unsigned char src[M * NS], dst[256 * 8], want[256 * 8];
    for (int i = 0; i < M * NS; i++) src[i] = (unsigned char)(100 + i % 50);
    int64_t sshape[2] = {M, NS}, dshape[2] = {256, 8};
    moeplug_tensor s = host(src, sshape, 2, MOEPLUG_DTYPE_CODE_FLOAT8_E8M0FNU, 8);
    moeplug_tensor d = host(dst, dshape, 2, MOEPLUG_DTYPE_CODE_FLOAT8_E8M0FNU, 8);
    moeplug_shuffle_scale_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.src = &s;
    a.dst = &d;
    memset(dst, GUARD, sizeof dst);
    OK(moeplug_shuffle_scale(&a, NULL));
    shuffle_f3(src, want, M, NS);
    CHECK(memcmp(dst, want, sizeof want) == 0, "shuffle_scale differs from e8m0_shuffle");
}

static void test_swizzle_scale(void) {
    /* AITER_E8M0 of [E, N, K/32] is e8m0_shuffle of the [E*N, K/32] view. */
    enum { E = 2, N = 32, KS = 8 };
    static unsigned char src[E * N * KS], dst[256 * 8], want[256 * 8];
    for (int i = 0; i < E * N * KS; i++) src[i] = (unsigned char)(90 + i % 60);
    int64_t sshape[3] = {E, N, KS}, dshape[2] = {256, 8};
    moeplug_tensor s = host(src, sshape, 3, MOEPLUG_DTYPE_CODE_FLOAT8_E8M0FNU, 8);
    moeplug_tensor d = host(dst, dshape, 2, MOEPLUG_DTYPE_CODE_FLOAT8_E8M0FNU, 8);
    moeplug_swizzle_scale_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.src = &s;
    a.dst = &d;
    a.layout = MOEPLUG_SCALE_LAYOUT_AITER_E8M0;
    OK(moeplug_swizzle_scale(&a, NULL));
    shuffle_f3(src, want, E * N, KS);
    CHECK(memcmp(dst, want, sizeof want) == 0, "swizzle_scale(AITER_E8M0) differs");

    /* CDNA4: [E, ceil(N/32), ceil(KS/8)*8*32], a permutation of the source bytes here. */
    static unsigned char cdna4[E * 1 * 256];
    int64_t cshape[3] = {E, 1, 256};
    moeplug_tensor c = host(cdna4, cshape, 3, MOEPLUG_DTYPE_CODE_FLOAT8_E8M0FNU, 8);
    a.dst = &c;
    a.layout = MOEPLUG_SCALE_LAYOUT_CDNA4_SWIZZLE;
    OK(moeplug_swizzle_scale(&a, NULL));
    unsigned count[256] = {0};
    for (int i = 0; i < E * N * KS; i++) count[src[i]]++;
    for (int i = 0; i < E * 256; i++) count[cdna4[i]]--;
    int permutation = 1;
    for (int v = 0; v < 256; v++) permutation &= count[v] == 0;
    CHECK(permutation, "swizzle_scale(CDNA4) is not a permutation of its source");
}

static void test_pad_weights(void) {
    enum { E = 2, N = 4, K = 8, NP = 8, KP = 16 };
    static uint16_t src[E * N * K], dst[E * NP * KP];
    fill_bf16(src, E * N * K, 2, 1.0f);
    memset(dst, GUARD, sizeof dst);
    int64_t sshape[3] = {E, N, K}, dshape[3] = {E, NP, KP};
    moeplug_tensor s = host(src, sshape, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16), d = host(dst, dshape, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16);
    moeplug_pad_weights_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.src = &s;
    a.dst = &d;
    a.gate_up = 1;
    OK(moeplug_pad_weights(&a, NULL));
    int ok = 1;
    for (int e = 0; e < E; e++)
        for (int r = 0; r < NP; r++)
            for (int c = 0; c < KP; c++) {
                /* Gate rows 0..N/2 stay first, up rows start at NP/2. */
                int half = r / (NP / 2), within = r % (NP / 2);
                uint16_t want = 0;
                if (within < N / 2 && c < K) want = src[(e * N + half * (N / 2) + within) * K + c];
                ok &= dst[(e * NP + r) * KP + c] == want;
            }
    CHECK(ok, "pad_weights(gate_up) differs from the split padding");
}

static void test_quantize_mx(void) {
    /* Blocks whose amax is 4.0 (scale 2^0, e8m0 127 in every round mode) and whose values are
     * exact e2m1 numbers: codes 0 0.5 1 1.5 2 3 4 -> 0..6, sign bit 8. */
    enum { ROWS = 2, K = 64 };
    static const float e2m1[7] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f};
    static uint16_t src[ROWS * K];
    static unsigned char q[ROWS * K / 2], sc[ROWS * K / 32], want_q[ROWS * K / 2];
    for (int i = 0; i < ROWS * K; i++) {
        int code = (i % 32 == 0) ? 6 : (i * 5) % 7, neg = code != 0 && (i / 3) % 2;
        src[i] = f32_to_bf16(neg ? -e2m1[code] : e2m1[code]);
        unsigned char nib = (unsigned char)(code | (neg ? 8 : 0));
        if (i % 2 == 0) want_q[i / 2] = nib;
        else want_q[i / 2] |= (unsigned char)(nib << 4);
    }
    int64_t sshape[2] = {ROWS, K}, qshape[2] = {ROWS, K / 2}, scshape[2] = {ROWS, K / 32};
    moeplug_tensor s = host(src, sshape, 2, MOEPLUG_DTYPE_CODE_BFLOAT, 16);
    moeplug_tensor qt = host(q, qshape, 2, MOEPLUG_DTYPE_CODE_UINT, 8);
    moeplug_tensor st = host(sc, scshape, 2, MOEPLUG_DTYPE_CODE_FLOAT8_E8M0FNU, 8);
    moeplug_quantize_mx_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.src = &s;
    a.dst_q = &qt;
    a.dst_scale = &st;
    a.format = MOEPLUG_WEIGHT_FORMAT_MXFP4;
    OK(moeplug_quantize_mx(&a, NULL));
    int scales = 1;
    for (int i = 0; i < ROWS * K / 32; i++) scales &= sc[i] == 127;
    CHECK(scales, "quantize_mx: e8m0 scales are not 127");
    CHECK(memcmp(q, want_q, sizeof q) == 0, "quantize_mx: e2m1 codes differ");
}

/* prepare_moe (bf16, E=2, H=64, I=32: no padding) is the (16, 16) shuffle of both weights;
 * then a CPU fused_moe over them against a float reference of the checkpoint weights. */
enum { E = 2, H = 64, I = 32, M = 5, TOPK = 2 };

static void test_prepare_and_fused_moe(void) {
    static uint16_t w13[E * 2 * I * H], w2[E * H * I], o13[E * 2 * I * H], o2[E * H * I];
    static unsigned char want13[sizeof o13], want2[sizeof o2];
    fill_bf16(w13, E * 2 * I * H, 3, 0.25f);
    fill_bf16(w2, E * H * I, 4, 0.25f);
    int64_t s13[3] = {E, 2 * I, H}, s2[3] = {E, H, I};
    moeplug_tensor t13 = host(w13, s13, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16), t2 = host(w2, s2, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16);
    moeplug_tensor u13 = host(o13, s13, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16), u2 = host(o2, s2, 3, MOEPLUG_DTYPE_CODE_BFLOAT, 16);
    GUARDED(moeplug_layout, layout);
    moeplug_prepare_moe_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.weight_format = MOEPLUG_WEIGHT_FORMAT_BF16;
    a.w13 = &t13;
    a.w2 = &t2;
    a.out_w13 = &u13;
    a.out_w2 = &u2;
    a.out_layout = &layout.v;

    GUARDED(moeplug_prepare_moe_sizes_out, sizes);
    OK(moeplug_prepare_moe_sizes(&a, &sizes.v));
    CHECK(guard_intact(sizes.guard, sizeof sizes.guard), "prepare_moe_sizes wrote past struct_size");
    CHECK(sizes.v.w13_ndim == 3 && sizes.v.w13_shape[0] == E && sizes.v.w13_shape[1] == 2 * I &&
              sizes.v.w13_shape[2] == H && sizes.v.w13_bytes == sizeof o13,
          "prepare_moe_sizes: w13");
    CHECK(sizes.v.w2_bytes == sizeof o2 && sizes.v.w13_scale_ndim == 0 && sizes.v.w13_bias_bytes == 0,
          "prepare_moe_sizes: w2 / absent outputs");

    OK(moeplug_prepare_moe(&a, NULL));
    CHECK(guard_intact(layout.guard, sizeof layout.guard), "prepare_moe wrote past out_layout");
    const moeplug_layout *l = &layout.v, *r = &sizes.v.layout;
    CHECK(l->weight_format == r->weight_format && l->gate_mode == r->gate_mode && l->weight_layout == r->weight_layout &&
              l->scale_layout == r->scale_layout && l->num_experts == r->num_experts &&
              l->hidden_size == r->hidden_size && l->intermediate_size == r->intermediate_size &&
              l->hidden_padded == r->hidden_padded && l->intermediate_padded == r->intermediate_padded &&
              l->flags == r->flags && l->struct_size == r->struct_size,
          "prepare_moe and prepare_moe_sizes disagree on the record");
    CHECK(layout.v.struct_size == sizeof(moeplug_layout), "layout.struct_size = %u", layout.v.struct_size);
    CHECK(layout.v.weight_format == MOEPLUG_WEIGHT_FORMAT_BF16 && layout.v.gate_mode == MOEPLUG_GATE_MODE_SEPARATED &&
              layout.v.weight_layout == MOEPLUG_WEIGHT_LAYOUT_AITER_16X16 && layout.v.num_experts == E &&
              layout.v.hidden_size == H && layout.v.hidden_padded == H && layout.v.intermediate_size == I &&
              layout.v.intermediate_padded == I && layout.v.flags == 0,
          "prepare_moe: unexpected record");
    shuffle_f1((const unsigned char *)w13, want13, E, 2 * I, H, 2);
    shuffle_f1((const unsigned char *)w2, want2, E, H, I, 2);
    CHECK(memcmp(o13, want13, sizeof o13) == 0, "prepare_moe: w13 is not the (16, 16) shuffle");
    CHECK(memcmp(o2, want2, sizeof o2) == 0, "prepare_moe: w2 is not the (16, 16) shuffle");

    static uint16_t x[M * H], out[M * H];
    static float tw[M * TOPK];
    static int32_t ids[M * TOPK];
    fill_bf16(x, M * H, 5, 1.0f);
    for (int i = 0; i < M * TOPK; i++) {
        tw[i] = 0.25f + 0.5f * (float)(i % 3);
        ids[i] = (i * 7 + i / TOPK) % E;
    }
    ids[3] = E + 4; /* an id outside the experts contributes nothing */
    int64_t xs[2] = {M, H}, ks[2] = {M, TOPK};
    moeplug_tensor tx = host(x, xs, 2, MOEPLUG_DTYPE_CODE_BFLOAT, 16), tout = host(out, xs, 2, MOEPLUG_DTYPE_CODE_BFLOAT, 16);
    moeplug_tensor ttw = host(tw, ks, 2, MOEPLUG_DTYPE_CODE_FLOAT, 32), tid = host(ids, ks, 2, MOEPLUG_DTYPE_CODE_INT, 32);
    moeplug_fused_moe_args f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.layout = &layout.v;
    f.activation = MOEPLUG_ACTIVATION_SILU;
    f.hidden_states = &tx;
    f.w13 = &u13;
    f.w2 = &u2;
    f.topk_weights = &ttw;
    f.topk_ids = &tid;
    f.output = &tout;
    OK(moeplug_check_fused_moe(MOEPLUG_DEVICE_TYPE_CPU, 0, &f));
    size_t ws = 1;
    OK(moeplug_fused_moe_workspace_size(&f, &ws));
    static unsigned char workspace[1 << 20];
    int64_t wshape[1] = {(int64_t)ws};
    moeplug_tensor tws = host(workspace, wshape, 1, MOEPLUG_DTYPE_CODE_UINT, 8);
    CHECK(ws <= sizeof workspace, "workspace %zu bytes", ws);
    if (ws > 0) f.workspace = &tws;
    OK(moeplug_fused_moe(&f));

    double num = 0, den = 0;
    for (int t = 0; t < M; t++) {
        double y[H] = {0};
        for (int s = 0; s < TOPK; s++) {
            int e = ids[t * TOPK + s];
            if (e < 0 || e >= E) continue;
            double act[I];
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    double xv = bf16_to_f32(x[t * H + h]);
                    g += xv * bf16_to_f32(w13[(e * 2 * I + i) * H + h]);
                    u += xv * bf16_to_f32(w13[(e * 2 * I + I + i) * H + h]);
                }
                act[i] = g / (1.0 + exp(-g)) * u;
            }
            for (int h = 0; h < H; h++) {
                double acc = 0;
                for (int i = 0; i < I; i++) acc += act[i] * bf16_to_f32(w2[(e * H + h) * I + i]);
                y[h] += tw[t * TOPK + s] * acc;
            }
        }
        for (int h = 0; h < H; h++) {
            double d = bf16_to_f32(out[t * H + h]) - y[h];
            num += d * d;
            den += y[h] * y[h];
        }
    }
    double rel = sqrt(num / den);
    CHECK(den > 0 && rel < 1e-2, "fused_moe: relative L2 error %.3g against the float reference", rel);
}

int main(void) {
    test_caps();
    test_shuffle_weight();
    test_shuffle_scale();
    test_swizzle_scale();
    test_pad_weights();
    test_quantize_mx();
    test_prepare_and_fused_moe();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("frozen_1_0: all checks passed against %s\n", moeplug_version());
    return 0;
}
