// The attention ops of relpos/attention_ops.hpp: names, scales, and each op routed to its backend
// (src/cpu/bot_attention.cpp | src/cuda/bot_attention.cu, src/cpu/sasa_attention.cpp |
// src/cuda/sasa_attention.cu; shape checks in core/attention_geometry.cpp).
#include "relpos/attention_ops.hpp"

#include <cmath>

#include "core/dispatch.hpp"
#include "io/json_reader.hpp"

namespace relpos {

namespace {
constexpr detail::EnumName<PosEncoding> kPosEncodings[] = {
    {PosEncoding::Relative, "relative"}, {PosEncoding::Absolute, "absolute"}, {PosEncoding::None, "none"}};
}  // namespace

PosEncoding parse_pos_encoding(const std::string& s) { return detail::parse_enum(s, kPosEncodings, "position encoding"); }
std::string to_string(PosEncoding p) { return detail::enum_name(p, kPosEncodings); }

float BotAttnSpec::scale() const { return 1.0f / std::sqrt(static_cast<float>(dqk)); }
float SasaSpec::scale() const { return 1.0f / std::sqrt(static_cast<float>(dqk)); }

namespace ops {

Tensor bot_attention(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w, const BotAttnSpec& spec,
                     Tensor* probs) {
  RELPOS_DISPATCH(qkv, bot_attention, qkv, pos_h, pos_w, spec, probs);
}
BotAttnGrads bot_attention_backward(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w,
                                    const BotAttnSpec& spec, const Tensor& probs, const Tensor& dout) {
  same_device("attention backward", qkv, {&probs, &dout});
  RELPOS_DISPATCH(qkv, bot_attention_backward, qkv, pos_h, pos_w, spec, probs, dout);
}
Tensor rel_pos_logits(const Tensor& q, const Tensor& table_h, const Tensor& table_w, int height, int width,
                      int clip) {
  same_device("rel_pos_logits", q, {&table_h, &table_w});
  RELPOS_DISPATCH(q, rel_pos_logits, q, table_h, table_w, height, width, clip);
}
Tensor sasa_attention(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec,
                      Tensor* probs, Act act) {
  RELPOS_CHECK(act == Act::None || act == Act::ReLU, "local attention: the output activation must be none or relu");
  RELPOS_DISPATCH(qkv, sasa_attention, qkv, r_row, r_col, spec, probs, act);
}
Tensor sasa_projected_attention(const Tensor& x, const Tensor& w, const Tensor* v_bias, const Tensor& r_row,
                                const Tensor& r_col, const SasaSpec& spec, Act act, bool pool2x2, OpCache* cache) {
  RELPOS_CHECK(act == Act::None || act == Act::ReLU, "local attention: the output activation must be none or relu");
  RELPOS_CHECK(x.is_cpu(), "local attention projection: CPU only (the input is on " << to_string(x.device()) << ")");
  same_device("local attention projection", x, {&w, v_bias, &r_row, &r_col});
  if (cache) cache->use_weights(w.data(), w.numel());  // (the CPU op keeps packed copies of w)
  const detail::ThreadScope relpos_threads_;
  const detail::OpTimer timer("sasa_projected_attention", false);
  return cpu::sasa_projected_attention(x, w, v_bias, r_row, r_col, spec, act, pool2x2, cache);
}
SasaGrads sasa_attention_backward(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec,
                                  const Tensor& probs, const Tensor& dout) {
  same_device("local attention backward", qkv, {&probs, &dout});
  RELPOS_DISPATCH(qkv, sasa_attention_backward, qkv, r_row, r_col, spec, probs, dout);
}

}  // namespace ops
}  // namespace relpos
