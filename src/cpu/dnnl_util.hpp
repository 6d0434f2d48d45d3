// Internal: the oneDNN engine, per-thread streams, memory descriptors for our tensors, and
// primitive execution with a per-thread scratchpad (user scratchpad mode), so that one loaded
// model can run on many threads at once.
#pragma once

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "relpos/ops.hpp"
#include "relpos/tensor.hpp"

namespace relpos::cpu {

dnnl::engine& engine();
dnnl::stream& stream();  // one per calling thread

using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// Descriptor of a tensor as it is stored: 4-D channels-last -> nhwc, else plain row-major.
dnnl::memory::desc md_of(const Tensor& t);
dnnl::memory::desc md_plain(const Shape& shape);
dnnl::memory::desc md_nhwc(const Shape& nchw_shape);
dnnl::memory mem(const dnnl::memory::desc& md, const Tensor& t);
dnnl::memory mem(const dnnl::memory::desc& md, const float* p);

// A memory for `md` (weights packed for a kernel, kept as long as the model) in huge-page arena memory
// (core/huge_page_arena.hpp) that `hold` keeps.
dnnl::memory arena_memory(const dnnl::memory::desc& md, std::shared_ptr<void>& hold);

// Primitive attributes with the user scratchpad mode set.
dnnl::primitive_attr scratch_attr();
// Whether a primitive runs oneDNN's brgemm kernels (its implementation name says so).
bool is_brgemm(const dnnl::primitive_desc_base& pd);
// Whether oneDNN runs a float32 matmul through its brgemm kernels on this CPU (AVX-512, unless
// ONEDNN_MAX_CPU_ISA caps it). Probed once.
bool brgemm_matmul();
// Runs a primitive on the calling thread's stream with a scratchpad of the calling thread.
void execute(const dnnl::primitive& prim, const dnnl::memory::desc& scratchpad_md,
             std::unordered_map<int, dnnl::memory> args);

// A 4-D activation in channels-last layout (converted if it is not).
Tensor as_channels_last(const Tensor& x);

// The output of a convolution whose epilogue may add a residual (a oneDNN sum post-op adds onto
// what the output holds): the residual itself when the caller gave it up (overwrite_residual) and
// it is channels-last, else a new channels-last tensor holding a copy of it (or nothing).
Tensor output_for(const Shape& shape, const ops::Epilogue& ep, const char* op);

}  // namespace relpos::cpu

namespace relpos::cpu {
// Row-major C = alpha * op(A) op(B) + beta * C (oneDNN's sgemm; single-threaded when called
// inside an OpenMP parallel region).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);
}  // namespace relpos::cpu
