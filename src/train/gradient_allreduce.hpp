// Internal: averages the parameter gradients over the processes of a data-parallel run, in
// buckets overlapped with the backward pass. The buckets are fixed once, walking the parameters
// from the last to the first (the order in which the backward finishes them) and closing a bucket
// at bucket_mb MiB; Network::backward reports after each block which gradients are final, and
// every bucket whose parameters all are starts its all-reduce (MPI_Iallreduce on a flat host copy,
// or NCCL in place on the GPU) while the backward goes on. finish() waits for all of them and
// leaves each gradient the mean over the processes. bucket_mb = 0: one bucket, after the backward.
#pragma once

#include <cstddef>
#include <vector>

#include "relpos/network.hpp"
#include "train/process_group.hpp"

namespace relpos::detail {

class NcclGroup;

class GradientAllreduce {
 public:
  // nccl: all-reduce on the GPU with it (the gradients live there); nullptr: MPI on the host.
  GradientAllreduce(ProcessGroup& group, const std::vector<ParamRef>& params, double bucket_mb,
                    NcclGroup* nccl = nullptr);
  // The gradients of params[first..] are final: start every bucket they complete.
  void ready(std::size_t first);
  // After the backward: every gradient is the mean of the processes' gradients.
  void finish();
  std::size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into params_, highest first
    std::size_t lowest = 0;           // it starts once params[lowest..] are final
    std::vector<float> flat;          // host copy (MPI)
  };
  void start(Bucket& b);

  ProcessGroup& group_;
  std::vector<ParamRef> params_;
  NcclGroup* nccl_;
  std::vector<Bucket> buckets_;  // in start order
  std::size_t next_ = 0;         // the next bucket to start this step
};

}  // namespace relpos::detail
