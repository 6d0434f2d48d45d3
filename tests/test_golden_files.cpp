// The golden files themselves: the project's own set in tests/golden (tools/make_goldens.py) is
// complete and describes each case; it mirrors the optional shared set; and a missing shared folder
// makes the cross-check a skip, not a failure.
#include <cstdlib>
#include <set>

#include "test_util.hpp"

using namespace relpos;

namespace {

// The cases the shared set has too; then the project's own.
const char* kCases[] = {"rel_logits_h5w7", "bot_attn_s1_h6w8",  "bot_attn_s2_h8w6", "sasa_k7_s1_h9w11",
                        "sasa_k3_s2_h8w6", "tiny_botnet_96x64", "tiny_stem4_32x32"};
constexpr std::size_t kShared = 6;

// Tensors whose first dimension is the batch, which the two sets may choose differently.
bool batch_dependent(const std::string& name) {
  return name == "input" || name == "labels" || name == "logits_eval" || name == "logits_train";
}

}  // namespace

TEST_CASE("tests/golden holds every case, made by tools/make_goldens.py with its settings in the metadata") {
  for (const char* name : kCases) {
    const SafetensorsFile f = test::golden(name);
    INFO(name);
    CHECK(f.metadata().count("what"));
    CHECK(f.metadata().count("seed"));
    REQUIRE(f.metadata().count("generator"));
    CHECK(f.metadata().at("generator") == "tools/make_goldens.py");
    CHECK(f.entries().size() >= 4);
  }
  // The tiny model's file keeps the running statistics from before its training step.
  CHECK(test::golden("tiny_botnet_96x64").metadata().at("param_stats") == "before_train_step");
}

TEST_CASE("a missing cross-check folder gives no shared file; an existing one is read") {
  {
    test::ScopedEnv env("RELPOS_GOLDEN_DIR", "/nonexistent/relpos-golden");
    CHECK(test::shared_golden_dir() == "/nonexistent/relpos-golden");
    CHECK_FALSE(test::shared_golden("rel_logits_h5w7").has_value());
    int runs = 0;
    test::for_each_golden("rel_logits_h5w7", [&](const SafetensorsFile&, const std::string& label) {
      CHECK(label == "tests/golden");
      ++runs;
    });
    CHECK(runs == 1);
  }
  {
    test::ScopedEnv env("RELPOS_GOLDEN_DIR", test::golden_dir());
    const auto f = test::shared_golden("rel_logits_h5w7");
    REQUIRE(f.has_value());
    CHECK(f->has("rel_logits"));
    int runs = 0;
    test::for_each_golden("rel_logits_h5w7", [&](const SafetensorsFile&, const std::string&) { ++runs; });
    CHECK(runs == 2);
  }
}

TEST_CASE("tests/golden mirrors the shared golden files: tensor names, shapes and case settings") {
  for (std::size_t c = 0; c < kShared; ++c) {
    const char* name = kCases[c];
    const auto shared = test::shared_golden(name);
    if (!shared) return;  // no shared folder: nothing to mirror (the message says so)
    const SafetensorsFile own = test::golden(name);
    INFO(name);
    std::set<std::string> own_names, shared_names;
    for (const auto& e : own.entries()) own_names.insert(e.name);
    for (const auto& e : shared->entries()) shared_names.insert(e.name);
    CHECK(own_names == shared_names);
    for (const auto& e : shared->entries()) {
      if (!own.has(e.name)) continue;
      Shape a = own.entry(e.name).shape, b = e.shape;
      if (batch_dependent(e.name) && !a.empty() && !b.empty()) a[0] = b[0] = 0;
      CHECK_MESSAGE(a == b, e.name << ": " << to_string(own.entry(e.name).shape) << " vs " << to_string(e.shape));
    }
    for (const auto& entry : shared->metadata()) {
      const std::string& key = entry.first;  // not a structured binding: the CHECK macros capture it
      const auto& value = entry.second;
      if (key == "what" || key == "notes" || key == "timm_cfg") continue;  // prose
      REQUIRE_MESSAGE(own.metadata().count(key), "metadata key " << key);
      CHECK_MESSAGE(own.metadata().at(key) == value, key << ": " << own.metadata().at(key) << " vs " << value);
    }
  }
}
