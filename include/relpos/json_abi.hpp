// nlohmann/json for the public headers, checked against the nlohmann/json the library was built
// with (relpos/json_build_config.hpp). A mismatch would otherwise surface at link time as undefined
// references to nlohmann::json_abi_..._v3_x_y symbols; here it is a compile error naming the
// difference. The library's own sources include this header too, so a wrong recorded value fails
// relpos's own build rather than a consumer's. Implemented here alone: the checks are all at
// compile time.
#pragma once

#include <nlohmann/json.hpp>

#include "relpos/json_build_config.hpp"

#define RELPOS_JSON_STR_(x) #x
#define RELPOS_JSON_STR(x) RELPOS_JSON_STR_(x)

// 3.10 and earlier left these undefined when off; 3.11 defines them as 0.
#if defined(JSON_DIAGNOSTICS) && JSON_DIAGNOSTICS
#define RELPOS_JSON_CONSUMER_DIAGNOSTICS 1
#else
#define RELPOS_JSON_CONSUMER_DIAGNOSTICS 0
#endif
#if defined(JSON_USE_LEGACY_DISCARDED_VALUE_COMPARISON) && JSON_USE_LEGACY_DISCARDED_VALUE_COMPARISON
#define RELPOS_JSON_CONSUMER_LEGACY_DISCARDED_VALUE_COMPARISON 1
#else
#define RELPOS_JSON_CONSUMER_LEGACY_DISCARDED_VALUE_COMPARISON 0
#endif

static_assert(NLOHMANN_JSON_VERSION_MAJOR == RELPOS_JSON_VERSION_MAJOR &&
                  NLOHMANN_JSON_VERSION_MINOR == RELPOS_JSON_VERSION_MINOR &&
                  NLOHMANN_JSON_VERSION_PATCH == RELPOS_JSON_VERSION_PATCH,
              "relpos: librelpos was built with nlohmann/json " RELPOS_JSON_VERSION_STRING
              " but this program includes nlohmann/json " RELPOS_JSON_STR(NLOHMANN_JSON_VERSION_MAJOR) "." RELPOS_JSON_STR(
                  NLOHMANN_JSON_VERSION_MINOR) "." RELPOS_JSON_STR(NLOHMANN_JSON_VERSION_PATCH)
              ": nlohmann::json in relpos's API would not link; build with the same nlohmann/json as relpos");
static_assert(RELPOS_JSON_CONSUMER_DIAGNOSTICS == RELPOS_JSON_DIAGNOSTICS,
              "relpos: JSON_DIAGNOSTICS differs from librelpos's build (JSON_DIAGNOSTICS=" RELPOS_JSON_STR(
                  RELPOS_JSON_DIAGNOSTICS) "): nlohmann::json in relpos's API would not link; define "
                                           "JSON_DIAGNOSTICS as relpos was built, or rebuild relpos with it");
static_assert(RELPOS_JSON_CONSUMER_LEGACY_DISCARDED_VALUE_COMPARISON == RELPOS_JSON_LEGACY_DISCARDED_VALUE_COMPARISON,
              "relpos: JSON_USE_LEGACY_DISCARDED_VALUE_COMPARISON differs from librelpos's build (" RELPOS_JSON_STR(
                  RELPOS_JSON_LEGACY_DISCARDED_VALUE_COMPARISON) "): nlohmann::json in relpos's API would not link");
