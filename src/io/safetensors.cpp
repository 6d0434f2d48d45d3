#include "relpos/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/checked_math.hpp"
#include "io/atomic_file.hpp"
#include "io/json_reader.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {

constexpr std::uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit

std::size_t dtype_size(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "I8" || dt == "U8" || dt == "BOOL") return 1;
  return 0;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 are little-endian
  return v;
}

}  // namespace

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  detail::check_regular_file(path, "safetensors files");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  RELPOS_CHECK(in, "cannot open safetensors file '" << path << "': " << std::strerror(errno));
  const std::streamsize size = in.tellg();
  in.seekg(0);
  std::vector<char> bytes(static_cast<std::size_t>(std::max<std::streamsize>(size, 0)));
  if (size > 0) in.read(bytes.data(), size);
  RELPOS_CHECK(in, "error reading safetensors file '" << path << "'");
  return parse(std::move(bytes), path);
}

SafetensorsFile SafetensorsFile::parse(std::vector<char> bytes, const std::string& what) {
  SafetensorsFile f;
  f.what_ = what;
  f.bytes_ = std::move(bytes);
  const std::uint64_t size = f.bytes_.size();
  RELPOS_CHECK(size >= 8, what << ": not a safetensors file (only " << size
                               << " bytes, shorter than the 8-byte header length)");
  const auto hlen = load_le<std::uint64_t>(f.bytes_.data());
  RELPOS_CHECK(hlen <= kMaxHeader, what << ": safetensors header length " << hlen
                                        << " is larger than the 100 MiB limit (corrupt or not a safetensors file)");
  RELPOS_CHECK(hlen <= size - 8, what << ": truncated safetensors file: the header claims " << hlen
                                      << " bytes but only " << size - 8 << " follow");
  f.data_start_ = 8 + hlen;
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(f.bytes_.begin() + 8, f.bytes_.begin() + static_cast<std::ptrdiff_t>(f.data_start_),
                                           detail::refuse_duplicate_keys<nlohmann::ordered_json>(what + ": the safetensors header"));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    RELPOS_FAIL(what << ": the safetensors header is not valid JSON (" << detail::short_parse_error(e) << ")");
  }
  RELPOS_CHECK(header.is_object(), what << ": the safetensors header must be a JSON object");
  const std::uint64_t data_size = size - f.data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      RELPOS_CHECK(v.is_object(), what << ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m)
        f.metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      continue;
    }
    try {
      Entry e;
      e.name = name;
      e.dtype = v.at("dtype").get<std::string>();
      for (const auto& d : v.at("shape")) {
        RELPOS_CHECK(d.is_number_integer() && d.get<std::int64_t>() >= 0, "bad dimension " << d.dump());
        e.shape.push_back(d.get<std::int64_t>());
      }
      const auto& off = v.at("data_offsets");
      RELPOS_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                   "data_offsets must be two non-negative integers");
      e.begin = off[0].get<std::uint64_t>();
      e.end = off[1].get<std::uint64_t>();
      const std::size_t es = dtype_size(e.dtype);
      RELPOS_CHECK(es != 0, "unsupported dtype " << e.dtype);
      RELPOS_CHECK(e.begin <= e.end && e.end <= data_size,
                   "bytes " << e.begin << ".." << e.end << " lie outside the " << data_size
                            << "-byte data section (truncated file?)");
      const std::uint64_t need = checked_mul(
          static_cast<std::uint64_t>(checked_numel(e.shape, "shape " + to_string(e.shape))), es,
          "shape " + to_string(e.shape) + " of " + e.dtype);
      RELPOS_CHECK(e.end - e.begin == need, "shape " << to_string(e.shape) << " of " << e.dtype << " needs " << need
                                                     << " bytes but the file gives " << e.end - e.begin);
      f.index_[name] = f.entries_.size();
      f.entries_.push_back(std::move(e));
    } catch (const Error& err) {
      RELPOS_FAIL(what << ": tensor '" << name << "': " << err.what());
    } catch (const std::exception& err) {
      RELPOS_FAIL(what << ": tensor '" << name << "' has a malformed header entry (" << err.what() << ")");
    }
  }
  // Byte ranges must not overlap.
  std::vector<const Entry*> sorted;
  for (const auto& e : f.entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    RELPOS_CHECK(sorted[i]->begin >= sorted[i - 1]->end,
                 what << ": tensors '" << sorted[i - 1]->name << "' and '" << sorted[i]->name << "' overlap");
  return f;
}

bool SafetensorsFile::has(const std::string& name) const { return index_.count(name) != 0; }

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  RELPOS_CHECK(it != index_.end(), what_ << ": no tensor named '" << name << "'");
  return entries_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const Entry& e = entry(name);
  Tensor t(e.shape);
  const char* src = bytes_.data() + data_start_ + e.begin;
  float* dst = t.data();
  const std::int64_t n = t.numel();
  if (e.dtype == "F32") {
    if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
  } else if (e.dtype == "F16") {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = half_to_float(load_le<std::uint16_t>(src + 2 * i));
  } else if (e.dtype == "BF16") {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t bits = static_cast<std::uint32_t>(load_le<std::uint16_t>(src + 2 * i)) << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  } else if (e.dtype == "F64") {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_le<double>(src + 8 * i));
  } else if (e.dtype == "I64") {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_le<std::int64_t>(src + 8 * i));
  } else if (e.dtype == "I32") {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_le<std::int32_t>(src + 4 * i));
  } else if (e.dtype == "I8") {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<signed char>(src[i]));
  } else if (e.dtype == "U8" || e.dtype == "BOOL") {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<unsigned char>(src[i]));
  } else {
    RELPOS_FAIL(what_ << ": tensor '" << name << "' has dtype " << e.dtype << ", which relpos cannot convert to float32");
  }
  return t;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::set<std::string>& int8) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  std::vector<std::string> data;  // each tensor's bytes
  for (const auto& [name, t] : tensors) {
    RELPOS_CHECK(name != "__metadata__" && !header.contains(name), "duplicate or reserved tensor name '" << name << "'");
    const Tensor h = t.to(Device::CPU).contiguous();
    const bool i8 = int8.count(name) != 0;
    if (i8) {
      std::string bytes(static_cast<std::size_t>(h.numel()), '\0');
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        const float v = h.data()[i];
        RELPOS_CHECK(v >= -128.0f && v <= 127.0f && v == std::nearbyint(v),
                     "tensor '" << name << "' holds " << v << ", which is not an int8 integer");
        bytes[i] = static_cast<char>(static_cast<signed char>(v));
      }
      data.push_back(std::move(bytes));
    } else {
      data.emplace_back(reinterpret_cast<const char*>(h.data()), h.bytes());
    }
    const std::uint64_t bytes = data.back().size();
    header[name] = {{"dtype", i8 ? "I8" : "F32"}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned, as the reference writer does
  detail::write_atomically(path, [&](std::ostream& out) {
    const std::uint64_t hlen = h.size();
    out.write(reinterpret_cast<const char*>(&hlen), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const std::string& d : data) out.write(d.data(), static_cast<std::streamsize>(d.size()));
  });
}

}  // namespace relpos
