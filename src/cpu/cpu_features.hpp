// Internal: whether relpos's own AVX2 kernels run (the SASA planes, the Winograd convolutions): the
// CPU has AVX2 and FMA, and RELPOS_SIMD is not "generic" (which keeps the portable kernels and
// oneDNN's everywhere; the tests run both ways). Read once.
#pragma once

namespace relpos::cpu {

bool avx2_kernels();

}  // namespace relpos::cpu
