#include "relpos/tensor.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/caching_allocator.hpp"
#include "core/device_memory.hpp"
#include "core/checked_math.hpp"
#include "core/runtime_internal.hpp"
#include "relpos/error.hpp"

namespace relpos {

std::string to_string(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::CPU;
  if (s == "cuda" || s == "cuda:0" || s == "gpu") return Device::CUDA;
  RELPOS_FAIL("unknown device '" << s << "' (expected cpu or cuda)");
}

bool cuda_available() { return detail::cuda_runtime_available(); }
void synchronize() { detail::cuda_synchronize(); }

std::string to_string(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) {
    // hot path: build the message only on failure
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) checked_numel(s, "tensor shape " + to_string(s));
  }
  return n;
}

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  const std::size_t padded = std::max<std::size_t>(64, bytes);
  if (device == Device::CPU) {
    data_ = detail::host_allocator().allocate(padded);
    RELPOS_CHECK(data_ != nullptr, "out of host memory allocating " << bytes << " bytes");
  } else {
    data_ = detail::cuda_alloc(padded);
  }
}

Storage::~Storage() {
  const std::size_t padded = std::max<std::size_t>(64, bytes_);
  if (device_ == Device::CPU) {
    detail::host_allocator().release(data_, padded);
  } else {
    detail::cuda_free(data_, padded);
  }
}

Tensor::Tensor(Shape shape, Device device, Layout layout)
    : shape_(std::move(shape)), device_(device), layout_(layout) {
  for (auto d : shape_) RELPOS_CHECK(d >= 0, "negative dimension in shape " << to_string(shape_));
  RELPOS_CHECK(layout_ == Layout::Contiguous || shape_.size() == 4,
               "channels-last layout needs a 4-D shape, got " << to_string(shape_));
  // (numel() counts 0 until the storage exists)
  storage_ = std::make_shared<Storage>(static_cast<std::size_t>(numel_of(shape_)) * sizeof(float), device_);
}

Tensor Tensor::zeros(Shape shape, Device device, Layout layout) {
  return full(std::move(shape), 0.0f, device, layout);
}

Tensor Tensor::full(Shape shape, float value, Device device, Layout layout) {
  Tensor t(std::move(shape), device, layout);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(Shape shape, const std::vector<float>& values) {
  Tensor t(std::move(shape));
  RELPOS_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(),
               "from_vector: " << values.size() << " values for shape " << to_string(t.shape()));
  std::memcpy(t.data(), values.data(), t.bytes());
  return t;
}

std::int64_t Tensor::dim(int i) const {
  const int n = ndim();
  const int k = i < 0 ? i + n : i;  // (the message names the dimension asked for: -3, not -1)
  RELPOS_CHECK(k >= 0 && k < n, "dimension " << i << " out of range for shape " << to_string(shape_));
  return shape_[static_cast<std::size_t>(k)];
}

float* Tensor::ptr() const {
  return storage_ ? static_cast<float*>(storage_->data()) + offset_ : nullptr;
}

Tensor Tensor::reshape(Shape shape) const {
  RELPOS_CHECK(defined(), "reshape of an undefined tensor");
  RELPOS_CHECK(layout_ == Layout::Contiguous,
               "reshape needs a contiguous tensor, got " << describe());
  RELPOS_CHECK(numel_of(shape) == numel(),
               "cannot reshape " << to_string(shape_) << " to " << to_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::as_nhwc() const {
  RELPOS_CHECK(layout_ == Layout::ChannelsLast, "as_nhwc needs a channels-last tensor, got " << describe());
  Tensor t = *this;
  t.shape_ = {shape_[0], shape_[2], shape_[3], shape_[1]};
  t.layout_ = Layout::Contiguous;
  return t;
}

Tensor Tensor::from_nhwc(const Tensor& nhwc) {
  RELPOS_CHECK(nhwc.ndim() == 4 && nhwc.layout_ == Layout::Contiguous,
               "from_nhwc needs a contiguous 4-D tensor, got " << nhwc.describe());
  Tensor t = nhwc;
  t.shape_ = {nhwc.shape_[0], nhwc.shape_[3], nhwc.shape_[1], nhwc.shape_[2]};
  t.layout_ = Layout::ChannelsLast;
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return Tensor();
  Tensor t(shape_, device_, layout_);
  if (numel() > 0) detail::copy_bytes(t.data(), device_, data(), device_, bytes());
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_ || !defined()) return *this;
  Tensor t(shape_, device, layout_);
  if (numel() > 0) detail::copy_bytes(t.data(), device, data(), device_, bytes());
  return t;
}

namespace {
void permute_cpu(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t hw,
                 bool to_nhwc) {
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const std::int64_t base = b * c * hw;
      for (std::int64_t p = 0; p < hw; ++p) {
        if (to_nhwc)
          dst[base + p * c + ch] = src[base + ch * hw + p];
        else
          dst[base + ch * hw + p] = src[base + p * c + ch];
      }
    }
}
}  // namespace

Tensor Tensor::to_layout(Layout layout) const {
  if (layout == layout_) return *this;
  RELPOS_CHECK(ndim() == 4, "layout change needs a 4-D tensor, got " << describe());
  Tensor t(shape_, device_, layout);
  const std::int64_t n = shape_[0], c = shape_[1], hw = shape_[2] * shape_[3];
  const bool to_nhwc = layout == Layout::ChannelsLast;
  if (device_ == Device::CPU) {
    const detail::ThreadScope threads;  // its OpenMP loop runs with relpos's thread setting
    permute_cpu(data(), t.data(), n, c, hw, to_nhwc);
  } else if (to_nhwc) {
    detail::cuda_nchw_to_nhwc(data(), t.data(), n, c, hw);
  } else {
    detail::cuda_nhwc_to_nchw(data(), t.data(), n, c, hw);
  }
  return t;
}

std::vector<float> Tensor::to_vector() const {
  Tensor host = to(Device::CPU).contiguous();
  std::vector<float> v(static_cast<std::size_t>(numel()));
  if (!v.empty()) std::memcpy(v.data(), host.data(), host.bytes());
  return v;
}

void Tensor::fill(float value) {
  if (numel() == 0) return;
  if (device_ == Device::CPU) {
    std::fill(data(), data() + numel(), value);
  } else {
    detail::cuda_fill(data(), static_cast<std::size_t>(numel()), value);
  }
}

void Tensor::copy_from(const Tensor& src) {
  RELPOS_CHECK(defined() && src.defined(), "copy_from: " << (defined() ? "from" : "into") << " an undefined tensor");
  RELPOS_CHECK(src.shape_ == shape_, "copy_from: shape " << to_string(src.shape_) << " into "
                                                         << to_string(shape_));
  if (numel() == 0) return;
  Tensor s = src.to_layout(layout_);
  detail::copy_bytes(data(), device_, s.data(), s.device_, bytes());
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << to_string(shape_) << " float32 " << to_string(device_)
     << (layout_ == Layout::ChannelsLast ? " channels_last" : "");
  return os.str();
}

}  // namespace relpos
