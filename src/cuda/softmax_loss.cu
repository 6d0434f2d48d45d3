// Softmax and cross-entropy for GPU tensors (twin of cpu/softmax_loss.cpp). They act on small
// logits (batch x classes), so they run on the host: the logits are copied there and the
// gradient back.
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"

namespace relpos::cuda {

Tensor softmax(const Tensor& x) { return cpu::softmax(x.to(Device::CPU)).to(Device::CUDA); }

ops::CrossEntropy cross_entropy(const Tensor& logits, const std::vector<int>& labels, float smoothing) {
  return cpu::cross_entropy(logits, labels, smoothing);  // copies the logits to the host and dlogits back
}

}  // namespace relpos::cuda
