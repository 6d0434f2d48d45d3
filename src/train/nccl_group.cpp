#include "train/nccl_group.hpp"

#include "relpos/error.hpp"

#ifdef RELPOS_WITH_CUDA
#include <cuda_runtime.h>
#endif
#ifdef RELPOS_WITH_NCCL
#include <nccl.h>

#include "cuda/cuda_common.hpp"
#endif

namespace relpos::detail {

#ifdef RELPOS_WITH_NCCL

#define RELPOS_NCCL_CHECK(expr)                                                                      \
  do {                                                                                               \
    const ncclResult_t relpos_r_ = (expr);                                                           \
    RELPOS_CHECK(relpos_r_ == ncclSuccess, "NCCL error: " << ncclGetErrorString(relpos_r_) << " (" #expr ")"); \
  } while (0)

struct NcclGroup::Impl {
  ncclComm_t comm = nullptr;
};

bool NcclGroup::available() { return true; }

NcclGroup::NcclGroup(ProcessGroup& group) : impl_(std::make_unique<Impl>()) {
  ncclUniqueId id{};
  if (group.rank() == 0) RELPOS_NCCL_CHECK(ncclGetUniqueId(&id));
  group.broadcast(&id, sizeof id, 0);
  RELPOS_NCCL_CHECK(ncclCommInitRank(&impl_->comm, group.size(), id, group.rank()));
}

NcclGroup::~NcclGroup() {
  if (impl_ && impl_->comm) ncclCommDestroy(impl_->comm);
}

void NcclGroup::begin() { RELPOS_NCCL_CHECK(ncclGroupStart()); }

void NcclGroup::allreduce_mean(Tensor& t) {
  RELPOS_CHECK(t.is_cuda(), "NCCL all-reduce of a tensor that is not on the GPU");
  RELPOS_NCCL_CHECK(ncclAllReduce(t.data(), t.data(), static_cast<std::size_t>(t.numel()), ncclFloat, ncclAvg,
                                  impl_->comm, cuda::stream()));
}

void NcclGroup::end() { RELPOS_NCCL_CHECK(ncclGroupEnd()); }

#else

struct NcclGroup::Impl {};
bool NcclGroup::available() { return false; }
NcclGroup::NcclGroup(ProcessGroup&) { RELPOS_FAIL("this relpos was built without NCCL"); }
NcclGroup::~NcclGroup() = default;
void NcclGroup::begin() {}
void NcclGroup::allreduce_mean(Tensor&) {}
void NcclGroup::end() {}

#endif

void select_gpu_for_local_rank(int local_rank) {
#ifdef RELPOS_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no GPU: clear the error, nothing to choose
    return;
  }
  if (count > 1) (void)cudaSetDevice(local_rank % count);
#else
  (void)local_rank;
#endif
}

}  // namespace relpos::detail
