// Internal: how an op reaches its backend. RELPOS_DISPATCH(t, fn, args...) applies the thread
// setting, times the op for RELPOS_PROFILE and calls cuda::fn or cpu::fn by the device of t.
#pragma once

#include <initializer_list>

#include "core/op_profile.hpp"
#include "core/ops_internal.hpp"
#include "cpu/cpu_ops.hpp"
#include "relpos/error.hpp"
#ifdef RELPOS_WITH_CUDA
#include "cuda/cuda_ops.hpp"
#define RELPOS_DISPATCH(t, fn, ...)                          \
  const detail::ThreadScope relpos_threads_;                   \
  const detail::OpTimer relpos_op_timer_(#fn, (t).is_cuda()); \
  return (t).is_cuda() ? cuda::fn(__VA_ARGS__) : cpu::fn(__VA_ARGS__)
#else
#define RELPOS_DISPATCH(t, fn, ...)                   \
  const detail::ThreadScope relpos_threads_;            \
  const detail::OpTimer relpos_op_timer_(#fn, false); \
  return cpu::fn(__VA_ARGS__)
#endif

namespace relpos::ops {

// Throws when some of `others` (null or undefined ones aside) live on another device than x.
inline void same_device(const char* op, const Tensor& x, std::initializer_list<const Tensor*> others) {
  for (const Tensor* t : others)
    RELPOS_CHECK(t == nullptr || !t->defined() || t->device() == x.device(),
                 op << ": inputs on different devices (" << to_string(x.device()) << " and "
                    << to_string(t->device()) << ")");
}

}  // namespace relpos::ops
