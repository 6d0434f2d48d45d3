// Micro-benchmarks of single ops (Google Benchmark): the machine's GEMM ceiling, and the cases of
// the table of op cases marked bench (convolutions as botnet26t_256 runs them, the attention ops).
//   build/relpos_microbench --benchmark_filter=attention
#define DOCTEST_CONFIG_IMPLEMENT  // the test helpers the table uses report through doctest
#include <benchmark/benchmark.h>
#include <doctest/doctest.h>

#include <random>

#include "cpu/dnnl_util.hpp"
#include "relpos/attention_ops.hpp"
#include "core/ops_internal.hpp"
#include "op_cases.hpp"
#include "relpos/ops.hpp"

using namespace relpos;

namespace {
Tensor rnd(const Shape& s, Layout layout = Layout::Contiguous) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> v(static_cast<std::size_t>(numel_of(s)));
  for (auto& x : v) x = d(rng);
  return Tensor::from_vector(s, v).to_layout(layout);
}

void flops(benchmark::State& st, double per_iter) {
  st.counters["GFLOP/s"] = benchmark::Counter(per_iter * static_cast<double>(st.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}
}  // namespace

static void BM_Sgemm(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  Tensor a = rnd({n, n}), b = rnd({n, n}), c({n, n});
  for (auto _ : st) cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  flops(st, 2.0 * n * n * n);
}
BENCHMARK(BM_Sgemm)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// The ops: every case of the table of op cases (tests/op_cases.cpp) marked bench, forward. The
// cases' shapes are botnet26t_256's convolutions and the attention sizes of docs/attention.md.
int main(int argc, char** argv) {
  static const std::vector<test::OpCase> cases = test::op_cases();
  for (const test::OpCase& c : cases) {
    if (!c.bench) continue;
    benchmark::RegisterBenchmark(c.name.c_str(), [&c](benchmark::State& st) {
      for (auto _ : st) benchmark::DoNotOptimize(c.run(c.inputs, Tensor()));
      if (c.flop > 0) flops(st, c.flop);
    })->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
