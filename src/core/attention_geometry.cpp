#include "core/attention_geometry.hpp"

#include <cmath>

#include "relpos/error.hpp"

namespace relpos {

namespace {
Shape table_shape(bool per_head, int heads, std::int64_t rows, int d) {
  return per_head ? Shape{heads, rows, d} : Shape{rows, d};
}

void check_qkv(const Shape& qkv, int channels, int heads, int dqk, int dv, const char* what) {
  RELPOS_CHECK(heads >= 1 && dqk >= 1 && dv >= 1,
               what << ": heads, dqk and dv must be positive (got " << heads << ", " << dqk << ", " << dv << ")");
  RELPOS_CHECK(qkv.size() == 4, what << ": qkv must be (B, C, H, W), got " << to_string(qkv));
  RELPOS_CHECK(qkv[1] == channels, what << ": qkv has " << qkv[1] << " channels but " << heads << " heads with dqk "
                                        << dqk << " and dv " << dv << " need " << channels);
}
}  // namespace

BotGeometry bot_geometry(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w, const BotAttnSpec& spec) {
  check_qkv(qkv.shape(), spec.channels_qkv(), spec.heads, spec.dqk, spec.dv, "attention");
  RELPOS_CHECK(spec.clip >= 0, "attention: clip must be >= 0, got " << spec.clip);
  BotGeometry g;
  g.B = qkv.dim(0), g.H = qkv.dim(2), g.W = qkv.dim(3), g.N = g.H * g.W;
  g.Ct = spec.channels_qkv(), g.Co = spec.channels_out();
  g.heads = spec.heads, g.dqk = spec.dqk, g.dv = spec.dv;
  g.per_head = spec.per_head;
  g.s = spec.scale();
  g.alpha_pos = spec.scale_pos_embed ? g.s : 1.0f;
  if (spec.pos == PosEncoding::Relative) {
    g.kh = spec.clip > 0 ? spec.clip : static_cast<int>(g.H - 1);
    g.kw = spec.clip > 0 ? spec.clip : static_cast<int>(g.W - 1);
    g.Th = 2 * g.kh + 1, g.Tw = 2 * g.kw + 1;
    const Shape want_h = table_shape(spec.per_head, spec.heads, g.Th, spec.dqk);
    const Shape want_w = table_shape(spec.per_head, spec.heads, g.Tw, spec.dqk);
    if (spec.clip == 0 && pos_h.ndim() >= 2 && pos_w.ndim() >= 2 &&
        (pos_h.shape() != want_h || pos_w.shape() != want_w)) {
      RELPOS_FAIL("attention: the relative position tables " << to_string(pos_h.shape()) << " and "
                  << to_string(pos_w.shape()) << " fit a " << (pos_h.dim(-2) + 1) / 2 << "x"
                  << (pos_w.dim(-2) + 1) / 2 << " feature map, but the map is " << g.H << "x" << g.W
                  << "; this model has a fixed input size (models with clip > 0 accept any size)");
    }
    RELPOS_CHECK(pos_h.shape() == want_h, "attention: height table is " << to_string(pos_h.shape())
                                                                        << ", expected " << to_string(want_h));
    RELPOS_CHECK(pos_w.shape() == want_w, "attention: width table is " << to_string(pos_w.shape())
                                                                       << ", expected " << to_string(want_w));
  } else if (spec.pos == PosEncoding::Absolute) {
    g.Th = g.N;
    const Shape want = table_shape(spec.per_head, spec.heads, g.N, spec.dqk);
    RELPOS_CHECK(pos_h.shape() == want, "attention: absolute position table is " << to_string(pos_h.shape())
                                            << " but a " << g.H << "x" << g.W << " map needs " << to_string(want));
  }
  for (const Tensor* t : {&pos_h, &pos_w})
    RELPOS_CHECK(!t->defined() || (t->device() == qkv.device() && t->layout() == Layout::Contiguous),
                 "attention: position tables must be contiguous and on the same device as qkv");
  return g;
}

SasaGeometry sasa_geometry(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec) {
  return sasa_geometry(qkv.shape(), qkv.device(), r_row, r_col, spec);
}

SasaGeometry sasa_geometry(const Shape& qkv, Device device, const Tensor& r_row, const Tensor& r_col,
                           const SasaSpec& spec) {
  check_qkv(qkv, spec.channels_qkv(), spec.heads, spec.dqk, spec.dv, "local attention");
  RELPOS_CHECK(spec.kernel >= 1 && spec.kernel % 2 == 1,
               "local attention: the window must be odd, got " << spec.kernel);
  RELPOS_CHECK(spec.dqk % 2 == 0, "local attention: dqk must be even (half rows, half columns), got " << spec.dqk);
  SasaGeometry g;
  g.B = qkv[0], g.H = qkv[2], g.W = qkv[3], g.N = g.H * g.W;
  g.Ct = spec.channels_qkv(), g.Co = spec.channels_out();
  g.heads = spec.heads, g.dqk = spec.dqk, g.dv = spec.dv;
  g.k = spec.kernel, g.r = spec.kernel / 2, g.half = spec.dqk / 2;
  g.s = spec.scale();
  const Shape want{spec.kernel, spec.dqk / 2};
  RELPOS_CHECK(r_row.shape() == want && r_col.shape() == want,
               "local attention: r_row " << to_string(r_row.shape()) << " and r_col " << to_string(r_col.shape())
                                         << " must both be " << to_string(want));
  RELPOS_CHECK(r_row.device() == device && r_col.device() == device,
               "local attention: embeddings must be on the same device as qkv");
  return g;
}

}  // namespace relpos
