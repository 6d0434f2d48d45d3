// Shared helpers for the tests: golden files, tolerances, random tensors.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "relpos/model.hpp"
#include "relpos/safetensors.hpp"
#include "relpos/tensor.hpp"

namespace relpos::test {

// The project's own reference files, tests/golden/<name>.safetensors (made by tools/make_goldens.py);
// a missing one fails the test.
std::string golden_dir();
SafetensorsFile golden(const std::string& name);  // e.g. "bot_attn_s1_h6w8"
// An optional second set of reference files for a cross-check: $RELPOS_GOLDEN_DIR, else the folder
// CMake was configured with (default ../shared/golden beside the checkout). When that folder does not
// exist the cross-check is skipped with a message; when it exists it must hold the file.
std::string shared_golden_dir();
std::optional<SafetensorsFile> shared_golden(const std::string& name);
// Runs `check` on the project's golden file `name`, then on the shared one when there is one; `label`
// ("tests/golden" or "shared") is for messages.
void for_each_golden(const std::string& name,
                     const std::function<void(const SafetensorsFile& f, const std::string& label)>& check);
std::string source_dir();

float max_abs(const Tensor& t);
float max_abs_diff(const Tensor& a, const Tensor& b);  // shapes must match (any layout/device)

// docs/attention.md, "Reference tolerances": forward values within 1e-4 * max(1, max|ref|); gradients within 1e-3
// relative to the largest reference magnitude.
void check_forward(const Tensor& got, const Tensor& ref, const std::string& what);
void check_grad(const Tensor& got, const Tensor& ref, const std::string& what);
void check_close(const Tensor& got, const Tensor& ref, float tol, const std::string& what);

Tensor random_tensor(const Shape& shape, std::mt19937& rng, float scale = 1.0f);

// <a, g> over all entries.
double inner(const Tensor& a, const Tensor& g);
// Compares `analytic` with central differences of loss() in the entries of `value` (a sample of at
// most max_points of them): |fd - analytic| <= tol * max|analytic|. Float forward passes: eps and
// the tolerance are set for that.
void fd_check(const std::function<double()>& loss, Tensor& value, const Tensor& analytic, const std::string& what,
              float eps = 1e-2f, double tol = 2e-2, int max_points = 40);

// A temporary folder removed at the end of the test.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// Sets an environment variable for the scope of one test, then restores it.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace relpos::test

namespace relpos::test {
// A small image-folder dataset: root/{train,test}/{bars,columns,dots}/NNN.png, 12x12 RGB,
// easy to tell apart (a bright row, a bright column, or scattered dots, plus noise).
void make_pattern_dataset(const std::string& root, int per_class_train, int per_class_test, unsigned seed = 1);
std::string tiny_rgb_config();  // tests/data/tiny_rgb_config.json
// Fashion-MNIST classes (by index) as a folder dataset: root/{train,test}/<folder>/NNNNN.png, the
// first images of each class in the files' order; folders named as the labels (label_folder_name)
// or by `folder_names`. False (nothing written) when the dataset is not installed.
bool make_fashion_mnist_folder(const std::string& root, const std::vector<int>& classes, int per_class_train,
                               int per_class_test, const std::vector<std::string>& folder_names = {});
// Every parameter of the model, in params() order, as one vector (to compare two models' weights).
std::vector<float> weights_of(const Model& m);
}  // namespace relpos::test
