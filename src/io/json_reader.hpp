// Internal: the one way relpos reads JSON files and objects. Every error names where it is ("P:
// key 'x'", "model config: stages[2].sasa: key 'kernel'") and says what was expected. Enums are
// parsed here, at the boundary, from one table of names each (see docs/config.md and
// docs/formats.md for the keys).
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "relpos/error.hpp"

namespace relpos::detail {

// The file parsed as JSON; errors name the file (missing, a directory, unreadable, not JSON, a key
// given twice in one object).
nlohmann::json read_json_file(const std::string& path);
// JSON text held elsewhere (a safetensors file's metadata entry), parsed as read_json_file parses a
// file (duplicate keys and deep nesting refused); errors name `where`.
nlohmann::json parse_json_text(const std::string& text, const std::string& where);

// Whether text is valid UTF-8, as JSON text (and so every label and name a model file stores) must be.
bool valid_utf8(const std::string& text);
// text for a message: its bytes that are not valid UTF-8 shown as U+FFFD.
std::string printable_utf8(const std::string& text);

// A JSON parse error's message with its "last read" text cut to a few dozen characters (a cut-off
// weights file would quote kilobytes of base64).
std::string short_parse_error(const std::exception& e);

// How deep relpos's JSON files may nest (theirs nest a few levels): deeper text is refused while it
// is parsed, since copying a parsed value recurses once per level and a file nested a hundred
// thousand levels deep overflowed the stack.
constexpr int kMaxJsonDepth = 64;

// A parser callback (Json::parse(text, callback)) that refuses a key given twice in one object,
// naming `where`, the key and the object holding it: the JSON library would keep the last value
// silently (a tensor, a label list or a config value overridden without a word). It also refuses
// nesting deeper than kMaxJsonDepth.
template <typename Json>
typename Json::parser_callback_t refuse_duplicate_keys(const std::string& where) {
  struct Object {
    std::set<std::string> keys;
    std::string name;  // the key it is the value of ("" at the top)
  };
  struct State {
    std::vector<Object> objects;
    std::string last_key;
  };
  auto state = std::make_shared<State>();
  return [state, where](int depth, typename Json::parse_event_t event, Json& parsed) {
    State& s = *state;
    RELPOS_CHECK(depth <= kMaxJsonDepth, where << ": JSON nested deeper than " << kMaxJsonDepth << " levels");
    if (event == Json::parse_event_t::object_start) {
      s.objects.push_back({{}, s.objects.empty() ? std::string() : s.last_key});
    } else if (event == Json::parse_event_t::object_end) {
      if (!s.objects.empty()) s.objects.pop_back();
    } else if (event == Json::parse_event_t::key && !s.objects.empty()) {
      s.last_key = parsed.template get<std::string>();
      Object& o = s.objects.back();
      RELPOS_CHECK(o.keys.insert(s.last_key).second, where << ": key '" << s.last_key << "' appears twice"
                                                           << (o.name.empty() ? "" : " in '" + o.name + "'"));
    }
    return true;
  };
}

// A name table for an enum: {{Enum::A, "a"}, {Enum::B, "b"}}. The first name of a value is the one
// written; later ones are accepted aliases.
template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E, std::size_t N>
std::string enum_names(const EnumName<E> (&names)[N]) {  // "a, b or c"
  std::string out;
  for (std::size_t i = 0; i < N; ++i)
    if (*names[i].name) out += (out.empty() ? "" : (i + 1 == N ? " or " : ", ")) + std::string(names[i].name);
  return out;
}

// The entry named text, or nullptr.
template <typename E, std::size_t N>
const EnumName<E>* find_enum(const std::string& text, const EnumName<E> (&names)[N]) {
  for (const auto& n : names)
    if (text == n.name) return &n;
  return nullptr;
}

// The value named text; otherwise an Error "<what> 'text' is not known (expected a, b or c)".
template <typename E, std::size_t N>
E parse_enum(const std::string& text, const EnumName<E> (&names)[N], const std::string& what) {
  if (const auto* n = find_enum(text, names)) return n->value;
  RELPOS_FAIL(what << " '" << text << "' is not known (expected " << enum_names(names) << ")");
}

template <typename E, std::size_t N>
const char* enum_name(E value, const EnumName<E> (&names)[N]) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}

// Reads one JSON object's keys with their types and ranges checked. In strict mode done() rejects
// keys nobody asked for (a typo in a config is an error); files that other relpos versions write
// (checkpoints) are read leniently, so a key added later is simply absent from an old file.
class JsonReader {
 public:
  JsonReader(const nlohmann::json& j, std::string where, bool strict = true);

  bool has(const std::string& k) const { return j_.contains(k); }
  const std::string& where() const { return where_; }
  // "where: key 'k'" for messages about one key.
  std::string at(const std::string& k) const { return where_ + ": key '" + k + "'"; }

  template <typename T>
  T get(const std::string& k, const T& fallback) {
    used_.insert(k);
    if (!j_.contains(k)) return fallback;
    return convert<T>(k);
  }
  template <typename T>
  T need(const std::string& k) {
    require(k);
    return get<T>(k, T{});
  }
  // Reads k into out when present (lenient readers).
  template <typename T>
  void read(const std::string& k, T& out) {
    out = get<T>(k, out);
  }
  const nlohmann::json& raw(const std::string& k);
  // A nested object as a reader whose messages name "where.k".
  JsonReader child(const std::string& k);

  // An integer in [lo, hi]: JSON floats, out-of-range and huge values are errors, never converted.
  int int_in(const std::string& k, int fallback, long long lo, long long hi);
  int need_int_in(const std::string& k, long long lo, long long hi);
  // A whole number element (e.g. "input_size[0]") checked like int_in.
  int check_int(const std::string& name, const nlohmann::json& v, long long lo, long long hi) const;
  double num_in(const std::string& k, double fallback, double lo_exclusive, double hi);

  template <typename E, std::size_t N>
  E enum_in(const std::string& k, E fallback, const EnumName<E> (&names)[N]) {
    used_.insert(k);
    if (!j_.contains(k)) return fallback;
    const nlohmann::json& v = j_.at(k);
    RELPOS_CHECK(v.is_string(), at(k) << " must be a string, got " << v.dump());
    if (const auto* n = find_enum(v.get<std::string>(), names)) return n->value;
    RELPOS_FAIL(at(k) << " is " << v.dump() << " (expected " << enum_names(names) << ")");
  }

  void done() const;

 private:
  void require(const std::string& k) const;
  template <typename T>
  T convert(const std::string& k) const {
    try {
      return j_.at(k).get<T>();
    } catch (const nlohmann::json::exception&) {
      RELPOS_FAIL(at(k) << " has the wrong type (" << j_.at(k).dump() << ")");
    }
  }
  const nlohmann::json& j_;
  std::string where_;
  bool strict_;
  std::set<std::string> used_;
};

}  // namespace relpos::detail
