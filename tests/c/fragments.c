/* Weights prepared with the primitives, their record assembled from the fragments the
 * primitives report (ABI 1.1), and a CPU fused_moe on it: bf16 E=2, H=48, I=24 padded to
 * 64 / 32, pad_weights then shuffle_weight for w13 and w2. Checks: each call's fragment, the
 * weights and record equal what moeplug_prepare_moe makes of the same checkpoint, the
 * launch against a float64 reference of the unpadded layer, and a hand-edited record field
 * refused with LAYOUT_MISMATCH naming it, the output untouched. Linked against the current
 * header and library by tests/fragments.rs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeplug.h"

enum { E = 2, H = 48, I = 24, HP = 64, IP = 32, M = 5, K = 2 };

static int failures = 0;

#define CHECK(cond, ...)                                      \
    do {                                                      \
        if (!(cond)) {                                        \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);   \
            fprintf(stderr, __VA_ARGS__);                     \
            fprintf(stderr, "\n");                            \
            failures++;                                       \
        }                                                     \
    } while (0)

static uint16_t to_bf16(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static moeplug_tensor host(void *data, const int64_t *shape, int32_t ndim, uint8_t code, uint8_t bits) {
    moeplug_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = 1;
    t.ndim = ndim;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

static moeplug_tensor bf16(void *data, const int64_t *shape, int32_t ndim) { return host(data, shape, ndim, 4, 16); }

static moeplug_layout_fragment fresh_fragment(void) {
    moeplug_layout_fragment f;
    memset(&f, 0xEE, sizeof f); /* every byte must be written */
    f.struct_size = sizeof f;
    return f;
}

/* pad_weights(src -> dst) then shuffle_weight(dst -> out), reporting both fragments. */
static void pad_and_shuffle(moeplug_tensor *src, moeplug_tensor *padded, moeplug_tensor *out, int gate_up,
                            moeplug_layout_fragment *pad_f, moeplug_layout_fragment *shuf_f) {
    moeplug_pad_weights_args p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.src = src;
    p.dst = padded;
    p.gate_up = gate_up;
    p.out_fragment = pad_f;
    moeplug_status st = moeplug_pad_weights(&p, NULL);
    CHECK(st == MOEPLUG_OK, "pad_weights: %s", moeplug_last_error());
    moeplug_shuffle_weight_args s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.src = padded;
    s.dst = out;
    s.out_fragment = shuf_f;
    st = moeplug_shuffle_weight(&s, NULL);
    CHECK(st == MOEPLUG_OK, "shuffle_weight: %s", moeplug_last_error());
}

static void expect_fragment(const char *what, const moeplug_layout_fragment *f, int32_t format, int32_t gate,
                            int32_t wlayout, int64_t ne, int64_t h, int64_t i, int64_t hp, int64_t ip) {
    CHECK(f->struct_size == sizeof *f, "%s.struct_size %u", what, f->struct_size);
    CHECK(f->weight_format == format && f->gate_mode == gate && f->weight_layout == wlayout &&
              f->scale_layout == 0 && f->act_dtype == 0,
          "%s: enums %d %d %d %d %d", what, f->weight_format, f->gate_mode, f->weight_layout, f->scale_layout,
          f->act_dtype);
    CHECK(f->num_experts == ne && f->hidden_size == h && f->intermediate_size == i && f->hidden_padded == hp &&
              f->intermediate_padded == ip,
          "%s: sizes %lld %lld %lld %lld %lld", what, (long long)f->num_experts, (long long)f->hidden_size,
          (long long)f->intermediate_size, (long long)f->hidden_padded, (long long)f->intermediate_padded);
    CHECK(f->has_bias == MOEPLUG_FRAGMENT_BIAS_UNKNOWN && f->reserved0 == 0, "%s: has_bias %d reserved0 %u", what,
          f->has_bias, f->reserved0);
}

int main(void) {
    uint16_t *w13 = malloc(2u * E * 2 * I * H), *w2 = malloc(2u * E * H * I);
    uint16_t *w13p = malloc(2u * E * 2 * IP * HP), *w2p = malloc(2u * E * HP * IP);
    uint16_t *w13s = malloc(2u * E * 2 * IP * HP), *w2s = malloc(2u * E * HP * IP);
    uint16_t *r13 = malloc(2u * E * 2 * IP * HP), *r2 = malloc(2u * E * HP * IP);
    for (int j = 0; j < E * 2 * I * H; j++) w13[j] = to_bf16(((j * 29) % 13 - 6) / 64.0);
    for (int j = 0; j < E * H * I; j++) w2[j] = to_bf16(((j * 23) % 11 - 5) / 64.0);

    const int64_t s13[3] = {E, 2 * I, H}, s2[3] = {E, H, I}, s13p[3] = {E, 2 * IP, HP}, s2p[3] = {E, HP, IP};
    moeplug_tensor t13 = bf16(w13, s13, 3), t2 = bf16(w2, s2, 3);
    moeplug_tensor t13p = bf16(w13p, s13p, 3), t2p = bf16(w2p, s2p, 3);
    moeplug_tensor t13s = bf16(w13s, s13p, 3), t2s = bf16(w2s, s2p, 3);

    /* 1. Each primitive reports what it established. */
    moeplug_layout_fragment f[4] = {fresh_fragment(), fresh_fragment(), fresh_fragment(), fresh_fragment()};
    pad_and_shuffle(&t13, &t13p, &t13s, 1, &f[0], &f[1]);
    pad_and_shuffle(&t2, &t2p, &t2s, 0, &f[2], &f[3]);
    expect_fragment("pad w13", &f[0], MOEPLUG_WEIGHT_FORMAT_BF16, MOEPLUG_GATE_MODE_SEPARATED, 0, E, H, I, HP, IP);
    expect_fragment("shuffle w13", &f[1], MOEPLUG_WEIGHT_FORMAT_BF16, 0, MOEPLUG_WEIGHT_LAYOUT_AITER_16X16, 0, 0, 0, 0, 0);
    expect_fragment("pad w2", &f[2], MOEPLUG_WEIGHT_FORMAT_BF16, 0, 0, E, H, I, HP, IP);
    expect_fragment("shuffle w2", &f[3], MOEPLUG_WEIGHT_FORMAT_BF16, 0, MOEPLUG_WEIGHT_LAYOUT_AITER_16X16, 0, 0, 0, 0, 0);

    /* 2. The record assembled from them. */
    const moeplug_layout_fragment *parts[4] = {&f[0], &f[1], &f[2], &f[3]};
    moeplug_layout layout;
    memset(&layout, 0xEE, sizeof layout);
    layout.struct_size = sizeof layout;
    moeplug_status st = moeplug_layout_from_fragments(parts, 4, &layout);
    CHECK(st == MOEPLUG_OK, "layout_from_fragments: %s", moeplug_last_error());
    CHECK(layout.struct_size == sizeof layout && layout.weight_format == MOEPLUG_WEIGHT_FORMAT_BF16 &&
              layout.gate_mode == MOEPLUG_GATE_MODE_SEPARATED &&
              layout.weight_layout == MOEPLUG_WEIGHT_LAYOUT_AITER_16X16 && layout.scale_layout == 0 &&
              layout.num_experts == E && layout.hidden_size == H && layout.intermediate_size == I &&
              layout.hidden_padded == HP && layout.intermediate_padded == IP && layout.flags == 0 &&
              layout.reserved0 == 0 && layout.act_dtype == 0 && layout.reserved1 == 0,
          "assembled record has the wrong fields");
    CHECK(layout.prep_fingerprint != 0, "assembled record is not sealed");

    /* 3. moeplug_prepare_moe makes the same weights and the same record of this checkpoint. */
    moeplug_layout want;
    memset(&want, 0, sizeof want);
    want.struct_size = sizeof want;
    moeplug_tensor o13 = bf16(r13, s13p, 3), o2 = bf16(r2, s2p, 3);
    moeplug_prepare_moe_args pa;
    memset(&pa, 0, sizeof pa);
    pa.struct_size = sizeof pa;
    pa.weight_format = MOEPLUG_WEIGHT_FORMAT_BF16;
    pa.hidden_align = HP;
    pa.intermediate_align = IP;
    pa.w13 = &t13;
    pa.w2 = &t2;
    pa.out_w13 = &o13;
    pa.out_w2 = &o2;
    pa.out_layout = &want;
    st = moeplug_prepare_moe(&pa, NULL);
    CHECK(st == MOEPLUG_OK, "prepare_moe: %s", moeplug_last_error());
    CHECK(memcmp(r13, w13s, 2u * E * 2 * IP * HP) == 0, "w13 differs from prepare_moe's");
    CHECK(memcmp(r2, w2s, 2u * E * HP * IP) == 0, "w2 differs from prepare_moe's");
    /* Every field but the seal (prepare_moe also establishes that there are no biases). */
    CHECK(memcmp(&want, &layout, offsetof(moeplug_layout, prep_fingerprint)) == 0,
          "record differs from prepare_moe's");

    /* 4. A CPU launch on the assembled record, against a float64 reference of the unpadded layer. */
    uint16_t *x = malloc(2u * M * H), *out = malloc(2u * M * H);
    float tw[M * K];
    int32_t ti[M * K];
    for (int j = 0; j < M * H; j++) x[j] = to_bf16(((j * 37) % 17 - 8) / 16.0);
    for (int t = 0; t < M * K; t++) {
        ti[t] = (t / K + t % K) % E;
        tw[t] = t % K ? 0.25f : 0.75f;
    }
    const int64_t sx[2] = {M, H}, sk[2] = {M, K};
    moeplug_tensor tx = bf16(x, sx, 2), tout = bf16(out, sx, 2);
    moeplug_tensor ttw = host(tw, sk, 2, 2, 32), tti = host(ti, sk, 2, 0, 32);
    moeplug_fused_moe_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.layout = &layout;
    a.hidden_states = &tx;
    a.w13 = &t13s;
    a.w2 = &t2s;
    a.topk_weights = &ttw;
    a.topk_ids = &tti;
    a.output = &tout;
    memset(out, 0xAB, 2u * M * H);
    st = moeplug_fused_moe(&a);
    CHECK(st == MOEPLUG_OK, "fused_moe: %s", moeplug_last_error());
    double err = 0, norm = 0;
    for (int t = 0; t < M; t++) {
        double acc[H] = {0};
        for (int s = 0; s < K; s++) {
            int e = ti[t * K + s];
            double act[I];
            for (int j = 0; j < I; j++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    double xv = from_bf16(x[t * H + h]);
                    g += xv * from_bf16(w13[(e * 2 * I + j) * H + h]);
                    u += xv * from_bf16(w13[(e * 2 * I + I + j) * H + h]);
                }
                act[j] = from_bf16(to_bf16(g / (1 + exp(-g)) * u));
            }
            for (int n = 0; n < H; n++) {
                double y = 0;
                for (int j = 0; j < I; j++) y += act[j] * from_bf16(w2[(e * H + n) * I + j]);
                acc[n] += tw[t * K + s] * y;
            }
        }
        for (int n = 0; n < H; n++) {
            double d = from_bf16(out[t * H + n]) - acc[n];
            err += d * d;
            norm += acc[n] * acc[n];
        }
    }
    double rel = sqrt(err / norm);
    CHECK(norm > 0 && rel < 1e-2, "fused_moe: relative L2 error %.3e against the reference", rel);

    /* 5. A hand edit the tensors cannot show is refused, naming the field; output untouched. */
    struct {
        const char *field;
        int32_t *slot;
        int32_t value;
        const char *message;
    } edits[] = {
        {"gate_mode", &layout.gate_mode, MOEPLUG_GATE_MODE_INTERLEAVE,
         "moeplug_fused_moe: layout.gate_mode: the record says interleave, but preparation produced separated "
         "(layout.prep_fingerprint)"},
        {"weight_layout", &layout.weight_layout, MOEPLUG_WEIGHT_LAYOUT_PLAIN,
         "moeplug_fused_moe: layout.weight_layout: the record says plain, but preparation produced aiter_16x16 "
         "(layout.prep_fingerprint)"},
    };
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        int32_t kept = *edits[k].slot;
        *edits[k].slot = edits[k].value;
        memset(out, 0xAB, 2u * M * H);
        st = moeplug_fused_moe(&a);
        CHECK(st == MOEPLUG_LAYOUT_MISMATCH, "edited %s: status %d: %s", edits[k].field, (int)st,
              moeplug_last_error());
        CHECK(strcmp(moeplug_last_error(), edits[k].message) == 0, "edited %s: message \"%s\"", edits[k].field,
              moeplug_last_error());
        for (int j = 0; j < M * H; j++) {
            if (out[j] != 0xABAB) {
                CHECK(0, "edited %s: output written at %d", edits[k].field, j);
                break;
            }
        }
        *edits[k].slot = kept;
    }

    /* 6. A primitive given a fragment below its 1.1 size does nothing. */
    moeplug_layout_fragment small = fresh_fragment();
    small.struct_size = MOEPLUG_LAYOUT_FRAGMENT_SIZE_V1_1 - 8;
    memset(w13s, 0x5A, 2u * E * 2 * IP * HP);
    moeplug_shuffle_weight_args s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.src = &t13p;
    s.dst = &t13s;
    s.out_fragment = &small;
    st = moeplug_shuffle_weight(&s, NULL);
    CHECK(st == MOEPLUG_INVALID_ARGUMENT &&
              strcmp(moeplug_last_error(), "moeplug_shuffle_weight: out_fragment.struct_size: expected at least 72 "
                                           "(the 1.1 size of moeplug_layout_fragment), got 64") == 0,
          "small out_fragment: status %d: %s", (int)st, moeplug_last_error());
    CHECK(w13s[0] == 0x5A5A, "small out_fragment: dst written");

    free(w13), free(w2), free(w13p), free(w2p), free(w13s), free(w2s), free(r13), free(r2), free(x), free(out);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("fused_moe on an assembled record: rel L2 %.3e; all checks passed\n", rel);
    return 0;
}
