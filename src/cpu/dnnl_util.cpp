#include "cpu/dnnl_util.hpp"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/huge_page_arena.hpp"
#include "cpu/thread_buffer.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

dnnl::memory::desc md_plain(const Shape& shape) {
  dims d(shape.begin(), shape.end());
  tag t = tag::undef;
  switch (shape.size()) {
    case 1: t = tag::a; break;
    case 2: t = tag::ab; break;
    case 3: t = tag::abc; break;
    case 4: t = tag::abcd; break;
    case 5: t = tag::abcde; break;
    default: RELPOS_FAIL("no plain oneDNN layout for shape " << to_string(shape));
  }
  return dnnl::memory::desc(d, dt::f32, t);
}

dnnl::memory::desc md_nhwc(const Shape& s) {
  RELPOS_CHECK(s.size() == 4, "expected a 4-D shape, got " << to_string(s));
  return dnnl::memory::desc({s[0], s[1], s[2], s[3]}, dt::f32, tag::nhwc);
}

dnnl::memory::desc md_of(const Tensor& t) {
  return t.layout() == Layout::ChannelsLast ? md_nhwc(t.shape()) : md_plain(t.shape());
}

dnnl::memory mem(const dnnl::memory::desc& md, const Tensor& t) {
  return dnnl::memory(md, engine(), const_cast<float*>(t.data()));
}

dnnl::memory mem(const dnnl::memory::desc& md, const float* p) {
  return dnnl::memory(md, engine(), const_cast<float*>(p));
}

dnnl::primitive_attr scratch_attr() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

bool is_brgemm(const dnnl::primitive_desc_base& pd) { return std::strncmp(pd.impl_info_str(), "brg", 3) == 0; }

bool brgemm_matmul() {
  static const bool on = [] {
    const dnnl::memory::desc a({64, 64}, dt::f32, tag::ab), b({64, 64}, dt::f32, tag::any);
    return is_brgemm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, a), engine()));
  }();
  return on;
}

dnnl::memory arena_memory(const dnnl::memory::desc& md, std::shared_ptr<void>& hold) {
  hold = detail::arena_alloc(md.get_size());
  return dnnl::memory(md, engine(), hold.get());
}

void execute(const dnnl::primitive& prim, const dnnl::memory::desc& scratchpad_md,
             std::unordered_map<int, dnnl::memory> args) {
  const std::size_t need = scratchpad_md.get_size();
  if (need > 0) {
    float* scratch = thread_buffer(ThreadBuffer::DnnlScratchpad, static_cast<std::int64_t>((need + 3) / 4));
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratchpad_md, engine(), scratch));
  }
  prim.execute(stream(), args);
  stream().wait();
}

Tensor as_channels_last(const Tensor& x) {
  RELPOS_CHECK(x.ndim() == 4, "expected a 4-D (N, C, H, W) tensor, got " << x.describe());
  RELPOS_CHECK(x.is_cpu(), "expected a CPU tensor, got " << x.describe());
  return x.channels_last();
}

Tensor output_for(const Shape& shape, const ops::Epilogue& ep, const char* op) {
  if (!ep.residual) return Tensor(shape, Device::CPU, Layout::ChannelsLast);
  RELPOS_CHECK(ep.residual->shape() == shape, op << ": residual " << ep.residual->describe()
                                                 << " does not match output " << to_string(shape));
  if (ep.overwrite_residual && ep.residual->is_cpu() && ep.residual->layout() == Layout::ChannelsLast)
    return *ep.residual;
  Tensor y(shape, Device::CPU, Layout::ChannelsLast);
  y.copy_from(*ep.residual);
  return y;
}

}  // namespace relpos::cpu

namespace relpos::cpu {
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                                      ldb, beta, c, ldc);
  RELPOS_CHECK(st == dnnl_success, "oneDNN sgemm failed (" << m << "x" << n << "x" << k << ")");
}
}  // namespace relpos::cpu
