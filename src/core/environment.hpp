// Internal: the RELPOS_* environment variables the library reads (docs/threads.md,
// docs/attention.md, docs/models.md), checked in one place.
#pragma once

#include <cstddef>

namespace relpos::detail {

// The variable's value; nullptr when it is unset or set to the empty string (both mean the default).
const char* setting(const char* name);

// Throws relpos::Error naming the first RELPOS_* variable whose value is none of those it accepts
// (RELPOS_SIMD=avx-512 would otherwise run the default without a word). Cheap once the environment
// has passed: a ThreadScope, which starts every op and Model call, calls it.
void check_environment();

// A size in MiB from `name` (a non-negative integer; check_environment refuses the rest), else `fallback`.
std::size_t setting_mib(const char* name, std::size_t fallback);

}  // namespace relpos::detail
