// Internal: which of relpos's own vector kernels run (the SASA planes, the Winograd convolutions).
// avx2_kernels(): the CPU has AVX2 and FMA; avx512_kernels(): it also has AVX-512 F, VL, DQ and BW.
// RELPOS_SIMD caps the choice: "generic" keeps the portable kernels and oneDNN's everywhere, "avx2"
// stops at AVX2 (the tests run every level the CPU has; benchmarks compare them). Read once.
#pragma once

namespace relpos::cpu {

bool avx2_kernels();
bool avx512_kernels();

}  // namespace relpos::cpu
