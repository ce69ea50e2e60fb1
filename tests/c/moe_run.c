/* A real CPU fused_moe through dlopen and the header: a bf16 layer (E=2, H=64, I=32, M=7,
 * k=2, one id out of range) against a float64 reference of API.md §6, and a launch that must
 * fail leaving the output untouched. Built plain, under AddressSanitizer and under valgrind
 * by tests/sanitizers.rs. Usage: moe_run /path/to/libmoeplug.so */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeplug.h"

enum { E = 2, H = 64, I = 32, M = 7, K = 2 };

typedef moeplug_status (*fused_fn)(const moeplug_fused_moe_args *);
typedef const char *(*str_fn)(void);

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

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s libmoeplug.so\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    fused_fn fused = (fused_fn)dlsym(lib, "moeplug_fused_moe");
    str_fn last_error = (str_fn)dlsym(lib, "moeplug_last_error");
    if (!fused || !last_error) {
        fprintf(stderr, "missing symbols\n");
        return 2;
    }

    /* Heap buffers of exactly the described sizes, so a sanitizer sees any overrun. */
    uint16_t *x = malloc(sizeof(uint16_t) * M * H);
    uint16_t *w13 = malloc(sizeof(uint16_t) * E * 2 * I * H);
    uint16_t *w2 = malloc(sizeof(uint16_t) * E * H * I);
    float *tw = malloc(sizeof(float) * M * K);
    int32_t *ti = malloc(sizeof(int32_t) * M * K);
    uint16_t *out = malloc(sizeof(uint16_t) * M * H);
    for (int j = 0; j < M * H; j++) x[j] = to_bf16(((j * 37) % 17 - 8) / 16.0);
    for (int j = 0; j < E * 2 * I * H; j++) w13[j] = to_bf16(((j * 29) % 13 - 6) / 64.0);
    for (int j = 0; j < E * H * I; j++) w2[j] = to_bf16(((j * 23) % 11 - 5) / 64.0);
    for (int t = 0; t < M; t++) {
        for (int s = 0; s < K; s++) {
            ti[t * K + s] = (t + s) % E;
            tw[t * K + s] = s ? 0.25f : 0.75f;
        }
    }
    ti[3 * K + 1] = E + 5; /* out of range: contributes nothing */

    moeplug_layout layout;
    memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    layout.weight_format = MOEPLUG_WEIGHT_FORMAT_BF16;
    layout.gate_mode = MOEPLUG_GATE_MODE_SEPARATED;
    layout.weight_layout = MOEPLUG_WEIGHT_LAYOUT_PLAIN;
    layout.num_experts = E;
    layout.hidden_size = layout.hidden_padded = H;
    layout.intermediate_size = layout.intermediate_padded = I;

    const int64_t sx[2] = {M, H}, s13[3] = {E, 2 * I, H}, s2[3] = {E, H, I}, sk[2] = {M, K};
    moeplug_tensor tx = host(x, sx, 2, 4, 16), t13 = host(w13, s13, 3, 4, 16), t2 = host(w2, s2, 3, 4, 16);
    moeplug_tensor ttw = host(tw, sk, 2, 2, 32), tti = host(ti, sk, 2, 0, 32), tout = host(out, sx, 2, 4, 16);
    moeplug_fused_moe_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.layout = &layout;
    a.hidden_states = &tx;
    a.w13 = &t13;
    a.w2 = &t2;
    a.topk_weights = &ttw;
    a.topk_ids = &tti;
    a.output = &tout;
    moeplug_status st = fused(&a);
    if (st != MOEPLUG_OK) {
        fprintf(stderr, "fused_moe: status %d: %s\n", (int)st, last_error());
        return 1;
    }

    /* Reference: gate/up in float64, the stage-1 output cast to bf16 (as AITER), w2, sum. */
    double err = 0, norm = 0;
    for (int t = 0; t < M; t++) {
        double acc[H] = {0};
        for (int s = 0; s < K; s++) {
            int e = ti[t * K + s];
            if (e < 0 || e >= E) continue;
            double a2[I];
            for (int j = 0; j < I; j++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    double xv = from_bf16(x[t * H + h]);
                    g += xv * from_bf16(w13[(e * 2 * I + j) * H + h]);
                    u += xv * from_bf16(w13[(e * 2 * I + I + j) * H + h]);
                }
                a2[j] = from_bf16(to_bf16(g / (1 + exp(-g)) * u));
            }
            for (int n = 0; n < H; n++) {
                double y = 0;
                for (int j = 0; j < I; j++) y += a2[j] * from_bf16(w2[(e * H + n) * I + j]);
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
    if (!(norm > 0) || !(rel < 1e-2)) {
        fprintf(stderr, "fused_moe: relative L2 error %.3e against the reference\n", rel);
        return 1;
    }

    /* A launch that fails (topk_ids as float32) must leave the output as it was. */
    memset(out, 0xAB, sizeof(uint16_t) * M * H);
    moeplug_tensor bad = host(ti, sk, 2, 2, 32);
    a.topk_ids = &bad;
    st = fused(&a);
    if (st != MOEPLUG_INVALID_ARGUMENT || !strstr(last_error(), "topk_ids")) {
        fprintf(stderr, "bad topk_ids: status %d: %s\n", (int)st, last_error());
        return 1;
    }
    for (int j = 0; j < M * H; j++) {
        if (out[j] != 0xABAB) {
            fprintf(stderr, "output written by a failed launch at %d\n", j);
            return 1;
        }
    }
    free(x);
    free(w13);
    free(w2);
    free(tw);
    free(ti);
    free(out);
    printf("fused_moe rel L2 %.3e; all checks passed\n", rel);
    return 0;
}
