// Internal: grow-only scratch buffers of the calling thread, for the CPU kernels' per-thread work
// areas (SASA's scratch, gradient planes, projected planes and one head's planes, the batch norm's
// blocks of a 1x1 convolution's gradient, oneDNN's scratchpads). Allocating (and zeroing) them on
// every call cost more than filling them. 64-byte aligned: the kernels' vectors in them then never straddle cache lines
// (a split store followed by a load of the same vector stalls), carved from huge-page slabs
// (core/huge_page_arena.hpp). The contents are kept between calls; a larger request replaces them.
#pragma once

#include <cstdint>

namespace relpos::cpu {

enum class ThreadBuffer {
  SasaScratch,
  SasaGradPlanes,
  SasaProjectedPlanes,
  SasaHeadPlanes,
  Conv1x1Block,
  DnnlScratchpad,
  Count
};

// At least `floats` floats, the same memory for the same slot until a larger request.
float* thread_buffer(ThreadBuffer slot, std::int64_t floats);

}  // namespace relpos::cpu
