// A C++ runtime loading moeplug as an optional plug-in: dlopen the soname, resolve each
// symbol at its ELF version with dlvsym through the header's moeplug_*_fn typedefs, refuse a
// library of another ABI major (or an older minor than this header), then ask the CPU and
// the GPU what they can run.
//
// build: c++ -std=c++17 $(pkg-config --cflags moeplug) consumer.cpp -ldl -o consumer
// run:   LD_LIBRARY_PATH=<prefix>/lib ./consumer      (or: ./consumer /path/to/libmoeplug.so.1)
#include <dlfcn.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "moeplug.h"

namespace {

// The library and the entry points this program uses, resolved once.
class Moeplug {
public:
    explicit Moeplug(const char *path) : handle_(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
        if (!handle_) throw std::runtime_error(std::string("dlopen: ") + dlerror());
        resolve(abi_version, "moeplug_abi_version");
        resolve(version, "moeplug_version");
        resolve(status_name, "moeplug_status_name");
        resolve(last_error, "moeplug_last_error");
        resolve(get_caps, "moeplug_get_caps");
        resolve(check_fused_moe, "moeplug_check_fused_moe");
        resolve(fused_moe, "moeplug_fused_moe");
        resolve(prepare_moe, "moeplug_prepare_moe");
        const uint32_t abi = abi_version();
        if (abi >> 16 != MOEPLUG_ABI_VERSION >> 16 || (abi & 0xFFFF) < (MOEPLUG_ABI_VERSION & 0xFFFF))
            throw std::runtime_error("library ABI " + std::to_string(abi >> 16) + "." +
                                     std::to_string(abi & 0xFFFF) + ", this program needs " +
                                     std::to_string(MOEPLUG_ABI_VERSION >> 16) + "." +
                                     std::to_string(MOEPLUG_ABI_VERSION & 0xFFFF) + " or a later minor");
    }
    ~Moeplug() { dlclose(handle_); }
    Moeplug(const Moeplug &) = delete;
    Moeplug &operator=(const Moeplug &) = delete;

    // "MOEPLUG_BACKEND_UNAVAILABLE: <why>" for a failed call.
    std::string error(moeplug_status st) const {
        return std::string(status_name(st)) + ": " + last_error();
    }

    moeplug_abi_version_fn abi_version = nullptr;
    moeplug_version_fn version = nullptr;
    moeplug_status_name_fn status_name = nullptr;
    moeplug_last_error_fn last_error = nullptr;
    moeplug_get_caps_fn get_caps = nullptr;
    moeplug_check_fused_moe_fn check_fused_moe = nullptr;
    moeplug_fused_moe_fn fused_moe = nullptr;
    moeplug_prepare_moe_fn prepare_moe = nullptr;

private:
    template <typename Fn> void resolve(Fn &fn, const char *name) {
        // dlvsym, not dlsym: bind to the 1.0 definition even if a later library adds a 2.0 one.
        void *p = dlvsym(handle_, name, "MOEPLUG_1.0");
        if (!p) throw std::runtime_error(std::string(name) + "@MOEPLUG_1.0 not found");
        fn = reinterpret_cast<Fn>(p);
    }
    void *handle_;
};

// What this runtime needs for a gpt-oss layer: MXFP4 weights in AITER's layout, SWIGLU_OAI.
bool runs_gpt_oss(const moeplug_caps &c) {
    return (c.weight_formats & (1u << MOEPLUG_WEIGHT_FORMAT_MXFP4)) &&
           (c.activations & (1u << MOEPLUG_ACTIVATION_SWIGLU_OAI)) &&
           (c.weight_layouts & (1u << MOEPLUG_WEIGHT_LAYOUT_AITER_16X16));
}

}  // namespace

int main(int argc, char **argv) {
    try {
        Moeplug lib(argc > 1 ? argv[1] : "libmoeplug.so.1");
        const uint32_t abi = lib.abi_version();
        std::printf("loaded moeplug %s, ABI %u.%u (header %u.%u)\n", lib.version(), abi >> 16,
                    abi & 0xFFFF, MOEPLUG_ABI_VERSION >> 16, MOEPLUG_ABI_VERSION & 0xFFFF);

        // A bad argument is a status and a message, never a crash.
        moeplug_caps caps{};
        caps.struct_size = sizeof caps;
        moeplug_status st = lib.get_caps(99, 0, &caps);
        if (st != MOEPLUG_INVALID_ARGUMENT) throw std::runtime_error("device type 99 accepted");
        std::printf("device type 99: %s\n", lib.error(st).c_str());

        const struct { const char *name; int32_t type; bool required; } devices[] = {
            {"cpu", MOEPLUG_DEVICE_TYPE_CPU, true},
            {"cuda:0", MOEPLUG_DEVICE_TYPE_CUDA, false},
        };
        for (const auto &d : devices) {
            caps = moeplug_caps{};
            caps.struct_size = sizeof caps;
            st = lib.get_caps(d.type, 0, &caps);
            if (st != MOEPLUG_OK) {
                std::printf("%s: unavailable (%s)\n", d.name, lib.error(st).c_str());
                if (d.required) return 1;
                continue;
            }
            std::printf("%s: %s, runtime '%s', gpt-oss MXFP4 layer %s\n", d.name, caps.arch,
                        caps.runtime_version, runs_gpt_oss(caps) ? "supported" : "not supported");
            if (d.required && !runs_gpt_oss(caps)) return 1;
        }
        std::printf("consumer: OK\n");
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "consumer: %s\n", e.what());
        return 1;
    }
}
