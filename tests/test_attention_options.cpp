// Every BoTNet attention option (clip, per-head tables, absolute / no positions, scale_pos_embed)
// and SASA windows, against a plain-loop double-precision reference of docs/attention.md:
// forward values, and gradients against central differences of that reference.
#include <cmath>
#include <functional>
#include <random>

#include "core/op_cache.hpp"
#include "core/ops_internal.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/attention_ops.hpp"
#include "relpos/error.hpp"
#include "relpos/runtime.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

using Vec = std::vector<double>;

Tensor to_t(const Shape& s, const Vec& v) { return Tensor::from_vector(s, std::vector<float>(v.begin(), v.end())); }

int clampi(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// qkv given in logical NCHW order; returns out (B, heads*dv, H, W) in NCHW order.
Vec ref_bot(const Vec& qkv, const Vec& ph, const Vec& pw, const BotAttnSpec& sp, int B, int H, int W) {
  const int N = H * W, Ct = sp.channels_qkv(), Co = sp.channels_out(), d = sp.dqk;
  const double s = 1.0 / std::sqrt(static_cast<double>(d));
  const double a = sp.scale_pos_embed ? s : 1.0;
  const int kh = sp.clip > 0 ? sp.clip : H - 1, kw = sp.clip > 0 ? sp.clip : W - 1;
  const int th = sp.pos == PosEncoding::Absolute ? N : 2 * kh + 1, tw = 2 * kw + 1;
  auto at = [&](int b, int c, int p) { return qkv[(static_cast<std::size_t>(b) * Ct + c) * N + p]; };
  Vec out(static_cast<std::size_t>(B) * Co * N, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < sp.heads; ++h)
      for (int i = 0; i < N; ++i) {
        Vec logit(static_cast<std::size_t>(N));
        for (int j = 0; j < N; ++j) {
          double qk = 0.0, pos = 0.0;
          const int ry = clampi(j / W - i / W, -kh, kh) + kh, rx = clampi(j % W - i % W, -kw, kw) + kw;
          for (int c = 0; c < d; ++c) {
            const double q = at(b, h * d + c, i);
            qk += q * at(b, sp.heads * d + h * d + c, j);
            const std::size_t hoff = sp.per_head ? static_cast<std::size_t>(h) * th * d : 0;
            const std::size_t woff = sp.per_head ? static_cast<std::size_t>(h) * tw * d : 0;
            if (sp.pos == PosEncoding::Relative)
              pos += q * (ph[hoff + static_cast<std::size_t>(ry) * d + c] + pw[woff + static_cast<std::size_t>(rx) * d + c]);
            else if (sp.pos == PosEncoding::Absolute)
              pos += q * ph[hoff + static_cast<std::size_t>(j) * d + c];
          }
          logit[static_cast<std::size_t>(j)] = s * qk + a * pos;
        }
        double m = logit[0], sum = 0.0;
        for (double l : logit) m = std::max(m, l);
        for (double& l : logit) sum += (l = std::exp(l - m));
        for (int c = 0; c < sp.dv; ++c) {
          double o = 0.0;
          for (int j = 0; j < N; ++j)
            o += logit[static_cast<std::size_t>(j)] / sum * at(b, 2 * sp.heads * d + h * sp.dv + c, j);
          out[(static_cast<std::size_t>(b) * Co + h * sp.dv + c) * N + i] = o;
        }
      }
  return out;
}

Vec ref_sasa(const Vec& qkv, const Vec& rr, const Vec& rc, const SasaSpec& sp, int B, int H, int W) {
  const int N = H * W, Ct = sp.channels_qkv(), Co = sp.channels_out(), d = sp.dqk, half = d / 2, r = sp.kernel / 2;
  const double s = 1.0 / std::sqrt(static_cast<double>(d));
  auto at = [&](int b, int c, int p) { return qkv[(static_cast<std::size_t>(b) * Ct + c) * N + p]; };
  Vec out(static_cast<std::size_t>(B) * Co * N, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < sp.heads; ++h)
      for (int i = 0; i < N; ++i) {
        std::vector<std::pair<int, double>> win;  // key, logit
        for (int dy = -r; dy <= r; ++dy)
          for (int dx = -r; dx <= r; ++dx) {
            const int y = i / W + dy, x = i % W + dx;
            if (y < 0 || y >= H || x < 0 || x >= W) continue;
            const int j = y * W + x;
            double l = 0.0, pr = 0.0, pc = 0.0;
            for (int c = 0; c < d; ++c) l += at(b, h * d + c, i) * at(b, sp.heads * d + h * d + c, j);
            for (int c = 0; c < half; ++c) {
              pr += at(b, h * d + c, i) * rr[static_cast<std::size_t>(dy + r) * half + c];
              pc += at(b, h * d + half + c, i) * rc[static_cast<std::size_t>(dx + r) * half + c];
            }
            win.emplace_back(j, s * l + pr + pc);
          }
        double m = -1e300, sum = 0.0;
        for (auto& w : win) m = std::max(m, w.second);
        for (auto& w : win) sum += (w.second = std::exp(w.second - m));
        for (int c = 0; c < sp.dv; ++c) {
          double o = 0.0;
          for (auto& w : win) o += w.second / sum * at(b, 2 * sp.heads * d + h * sp.dv + c, w.first);
          out[(static_cast<std::size_t>(b) * Co + h * sp.dv + c) * N + i] = o;
        }
      }
  return out;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d/dx of <f(x), g> by central differences, for every element of x.
Vec numeric_grad(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& g) {
  Vec out(x.size());
  const double eps = 1e-5;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double up = dot(f(x), g);
    x[i] = keep - eps;
    const double down = dot(f(x), g);
    x[i] = keep;
    out[i] = (up - down) / (2 * eps);
  }
  return out;
}

void check_vec(const Tensor& got, const Vec& ref, double rel, const std::string& what) {
  const auto g = got.to_vector();
  REQUIRE(g.size() == ref.size());
  double m = 0.0, diff = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    m = std::max(m, std::fabs(ref[i]));
    diff = std::max(diff, std::fabs(g[i] - ref[i]));
  }
  INFO(what << ": max |diff| " << diff << ", max |ref| " << m);
  CHECK(diff <= rel * std::max(m, 1e-3));
}

Vec random_vec(std::size_t n, std::mt19937& rng, double scale) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));  // exactly representable in float
  return v;
}

void check_bot(BotAttnSpec sp, int B, int H, int W, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const int kh = sp.clip > 0 ? sp.clip : H - 1, kw = sp.clip > 0 ? sp.clip : W - 1;
  const Shape qkv_shape{B, sp.channels_qkv(), H, W};
  Shape hs, ws{1};
  if (sp.pos == PosEncoding::Relative) {
    hs = sp.per_head ? Shape{sp.heads, 2 * kh + 1, sp.dqk} : Shape{2 * kh + 1, sp.dqk};
    ws = sp.per_head ? Shape{sp.heads, 2 * kw + 1, sp.dqk} : Shape{2 * kw + 1, sp.dqk};
  } else if (sp.pos == PosEncoding::Absolute) {
    hs = sp.per_head ? Shape{sp.heads, H * W, sp.dqk} : Shape{H * W, sp.dqk};
  } else {
    hs = {1};
  }
  const Vec qkv = random_vec(static_cast<std::size_t>(numel_of(qkv_shape)), rng, 1.0);
  const Vec ph = random_vec(static_cast<std::size_t>(numel_of(hs)), rng, 0.5);
  const Vec pw = random_vec(static_cast<std::size_t>(numel_of(ws)), rng, 0.5);
  const Shape out_shape{B, sp.channels_out(), H, W};
  const Vec g = random_vec(static_cast<std::size_t>(numel_of(out_shape)), rng, 1.0);

  const Tensor tq = to_t(qkv_shape, qkv), th = to_t(hs, ph), tw = to_t(ws, pw);
  Tensor probs;
  const Tensor out = ops::bot_attention(tq, th, tw, sp, &probs);
  check_vec(out, ref_bot(qkv, ph, pw, sp, B, H, W), 1e-5, "forward");
  const auto grads = ops::bot_attention_backward(tq, th, tw, sp, probs, to_t(out_shape, g));
  check_vec(grads.dqkv, numeric_grad([&](const Vec& x) { return ref_bot(x, ph, pw, sp, B, H, W); }, qkv, g), 1e-4, "d qkv");
  if (sp.pos != PosEncoding::None)
    check_vec(grads.dpos_h, numeric_grad([&](const Vec& x) { return ref_bot(qkv, x, pw, sp, B, H, W); }, ph, g), 1e-4,
              "d pos_h");
  if (sp.pos == PosEncoding::Relative)
    check_vec(grads.dpos_w, numeric_grad([&](const Vec& x) { return ref_bot(qkv, ph, x, sp, B, H, W); }, pw, g), 1e-4,
              "d pos_w");
}

}  // namespace

TEST_CASE("BoTNet attention options match the reference, forward and gradients") {
  BotAttnSpec base;
  base.heads = 2, base.dqk = 4, base.dv = 3;
  SUBCASE("relative, non-square map") { check_bot(base, 2, 3, 5, 1); }
  SUBCASE("relative, scale_pos_embed") {
    BotAttnSpec sp = base;
    sp.scale_pos_embed = true;
    check_bot(sp, 1, 4, 3, 2);
  }
  SUBCASE("relative, per-head tables") {
    BotAttnSpec sp = base;
    sp.per_head = true;
    check_bot(sp, 2, 3, 4, 3);
  }
  SUBCASE("relative, clip 1 (offsets clamped) on a map larger than the tables") {
    BotAttnSpec sp = base;
    sp.clip = 1;
    check_bot(sp, 1, 4, 5, 4);
  }
  SUBCASE("relative, clip 2 with per-head tables and scale_pos_embed") {
    BotAttnSpec sp = base;
    sp.clip = 2, sp.per_head = true, sp.scale_pos_embed = true;
    check_bot(sp, 1, 2, 6, 5);
  }
  SUBCASE("absolute positions") {
    BotAttnSpec sp = base;
    sp.pos = PosEncoding::Absolute;
    check_bot(sp, 2, 3, 3, 6);
  }
  SUBCASE("absolute positions, per head, scale_pos_embed") {
    BotAttnSpec sp = base;
    sp.pos = PosEncoding::Absolute, sp.per_head = true, sp.scale_pos_embed = true;
    check_bot(sp, 1, 2, 3, 7);
  }
  SUBCASE("no positions") {
    BotAttnSpec sp = base;
    sp.pos = PosEncoding::None;
    check_bot(sp, 2, 3, 2, 8);
  }
  SUBCASE("one head, a 1x1 map") { check_bot(BotAttnSpec{1, 2, 2}, 1, 1, 1, 9); }
  SUBCASE("more query rows than one block") {
    // 900 queries: blocks of 72 rows (logits of a block within 256 KiB), the last one of 36
    BotAttnSpec sp{2, 2, 2};
    sp.clip = 3;
    std::mt19937 rng(10);
    const Shape qs{1, sp.channels_qkv(), 30, 30};
    const Vec qkv = random_vec(static_cast<std::size_t>(numel_of(qs)), rng, 1.0);
    const Vec ph = random_vec(14, rng, 0.5), pw = random_vec(14, rng, 0.5);
    check_vec(ops::bot_attention(to_t(qs, qkv), to_t({7, 2}, ph), to_t({7, 2}, pw), sp), ref_bot(qkv, ph, pw, sp, 1, 30, 30),
              1e-5, "forward, 900 queries");
  }
}

TEST_CASE("clipped relative attention accepts any map size; unclipped insists on its own") {
  BotAttnSpec sp{2, 4, 4};
  sp.clip = 2;
  const Tensor t = Tensor::zeros({5, 4});
  for (int h : {1, 3, 8})
    CHECK(ops::bot_attention(Tensor::zeros({1, sp.channels_qkv(), h, 7}), t, t, sp).shape() ==
          Shape{1, 8, h, 7});
  sp.clip = 0;
  CHECK(ops::bot_attention(Tensor::zeros({1, sp.channels_qkv(), 3, 3}), t, t, sp).shape() == Shape{1, 8, 3, 3});
  CHECK_THROWS_AS(ops::bot_attention(Tensor::zeros({1, sp.channels_qkv(), 4, 4}), t, t, sp), Error);
}

TEST_CASE("SASA local attention matches the reference for several windows, forward and gradients") {
  for (int k : {1, 3, 5}) {
    CAPTURE(k);
    SasaSpec sp;
    sp.heads = 2, sp.dqk = 4, sp.dv = 3, sp.kernel = k;
    const int B = 2, H = 4, W = 3;
    std::mt19937 rng(20 + static_cast<std::uint32_t>(k));
    const Shape qs{B, sp.channels_qkv(), H, W}, os{B, sp.channels_out(), H, W};
    const Vec qkv = random_vec(static_cast<std::size_t>(numel_of(qs)), rng, 1.0);
    const Vec rr = random_vec(static_cast<std::size_t>(k * 2), rng, 0.5), rc = random_vec(static_cast<std::size_t>(k * 2), rng, 0.5);
    const Vec g = random_vec(static_cast<std::size_t>(numel_of(os)), rng, 1.0);
    const Tensor tq = to_t(qs, qkv), trr = to_t({k, 2}, rr), trc = to_t({k, 2}, rc);
    Tensor probs;
    check_vec(ops::sasa_attention(tq, trr, trc, sp, &probs), ref_sasa(qkv, rr, rc, sp, B, H, W), 1e-5, "forward");
    const auto gr = ops::sasa_attention_backward(tq, trr, trc, sp, probs, to_t(os, g));
    check_vec(gr.dqkv, numeric_grad([&](const Vec& x) { return ref_sasa(x, rr, rc, sp, B, H, W); }, qkv, g), 1e-4, "d qkv");
    check_vec(gr.dr_row, numeric_grad([&](const Vec& x) { return ref_sasa(qkv, x, rc, sp, B, H, W); }, rr, g), 1e-4, "d r_row");
    check_vec(gr.dr_col, numeric_grad([&](const Vec& x) { return ref_sasa(qkv, rr, x, sp, B, H, W); }, rc, g), 1e-4, "d r_col");
  }
}

TEST_CASE("SASA local attention: rows past 8 pixels, channel counts off the vector width, windows wider than the map") {
  // The CPU kernels run 8 or 16 query pixels (AVX2, or AVX-512 and the generic build) and up to 8
  // channels at a time: these shapes have partial vectors, partial channel chunks and windows larger
  // than the map; maps 16 and wider run AVX-512's kernels where the CPU has them (W = 17: one full
  // vector and one lane; W = 37: two and five). Gradients are checked along random directions (the
  // full central differences would take minutes at these sizes).
  struct Geo {
    int B, H, W, heads, dqk, dv, k;
  };
  for (const Geo& s : {Geo{1, 5, 11, 3, 10, 9, 7}, Geo{2, 3, 17, 1, 2, 1, 5}, Geo{1, 9, 8, 2, 16, 8, 9},
                       Geo{1, 2, 2, 2, 6, 5, 7}, Geo{2, 6, 37, 2, 10, 9, 7}, Geo{1, 4, 16, 1, 4, 3, 3}}) {
    CAPTURE(s.H);
    CAPTURE(s.W);
    CAPTURE(s.k);
    SasaSpec sp;
    sp.heads = s.heads, sp.dqk = s.dqk, sp.dv = s.dv, sp.kernel = s.k;
    std::mt19937 rng(static_cast<std::uint32_t>(100 + s.W));
    const Shape qs{s.B, sp.channels_qkv(), s.H, s.W}, os{s.B, sp.channels_out(), s.H, s.W}, es{s.k, s.dqk / 2};
    const Vec qkv = random_vec(static_cast<std::size_t>(numel_of(qs)), rng, 1.0);
    const Vec rr = random_vec(static_cast<std::size_t>(numel_of(es)), rng, 0.5);
    const Vec rc = random_vec(static_cast<std::size_t>(numel_of(es)), rng, 0.5);
    const Vec g = random_vec(static_cast<std::size_t>(numel_of(os)), rng, 1.0);
    const Tensor tq = to_t(qs, qkv).channels_last(), trr = to_t(es, rr), trc = to_t(es, rc);
    Tensor probs;
    const Tensor out = ops::sasa_attention(tq, trr, trc, sp, &probs);
    check_vec(out.contiguous(), ref_sasa(qkv, rr, rc, sp, s.B, s.H, s.W), 1e-5, "forward");
    // Every query's probabilities sum to 1, and entries outside the map are exactly 0.
    const auto p = probs.to_vector();
    const int kk = s.k * s.k, r = s.k / 2;
    double worst = 0.0;
    int outside_nonzero = 0;
    for (int b = 0; b < s.B; ++b)
      for (int y = 0; y < s.H; ++y)
        for (int x = 0; x < s.W; ++x)
          for (int h = 0; h < s.heads; ++h) {
            const float* row = p.data() + (((static_cast<std::size_t>(b) * s.H + y) * s.W + x) * s.heads + h) * kk;
            double sum = 0.0;
            for (int o = 0; o < kk; ++o) {
              sum += row[o];
              const int ky = y + o / s.k - r, kx = x + o % s.k - r;
              if ((ky < 0 || ky >= s.H || kx < 0 || kx >= s.W) && row[o] != 0.0f) ++outside_nonzero;
            }
            worst = std::max(worst, std::fabs(sum - 1.0));
          }
    CHECK(worst < 1e-5);
    CHECK(outside_nonzero == 0);
    const auto gr = ops::sasa_attention_backward(tq, trr, trc, sp, probs, to_t(os, g).channels_last());
    const auto along = [&](const std::function<Vec(const Vec&)>& f, const Vec& x0, const Tensor& grad, const char* what) {
      const auto gv = grad.contiguous().to_vector();
      for (int t = 0; t < 2; ++t) {
        const Vec dir = random_vec(x0.size(), rng, 1.0);
        const double eps = 1e-4;
        Vec up = x0, down = x0;
        for (std::size_t i = 0; i < x0.size(); ++i) up[i] += eps * dir[i], down[i] -= eps * dir[i];
        const double numeric = (dot(f(up), g) - dot(f(down), g)) / (2 * eps);
        double analytic = 0.0, scale = 0.0;
        for (std::size_t i = 0; i < x0.size(); ++i) {
          analytic += gv[i] * dir[i];
          scale += std::fabs(gv[i] * dir[i]);
        }
        INFO(what << ": analytic " << analytic << ", numeric " << numeric);
        CHECK(std::fabs(analytic - numeric) <= 1e-4 * std::max(1.0, scale));
      }
    };
    along([&](const Vec& x) { return ref_sasa(x, rr, rc, sp, s.B, s.H, s.W); }, qkv, gr.dqkv, "d qkv");
    along([&](const Vec& x) { return ref_sasa(qkv, x, rc, sp, s.B, s.H, s.W); }, rr, gr.dr_row, "d r_row");
    along([&](const Vec& x) { return ref_sasa(qkv, rr, x, sp, s.B, s.H, s.W); }, rc, gr.dr_col, "d r_col");
  }
}

TEST_CASE("SASA local attention gives the same bits whatever the thread count and the call before") {
  // The CPU kernels keep padded planes between calls; a call with another shape in between, or
  // another thread count, must change nothing.
  SasaSpec sp;
  sp.heads = 4, sp.dqk = 8, sp.dv = 8, sp.kernel = 7;
  const auto make = [&](int B, int H, int W, std::uint32_t seed) {
    std::mt19937 rng(seed);
    const Shape qs{B, sp.channels_qkv(), H, W};
    return to_t(qs, random_vec(static_cast<std::size_t>(numel_of(qs)), rng, 1.0)).channels_last();
  };
  std::mt19937 rng(7);
  const Tensor rr = to_t({7, 4}, random_vec(28, rng, 0.5)), rc = to_t({7, 4}, random_vec(28, rng, 0.5));
  const Tensor a = make(3, 12, 13, 1), b = make(2, 6, 21, 2);
  const Shape os{3, sp.channels_out(), 12, 13};
  const Tensor da = to_t(os, random_vec(static_cast<std::size_t>(numel_of(os)), rng, 1.0)).channels_last();
  const auto run = [&](const Tensor& x, const Tensor& d) {
    Tensor probs;
    const Tensor out = ops::sasa_attention(x, rr, rc, sp, &probs);
    const auto gr = ops::sasa_attention_backward(x, rr, rc, sp, probs, d);
    return std::vector<std::vector<float>>{out.contiguous().to_vector(), gr.dqkv.contiguous().to_vector(),
                                           gr.dr_row.to_vector(), gr.dr_col.to_vector()};
  };
  const int before = relpos::num_threads();
  relpos::set_num_threads(1);
  const auto one = run(a, da);
  relpos::set_num_threads(2);
  Tensor pb;
  (void)ops::sasa_attention(b, rr, rc, sp, &pb);  // another layout of the kept planes
  const auto two = run(a, da);
  relpos::set_num_threads(before);
  for (std::size_t i = 0; i < one.size(); ++i) {
    CAPTURE(i);
    CHECK(one[i] == two[i]);
  }
}

TEST_CASE("SASA local attention: both ways of splitting the forward over threads give the same bits") {
  // One image of one head: on one thread it is one (image, head) pair per thread, which a thread
  // copies and runs alone; on two threads there are fewer pairs than threads, so the image's planes
  // are copied first and the pairs of query rows are split over the threads.
  SasaSpec sp;
  sp.heads = 1, sp.dqk = 8, sp.dv = 8, sp.kernel = 5;
  std::mt19937 rng(11);
  const Shape qs{1, sp.channels_qkv(), 9, 21};
  const Tensor x = to_t(qs, random_vec(static_cast<std::size_t>(numel_of(qs)), rng, 1.0)).channels_last();
  const Tensor rr = to_t({5, 4}, random_vec(20, rng, 0.5)), rc = to_t({5, 4}, random_vec(20, rng, 0.5));
  const int before = relpos::num_threads();
  relpos::set_num_threads(1);
  Tensor p1, p2;
  const auto one = ops::sasa_attention(x, rr, rc, sp, &p1).contiguous().to_vector();
  const auto one_infer = ops::sasa_attention(x, rr, rc, sp).contiguous().to_vector();
  relpos::set_num_threads(2);
  const auto two = ops::sasa_attention(x, rr, rc, sp, &p2).contiguous().to_vector();
  relpos::set_num_threads(before);
  CHECK(one == two);
  CHECK(one == one_infer);  // with and without the probabilities
  CHECK(p1.to_vector() == p2.to_vector());
}

TEST_CASE("SASA local attention: the output activation is ReLU of the plain output, on both thread splits") {
  // act = ReLU is applied as the output is written: the same bits as the plain output through ReLU,
  // whichever way the forward splits the work (one (image, head) pair per thread, or row pairs of
  // one image over the threads), at 8 and 16 lanes' widths, NaN kept.
  SasaSpec sp;
  sp.heads = 2, sp.dqk = 8, sp.dv = 8, sp.kernel = 5;
  std::mt19937 rng(13);
  const Tensor rr = to_t({5, 4}, random_vec(20, rng, 0.5)), rc = to_t({5, 4}, random_vec(20, rng, 0.5));
  const int before = relpos::num_threads();
  for (const int B : {1, 3})
    for (const int W : {7, 21})
      for (const int threads : {1, 2}) {
        CAPTURE(B);
        CAPTURE(W);
        CAPTURE(threads);
        const Shape qs{B, sp.channels_qkv(), 9, W};
        Vec v = random_vec(static_cast<std::size_t>(numel_of(qs)), rng, 1.0);
        v[static_cast<std::size_t>(2 * sp.heads * sp.dqk)] = std::nan("");  // pixel 0's first value channel
        const Tensor x = to_t(qs, v).channels_last();
        relpos::set_num_threads(threads);
        const auto plain = ops::sasa_attention(x, rr, rc, sp).contiguous().to_vector();
        const auto fused = ops::sasa_attention(x, rr, rc, sp, nullptr, Act::ReLU).contiguous().to_vector();
        REQUIRE(plain.size() == fused.size());
        std::size_t nan = 0, zeroed = 0, mismatched = 0;
        for (std::size_t i = 0; i < plain.size(); ++i) {
          if (std::isnan(plain[i])) {
            nan += std::isnan(fused[i]) ? 1 : 0;
            mismatched += std::isnan(fused[i]) ? 0 : 1;
            continue;
          }
          const float want = plain[i] < 0.0f ? 0.0f : plain[i];
          zeroed += plain[i] < 0.0f ? 1 : 0;
          mismatched += fused[i] == want ? 0 : 1;
        }
        CHECK(mismatched == 0);
        CHECK(nan > 0);                    // the NaN reached some outputs and stayed NaN
        CHECK(zeroed > plain.size() / 4);  // and ReLU had something to do
      }
  relpos::set_num_threads(before);
  std::mt19937 r2(1);
  const Tensor x = to_t({1, sp.channels_qkv(), 5, 5}, random_vec(static_cast<std::size_t>(sp.channels_qkv() * 25), r2, 1.0));
  CHECK_THROWS_WITH_AS(ops::sasa_attention(x, rr, rc, sp, nullptr, Act::SiLU), doctest::Contains("none or relu"),
                       Error);
}

namespace {
// A projected SASA layer of `heads` heads of d channels (k = 7) on B images of Cin channels and
// H x W pixels, with random weights, position tables and value bias drawn from `seed`.
struct ProjectedLayer {
  SasaSpec sp;
  Tensor x, w, rr, rc, vb;
};
ProjectedLayer projected_layer(int B, int H, int W, int Cin, int heads, int d, std::uint32_t seed) {
  ProjectedLayer l;
  l.sp.heads = heads, l.sp.dqk = d, l.sp.dv = d, l.sp.kernel = 7;
  std::mt19937 rng(seed);
  const Shape xs{B, Cin, H, W}, ws{l.sp.channels_qkv(), Cin, 1, 1}, es{7, d / 2};
  l.x = to_t(xs, random_vec(static_cast<std::size_t>(numel_of(xs)), rng, 1.0)).channels_last();
  l.w = to_t(ws, random_vec(static_cast<std::size_t>(numel_of(ws)), rng, 0.1));
  l.rr = to_t(es, random_vec(static_cast<std::size_t>(numel_of(es)), rng, 0.5));
  l.rc = to_t(es, random_vec(static_cast<std::size_t>(numel_of(es)), rng, 0.5));
  l.vb = to_t({l.sp.channels_out()}, random_vec(static_cast<std::size_t>(l.sp.channels_out()), rng, 1.0));
  return l;
}
}  // namespace

TEST_CASE("SASA projected attention: the same bits on 1, 2, 3 and 4 threads, with guarded planes and head by head") {
  // The projection by sgemm into planes with guards (many pixels for the weights: each thread
  // projects its own rows) and head by head (few pixels, or heads of 48 channels and more on a small
  // map: one task per head and group of images, where oneDNN has brgemm kernels) must not depend on
  // the thread count, nor on a call with another layout in between. Without brgemm kernels (AVX2, or
  // ONEDNN_MAX_CPU_ISA=AVX2 as one ctest entry runs this) the few-pixel layers take one sgemm split
  // by oneDNN, whose sums may differ on 3 threads: 1 and 2 threads only there. (Not 16 threads here:
  // in the sanitized build, clang's OpenMP runtime under oneDNN's GNU one, 16 threads calling oneDNN
  // leave LeakSanitizer reports inside libomp.)
  struct Geo {
    int B, H, W, Cin, heads, d;
  };
  for (const Geo& s : {Geo{1, 12, 56, 16, 1, 8}, Geo{2, 7, 7, 64, 2, 16}, Geo{3, 16, 16, 132, 4, 128},
                       Geo{5, 7, 7, 64, 3, 8}, Geo{1, 7, 7, 64, 1, 16}, Geo{2, 28, 28, 16, 2, 16}}) {
    CAPTURE(s.B);
    CAPTURE(s.W);
    CAPTURE(s.Cin);
    const ProjectedLayer l = projected_layer(s.B, s.H, s.W, s.Cin, s.heads, s.d, static_cast<std::uint32_t>(500 + s.Cin));
    const SasaSpec& sp = l.sp;
    const Tensor &x = l.x, &w = l.w, &rr = l.rr, &rc = l.rc, &vb = l.vb;
    const int before = relpos::num_threads();
    OpCache cache;
    relpos::set_num_threads(1);
    const auto one = ops::sasa_projected_attention(x, w, &vb, rr, rc, sp, Act::ReLU, false, &cache).contiguous().to_vector();
    for (const int threads : {2, 3, 4}) {
      if (threads > 2 && !cpu::brgemm_matmul()) continue;
      CAPTURE(threads);
      relpos::set_num_threads(threads);
      (void)ops::sasa_projected_attention(x, w, &vb, rr, rc, sp, Act::None, s.H % 2 == 0, nullptr);  // (no cache)
      const auto other = ops::sasa_projected_attention(x, w, &vb, rr, rc, sp, Act::ReLU, false, &cache).contiguous().to_vector();
      CHECK(one == other);
    }
    relpos::set_num_threads(before);
  }
}

TEST_CASE("SASA projected attention: a call whose input held NaN leaves nothing behind for the next") {
  // Every layer writes its planes into one buffer of the calling thread; what a layer of another
  // shape left there (here NaN everywhere its maps were) lies where this layer's guards are, which
  // its masked window columns read. Banded planes in one chunk and with a short last chunk, a head's
  // planes (many pixels, heads of 96 channels; few pixels); one and two threads.
  struct Geo {
    int B, H, W, Cin, heads, d;
  };
  const int before = relpos::num_threads();
  for (const Geo& s : {Geo{1, 12, 56, 16, 1, 8}, Geo{3, 32, 32, 16, 16, 8}, Geo{3, 32, 32, 16, 4, 32},
                       Geo{3, 16, 16, 132, 4, 128}})
    for (const int threads : {1, 2}) {
      CAPTURE(s.W);
      CAPTURE(s.Cin);
      CAPTURE(threads);
      const ProjectedLayer l = projected_layer(s.B, s.H, s.W, s.Cin, s.heads, s.d, static_cast<std::uint32_t>(700 + s.Cin));
      const SasaSpec& sp = l.sp;
      const Tensor &x = l.x, &w = l.w, &rr = l.rr, &rc = l.rc;
      relpos::set_num_threads(threads);
      const auto want = ops::sasa_projected_attention(x, w, nullptr, rr, rc, sp, Act::None, false).contiguous().to_vector();
      // other planes: wider ones (more floats), and narrower but more pixels (their maps start
      // before this layer's first and run past its last)
      for (const Shape& nan_shape : {Shape{s.B + 1, s.Cin, s.H + 3, s.W + 5}, Shape{s.B + 1, s.Cin, s.H + 4, s.W - 3}}) {
        CAPTURE(nan_shape[3]);
        const Tensor nan_x = Tensor::full(nan_shape, std::nanf("")).channels_last();
        const auto poisoned = ops::sasa_projected_attention(nan_x, w, nullptr, rr, rc, sp, Act::None, false).to_vector();
        CHECK(std::isnan(poisoned[0]));
        const auto got = ops::sasa_projected_attention(x, w, nullptr, rr, rc, sp, Act::None, false).contiguous().to_vector();
        std::size_t nan = 0;
        for (const float v : got) nan += std::isnan(v) ? 1 : 0;
        CHECK(nan == 0);
        CHECK(got == want);
      }
    }
  relpos::set_num_threads(before);
}

TEST_CASE("SASA projected attention: the 1x1 projection written straight into the planes gives the op on the projection") {
  // Inference runs a SASA layer's qkv projection into the kernels' planes (rows with no padding
  // columns: a window column off the map reads the next or previous row, masked) with the value
  // bias added as the output is written. It must give what the projection (a convolution with the
  // bias on the value rows) and the op give: partial vectors, maps narrower than the window, a
  // batch, one and two threads, both ways of splitting the work, with and without ReLU.
  struct Geo {
    int B, H, W, Cin, heads, dqk, dv, k;
  };
  const int before = relpos::num_threads();
  for (const Geo& s : {Geo{1, 5, 11, 7, 3, 10, 9, 7}, Geo{2, 3, 17, 16, 1, 2, 1, 5}, Geo{1, 9, 8, 5, 2, 16, 8, 9},
                       Geo{1, 2, 2, 3, 2, 6, 5, 7}, Geo{2, 6, 37, 12, 2, 10, 9, 7}, Geo{3, 7, 13, 8, 2, 8, 8, 3},
                       Geo{1, 1, 1, 4, 1, 2, 2, 1}, Geo{1, 12, 56, 16, 1, 8, 8, 7},
                       Geo{3, 40, 40, 4, 8, 64, 64, 3},  // (one image per chunk of planes: 3 chunks)
                       Geo{2, 14, 14, 8, 2, 8, 8, 7}, Geo{1, 4, 18, 6, 3, 4, 10, 5},
                       // head by head: few pixels for the weights (a task for two and for five 7x7
                       // maps, for one 16x16 map; a single task), heads of 48 channels (a task for
                       // three of six 7x7 maps)
                       Geo{2, 7, 7, 64, 2, 16, 16, 7}, Geo{3, 16, 16, 132, 4, 128, 128, 7},
                       Geo{5, 7, 7, 64, 3, 8, 8, 7}, Geo{6, 7, 7, 16, 2, 16, 16, 7}, Geo{1, 7, 7, 64, 1, 16, 16, 7},
                       // many pixels, heads of 48 channels: head by head too
                       Geo{2, 28, 28, 16, 2, 16, 16, 7}})
    for (const int threads : {1, 2})
      for (const bool biased : {false, true})
        for (const Act act : {Act::None, Act::ReLU}) {
          CAPTURE(s.H);
          CAPTURE(s.W);
          CAPTURE(s.k);
          CAPTURE(threads);
          CAPTURE(biased);
          SasaSpec sp;
          sp.heads = s.heads, sp.dqk = s.dqk, sp.dv = s.dv, sp.kernel = s.k;
          std::mt19937 rng(static_cast<std::uint32_t>(300 + s.W + s.k));
          const Shape xs{s.B, s.Cin, s.H, s.W}, ws{sp.channels_qkv(), s.Cin, 1, 1}, es{s.k, s.dqk / 2};
          const Tensor x = to_t(xs, random_vec(static_cast<std::size_t>(numel_of(xs)), rng, 1.0)).channels_last();
          const Tensor w = to_t(ws, random_vec(static_cast<std::size_t>(numel_of(ws)), rng, 0.5));
          const Tensor rr = to_t(es, random_vec(static_cast<std::size_t>(numel_of(es)), rng, 0.5));
          const Tensor rc = to_t(es, random_vec(static_cast<std::size_t>(numel_of(es)), rng, 0.5));
          const Vec vb = random_vec(static_cast<std::size_t>(sp.channels_out()), rng, 1.0);
          Vec full(static_cast<std::size_t>(sp.channels_qkv()), 0.0);  // the projection's bias: values only
          std::copy(vb.begin(), vb.end(), full.end() - static_cast<std::ptrdiff_t>(vb.size()));
          const Tensor v_bias = to_t({sp.channels_out()}, vb), bias = to_t({sp.channels_qkv()}, full);
          relpos::set_num_threads(threads);
          const Tensor qkv = ops::conv2d(x, w, biased ? &bias : nullptr, {});
          const Tensor att = ops::sasa_attention(qkv, rr, rc, sp);
          for (const bool pool : {false, true}) {
            if (pool && (s.H % 2 != 0 || s.W % 2 != 0)) continue;
            CAPTURE(pool);
            // (the pooled form: the layer at stride 2, its activation after the pool)
            const Tensor ref = pool ? ops::activation(ops::pool2d(att, {ops::PoolKind::Avg, 2, 2, 0}), act)
                                    : ops::activation(att, act);
            const auto want = ref.contiguous().to_vector();
            const Tensor out = ops::sasa_projected_attention(x, w, biased ? &v_bias : nullptr, rr, rc, sp, act, pool);
            CHECK(out.shape() == ref.shape());
            const auto got = out.contiguous().to_vector();
            REQUIRE(want.size() == got.size());
            double worst = 0.0, scale = 0.0;
            for (std::size_t i = 0; i < want.size(); ++i) {
              worst = std::max(worst, static_cast<double>(std::fabs(want[i] - got[i])));
              scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
            }
            CHECK((scale > 0.1 || act == Act::ReLU));  // (ReLU may zero a tiny map's few outputs)
            CHECK(worst <= 2e-6 * std::max(1.0, scale));
          }
        }
  relpos::set_num_threads(before);
  SasaSpec sp;
  sp.heads = 2, sp.dqk = 4, sp.dv = 4, sp.kernel = 3;
  const Tensor x = Tensor::zeros({1, 5, 4, 4}).channels_last(), rr = Tensor::zeros({3, 2}), rc = Tensor::zeros({3, 2});
  const Tensor bad_w = Tensor::zeros({sp.channels_qkv(), 6, 1, 1}), bad_b = Tensor::zeros({3});
  CHECK_THROWS_WITH_AS(ops::sasa_projected_attention(x, bad_w, nullptr, rr, rc, sp, Act::None),
                       doctest::Contains("do not fit a 1x1 projection of 5 channels"), relpos::Error);
  CHECK_THROWS_WITH_AS(
      ops::sasa_projected_attention(x, Tensor::zeros({sp.channels_qkv(), 5, 1, 1}), &bad_b, rr, rc, sp, Act::None),
      doctest::Contains("value bias"), relpos::Error);
  // An empty batch gives an empty output (no chunk of zero images).
  CHECK(ops::sasa_projected_attention(Tensor::zeros({0, 5, 4, 4}).channels_last(),
                                      Tensor::zeros({sp.channels_qkv(), 5, 1, 1}), nullptr, rr, rc, sp, Act::None)
            .shape() == Shape({0, sp.channels_out(), 4, 4}));
  CHECK_THROWS_WITH_AS(ops::sasa_projected_attention(Tensor::zeros({1, 5, 3, 4}).channels_last(),
                                                     Tensor::zeros({sp.channels_qkv(), 5, 1, 1}), nullptr, rr, rc, sp,
                                                     Act::None, true),
                       doctest::Contains("needs an even map, got 3x4"), relpos::Error);
}
