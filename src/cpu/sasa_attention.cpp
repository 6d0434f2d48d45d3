// Stand-alone local self-attention (SASA) on the CPU (docs/attention.md, "SASA local attention").
//
// Each pixel's query attends over the k x k window centred on it; keys outside the image are
// left out of the softmax. The position term of a window entry at offset (dy, dx) is
// q[:d/2].r_row[dy] + q[d/2:].r_col[dx]. Probabilities are stored (B, H, W, heads, k*k), zero where
// masked.
//
// The work is done in planar form (sasa_planes.hpp): a chunk of images is spread from channels-
// last into zero-padded channel planes, the vectorised kernels run over (image, head, row) in the
// forward and (image, head) in the backward, and the backward's planes are gathered back into
// channels-last. Every value is computed in one fixed order, whatever the thread count. Inference
// of a folded layer (sasa_projected_attention) skips the spread: its 1x1 projection writes the
// planes itself (by sgemm), or, with few pixels for the weights or heads of 48 channels and more,
// runs head by head (a oneDNN matmul per head into the thread's buffer, its planes made there).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <omp.h>
#include <string>
#include <vector>

#include "core/attention_geometry.hpp"
#include "core/op_cache.hpp"
#include "core/op_profile.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "cpu/sasa_planes.hpp"
#include "cpu/thread_buffer.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace sasa {

std::int64_t scratch_floats(const Planes& p) {
  const std::int64_t kk = static_cast<std::int64_t>(p.k) * p.k;
  // two rows' L, pr and pc; a pooled layer's merged window; a block's queries
  const std::int64_t forward = 2 * kk + 4 * p.k + (p.k + 1) * p.k + 2 * p.dqk;
  const std::int64_t backward = 2 * kk + 2 * p.k + 2 * static_cast<std::int64_t>(p.k) * p.half;  // backward_head's
  return kMaxLanes * (std::max(forward, backward) + 1);  // whole 64-byte lines
}

const Kernels& kernels(int W) {
  // RELPOS_SIMD=generic: the portable kernels even on an AVX2 CPU; RELPOS_SIMD=avx2: no AVX-512 (the
  // tests run each). A map 9 to 15 wide leaves some of the 16 lanes empty, but one AVX-512 vector per row
  // still beats two of AVX2 (14x14: 0.098 against 0.140 ms); one 8 or narrower would leave half of them
  // empty.
  if (avx512_kernels() && W > 8) return avx512::kKernels;
  return avx2_kernels() ? avx2::kKernels : generic::kKernels;
}

}  // namespace sasa

namespace {

sasa::Planes planes_of(const SasaGeometry& g, const Tensor& r_row, const Tensor& r_col, const sasa::Kernels& kern) {
  sasa::Planes p;
  p.H = static_cast<int>(g.H);
  p.W = static_cast<int>(g.W);
  p.k = g.k;
  p.r = g.r;
  p.Wv = (p.W + kern.lanes - 1) / kern.lanes * kern.lanes;
  p.Hp = p.H + 2 * p.r;
  p.Wp = p.Wv + 2 * p.r;
  p.heads = g.heads;
  p.dqk = g.dqk;
  p.dv = g.dv;
  p.half = g.half;
  p.s = g.s;
  p.r_row = r_row.data();
  p.r_col = r_col.data();
  p.stride = p.plane_floats();
  return p;
}

// Images [b0, b0 + n) of a channels-last (B, C, H, W) tensor as zero-padded planes: plane c of
// image i at planes + (i * C + c) * plane.
// With pads_clean (the buffer held the same layout before), the zero padding is left as it is.
void spread_to_planes(const sasa::Kernels& kern, const Tensor& src, std::int64_t b0, std::int64_t n,
                      const sasa::Planes& p, float* planes, bool pads_clean) {
  const std::int64_t C = src.shape()[1], P = p.plane(), image = static_cast<std::int64_t>(p.H) * p.W * C;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    for (int py = 0; py < p.Hp; ++py)
      kern.spread_row(p, src.data() + (b0 + i) * image, C, 0, C, planes + i * C * P, py, !pads_clean);
}

// The inverse for the map's interior: planes back into images [b0, b0 + n) of channels-last dst.
void gather_from_planes(const sasa::Kernels& kern, const float* planes, const sasa::Planes& p, std::int64_t b0,
                        std::int64_t n, Tensor& dst) {
  const std::int64_t C = dst.shape()[1], P = p.plane(), image = static_cast<std::int64_t>(p.H) * p.W * C;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    for (int y = 0; y < p.H; ++y) kern.gather_row(p, planes + i * C * P, C, dst.data() + (b0 + i) * image, y);
}

// Plane buffers of the calling thread, one per plane layout (a network's SASA layers have a few):
// the padding spread_to_planes zeroed is still zero when the same layout comes back, so only the
// map's interior is written again. `clean` says so.
using PlaneLayout = std::array<std::int64_t, 7>;  // role, H, W, r, Wp, channels, images
float* plane_buffer(const PlaneLayout& layout, std::int64_t floats, bool* clean) {
  struct Entry {
    PlaneLayout layout{};
    std::unique_ptr<float[]> data;
    std::uint64_t used = 0;
  };
  constexpr std::size_t kKeep = 12;
  thread_local std::vector<Entry> entries;
  thread_local std::uint64_t clock = 0;
  ++clock;
  for (Entry& e : entries)
    if (e.layout == layout) {
      e.used = clock;
      *clean = true;
      return e.data.get();
    }
  if (entries.size() >= kKeep)  // forget the least recently used
    entries.erase(std::min_element(entries.begin(), entries.end(),
                                   [](const Entry& a, const Entry& b) { return a.used < b.used; }));
  // (kColumnReach floats of guard on either side, zero: the kernels' loads of a window row reach
  // there at the first and last plane's ends)
  const std::size_t n = static_cast<std::size_t>(floats + 2 * sasa::kColumnReach);
  entries.push_back({layout, std::unique_ptr<float[]>(new float[n]()), clock});
  *clean = false;
  return entries.back().data.get() + sasa::kColumnReach;
}

// run(i, h, y) for the row pairs y = 0, 2, ... of every head of images [0, n), split over the
// threads (when there are fewer (image, head) pairs than threads).
template <typename Run>
void for_row_pairs(std::int64_t n, int heads, int H, const Run& run) {
  const int pairs = (H + 1) / 2;
#pragma omp parallel for collapse(3) schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h)
      for (int pr = 0; pr < pairs; ++pr) run(i, h, 2 * pr);
}

PlaneLayout plane_layout(int role, const sasa::Planes& p, std::int64_t C, std::int64_t n) {
  return {role, p.H, p.W, p.r, p.Wp, C, n};
}

// Images per chunk: enough units of work for every thread, without planes for the whole batch.
std::int64_t chunk_images(std::int64_t B, std::int64_t units_per_image, int threads) {
  const std::int64_t want = (4 * static_cast<std::int64_t>(threads) + units_per_image - 1) / units_per_image;
  return std::clamp<std::int64_t>(want, 1, B);
}

// The projection head by head (attend_by_head, below), where oneDNN has brgemm kernels for this
// CPU (AVX-512): a single-threaded matmul primitive for M pixels (to run inside a parallel region)
// and each head's q, k and v rows of w, (hc x Cin) for hc = 2 dqk + dv, packed once for it. The
// layer's cache keeps them (its `use_weights` empties it for other weights); plans depend on the
// shapes.
struct HeadRows {
  dnnl::memory::desc md;             // the packed layout
  std::vector<dnnl::memory> packed;  // per head
  std::vector<std::shared_ptr<void>> held;  // their memory (arena_memory)
};
struct HeadMatmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory::desc src_md, dst_md, scratchpad;  // pd's, queried once (not for every task)
  std::shared_ptr<HeadRows> rows;
  bool brgemm = false;
};

std::shared_ptr<HeadRows> pack_head_rows(const float* w, const SasaGeometry& g, std::int64_t Cin,
                                         const dnnl::memory::desc& md) {
  auto rows = std::make_shared<HeadRows>();
  rows->md = md;
  const std::int64_t hc = 2 * g.dqk + g.dv;
  std::vector<float> plain(static_cast<std::size_t>(hc * Cin));
  for (int h = 0; h < g.heads; ++h) {
    // the head's q, then its k, then its v channels (sasa::Planes' order)
    const std::int64_t first[3] = {static_cast<std::int64_t>(h) * g.dqk, static_cast<std::int64_t>(g.heads + h) * g.dqk,
                                   2 * static_cast<std::int64_t>(g.heads) * g.dqk + static_cast<std::int64_t>(h) * g.dv};
    const std::int64_t count[3] = {g.dqk, g.dqk, g.dv};
    float* dst = plain.data();
    for (int part = 0; part < 3; ++part) {
      std::copy(w + first[part] * Cin, w + (first[part] + count[part]) * Cin, dst);
      dst += count[part] * Cin;
    }
    dnnl::memory src(dnnl::memory::desc({Cin, hc}, dt::f32, dims{1, Cin}), engine(), plain.data());
    rows->held.emplace_back();
    rows->packed.push_back(arena_memory(md, rows->held.back()));
    dnnl::reorder(src, rows->packed.back()).execute(stream(), src, rows->packed.back());
    stream().wait();
  }
  return rows;
}

std::shared_ptr<HeadMatmul> head_matmul(const float* w, const SasaGeometry& g, std::int64_t Cin, std::int64_t M,
                                        OpCache* cache) {
  const std::int64_t hc = 2 * g.dqk + g.dv;
  const std::string shape = std::to_string(g.heads) + "x" + std::to_string(hc) + "," + std::to_string(Cin);
  const std::string key = "sasa_head_matmul:" + shape + "," + std::to_string(M);
  std::shared_ptr<HeadMatmul> plan = cache ? std::static_pointer_cast<HeadMatmul>(cache->find(key)) : nullptr;
  if (plan) return plan;
  plan = std::make_shared<HeadMatmul>();
  {
    // a primitive for one thread: oneDNN sizes its split by the caller's OpenMP thread count
    struct OneThread {
      const int saved = omp_get_max_threads();
      OneThread() { omp_set_num_threads(1); }
      ~OneThread() { omp_set_num_threads(saved); }
    } one;
    plan->pd = dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(dnnl::memory::desc({M, Cin}, dt::f32, tag::ab), dnnl::memory::desc({Cin, hc}, dt::f32, tag::any),
                           dnnl::memory::desc({M, hc}, dt::f32, tag::ab)),
        scratch_attr(), engine());
  }
  plan->brgemm = is_brgemm(plan->pd);
  if (plan->brgemm) {
    plan->prim = dnnl::matmul(plan->pd);
    plan->src_md = plan->pd.src_desc();
    plan->dst_md = plan->pd.dst_desc();
    plan->scratchpad = plan->pd.scratchpad_desc();
    // the packed rows, shared by the plans of every M that packs them the same way
    const std::string rkey = "sasa_head_rows:" + shape;
    plan->rows = cache ? std::static_pointer_cast<HeadRows>(cache->find(rkey)) : nullptr;
    if (!plan->rows || plan->rows->md != plan->pd.weights_desc()) {
      plan->rows = pack_head_rows(w, g, Cin, plan->pd.weights_desc());
      if (cache) cache->put(rkey, plan->rows);
    }
  }
  if (cache) cache->put(key, plan);
  return plan;
}

// Layers with many pixels for the weights go head by head where a head has at least
// kHeadMinChannels q, k and v channels (narrower products waste the matmul's vectors) and an
// image's q, k and v of one head are at most kHeadMaxFloats floats (sasa_resnet26's 56x56 stage
// with heads of 16: 150,528).
constexpr std::int64_t kHeadMinChannels = 48, kHeadMaxFloats = 160 * 1024;

// Where the kernels' plane pointers start and the zero guards around planes with no padding of
// their own: the origin (padded (0, 0)) lies `lead` floats before pixel (0, 0); `front` floats of
// guard precede the first plane and `back` follow the last (whole 64-byte lines), so that the
// origin and the lanes past the last row's end stay inside, with kColumnReach more on either side
// for the AVX-512 kernels' loads of a window row.
struct PlaneGuards {
  std::int64_t lead, front, back;
};
PlaneGuards plane_guards(const sasa::Planes& p) {
  const std::int64_t lead = static_cast<std::int64_t>(p.r) * p.W + p.r;
  return {lead, (lead + sasa::kColumnReach + 15) / 16 * 16,
          (p.r + sasa::kMaxLanes + sasa::kColumnReach + 15) / 16 * 16};
}

// Images per task of attend_by_head: the largest divisor m of n whose m images stay within
// kHeadPixels pixels, so that a task's q, k and v, channels-last and as planes, stay in the L2
// cache. It does not depend on the thread count, so that neither do the products' shapes.
constexpr std::int64_t kHeadPixels = 256;
std::int64_t head_group(std::int64_t n, std::int64_t HW) {
  std::int64_t m = std::max<std::int64_t>(1, std::min(n, kHeadPixels / std::max<std::int64_t>(HW, 1)));
  while (n % m != 0) --m;
  return m;
}

// The attention of images [b0, b0 + n) head by head, where oneDNN has brgemm kernels for this CPU
// (AVX-512): each task is one head of a group of m images. A single-threaded matmul with the head's
// packed rows writes that head's q, k and v of the group channels-last into a buffer of the thread,
// they are turned into planes in the same buffer, and the kernels run on every row of the group:
// all of it within the thread's L2 cache, no thread reads planes another wrote, and the pixels are
// not repacked at every product. The planes (hc of them, M = m * HW floats apart) have one guard
// before the first and one after the last; a column off the map at a plane's first or last row
// reads the neighbouring plane, finite and masked like a neighbouring row. A task never splits and
// its product has the same shape for any thread count, so the results are the same bits on any
// number of threads (with fewer tasks than threads some wait). Returns false, having done nothing,
// where oneDNN has no brgemm kernels. `ms`, when given, gains the time of the projection and of the
// kernels: the wall time split in proportion to the threads' time in each.
bool attend_by_head(const Tensor& x, const float* w, const SasaGeometry& g, const sasa::Kernels& kern,
                    const sasa::Planes& p, std::int64_t b0, std::int64_t n, Tensor& out, float* scratch,
                    std::int64_t S, OpCache* cache, double ms[2]) {
  const std::int64_t Cin = x.dim(1), HW = g.H * g.W, hc = 2 * g.dqk + g.dv;
  const std::int64_t m = head_group(n, HW), M = m * HW, tasks = (n / m) * g.heads;
  const std::shared_ptr<HeadMatmul> plan = head_matmul(w, g, Cin, M, cache);
  if (!plan->brgemm) return false;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const PlaneGuards guards = plane_guards(p);
  const std::int64_t lead = guards.lead, front = guards.front, back = guards.back;
  const std::int64_t oh = p.pool2 ? g.H / 2 : g.H, ow = p.pool2 ? g.W / 2 : g.W;
  sasa::Planes ph = p;  // the group's planes
  ph.stride = M;
  sasa::Planes flat = p;  // the group's pixels as one row, for spread_row
  flat.H = flat.Hp = 1;
  flat.W = flat.Wv = flat.Wp = static_cast<int>(M);
  flat.r = 0;
  flat.stride = M;
  double project_s = 0.0, kernels_s = 0.0;
#pragma omp parallel reduction(+ : project_s, kernels_s)
  {
    float* planes = thread_buffer(ThreadBuffer::SasaHeadPlanes, front + hc * M + back + M * hc);
    float* qkv = planes + front + hc * M + back;  // (M x hc), channels-last
    std::fill(planes, planes + front, 0.0f);
    std::fill(planes + front + hc * M, planes + front + hc * M + back, 0.0f);
    float* sc = scratch + omp_get_thread_num() * S;
    // tasks image group by image group, so that a thread's consecutive heads read the same pixels
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t i0 = b0 + (t / g.heads) * m;
      const int h = static_cast<int>(t % g.heads);
      const float* px = x.data() + i0 * HW * Cin;
      const Clock::time_point t0 = ms ? Clock::now() : Clock::time_point{};
      execute(plan->prim, plan->scratchpad,
              {{DNNL_ARG_SRC, dnnl::memory(plan->src_md, engine(), const_cast<float*>(px))},
               {DNNL_ARG_WEIGHTS, plan->rows->packed[static_cast<std::size_t>(h)]},
               {DNNL_ARG_DST, dnnl::memory(plan->dst_md, engine(), qkv)}});
      kern.spread_row(flat, qkv, hc, 0, hc, planes + front, 0, false);
      const Clock::time_point t1 = ms ? Clock::now() : Clock::time_point{};
      for (std::int64_t i = 0; i < m; ++i) {
        const float* q = planes + front + i * HW - lead;  // (the kernels' origin: padded (0, 0))
        for (int y = 0; y < p.H; y += 2)
          kern.forward_rows(ph, q, q + g.dqk * M, q + 2 * g.dqk * M, h, y, std::min(2, p.H - y),
                            out.data() + (i0 + i) * oh * ow * g.Co, nullptr, sc);
      }
      if (ms) {
        project_s += std::chrono::duration<double>(t1 - t0).count();
        kernels_s += std::chrono::duration<double>(Clock::now() - t1).count();
      }
    }
  }
  if (ms) {
    const double wall = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    const double share = project_s + kernels_s > 0.0 ? kernels_s / (project_s + kernels_s) : 0.0;
    ms[0] += wall * (1.0 - share);
    ms[1] += wall * share;
  }
  return true;
}

}  // namespace

Tensor sasa_attention(const Tensor& qkv_in, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec,
                      Tensor* probs, Act act) {
  const Tensor qkv = as_channels_last(qkv_in);
  const SasaGeometry g = sasa_geometry(qkv, r_row, r_col, spec);
  Tensor out({g.B, g.Co, g.H, g.W}, Device::CPU, Layout::ChannelsLast);
  const std::int64_t kk = static_cast<std::int64_t>(g.k) * g.k;
  if (probs) *probs = Tensor({g.B, g.H, g.W, g.heads, kk});
  const sasa::Kernels& kern = sasa::kernels(static_cast<int>(g.W));
  sasa::Planes p = planes_of(g, r_row, r_col, kern);
  p.relu = act == Act::ReLU;
  const int threads = omp_get_max_threads();
  const std::int64_t P = p.plane(), S = sasa::scratch_floats(p);
  const std::int64_t per_image = g.N * g.Ct, dqk = g.dqk, dv = g.dv;
  const auto probs_of = [&](std::int64_t i) { return probs ? probs->data() + i * g.N * g.heads * kk : nullptr; };
  if (g.B * g.heads >= threads) {
    // Enough (image, head) pairs for every thread: each thread spreads one head's q, k and v into its
    // own planes and runs that head's rows right away, while the planes are in its cache.
    const std::int64_t head_planes = 2 * dqk + dv;
#pragma omp parallel
    {
      bool clean = false;
      float* planes = plane_buffer(plane_layout(3, p, head_planes, 1), head_planes * P, &clean);
      float* scratch = thread_buffer(ThreadBuffer::SasaScratch, S);
#pragma omp for schedule(static)
      for (std::int64_t u = 0; u < g.B * g.heads; ++u) {
        const std::int64_t i = u / g.heads;
        const int h = static_cast<int>(u % g.heads);
        const float* img = qkv.data() + i * per_image;
        float *q = planes, *k = planes + dqk * P, *v = planes + 2 * dqk * P;
        for (int py = 0; py < p.Hp; ++py) {
          kern.spread_row(p, img, g.Ct, p.q_channel(h), dqk, q, py, !clean);
          kern.spread_row(p, img, g.Ct, p.k_channel(h), dqk, k, py, !clean);
          kern.spread_row(p, img, g.Ct, p.v_channel(h), dv, v, py, !clean);
        }
        clean = true;
        for (int y = 0; y < p.H; y += 2)
          kern.forward_rows(p, q, k, v, h, y, std::min(2, p.H - y), out.data() + i * g.N * g.Co, probs_of(i),
                            scratch);
      }
    }
    return out;
  }
  // Fewer pairs than threads: the images' planes first, then the row pairs of every head in parallel.
  const int pairs = (p.H + 1) / 2;
  const std::int64_t G = chunk_images(g.B, static_cast<std::int64_t>(g.heads) * pairs, threads);
  bool clean = false;
  float* planes = plane_buffer(plane_layout(0, p, g.Ct, G), G * g.Ct * P, &clean);
  float* scratch = thread_buffer(ThreadBuffer::SasaScratch, threads * S);
  for (std::int64_t b0 = 0; b0 < g.B; b0 += G) {
    const std::int64_t n = std::min(G, g.B - b0);
    spread_to_planes(kern, qkv, b0, n, p, planes, clean || b0 > 0);
    for_row_pairs(n, g.heads, p.H, [&](std::int64_t i, int h, int y) {
      const float* img = planes + i * g.Ct * P;
      kern.forward_rows(p, img + p.q_channel(h) * P, img + p.k_channel(h) * P, img + p.v_channel(h) * P, h, y,
                        std::min(2, p.H - y), out.data() + (b0 + i) * g.N * g.Co, probs_of(b0 + i),
                        scratch + omp_get_thread_num() * S);
    });
  }
  return out;
}

ops::SasaGrads sasa_attention_backward(const Tensor& qkv_in, const Tensor& r_row, const Tensor& r_col,
                                       const SasaSpec& spec, const Tensor& probs, const Tensor& dout_in) {
  const Tensor qkv = as_channels_last(qkv_in);
  const Tensor dout = as_channels_last(dout_in);
  const SasaGeometry g = sasa_geometry(qkv, r_row, r_col, spec);
  const std::int64_t kk = static_cast<std::int64_t>(g.k) * g.k;
  RELPOS_CHECK(probs.shape() == Shape({g.B, g.H, g.W, g.heads, kk}),
               "local attention backward: saved probabilities " << probs.describe() << " do not fit");
  RELPOS_CHECK(dout.shape() == Shape({g.B, g.Co, g.H, g.W}),
               "local attention backward: gradient " << dout.describe() << " does not match the output");
  ops::SasaGrads grads;
  grads.dqkv = Tensor(qkv.shape(), Device::CPU, Layout::ChannelsLast);
  grads.dr_row = Tensor::zeros(r_row.shape());
  grads.dr_col = Tensor::zeros(r_col.shape());
  const sasa::Kernels& kern = sasa::kernels(static_cast<int>(g.W));
  const sasa::Planes p = planes_of(g, r_row, r_col, kern);
  const int threads = omp_get_max_threads();
  const std::int64_t G = chunk_images(g.B, g.heads, threads);
  const std::int64_t P = p.plane();
  bool clean = false, dclean = false;
  float* planes = plane_buffer(plane_layout(1, p, g.Ct, G), G * g.Ct * P, &clean);
  float* dplanes = plane_buffer(plane_layout(2, p, g.Co, G), G * g.Co * P, &dclean);
  float* gplanes = thread_buffer(ThreadBuffer::SasaGradPlanes, G * g.Ct * P);
  const std::int64_t S = sasa::scratch_floats(p), tsize = static_cast<std::int64_t>(g.k) * g.half;
  float* scratch = thread_buffer(ThreadBuffer::SasaScratch, threads * S);
  // Each (image, head) writes its own embedding gradients; they are added in that order after.
  std::vector<float> dr(static_cast<std::size_t>(g.B * g.heads * 2 * tsize));
  for (std::int64_t b0 = 0; b0 < g.B; b0 += G) {
    const std::int64_t n = std::min(G, g.B - b0);
    spread_to_planes(kern, qkv, b0, n, p, planes, clean || b0 > 0);
    spread_to_planes(kern, dout, b0, n, p, dplanes, dclean || b0 > 0);
#pragma omp parallel for schedule(static)
    for (std::int64_t pl = 0; pl < n * g.Ct; ++pl) std::fill(gplanes + pl * P, gplanes + (pl + 1) * P, 0.0f);
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t i = 0; i < n; ++i)
      for (int h = 0; h < g.heads; ++h)
        kern.backward_head(p, planes + i * g.Ct * P, dplanes + i * g.Co * P,
                           probs.data() + (b0 + i) * g.N * g.heads * kk, h, gplanes + i * g.Ct * P,
                           dr.data() + ((b0 + i) * g.heads + h) * 2 * tsize, scratch + omp_get_thread_num() * S);
    gather_from_planes(kern, gplanes, p, b0, n, grads.dqkv);
  }
  for (std::int64_t u = 0; u < g.B * g.heads; ++u)
    for (std::int64_t t = 0; t < tsize; ++t) {
      grads.dr_row.data()[t] += dr[static_cast<std::size_t>(u * 2 * tsize + t)];
      grads.dr_col.data()[t] += dr[static_cast<std::size_t>(u * 2 * tsize + tsize + t)];
    }
  return grads;
}

Tensor sasa_projected_attention(const Tensor& x_in, const Tensor& w, const Tensor* v_bias, const Tensor& r_row,
                                const Tensor& r_col, const SasaSpec& spec, Act act, bool pool2x2, OpCache* cache) {
  const Tensor x = as_channels_last(x_in);
  RELPOS_CHECK(x.ndim() == 4, "local attention projection: input " << x.describe() << " is not (N, C, H, W)");
  const std::int64_t B = x.dim(0), Cin = x.dim(1), H = x.dim(2), W = x.dim(3);
  RELPOS_CHECK(w.shape() == Shape({spec.channels_qkv(), Cin, 1, 1}) && w.layout() == Layout::Contiguous,
               "local attention projection: weights " << w.describe() << " do not fit a 1x1 projection of " << Cin
                                                        << " channels to " << spec.channels_qkv());
  RELPOS_CHECK(!v_bias || v_bias->shape() == Shape({spec.channels_out()}),
               "local attention projection: value bias " << v_bias->describe() << " must have "
                                                          << spec.channels_out() << " entries");
  // The geometry and checks of the attention itself, on the qkv shape the projection makes.
  const SasaGeometry g = sasa_geometry(Shape{B, spec.channels_qkv(), H, W}, Device::CPU, r_row, r_col, spec);
  RELPOS_CHECK(!pool2x2 || (H % 2 == 0 && W % 2 == 0),
               "local attention projection: a 2x2 pool needs an even map, got " << H << "x" << W);
  const std::int64_t oh = pool2x2 ? H / 2 : H, ow = pool2x2 ? W / 2 : W;
  Tensor out({B, g.Co, oh, ow}, Device::CPU, Layout::ChannelsLast);
  if (B == 0 || H == 0 || W == 0) return out;  // (an empty batch or map: nothing to chunk)
  // With profiling on, the op's time in two parts (profile_parts()): "attention" is the window
  // kernels, "projection" the rest (the planes' setup and the qkv products).
  using Clock = std::chrono::steady_clock;
  const bool parts = detail::op_parts_wanted();
  const Clock::time_point op_start = parts ? Clock::now() : Clock::time_point{};
  double attention_ms = 0.0;
  const auto since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  const sasa::Kernels& kern = sasa::kernels(static_cast<int>(W));
  sasa::Planes p = planes_of(g, r_row, r_col, kern);
  p.relu = act == Act::ReLU;
  p.pool2 = pool2x2;
  p.v_bias = v_bias ? v_bias->data() : nullptr;
  p.Wv = p.Wp = p.W;
  const std::int64_t HW = H * W;
  const PlaneGuards guards = plane_guards(p);
  const std::int64_t lead = guards.lead, front = guards.front, back = guards.back;
  const std::int64_t G = std::clamp<std::int64_t>((std::int64_t{1} << 20) / (g.Ct * HW), 1, B);  // ~4 MiB
  const bool dense = G * HW < 4 * Cin;  // few pixels for the weights (the later stages)
  const int threads = omp_get_max_threads();
  const std::int64_t S = sasa::scratch_floats(p);
  float* scratch = thread_buffer(ThreadBuffer::SasaScratch, threads * S);
  double by_head_ms[2] = {0.0, 0.0};  // (attend_by_head's projection and kernels)
  const auto finish = [&] {
    if (parts) {
      attention_ms += by_head_ms[1];
      detail::add_op_part("projection", since(op_start) - attention_ms);
      detail::add_op_part("attention", attention_ms);
    }
    return out;
  };
  // Head by head where oneDNN has brgemm kernels, each thread's planes in its own L2 cache: the
  // layers with few pixels for the weights, and those whose heads have enough channels on a map
  // small enough for a head's planes to stay in L2 (tools/bench/README.md: sasa_resnet26 at batch 1
  // 1.0 to 1.9% faster for the first, 1.4 to 1.9% more for the second, its stage 1; stage 0's
  // heads of 8 + 8 + 8 channels ran 12 to 16% slower that way).
  const std::int64_t hc = 2 * g.dqk + g.dv;
  const bool by_head = dense || (hc >= kHeadMinChannels && HW * hc <= kHeadMaxFloats);
  if (by_head && attend_by_head(x, w.data(), g, kern, p, 0, B, out, scratch, S, cache, parts ? by_head_ms : nullptr))
    return finish();
  // Otherwise planes of a chunk of G images for all heads: rows W wide with no padding columns, the
  // chunk's maps back to back in each plane. A window column left or right of the map reads the end
  // of the row above or the start of the row below (of this image or the next), and the kernels
  // mask such columns lane by lane; the window rows they take are the map's own. Guards before the
  // first map (the kernels' plane pointer, r padding rows and columns before pixel (0, 0), stays
  // inside) and after the last (for the lanes past the last row's end) hold zeros, written at every
  // chunk: the buffer is shared by every layer, so whatever another layer left there is
  // overwritten. Dense layers here (no brgemm kernels: a CPU without AVX-512) have no guards per
  // plane: one before the first plane and one after the last, the planes of a chunk of n images
  // n * HW floats apart, so that the projection's output is one dense matrix; a column off the map
  // at either end of a plane then reads the neighbouring plane, as finite and as masked.
  const std::int64_t P = dense ? G * HW : front + G * HW + back;
  // One buffer of the calling thread for every layer (the largest layer's size), so that a layer
  // writes its planes where the layer before it had just read its own, still in the caches, where a
  // buffer per layer would be last touched one inference earlier (sasa_resnet26 at batch 1 0.5 to
  // 0.9% faster and 8 MB smaller, tools/bench/README.md). Each chunk writes its own guards. The
  // guard in front of plane 0 starts here.
  float* planes = thread_buffer(ThreadBuffer::SasaProjectedPlanes, dense ? front + g.Ct * P + back : g.Ct * P);
  const int pairs = (p.H + 1) / 2;
  for (std::int64_t b0 = 0; b0 < B; b0 += G) {
    const std::int64_t n = std::min(G, B - b0);
    // (a short last chunk, few pixels for the weights: head by head where it can)
    if (!dense && n * HW < 4 * Cin &&
        attend_by_head(x, w.data(), g, kern, p, b0, n, out, scratch, S, cache, parts ? by_head_ms : nullptr))
      continue;
    const std::int64_t stride = dense ? n * HW : P;  // from one plane to the next
    p.stride = stride;
    // The guards, zero: before the first map (only a pointer points there: plane 0 holds queries,
    // which the kernels read on the map alone), then after each map (dense: after the last), which
    // the masked window columns of the next plane's keys and values read
    std::fill(planes, planes + front, 0.0f);
    if (dense) {
      std::fill(planes + front + g.Ct * stride, planes + front + g.Ct * stride + back, 0.0f);
    } else {
      for (std::int64_t c = 0; c < g.Ct; ++c)
        std::fill(planes + front + c * P + n * HW, planes + std::min(front + (c + 1) * P, g.Ct * P), 0.0f);
    }
    // The planes of the chunk's pixels [px0, px1): (Ct x pixels) = w (Ct x Cin) times the pixels
    // (pixels x Cin)^T, by oneDNN's sgemm (single-threaded inside a parallel region).
    const auto project = [&](std::int64_t px0, std::int64_t px1) {
      gemm(false, true, g.Ct, px1 - px0, Cin, 1.0f, w.data(), Cin, x.data() + (b0 * HW + px0) * Cin, Cin, 0.0f,
           planes + front + px0, stride);
    };
    // The kernels address padded (row, column) at row * W + column from their plane pointer.
    const auto plane = [&](std::int64_t i, std::int64_t c) { return planes + front + c * stride + i * HW - lead; };
    const auto run = [&](std::int64_t i, int h, int y) {
      kern.forward_rows(p, plane(i, p.q_channel(h)), plane(i, p.k_channel(h)), plane(i, p.v_channel(h)), h, y,
                        std::min(2, p.H - y), out.data() + (b0 + i) * oh * ow * g.Co, nullptr,
                        scratch + omp_get_thread_num() * S);
    };
    if (!dense && n * HW >= 4 * Cin) {
      // Many pixels for the weights (the early stages): each thread projects its own band of row
      // pairs (all channels) with a single-threaded sgemm and, once every band is there, runs every
      // head on those rows, so the planes it reads were written by its own core but for the r rows
      // of window above and below (stage 0 of sasa_resnet26: the op 0.79 to 0.93 ms against 0.92 to
      // 1.14, tools/bench/README.md). With few pixels each thread would stream all the weights, so
      // those layers go head by head (above) or through oneDNN's own split of one sgemm.
      const std::int64_t units = n * pairs;  // (image, row pair)
      const auto first_pixel = [&](std::int64_t u) { return (u / pairs) * HW + 2 * (u % pairs) * W; };
      Clock::time_point kernels_start{};
#pragma omp parallel
      {
        const int T = omp_get_num_threads(), t = omp_get_thread_num();
        const std::int64_t u0 = units * t / T, u1 = units * (t + 1) / T;
        if (u0 < u1) project(first_pixel(u0), u1 == units ? n * HW : first_pixel(u1));
#pragma omp barrier
        if (parts && t == 0) kernels_start = Clock::now();  // (every band projected)
        for (int h = 0; h < g.heads; ++h)
          for (std::int64_t u = u0; u < u1; ++u) run(u / pairs, h, static_cast<int>(2 * (u % pairs)));
      }
      if (parts) attention_ms += since(kernels_start);
      continue;
    }
    // the whole chunk's planes, on every thread
    project(0, n * HW);
    const Clock::time_point kernels_start = parts ? Clock::now() : Clock::time_point{};
    if (n * g.heads >= threads) {
#pragma omp parallel for schedule(static)
      for (std::int64_t u = 0; u < n * g.heads; ++u)
        for (int y = 0; y < p.H; y += 2) run(u / g.heads, static_cast<int>(u % g.heads), y);
    } else {
      for_row_pairs(n, g.heads, p.H, run);
    }
    if (parts) attention_ms += since(kernels_start);
  }
  return finish();
}

}  // namespace relpos::cpu
