// Micro-benchmarks of single ops (Google Benchmark): the machine's GEMM ceiling, the cases of the
// table of op cases marked bench (convolutions as botnet26t_256 runs them, the attention ops), and
// SASA's projection and attention fused as sasa_resnet26's seven layer shapes run it. Each op is
// timed warm (the same call again and again, its data in the caches) and cold ("/cold": a 64 MiB
// sweep before every timed call, as a network whose weights exceed the L3 cache meets its layers).
//   build/relpos_microbench --benchmark_filter=attention
//   build/relpos_microbench --benchmark_filter=sasa_projected
#define DOCTEST_CONFIG_IMPLEMENT  // the test helpers the table uses report through doctest
#include <benchmark/benchmark.h>
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "cpu/dnnl_util.hpp"
#include "relpos/attention_ops.hpp"
#include "core/op_cache.hpp"
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

// Writes one float per cache line of 64 MiB (more than this machine's caches hold), untimed: the
// next call finds its weights, inputs and buffers in memory, not in a cache.
void evict_caches(benchmark::State& st) {
  static std::vector<float> sweep(std::size_t{64} << 20 >> 2, 1.0f);
  st.PauseTiming();
  for (std::size_t i = 0; i < sweep.size(); i += 16) sweep[i] += 1.0f;
  benchmark::ClobberMemory();
  st.ResumeTiming();
}

// Registers `name` warm and `name`/cold; body(st, cold) runs the timing loop.
template <typename Body>
void register_warm_and_cold(const std::string& name, const Body& body) {
  for (const bool cold : {false, true})
    benchmark::RegisterBenchmark((cold ? name + "/cold" : name).c_str(), [body, cold](benchmark::State& st) {
      body(st, cold);
    })->Unit(benchmark::kMillisecond)->UseRealTime();
}

// SASA's qkv projection and local attention in one op (ops::sasa_projected_attention), as the
// layers of sasa_resnet26 (models/sasa_resnet26.json: 8 heads, 7x7 windows) run it at batch 1:
// input channels, map side, channels per head, and whether the block pools (stride 2).
void register_sasa_projected() {
  struct Layer {
    const char* stage;
    int in, side, d;
    bool pool;
  };
  static const Layer layers[] = {{"0.x", 64, 56, 8, false},   {"1.0", 128, 56, 16, true}, {"1.1", 128, 28, 16, false},
                                 {"2.0", 256, 28, 32, true},  {"2.1", 256, 14, 32, false}, {"3.0", 512, 14, 64, true},
                                 {"3.1", 512, 7, 64, false}};
  for (const Layer& l : layers) {
    SasaSpec spec;
    spec.heads = 8;
    spec.dqk = spec.dv = l.d;
    spec.kernel = 7;
    const std::string name = "sasa_projected stage " + std::string(l.stage) + " " + std::to_string(l.in) + "x" +
                             std::to_string(l.side) + "x" + std::to_string(l.side) + " d" + std::to_string(l.d) +
                             (l.pool ? " pooled" : "");
    // multiply-adds: the projection, and per pixel and head the window's logits and value sums
    const double pixels = static_cast<double>(l.side) * l.side;
    const double macs = pixels * l.in * spec.channels_qkv() + pixels * spec.heads * 49.0 * (spec.dqk + spec.dv);
    register_warm_and_cold(name, [l, spec, macs](benchmark::State& st, bool cold) {
      const Tensor x = rnd({1, l.in, l.side, l.side}, Layout::ChannelsLast);
      const Tensor w = rnd({spec.channels_qkv(), l.in, 1, 1});
      const Tensor r_row = rnd({spec.kernel, spec.dqk / 2}), r_col = rnd({spec.kernel, spec.dqk / 2});
      OpCache cache;  // (as the layer's: the projection's oneDNN plan made once)
      for (auto _ : st) {
        if (cold) evict_caches(st);
        benchmark::DoNotOptimize(
            ops::sasa_projected_attention(x, w, nullptr, r_row, r_col, spec, Act::ReLU, l.pool, &cache));
      }
      flops(st, 2.0 * macs);
    });
  }
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
    register_warm_and_cold(c.name, [&c](benchmark::State& st, bool cold) {
      for (auto _ : st) {
        if (cold) evict_caches(st);
        benchmark::DoNotOptimize(c.run(c.inputs, Tensor()));
      }
      if (c.flop > 0) flops(st, c.flop);
    });
  }
  register_sasa_projected();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
