// The one table of op cases (ggml's test-backend-ops idea): every op of the backend contract
// (src/core/backend_ops.inc) with its shapes, options and tolerances, listed once and driven by
//   tests/test_op_cases.cpp   the forward against a naive reference (or, for the attention ops, the
//                             golden files of test_attention_golden), and finite-difference
//                             gradients of every differentiable input;
//   tests/test_cuda.cpp       CPU vs CUDA parity of outputs and gradients;
//   tools/bench/microbench.cpp  forward (and forward + backward) timings of the cases marked bench.
// test_op_cases also reads backend_ops.inc and fails when a contract function has no case, so an
// op cannot lack a check by omission.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "relpos/tensor.hpp"

namespace relpos::test {

// What one run of a case gives on one device.
struct OpRun {
  std::vector<Tensor> outputs;  // outputs[0] is what the gradients are of
  std::vector<Tensor> grads;    // d <outputs[0], dy> / d inputs[diff[i]], in the order of diff
};

struct OpCase {
  std::vector<std::string> covers;  // the contract functions it exercises ("conv2d", "conv2d_backward")
  std::string name;                 // shapes and options, for messages and benchmark names
  std::vector<Tensor> inputs;       // on the CPU; a driver moves them to the device under test
  std::vector<int> diff;            // inputs that get gradients (finite-difference checked)
  // Runs the op on `in` (all on one device). With dy defined (shaped as outputs[0]), also the
  // backward. Never changes `in` (in-place ops run on copies).
  std::function<OpRun(const std::vector<Tensor>& in, const Tensor& dy)> run;
  // The forward computed naively on the CPU (outputs compared one by one), or empty when golden
  // files check the op (`golden` names the suite).
  std::function<std::vector<Tensor>(const std::vector<Tensor>& in)> reference;
  std::string golden;
  float tol_reference = 1e-4f;  // |op - reference| <= tol * max(1, max|reference|)
  float fd_eps = 1e-2f;         // finite-difference step
  float tol_fd = 2e-2f;         // |fd - analytic| <= tol * max|analytic|
  float tol_parity = 2e-5f;     // |cuda - cpu| <= tol * max(1, max|cpu|)
  bool bench = false;           // timed by the micro-benchmark
  double flop = 0.0;            // floating-point operations of one forward run (for GFLOP/s)
};

// The table, built afresh (the inputs are made from fixed seeds).
std::vector<OpCase> op_cases();

// The function names declared in src/core/backend_ops.inc.
std::vector<std::string> backend_contract_ops();

}  // namespace relpos::test
