# The nlohmann/json version and ABI options librelpos is built with, for the generated
# relpos/json_build_config.hpp, relposConfig.cmake and relpos.pc: nlohmann::json in the public API is
# only link-compatible with the same version and options (its inline ABI namespace).
# Sets RELPOS_JSON_VERSION{,_MAJOR,_MINOR,_PATCH}, RELPOS_JSON_DIAGNOSTICS and
# RELPOS_JSON_LEGACY_DISCARDED_VALUE_COMPARISON (0 or 1).

set(RELPOS_JSON_VERSION "${nlohmann_json_VERSION}")
if(NOT RELPOS_JSON_VERSION)
  # nlohmann_json added by a parent project (add_subdirectory): read the version from its header
  get_target_property(_relpos_json_dirs nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
  string(REGEX REPLACE "\\$<BUILD_INTERFACE:([^>]*)>" "\\1" _relpos_json_dirs "${_relpos_json_dirs}")
  string(REGEX REPLACE "\\$<INSTALL_INTERFACE:[^>]*>" "" _relpos_json_dirs "${_relpos_json_dirs}")
  find_file(_relpos_json_header nlohmann/json.hpp PATHS ${_relpos_json_dirs} NO_DEFAULT_PATH NO_CACHE)
  if(_relpos_json_header)
    file(STRINGS "${_relpos_json_header}" _relpos_json_defs REGEX "#define NLOHMANN_JSON_VERSION_(MAJOR|MINOR|PATCH) ")
    foreach(_part MAJOR MINOR PATCH)
      string(REGEX MATCH "NLOHMANN_JSON_VERSION_${_part} +([0-9]+)" _m "${_relpos_json_defs}")
      set(_relpos_json_${_part} "${CMAKE_MATCH_1}")
    endforeach()
    set(RELPOS_JSON_VERSION "${_relpos_json_MAJOR}.${_relpos_json_MINOR}.${_relpos_json_PATCH}")
  endif()
endif()
if(NOT RELPOS_JSON_VERSION MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)")
  message(FATAL_ERROR "relpos: cannot tell the nlohmann_json version (got '${RELPOS_JSON_VERSION}')")
endif()
set(RELPOS_JSON_VERSION_MAJOR ${CMAKE_MATCH_1})
set(RELPOS_JSON_VERSION_MINOR ${CMAKE_MATCH_2})
set(RELPOS_JSON_VERSION_PATCH ${CMAKE_MATCH_3})

# The ABI options, as the nlohmann_json target (JSON_Diagnostics=ON when nlohmann was configured)
# or our compile flags set them. A value this misreads fails relpos's own build: the library's
# sources include relpos/json_abi.hpp, which checks these against what the compiler sees.
get_target_property(_relpos_json_defs nlohmann_json::nlohmann_json INTERFACE_COMPILE_DEFINITIONS)
set(_relpos_json_seen "${_relpos_json_defs} ${CMAKE_CXX_FLAGS}")
get_directory_property(_relpos_dir_defs COMPILE_DEFINITIONS)
string(APPEND _relpos_json_seen " ${_relpos_dir_defs}")
if(CMAKE_BUILD_TYPE)
  string(TOUPPER "${CMAKE_BUILD_TYPE}" _relpos_bt)
  string(APPEND _relpos_json_seen " ${CMAKE_CXX_FLAGS_${_relpos_bt}}")
endif()
foreach(_opt DIAGNOSTICS USE_LEGACY_DISCARDED_VALUE_COMPARISON)
  if(_relpos_json_seen MATCHES "JSON_${_opt}(=1)?([ ;]|$)")
    set(_on 1)
  else()
    set(_on 0)
  endif()
  if(_opt STREQUAL "DIAGNOSTICS")
    set(RELPOS_JSON_DIAGNOSTICS ${_on})
  else()
    set(RELPOS_JSON_LEGACY_DISCARDED_VALUE_COMPARISON ${_on})
  endif()
endforeach()
