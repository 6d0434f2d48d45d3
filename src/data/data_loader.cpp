// Augmentation and the background batch loader.
#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <cmath>
#include <cstring>
#include <iostream>
#include <numeric>

#include "relpos/data.hpp"

#include "core/runtime_internal.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {

// splitmix64: a small, well-mixed generator; one per sample, seeded from (seed, epoch, index).
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1ull << 24); }  // [0, 1)
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }       // [0, n)
};

}  // namespace

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index) {
  Rng r{seed * 0x100000001b3ull ^ (epoch << 40) ^ index};
  r.next();
  return r.next();
}

void augment_image(float* img, int h, int w, int c, const Augment& aug, const float* fill, std::uint64_t seed) {
  Rng rng{seed};
  const std::size_t row = static_cast<std::size_t>(w) * c;
  if (aug.pad > 0) {
    const int dy = rng.below(2 * aug.pad + 1) - aug.pad, dx = rng.below(2 * aug.pad + 1) - aug.pad;
    if (dy != 0 || dx != 0) {
      std::vector<float> src(img, img + static_cast<std::size_t>(h) * row);
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          const int sy = y + dy, sx = x + dx;
          float* d = img + y * row + static_cast<std::size_t>(x) * c;
          if (sy < 0 || sy >= h || sx < 0 || sx >= w)
            for (int k = 0; k < c; ++k) d[k] = fill[k];
          else
            std::memcpy(d, src.data() + sy * row + static_cast<std::size_t>(sx) * c, sizeof(float) * c);
        }
    }
  }
  if (aug.hflip && rng.uniform() < 0.5f)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w / 2; ++x)
        for (int k = 0; k < c; ++k)
          std::swap(img[y * row + static_cast<std::size_t>(x) * c + k], img[y * row + static_cast<std::size_t>(w - 1 - x) * c + k]);
  if (aug.erase_prob > 0.0f && rng.uniform() < aug.erase_prob) {
    for (int attempt = 0; attempt < 10; ++attempt) {
      const float area = (aug.erase_min_area + rng.uniform() * (aug.erase_max_area - aug.erase_min_area)) * h * w;
      const float aspect = std::exp(std::log(0.3f) + rng.uniform() * (std::log(3.3f) - std::log(0.3f)));
      const int eh = static_cast<int>(std::lround(std::sqrt(area * aspect)));
      const int ew = static_cast<int>(std::lround(std::sqrt(area / aspect)));
      if (eh < 1 || ew < 1 || eh >= h || ew >= w) continue;
      const int y0 = rng.below(h - eh + 1), x0 = rng.below(w - ew + 1);
      for (int y = y0; y < y0 + eh; ++y) std::fill(img + y * row + static_cast<std::size_t>(x0) * c, img + y * row + static_cast<std::size_t>(x0 + ew) * c, 0.0f);
      break;
    }
  }
}

struct DataLoader::Impl {
  Impl(const Dataset& data, const Preprocess& pre, Options options);
  void stop();
  void work();
  // Works on the epoch's own snapshot: start_epoch() may replace the order meanwhile.
  Batch make(std::size_t batch_index, const std::vector<std::size_t>& order, int epoch);
  std::size_t batches_per_epoch() const;
  void start_epoch(int epoch, std::size_t start_batch);
  bool next(Batch& out);

  const Dataset& data_;
  Preprocess pre_;
  Options opt_;
  int epoch_ = 0;
  std::shared_ptr<const std::vector<std::size_t>> order_;  // replaced, never changed, by start_epoch
  std::size_t next_make_ = 0, next_take_ = 0, end_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::size_t, Batch> ready_;
  std::map<std::size_t, std::string> errors_;  // batches that could not be assembled
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::uint64_t generation_ = 0;  // bumped by start_epoch; stale work is dropped
  std::unique_ptr<std::atomic<bool>[]> bad_;  // samples known to be unreadable
  std::atomic<std::size_t> skipped_count_{0};
  std::array<float, 3> fill_{};  // the value of a black pixel after preprocessing
};

DataLoader::DataLoader(const Dataset& data, const Preprocess& pre, Options options)
    : impl_(std::make_unique<Impl>(data, pre, options)) {}
DataLoader::~DataLoader() { impl_->stop(); }
std::size_t DataLoader::batches_per_epoch() const { return impl_->batches_per_epoch(); }
void DataLoader::start_epoch(int epoch, std::size_t start_batch) { impl_->start_epoch(epoch, start_batch); }
bool DataLoader::next(Batch& out) { return impl_->next(out); }
std::size_t DataLoader::skipped() const { return impl_->skipped_count_.load(); }

DataLoader::Impl::Impl(const Dataset& data, const Preprocess& pre, Options options)
    : data_(data), pre_(pre), opt_(options), bad_(new std::atomic<bool>[data.size()]) {
  RELPOS_CHECK(opt_.batch >= 1, "batch size must be at least 1");
  RELPOS_CHECK(opt_.shards >= 1 && opt_.shard >= 0 && opt_.shard < opt_.shards,
               "data loader: shard " << opt_.shard << " of " << opt_.shards);
  RELPOS_CHECK(data.size() > 0, "the dataset is empty");
  for (std::size_t i = 0; i < data.size(); ++i) bad_[i] = false;
  for (int k = 0; k < 3; ++k) fill_[static_cast<std::size_t>(k)] = (0.0f - pre_.mean[static_cast<std::size_t>(k)]) / pre_.std[static_cast<std::size_t>(k)];
  const int workers = std::max(1, opt_.workers);
  try {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  } catch (const std::system_error& e) {  // a thread limit (ulimit -u): the started ones end before the error
    const std::size_t started = threads_.size();
    stop();
    RELPOS_FAIL("cannot start data-loading worker " << started + 1 << " of " << workers << " (" << e.what()
                                                    << "); use fewer workers (--workers, TrainOptions::workers)");
  }
}

void DataLoader::Impl::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

std::size_t DataLoader::Impl::batches_per_epoch() const {
  const std::size_t n = data_.size(), b = static_cast<std::size_t>(opt_.batch) * static_cast<std::size_t>(opt_.shards);
  return opt_.drop_last && n >= b ? n / b : (n + b - 1) / b;
}

void DataLoader::Impl::start_epoch(int epoch, std::size_t start_batch) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++generation_;
  epoch_ = epoch;
  auto order = std::make_shared<std::vector<std::size_t>>(data_.size());
  std::iota(order->begin(), order->end(), std::size_t{0});
  if (opt_.shuffle && order->size() > 1) {
    Rng rng{mix_seed(opt_.seed, static_cast<std::uint64_t>(epoch), ~0ull)};
    for (std::size_t i = order->size() - 1; i > 0; --i) std::swap((*order)[i], (*order)[rng.next() % (i + 1)]);
  }
  order_ = std::move(order);  // workers still holding the old one keep it alive
  end_ = batches_per_epoch();
  next_make_ = next_take_ = std::min(start_batch, end_);
  ready_.clear();
  errors_.clear();
  cv_.notify_all();
}

Batch DataLoader::Impl::make(std::size_t index, const std::vector<std::size_t>& order, int epoch) {
  // this shard's part of the global batch `index`
  const std::size_t b = static_cast<std::size_t>(opt_.batch), global = b * static_cast<std::size_t>(opt_.shards);
  const std::size_t global_end = std::min(order.size(), (index + 1) * global);
  const std::size_t begin = std::min(global_end, index * global + static_cast<std::size_t>(opt_.shard) * b);
  const std::size_t end = std::min(global_end, begin + b);
  const int c = pre_.in_chans();
  const std::size_t per = static_cast<std::size_t>(pre_.height) * pre_.width * c;
  std::vector<float> pixels;
  pixels.reserve((end - begin) * per);
  Batch out;
  out.first = begin;
  for (std::size_t k = begin; k < end; ++k) {
    const std::size_t i = order[k];
    if (bad_[i]) continue;
    Tensor one;
    try {
      const cv::Mat img = data_.image(i);
      // a stream of its own, so that the placement does not repeat the crop's draws
      one = make_batch({opt_.augment.canvas > 0 ? place_on_canvas(img, opt_.augment.canvas,
                                                                  mix_seed(opt_.seed ^ CanvasDataset::kDefaultSeed,
                                                                           static_cast<std::uint64_t>(epoch), i))
                                                : img},
                       pre_);
    } catch (const std::exception& e) {
      if (!bad_[i].exchange(true)) {
        ++skipped_count_;
        detail::log("skipped " + detail::naming(data_.name(i), e.what()));
      }
      continue;
    }
    augment_image(one.data(), pre_.height, pre_.width, c, opt_.augment, fill_.data(),
                  mix_seed(opt_.seed, static_cast<std::uint64_t>(epoch), i));
    pixels.insert(pixels.end(), one.data(), one.data() + per);
    out.labels.push_back(data_.label(i));
  }
  const auto n = static_cast<std::int64_t>(out.labels.size());
  out.images = Tensor::from_nhwc(Tensor::from_vector({n, pre_.height, pre_.width, c}, pixels));
  return out;
}

void DataLoader::Impl::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] {
      return stopping_ || (next_make_ < end_ && next_make_ < next_take_ + static_cast<std::size_t>(opt_.prefetch));
    });
    if (stopping_) return;
    const std::size_t index = next_make_++;
    const std::uint64_t gen = generation_;
    const std::shared_ptr<const std::vector<std::size_t>> order = order_;  // this epoch's, under the lock
    const int epoch = epoch_;
    lock.unlock();
    Batch b;
    std::string error;
    try {
      b = make(index, *order, epoch);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    if (gen != generation_) continue;  // the epoch changed under us
    if (!error.empty()) errors_[index] = error;
    ready_.emplace(index, std::move(b));
    cv_.notify_all();
  }
}

bool DataLoader::Impl::next(Batch& out) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (next_take_ >= end_) return false;
    cv_.wait(lock, [&] { return ready_.count(next_take_) != 0; });
    Batch b = std::move(ready_.at(next_take_));
    ready_.erase(next_take_);
    auto err = errors_.find(next_take_);
    ++next_take_;
    cv_.notify_all();
    if (err != errors_.end()) RELPOS_FAIL("the data loader failed to assemble a batch: " << err->second);
    // every sample of it was unreadable: skipped, except for a shard of a data-parallel run, whose
    // trainer must take the same steps as the other processes (it asks them whether to skip)
    if (b.labels.empty() && opt_.shards == 1) continue;
    out = std::move(b);
    return true;
  }
}

}  // namespace relpos
