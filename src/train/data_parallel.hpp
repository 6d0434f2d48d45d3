// Internal: what train() does as one of several processes (docs/distributed.md). Every process
// holds the same model and trains on its shard of each global batch (the loader cuts the same
// deterministic order); gradients are averaged in buckets during the backward
// (train/gradient_allreduce.hpp); with sync_bn, batch norm uses the global batch's statistics
// (core/batchnorm_sync.hpp). Rank 0 writes the files. Alone (no MPI launcher, or one process on
// the CPU) every call here is a no-op and train() runs as it always did.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/batchnorm_sync.hpp"
#include "relpos/trainer.hpp"
#include "train/process_group.hpp"

namespace relpos::detail {

// relpos::evaluate without its check that some image was read: count 0 (and zero scores) when
// none was (src/train/trainer.cpp).
EvalResult evaluate_readable(const Model& model, const Dataset& data, int batch,
                             const std::function<void(std::size_t, std::size_t)>& progress = {});
// The error of an evaluation that read no image: no images, or none readable (naming the first).
std::string nothing_to_evaluate(const Dataset& data);

class GradientAllreduce;
class NcclGroup;

class DataParallel : public BatchNormSync {
 public:
  // Joins this run's processes; throws when a launcher started several and relpos has no MPI.
  DataParallel();
  // Removes the batch-norm synchronisation; when an exception leaves train() in a run of several
  // processes, marks it failed so that mpirun stops the others (they would wait forever).
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  bool writer() const { return group_.rank() == 0; }  // writes logs, checkpoints and the model
  // A checkpoint records the processes that wrote it; resuming it takes as many.
  void check_resume(int checkpoint_processes, const std::string& checkpoint) const;
  // Collective: throws on every process when the processes' `run` texts (the recipe, the model's
  // architecture, the data's fingerprint and the progress) differ, naming the ones that differ from
  // process 0.
  void check_same_run(const std::string& run);

  // Once the model and optimizer are set up: rank 0's weights, buffers and optimizer state go to
  // every process; the gradient buckets are laid out; sync_bn installs the batch-norm sync.
  void start(Network& net, Optimizer& optimizer, const TrainOptions& options);
  // This process's part of each global batch.
  void shard(DataLoader::Options& loader) const;
  // For Network::backward: starts the buckets whose gradients are final (empty when alone).
  std::function<void(std::size_t)> gradient_hook();
  // After the backward: every gradient is the mean over the processes.
  void finish_gradients();
  // values[i] summed over the processes (every one gets the same sums).
  void sum(double* values, std::size_t n);
  // Before a checkpoint or an evaluation (collective): without sync_bn the batch-norm running
  // statistics are averaged; the processes' weights and optimizer state are checked to agree bit
  // for bit. Returns a warning ("" if none) when they did not and rank 0's were copied to all.
  std::string synchronize_state();
  // Without sync_bn in a run of several processes (collective; nothing otherwise): each tensor
  // becomes its mean over the processes. For the weight average's running statistics, which each
  // process averages from its own.
  void average_statistics(const std::vector<Tensor*>& tensors);
  // Without sync_bn in a run of several processes: copies of this process's batch-norm running
  // statistics, which synchronize_state replaces by the processes' mean (empty otherwise); and
  // putting them back.
  std::vector<Tensor> own_statistics() const;
  void restore_statistics(const std::vector<Tensor>& saved);
  // The test-set score, each process evaluating every size()-th image (a process whose part holds
  // no readable image counts none; the processes fail together when none of them has one).
  EvalResult evaluate(const Model& model, const Dataset& data, int batch);

  // BatchNormSync
  void allgather(const double* mine, std::size_t n, double* all) override;
  int processes() const override { return group_.size(); }

 private:
  ProcessGroup& group_;
  int uncaught_ = 0;
  bool sync_bn_ = false;
  // Collective: the processes whose `mine` differs from process 0's, as "1, 3" ("" when none).
  std::string differing(std::uint64_t mine);
  Network* net_ = nullptr;
  Optimizer* optimizer_ = nullptr;
  std::unique_ptr<NcclGroup> nccl_;
  std::unique_ptr<GradientAllreduce> grads_;
};

}  // namespace relpos::detail
