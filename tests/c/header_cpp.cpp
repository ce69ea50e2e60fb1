// The header must compile as C++17 and be usable from C++ (enums, structs, functions).
#include "moeplug.h"

#include <cstddef>
#include <type_traits>

static_assert(sizeof(moeplug_tensor) == 48, "moeplug_tensor is DLTensor");
static_assert(offsetof(moeplug_tensor, byte_offset) == 40, "byte_offset");
static_assert(std::is_standard_layout<moeplug_fused_moe_args>::value, "plain struct");
static_assert(MOEPLUG_OK == 0 && MOEPLUG_INTERNAL == 9, "status values");
static_assert(MOEPLUG_WEIGHT_FORMAT_MXFP4 == 6, "weight format values");

int main() {
    moeplug_status (*f)(const moeplug_fused_moe_args *) = &moeplug_fused_moe;
    return f == nullptr;
}
