// Micro-benchmarks of single ops (Google Benchmark): the machine's GEMM ceiling, convolutions
// as botnet26t_256 runs them, and the attention ops.
//   build/relpos_microbench --benchmark_filter=Attention
#include <benchmark/benchmark.h>

#include <random>

#include "cpu/dnnl_util.hpp"
#include "relpos/attention_ops.hpp"
#include "core/ops_internal.hpp"
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

// conv: batch, in, out, size, kernel, stride
static void BM_Conv(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), c = static_cast<int>(st.range(1)), o = static_cast<int>(st.range(2)),
            hw = static_cast<int>(st.range(3)), k = static_cast<int>(st.range(4)), s = static_cast<int>(st.range(5));
  Tensor x = rnd({n, c, hw, hw}, Layout::ChannelsLast), w = rnd({o, c, k, k}), b = rnd({o});
  OpCache cache;
  const ops::ConvSpec spec{s, (k - 1) / 2, 1};
  for (auto _ : st) benchmark::DoNotOptimize(ops::conv2d(x, w, &b, spec, {nullptr, Act::ReLU}, &cache));
  const double out = static_cast<double>(hw / s) * (hw / s);
  flops(st, 2.0 * n * o * c * k * k * out);
}
BENCHMARK(BM_Conv)
    ->Args({1, 64, 256, 64, 1, 1})
    ->Args({8, 64, 256, 64, 1, 1})
    ->Args({1, 64, 64, 64, 3, 1})
    ->Args({8, 64, 64, 64, 3, 1})
    ->Args({1, 256, 512, 16, 1, 1})
    ->Args({8, 256, 512, 16, 1, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// BoTNet attention: batch, size (h = w), dqk (= dv), heads
static void BM_BotAttention(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), hw = static_cast<int>(st.range(1)), d = static_cast<int>(st.range(2)),
            heads = static_cast<int>(st.range(3));
  BotAttnSpec spec;
  spec.heads = heads, spec.dqk = d, spec.dv = d;
  Tensor qkv = rnd({n, spec.channels_qkv(), hw, hw}, Layout::ChannelsLast);
  Tensor rh = rnd({2 * hw - 1, d}), rw = rnd({2 * hw - 1, d});
  for (auto _ : st) benchmark::DoNotOptimize(ops::bot_attention(qkv, rh, rw, spec));
  const double N = static_cast<double>(hw) * hw;
  flops(st, 2.0 * n * heads * (N * N * 2 * d + N * 2 * (2 * hw - 1) * d));
}
BENCHMARK(BM_BotAttention)->Args({1, 16, 64, 4})->Args({8, 16, 64, 4})->Args({1, 32, 64, 4})->Args({1, 8, 128, 4})->Unit(benchmark::kMillisecond)->UseRealTime();

static void BM_SasaAttention(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), hw = static_cast<int>(st.range(1)), d = static_cast<int>(st.range(2));
  SasaSpec spec;
  spec.heads = 8, spec.dqk = d, spec.dv = d, spec.kernel = 7;
  Tensor qkv = rnd({n, spec.channels_qkv(), hw, hw}, Layout::ChannelsLast);
  Tensor rr = rnd({7, d / 2}), rc = rnd({7, d / 2});
  for (auto _ : st) benchmark::DoNotOptimize(ops::sasa_attention(qkv, rr, rc, spec));
  flops(st, 2.0 * n * 8 * hw * hw * 49.0 * 2 * d);
}
BENCHMARK(BM_SasaAttention)->Args({1, 56, 8})->Args({1, 28, 16})->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
