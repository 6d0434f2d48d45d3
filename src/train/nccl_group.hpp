// Internal: an NCCL communicator over the processes of a data-parallel run, one GPU each, for the
// gradient all-reduce on the GPU. Bootstrapped over MPI: rank 0 makes the NCCL unique id and
// broadcasts it. Built only with CUDA, MPI and NCCL (RELPOS_WITH_NCCL); otherwise available() is
// false and GPU gradients go through MPI on the host.
#pragma once

#include <memory>

#include "relpos/tensor.hpp"
#include "train/process_group.hpp"

namespace relpos::detail {

class NcclGroup {
 public:
  static bool available();
  // Every process of the group calls it (collective). Uses the calling thread's CUDA stream.
  explicit NcclGroup(ProcessGroup& group);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // begin(); allreduce_mean(t) for several tensors; end(): one fused NCCL launch, queued on the
  // calling thread's stream (later work on that stream sees the means).
  void begin();
  void allreduce_mean(Tensor& t);
  void end();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// In a CUDA build: the GPU this process uses when several share a machine (local rank modulo the
// GPUs it sees), chosen before any CUDA work; nothing with one GPU or none. No-op otherwise.
void select_gpu_for_local_rank(int local_rank);

}  // namespace relpos::detail
