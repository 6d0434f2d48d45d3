#include "train/data_parallel.hpp"

#include <cstring>
#include <exception>
#include <sstream>
#include <vector>

#include "relpos/error.hpp"
#include "train/gradient_allreduce.hpp"
#include "train/nccl_group.hpp"

namespace relpos::detail {

namespace {

// Every `step`-th sample of a dataset, from `first` on.
class DatasetShard : public Dataset {
 public:
  DatasetShard(const Dataset& data, std::size_t first, std::size_t step) : data_(data), first_(first), step_(step) {}
  std::size_t size() const override { return data_.size() > first_ ? (data_.size() - first_ + step_ - 1) / step_ : 0; }
  int label(std::size_t i) const override { return data_.label(at(i)); }
  cv::Mat image(std::size_t i) const override { return data_.image(at(i)); }
  std::string name(std::size_t i) const override { return data_.name(at(i)); }
  const std::vector<std::string>& classes() const override { return data_.classes(); }

 private:
  std::size_t at(std::size_t i) const { return first_ + i * step_; }
  const Dataset& data_;
  std::size_t first_, step_;
};

// Each tensor's values, one after another, through a host copy (GPU tensors are copied back).
template <class F>
void each_state_tensor(Network& net, Optimizer& optimizer, F&& f) {
  for (const ParamRef& p : net.params())
    if (p.value->defined()) f(*p.value);
  for (auto& [name, t] : optimizer.state())  // the optimizer's own tensors (shared storage)
    if (t.defined()) f(t);
}

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::string DataParallel::differing(std::uint64_t mine) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(group_.size()));
  group_.allgather(&mine, 1, all.data());
  std::ostringstream differ;
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differ << (differ.tellp() > 0 ? ", " : "") << r;
  return differ.str();
}

DataParallel::DataParallel() : group_(ProcessGroup::world()), uncaught_(std::uncaught_exceptions()) {
  train_processes();  // joins MPI and picks the GPU, if the application has not asked yet
  RELPOS_CHECK(group_.size() == 1 || ProcessGroup::built_with_mpi(),
               "mpirun started " << group_.size() << " processes, but this relpos was built without MPI and cannot "
               "train data-parallel; rebuild it with MPI (Debian: libopenmpi-dev; see docs/distributed.md), or run "
               "one process");
}

DataParallel::~DataParallel() {
  if (batchnorm_sync() == this) set_batchnorm_sync(nullptr);
  if (std::uncaught_exceptions() > uncaught_ && group_.size() > 1) group_.fail();
}

void DataParallel::check_resume(int checkpoint_processes, const std::string& checkpoint) const {
  RELPOS_CHECK(checkpoint_processes == group_.size(),
               checkpoint << ": written by a run of " << checkpoint_processes << " process"
                          << (checkpoint_processes == 1 ? "" : "es") << " (global batch = processes x batch), but "
                          << group_.size() << " resume it; resume with "
                          << (checkpoint_processes == 1 ? std::string("one process")
                                                        : "mpirun -np " + std::to_string(checkpoint_processes)));
}

void DataParallel::check_same_run(const std::string& run) {
  if (group_.size() == 1) return;
  const std::string differ = differing(fnv1a(0xcbf29ce484222325ull, run.data(), run.size()));
  RELPOS_CHECK(differ.empty(), "process" << (differ.find(',') == std::string::npos ? " " : "es ") << differ
                                              << " of " << group_.size() << " got other options, another model or "
                                                 "other training data than process 0 (or resumed another checkpoint): "
                                                 "every process of a run needs the same relpos train command and data");
}

void DataParallel::start(Network& net, Optimizer& optimizer, const TrainOptions& options) {
  net_ = &net;
  optimizer_ = &optimizer;
  const bool gpu = net.device() == Device::CUDA;
  const bool use_nccl = gpu && group_.launched() && NcclGroup::available();
  if (group_.size() == 1 && !use_nccl) return;  // alone: nothing to exchange
  // The same starting point everywhere: rank 0's weights, buffers and optimizer state.
  each_state_tensor(net, optimizer, [&](Tensor& t) {
    Tensor host = t.is_cpu() ? t : t.to(Device::CPU);
    group_.broadcast(host.data(), host.bytes(), 0);
    if (!t.is_cpu()) t.copy_from(host);
  });
  if (use_nccl) nccl_ = std::make_unique<NcclGroup>(group_);
  grads_ = std::make_unique<GradientAllreduce>(group_, net.params(), options.bucket_mb, nccl_.get());
  sync_bn_ = options.sync_bn && group_.size() > 1;
  if (sync_bn_) set_batchnorm_sync(this);
}

void DataParallel::shard(DataLoader::Options& loader) const {
  loader.shards = group_.size();
  loader.shard = group_.rank();
}

std::function<void(std::size_t)> DataParallel::gradient_hook() {
  if (!grads_) return {};
  return [this](std::size_t first) { grads_->ready(first); };
}

void DataParallel::finish_gradients() {
  if (grads_) grads_->finish();
}

void DataParallel::sum(double* values, std::size_t n) { group_.allreduce_sum(values, n); }

void DataParallel::allgather(const double* mine, std::size_t n, double* all) { group_.allgather(mine, n, all); }

std::string DataParallel::synchronize_state() {
  if (group_.size() == 1 || !net_) return "";
  std::vector<Tensor*> statistics;  // each process kept its own running statistics: their mean
  for (const ParamRef& p : net_->params())
    if (!p.grad) statistics.push_back(p.value);
  average_statistics(statistics);
  std::uint64_t h = 0xcbf29ce484222325ull;
  each_state_tensor(*net_, *optimizer_, [&](Tensor& t) {
    const Tensor host = t.to(Device::CPU);
    h = fnv1a(h, host.data(), host.bytes());
  });
  const std::string differ = differing(h);
  if (differ.empty()) return "";
  // Rounding in an all-reduce can make processes drift apart: rank 0's state goes to all again.
  each_state_tensor(*net_, *optimizer_, [&](Tensor& t) {
    Tensor host = t.is_cpu() ? t : t.to(Device::CPU);
    group_.broadcast(host.data(), host.bytes(), 0);
    if (!t.is_cpu()) t.copy_from(host);
  });
  return "processes " + differ + " disagreed with process 0 on the weights or optimizer state; process 0's "
         "were copied to all";
}

void DataParallel::average_statistics(const std::vector<Tensor*>& tensors) {
  if (group_.size() == 1 || sync_bn_) return;
  for (Tensor* t : tensors) {
    std::vector<float> v = t->to_vector();
    std::vector<double> d(v.begin(), v.end());
    group_.allreduce_sum(d.data(), d.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(d[i] / group_.size());
    t->copy_from(Tensor::from_vector(t->shape(), v).to_layout(t->layout()));
  }
}

std::vector<Tensor> DataParallel::own_statistics() const {
  std::vector<Tensor> out;
  if (group_.size() == 1 || sync_bn_ || !net_) return out;
  for (const ParamRef& p : net_->params())
    if (!p.grad) out.push_back(p.value->clone());
  return out;
}

void DataParallel::restore_statistics(const std::vector<Tensor>& saved) {
  if (saved.empty()) return;
  std::size_t i = 0;
  for (const ParamRef& p : net_->params())
    if (!p.grad) p.value->copy_from(saved.at(i++));
}

EvalResult DataParallel::evaluate(const Model& model, const Dataset& data, int batch) {
  if (group_.size() == 1) return relpos::evaluate(model, data, batch);
  const DatasetShard part(data, static_cast<std::size_t>(group_.rank()), static_cast<std::size_t>(group_.size()));
  EvalResult mine;
  if (part.size() > 0) mine = detail::evaluate_readable(model, part, batch);
  const double n = static_cast<double>(mine.count);
  double sums[5] = {n, mine.loss * n, mine.top1 * n, static_cast<double>(mine.skipped), mine.top5 * n};
  group_.allreduce_sum(sums, 5);
  RELPOS_CHECK(sums[0] > 0, detail::nothing_to_evaluate(data));
  EvalResult r;  // the scores; the per-class tables stay this process's
  r.count = static_cast<std::size_t>(sums[0]);
  r.loss = sums[1] / sums[0];
  r.top1 = sums[2] / sums[0];
  r.top5 = sums[4] / sums[0];
  r.skipped = static_cast<std::size_t>(sums[3]);
  r.classes = mine.classes;
  return r;
}

}  // namespace relpos::detail

namespace relpos {

void abandon_train_processes() {
  detail::ProcessGroup& g = detail::ProcessGroup::world();
  if (g.size() > 1) g.fail();
}

TrainProcesses train_processes() {
  detail::ProcessGroup& g = detail::ProcessGroup::world();
  static const bool gpu_chosen = [&] {
    if (g.launched()) detail::select_gpu_for_local_rank(g.local_rank());
    return true;
  }();
  (void)gpu_chosen;
  TrainProcesses p;
  p.rank = g.rank();
  p.size = g.size();
  p.mpi = detail::ProcessGroup::built_with_mpi();
  p.launched = g.launched();
  p.nccl = detail::NcclGroup::available();
  return p;
}

}  // namespace relpos
