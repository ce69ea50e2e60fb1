/* Exercises libmoeplug through dlopen and the header alone: ABI version, capabilities, and
 * every generic error path (NULL argument, short struct_size, dirty tail, unknown enum).
 * Usage: abi_test /path/to/libmoeplug.so */
#define _GNU_SOURCE /* dlvsym */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeplug.h"

/* moeplug_tensor must be DLPack's DLTensor byte for byte. */
_Static_assert(sizeof(moeplug_tensor) == 48, "sizeof DLTensor");
_Static_assert(offsetof(moeplug_tensor, data) == 0, "data");
_Static_assert(offsetof(moeplug_tensor, device) == 8, "device");
_Static_assert(offsetof(moeplug_tensor, ndim) == 16, "ndim");
_Static_assert(offsetof(moeplug_tensor, dtype) == 20, "dtype");
_Static_assert(offsetof(moeplug_tensor, shape) == 24, "shape");
_Static_assert(offsetof(moeplug_tensor, strides) == 32, "strides");
_Static_assert(offsetof(moeplug_tensor, byte_offset) == 40, "byte_offset");
_Static_assert(sizeof(moeplug_device) == 8, "DLDevice");
_Static_assert(sizeof(moeplug_dtype) == 4, "DLDataType");

static int failures = 0;

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                 \
            fprintf(stderr, "\n");                        \
            failures++;                                   \
        }                                                 \
    } while (0)

typedef uint32_t (*abi_version_fn)(void);
typedef const char *(*str_fn)(void);
typedef const char *(*status_name_fn)(int32_t);
typedef moeplug_status (*get_caps_fn)(int32_t, int32_t, moeplug_caps *);
typedef moeplug_status (*check_fn)(int32_t, int32_t, const moeplug_fused_moe_args *);
typedef moeplug_status (*shuffle_weight_fn)(const moeplug_shuffle_weight_args *, void *);

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "missing symbol %s: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

/* The status and that the message mentions `needle`. */
static void expect(const char *what, moeplug_status got, moeplug_status want, str_fn last_error,
                   status_name_fn name, const char *needle) {
    const char *msg = last_error();
    CHECK(got == want, "%s: expected %s, got %s (%s)", what, name(want), name(got), msg);
    CHECK(msg != NULL && strstr(msg, needle) != NULL, "%s: message \"%s\" does not name \"%s\"", what,
          msg ? msg : "(null)", needle);
}

/* What the log callback saw last. */
static int log_calls = 0;
static int32_t log_level = 0;
static char log_text[512];
static void *log_user = NULL;

static void on_log(int32_t level, const char *message, void *user) {
    log_calls++;
    log_level = level;
    log_user = user;
    snprintf(log_text, sizeof log_text, "%s", message);
}

static void *sym_1_1(void *lib, const char *name) {
    void *p = dlvsym(lib, name, "MOEPLUG_1.1");
    if (!p) {
        fprintf(stderr, "missing symbol %s@MOEPLUG_1.1: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

/* The ABI 1.1 calls, resolved at their version node through the header's typedefs. */
static void check_1_1(void *lib, str_fn last_error, status_name_fn status_name, shuffle_weight_fn shuffle_weight) {
    moeplug_set_num_threads_fn set_threads = (moeplug_set_num_threads_fn)sym_1_1(lib, "moeplug_set_num_threads");
    moeplug_num_threads_fn threads = (moeplug_num_threads_fn)sym_1_1(lib, "moeplug_num_threads");
    moeplug_set_log_callback_fn set_log = (moeplug_set_log_callback_fn)sym_1_1(lib, "moeplug_set_log_callback");
    moeplug_set_progress_callback_fn set_progress =
        (moeplug_set_progress_callback_fn)sym_1_1(lib, "moeplug_set_progress_callback");
    CHECK(dlvsym(lib, "moeplug_set_num_threads", "MOEPLUG_1.0") == NULL, "a 1.1 call is versioned 1.0");

    moeplug_status st = set_threads(3);
    CHECK(st == MOEPLUG_OK && threads() == 3, "set_num_threads(3): %s, num_threads %u", status_name(st), threads());
    expect("set_num_threads(5000)", set_threads(5000), MOEPLUG_INVALID_ARGUMENT, last_error, status_name,
           "num_threads: expected 0 (every core) to 4096, got 5000");
    CHECK(threads() == 3, "a refused set_num_threads changed the count to %u", threads());
    CHECK(set_threads(0) == MOEPLUG_OK && threads() >= 1, "set_num_threads(0)");

    int token = 7;
    expect("set_log_callback(NULL, user)", set_log(NULL, &token), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "user: expected NULL when callback is NULL");
    expect("set_progress_callback(NULL, user)", set_progress(NULL, &token), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "user: expected NULL when callback is NULL");
    CHECK(set_log(on_log, &token) == MOEPLUG_OK, "set_log_callback: %s", last_error());
    st = shuffle_weight(NULL, NULL);
    CHECK(st == MOEPLUG_INVALID_ARGUMENT, "shuffle_weight(NULL) = %s", status_name(st));
    CHECK(log_calls == 1 && log_level == MOEPLUG_LOG_LEVEL_DEBUG && log_user == &token, "log: %d calls, level %d",
          log_calls, log_level);
    char want[600];
    snprintf(want, sizeof want, "MOEPLUG_INVALID_ARGUMENT: %s", last_error());
    CHECK(strcmp(log_text, want) == 0, "log message \"%s\", want \"%s\"", log_text, want);
    CHECK(set_log(NULL, NULL) == MOEPLUG_OK, "clearing the log callback");
    shuffle_weight(NULL, NULL);
    CHECK(log_calls == 1, "logged after clearing the callback");
    CHECK(set_progress(NULL, NULL) == MOEPLUG_OK, "clearing the progress callback");
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
    abi_version_fn abi_version = (abi_version_fn)sym(lib, "moeplug_abi_version");
    str_fn version = (str_fn)sym(lib, "moeplug_version");
    str_fn last_error = (str_fn)sym(lib, "moeplug_last_error");
    status_name_fn status_name = (status_name_fn)sym(lib, "moeplug_status_name");
    get_caps_fn get_caps = (get_caps_fn)sym(lib, "moeplug_get_caps");
    check_fn check = (check_fn)sym(lib, "moeplug_check_fused_moe");
    shuffle_weight_fn shuffle_weight = (shuffle_weight_fn)sym(lib, "moeplug_shuffle_weight");

    CHECK(abi_version() == ((1u << 16) | 1u), "abi_version = %#x", abi_version());
    CHECK(abi_version() == MOEPLUG_ABI_VERSION, "header and library disagree on the ABI");
    CHECK(strncmp(version(), MOEPLUG_VERSION, strlen(MOEPLUG_VERSION)) == 0, "version %s", version());
    CHECK(strcmp(status_name(MOEPLUG_OK), "MOEPLUG_OK") == 0, "status_name(0)");
    CHECK(strcmp(status_name(MOEPLUG_LAYOUT_MISMATCH), "MOEPLUG_LAYOUT_MISMATCH") == 0, "status_name(3)");
    CHECK(strcmp(status_name(MOEPLUG_INTERNAL), "MOEPLUG_INTERNAL") == 0, "status_name(9)");
    CHECK(strcmp(status_name(1234), "UNKNOWN") == 0, "status_name(1234)");

    /* Capabilities of the CPU: always answered. */
    moeplug_caps caps;
    memset(&caps, 0xAB, sizeof caps);
    caps.struct_size = sizeof caps;
    moeplug_status st = get_caps(MOEPLUG_DEVICE_TYPE_CPU, 0, &caps);
    CHECK(st == MOEPLUG_OK, "get_caps(cpu) = %s: %s", status_name(st), last_error());
    CHECK(strcmp(last_error(), "") == 0, "last_error after success: \"%s\"", last_error());
    CHECK(caps.backend == MOEPLUG_BACKEND_CPU, "caps.backend = %d", caps.backend);
    CHECK(caps.abi_version == ((1u << 16) | 1u), "caps.abi_version");
    CHECK(caps.device_type == MOEPLUG_DEVICE_TYPE_CPU, "caps.device_type");
    CHECK(memchr(caps.arch, 0, sizeof caps.arch) != NULL && strlen(caps.arch) > 0, "caps.arch");

    /* CUDA: caps, or BACKEND_UNAVAILABLE with a reason (no GPU or driver here). */
    moeplug_caps gpu;
    memset(&gpu, 0, sizeof gpu);
    gpu.struct_size = sizeof gpu;
    st = get_caps(MOEPLUG_DEVICE_TYPE_CUDA, 0, &gpu);
    CHECK(st == MOEPLUG_OK || st == MOEPLUG_BACKEND_UNAVAILABLE, "get_caps(cuda) = %s", status_name(st));
    if (st == MOEPLUG_BACKEND_UNAVAILABLE) {
        CHECK(strstr(last_error(), "CUDA") != NULL, "cuda message: %s", last_error());
        CHECK(gpu.backend == 0, "caps written on failure");
    } else {
        CHECK(gpu.backend == MOEPLUG_BACKEND_CUDA, "gpu.backend = %d", gpu.backend);
    }

    /* Error paths. */
    expect("get_caps(NULL)", get_caps(MOEPLUG_DEVICE_TYPE_CPU, 0, NULL), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "out");
    moeplug_caps short_caps;
    memset(&short_caps, 0, sizeof short_caps);
    short_caps.struct_size = 8;
    expect("get_caps(short)", get_caps(MOEPLUG_DEVICE_TYPE_CPU, 0, &short_caps), MOEPLUG_INVALID_ARGUMENT,
           last_error, status_name, "out.struct_size");
    expect("get_caps(device 77)", get_caps(77, 0, &caps), MOEPLUG_INVALID_ARGUMENT, last_error, status_name,
           "device_type");

    moeplug_layout layout;
    memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    layout.weight_format = MOEPLUG_WEIGHT_FORMAT_BF16;
    layout.gate_mode = MOEPLUG_GATE_MODE_SEPARATED;
    layout.weight_layout = MOEPLUG_WEIGHT_LAYOUT_AITER_16X16;
    layout.num_experts = 8;
    layout.hidden_size = layout.hidden_padded = 256;
    layout.intermediate_size = layout.intermediate_padded = 128;

    moeplug_fused_moe_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.layout = &layout;
    st = check(MOEPLUG_DEVICE_TYPE_CPU, 0, &args);
    CHECK(st == MOEPLUG_OK || st == MOEPLUG_UNSUPPORTED, "check(bf16) = %s: %s", status_name(st), last_error());
    if (st == MOEPLUG_UNSUPPORTED) {
        CHECK(strlen(last_error()) > 0, "UNSUPPORTED without a reason");
    }

    expect("check(NULL)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, NULL), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "args");
    args.struct_size = MOEPLUG_FUSED_MOE_ARGS_SIZE_V1_0 - 8; /* below the 1.0 size */
    expect("check(short)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, &args), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "args.struct_size");
    args.struct_size = sizeof args;

    /* A newer caller's larger struct: a zero tail is fine, a non-zero tail is refused. */
    struct {
        moeplug_fused_moe_args v1;
        uint64_t future_field;
    } bigger;
    memset(&bigger, 0, sizeof bigger);
    bigger.v1 = args;
    bigger.v1.struct_size = sizeof bigger;
    st = check(MOEPLUG_DEVICE_TYPE_CPU, 0, &bigger.v1);
    CHECK(st == MOEPLUG_OK || st == MOEPLUG_UNSUPPORTED, "check(zero tail) = %s", status_name(st));
    CHECK(strstr(last_error(), "struct_size") == NULL, "zero tail refused: %s", last_error());
    bigger.future_field = 1;
    expect("check(dirty tail)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, &bigger.v1), MOEPLUG_UNSUPPORTED, last_error,
           status_name, "newer ABI");

    args.struct_size = sizeof args;
    args.activation = 42;
    expect("check(activation 42)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, &args), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "activation");
    args.activation = MOEPLUG_ACTIVATION_SILU;
    args.act_dtype = -3;
    expect("check(act_dtype -3)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, &args), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "act_dtype");
    args.act_dtype = 0;
    layout.weight_format = 99;
    expect("check(weight_format 99)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, &args), MOEPLUG_INVALID_ARGUMENT,
           last_error, status_name, "layout.weight_format");
    layout.weight_format = MOEPLUG_WEIGHT_FORMAT_BF16;
    layout.hidden_padded = 100;
    expect("check(hidden_padded < hidden_size)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, &args),
           MOEPLUG_INVALID_ARGUMENT, last_error, status_name, "layout.hidden_padded");
    layout.hidden_padded = 256;
    args.layout = NULL;
    expect("check(layout NULL)", check(MOEPLUG_DEVICE_TYPE_CPU, 0, &args), MOEPLUG_INVALID_ARGUMENT, last_error,
           status_name, "args.layout");

    expect("shuffle_weight(NULL)", shuffle_weight(NULL, NULL), MOEPLUG_INVALID_ARGUMENT, last_error, status_name,
           "args");

    check_1_1(lib, last_error, status_name, shuffle_weight);

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("abi_test: all checks passed (%s)\n", version());
    return 0;
}
