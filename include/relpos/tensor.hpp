// relpos: float32 tensors with CPU or CUDA storage.
//
// A Tensor has a logical shape (for images always N, C, H, W, as in PyTorch) and a memory
// layout: Contiguous (row-major in the logical order) or ChannelsLast (4-D only, stored as
// N, H, W, C). Inside the network activations are ChannelsLast, which is what oneDNN and cuDNN
// run fastest and what makes each pixel's q, k and v contiguous for the attention GEMMs.
// Storage is shared between copies of a Tensor (like a shared_ptr); clone() makes a deep copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace relpos {

enum class Device : std::uint8_t { CPU, CUDA };
enum class Layout : std::uint8_t { Contiguous, ChannelsLast };

std::string to_string(Device d);
Device parse_device(const std::string& s);  // "cpu" | "cuda" | "cuda:0"
bool cuda_available();                      // built with CUDA and a GPU is present
// Waits until the GPU work this thread has queued is done (no-op without CUDA). Work is queued
// asynchronously; copying a tensor to the CPU also waits.
void synchronize();

using Shape = std::vector<std::int64_t>;
std::string to_string(const Shape& s);  // "[2, 3, 4]"
std::int64_t numel_of(const Shape& s);

// Raw memory on one device. CPU memory is 64-byte aligned; CUDA memory comes from the caching
// allocator of the CUDA backend.
class Storage {
 public:
  Storage(std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  // An undefined tensor (defined() false): no storage and no elements. to_vector() gives an empty
  // vector, clone() and to() undefined tensors, data() null; reshape and copy_from refuse it.
  Tensor() = default;
  // Uninitialised tensor.
  explicit Tensor(Shape shape, Device device = Device::CPU, Layout layout = Layout::Contiguous);

  static Tensor zeros(Shape shape, Device device = Device::CPU, Layout layout = Layout::Contiguous);
  static Tensor full(Shape shape, float value, Device device = Device::CPU,
                     Layout layout = Layout::Contiguous);
  // Host values in logical (row-major) order.
  static Tensor from_vector(Shape shape, const std::vector<float>& values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int i) const;  // negative i counts from the end
  std::int64_t numel() const { return storage_ ? numel_of(shape_) : 0; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(float); }
  Device device() const { return device_; }
  Layout layout() const { return layout_; }
  bool is_cpu() const { return device_ == Device::CPU; }
  bool is_cuda() const { return device_ == Device::CUDA; }

  // Pointer to the first element (host or device memory).
  float* data() { return ptr(); }
  const float* data() const { return ptr(); }

  // Same storage, new shape; the tensor must be Contiguous (or 4-D ChannelsLast viewed as
  // Contiguous [N, H, W, C] by as_nhwc()).
  Tensor reshape(Shape shape) const;
  // The physical N, H, W, C array of a ChannelsLast tensor as a Contiguous 4-D view.
  Tensor as_nhwc() const;
  // Interpret a Contiguous [N, H, W, C] tensor as a ChannelsLast [N, C, H, W] one (no copy).
  static Tensor from_nhwc(const Tensor& nhwc);

  Tensor clone() const;
  Tensor to(Device device) const;           // same tensor if already there
  Tensor to_layout(Layout layout) const;    // same tensor if already so
  Tensor contiguous() const { return to_layout(Layout::Contiguous); }
  Tensor channels_last() const { return to_layout(Layout::ChannelsLast); }

  // Host copy of the values in logical order (works for any device and layout).
  std::vector<float> to_vector() const;
  void fill(float value);
  void zero() { fill(0.0f); }
  void copy_from(const Tensor& src);  // shapes must match; devices and layouts may differ

  std::string describe() const;  // "[2, 3, 4] float32 cpu channels_last"

 private:
  float* ptr() const;
  Shape shape_;
  Device device_ = Device::CPU;
  Layout layout_ = Layout::Contiguous;
  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;  // in floats
};

}  // namespace relpos
