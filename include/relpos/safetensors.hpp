// relpos: reading and writing safetensors files (the format timm and Hugging Face publish
// weights in): an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "relpos/tensor.hpp"

namespace relpos {

class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    std::string dtype;  // "F32", "F16", "BF16", "F64", "I64", "I32", ...
    Shape shape;
    std::uint64_t begin = 0, end = 0;  // byte range inside the data section
  };

  // Reads and validates the whole file; throws relpos::Error naming the problem (missing file,
  // truncated or oversized header, bad JSON, unknown dtype, byte ranges outside the file or
  // overlapping, sizes that do not match the shape).
  static SafetensorsFile read(const std::string& path);
  static SafetensorsFile parse(std::vector<char> bytes, const std::string& what = "buffer");

  const std::vector<Entry>& entries() const { return entries_; }  // in header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const;
  const Entry& entry(const std::string& name) const;
  // The tensor converted to float32 on the CPU (F32, F16, BF16, F64, and integer dtypes: I64, I32,
  // I8, U8, BOOL).
  Tensor tensor(const std::string& name) const;
  const std::string& path() const { return what_; }

 private:
  std::string what_;
  std::vector<char> bytes_;
  std::size_t data_start_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes float32 tensors (in the given order) with optional string metadata; the tensors named in
// `int8` hold integers in [-128, 127] and are written as I8. The file is written to a temporary
// name and renamed, so a crash never leaves a half-written file.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::set<std::string>& int8 = {});

}  // namespace relpos
