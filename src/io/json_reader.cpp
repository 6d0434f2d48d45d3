#include "io/json_reader.hpp"

#include <filesystem>

#include "io/atomic_file.hpp"

namespace relpos::detail {

using nlohmann::json;

bool valid_utf8(const std::string& text) {
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

std::string printable_utf8(const std::string& text) {
  const std::string quoted = json(text).dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  return json::parse(quoted).get<std::string>();
}

std::string short_parse_error(const std::exception& e) {
  std::string m = e.what();
  const std::string mark = "last read: '";
  const std::size_t at = m.find(mark);
  const std::size_t keep = 48;
  if (at != std::string::npos && m.size() > at + mark.size() + keep + 1)
    m = m.substr(0, at + mark.size() + keep) + "...'";
  // the text read may be any bytes (a damaged file): shown as \xNN, so that the message stays
  // printable UTF-8 (grep took stderr for binary)
  std::string out;
  for (const char ch : m) {
    const auto b = static_cast<unsigned char>(ch);
    if (b >= 0x20 && b < 0x7f) {
      out += ch;
    } else {
      const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 15];
    }
  }
  return out;
}

json read_json_file(const std::string& path) {
  std::error_code ec;
  RELPOS_CHECK(std::filesystem::exists(path, ec), path << ": no such file");
  RELPOS_CHECK(!std::filesystem::is_directory(path, ec), path << ": is a directory, not a JSON file");
  try {
    return json::parse(read_file(path), refuse_duplicate_keys<json>(path));
  } catch (const json::exception& e) {
    RELPOS_FAIL(path << ": not valid JSON (" << short_parse_error(e) << ")");
  }
}

json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return json::parse(text, refuse_duplicate_keys<json>(where));
  } catch (const json::exception& e) {
    RELPOS_FAIL(where << ": not valid JSON (" << short_parse_error(e) << ")");
  }
}

JsonReader::JsonReader(const json& j, std::string where, bool strict)
    : j_(j), where_(std::move(where)), strict_(strict) {
  RELPOS_CHECK(j.is_object(), where_ << " must be a JSON object, got " << (j.is_null() ? "null" : j.type_name()));
}

void JsonReader::require(const std::string& k) const {
  RELPOS_CHECK(j_.contains(k), where_ << ": missing key '" << k << "'");
}

const json& JsonReader::raw(const std::string& k) {
  require(k);
  used_.insert(k);
  return j_.at(k);
}

JsonReader JsonReader::child(const std::string& k) {
  // "P" -> "P: k"; "P: a" -> "P: a.k"
  return JsonReader(raw(k), where_ + (where_.find(": ") == std::string::npos ? ": " : ".") + k, strict_);
}

int JsonReader::int_in(const std::string& k, int fallback, long long lo, long long hi) {
  used_.insert(k);
  if (!j_.contains(k)) return fallback;
  return check_int(k, j_.at(k), lo, hi);
}

int JsonReader::need_int_in(const std::string& k, long long lo, long long hi) {
  require(k);
  return int_in(k, 0, lo, hi);
}

int JsonReader::check_int(const std::string& name, const json& v, long long lo, long long hi) const {
  RELPOS_CHECK(v.is_number_integer(), at(name) << " must be a whole number, got " << v.dump());
  const bool fits = v.is_number_unsigned() ? v.get<unsigned long long>() <= static_cast<unsigned long long>(hi)
                                           : (v.get<long long>() >= lo && v.get<long long>() <= hi);
  RELPOS_CHECK(fits && v.get<long long>() >= lo, at(name) << " is " << v.dump() << "; it must be from " << lo << " to " << hi);
  return static_cast<int>(v.get<long long>());
}

double JsonReader::num_in(const std::string& k, double fallback, double lo_exclusive, double hi) {
  used_.insert(k);
  if (!j_.contains(k)) return fallback;
  const json& v = j_.at(k);
  RELPOS_CHECK(v.is_number(), at(k) << " must be a number, got " << v.dump());
  const double d = v.get<double>();
  RELPOS_CHECK(d > lo_exclusive && d <= hi,
               at(k) << " is " << v.dump() << "; it must be above " << lo_exclusive << " and at most " << hi);
  return d;
}

void JsonReader::done() const {
  if (!strict_) return;
  for (auto it = j_.begin(); it != j_.end(); ++it)
    RELPOS_CHECK(used_.count(it.key()), where_ << ": unknown key '" << it.key() << "'");
}

}  // namespace relpos::detail
