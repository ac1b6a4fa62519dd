// Quintet's parameter names and boxes <-> Hugging Face tensors (hf_names.hpp has the table).
#include "quintet/parallel/train/hf_names.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <unordered_set>

#include "quintet/core/error.hpp"

namespace quintet::train {

namespace {

// A piece that is the whole of an HF tensor of our shape.
HfPiece whole(std::string hf_name, const Shape& shape) {
  return {std::move(hf_name), shape, Shape(shape.size(), 0), shape, Shape(shape.size(), 0)};
}

// Entry i of our leading dimension, which is the whole HF tensor of shape `part`.
HfPiece stacked(std::string hf_name, const Shape& part, std::int64_t i) {
  Shape start(part.size() + 1, 0), sizes{1};
  start[0] = i;
  sizes.insert(sizes.end(), part.begin(), part.end());
  return {std::move(hf_name), part, std::move(start), std::move(sizes), Shape(part.size(), 0)};
}

HfParameter single(std::string hf_name, const Shape& shape) {
  return {shape, {whole(std::move(hf_name), shape)}};
}

// Our [names.size(), part...] tensor, one HF tensor per leading entry.
HfParameter stack(const std::vector<std::string>& names, const Shape& part) {
  HfParameter out;
  out.global_shape = {static_cast<std::int64_t>(names.size())};
  out.global_shape.insert(out.global_shape.end(), part.begin(), part.end());
  for (std::size_t i = 0; i < names.size(); ++i)
    out.pieces.push_back(stacked(names[i], part, static_cast<std::int64_t>(i)));
  return out;
}

std::string layer_prefix(std::int64_t l) { return fmt::format("model.layers.{}.", l); }

// The parameter of block l named `rest` ("attn.qkv.weight", ...).
HfParameter block_parameter(const model::GptConfig& m, const HfNaming& n, std::int64_t l,
                            std::string_view rest, std::string_view full_name) {
  const std::string L = layer_prefix(l);
  const std::int64_t d = m.hidden, D = m.head_size(), H = m.heads * D, K = m.kv_head_count() * D;
  const std::string attn = L + "self_attn.";
  if (rest == "norm1.weight") return single(L + "input_layernorm.weight", {d});
  if (rest == "norm2.weight") return single(L + "post_attention_layernorm.weight", {d});
  if (rest == "attn.qkv.weight")
    return stack({attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"}, {H, d});
  if (rest == "attn.qkv.bias")
    return stack({attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias"}, {H});
  if (rest == "attn.q.weight") return single(attn + "q_proj.weight", {H, d});
  if (rest == "attn.q.bias") return single(attn + "q_proj.bias", {H});
  if (rest == "attn.kv.weight")
    return stack({attn + "k_proj.weight", attn + "v_proj.weight"}, {K, d});
  if (rest == "attn.kv.bias") return stack({attn + "k_proj.bias", attn + "v_proj.bias"}, {K});
  if (rest == "attn.proj.weight") return single(attn + "o_proj.weight", {d, H});
  if (rest == "attn.proj.bias") return single(attn + "o_proj.bias", {d});
  if (rest == "attn.q_norm.weight") return single(attn + "q_norm.weight", {D});
  if (rest == "attn.k_norm.weight") return single(attn + "k_norm.weight", {D});
  if (!m.is_moe_block(l)) {
    const std::int64_t F = m.mlp_width();
    if (rest == "mlp.fc.weight") return single(L + "mlp.gate_proj.weight", {F, d});
    if (rest == "mlp.up.weight") return single(L + "mlp.up_proj.weight", {F, d});
    if (rest == "mlp.proj.weight") return single(L + "mlp.down_proj.weight", {d, F});
  } else {
    const std::int64_t E = m.moe.router.experts, F = m.expert_width();
    const std::string moe = L + n.moe_module + ".";
    if (rest == "mlp.router.weight") return single(moe + "gate.weight", {E, d});
    const bool fc = rest == "mlp.experts.fc.weight", up = rest == "mlp.experts.up.weight",
               down = rest == "mlp.experts.proj.weight";
    if (n.fused_experts && (fc || up)) {
      const Shape hf{E, 2 * F, d};
      return {{E, F, d},
              {{moe + "experts.gate_up_proj", hf, {0, 0, 0}, {E, F, d}, {0, up ? F : 0, 0}}}};
    }
    if (n.fused_experts && down) return single(moe + "experts.down_proj", {E, d, F});
    if (fc || up || down) {
      const std::string& which = fc ? n.expert_gate : up ? n.expert_up : n.expert_down;
      std::vector<std::string> names;
      for (std::int64_t e = 0; e < E; ++e)
        names.push_back(fmt::format("{}experts.{}.{}.weight", moe, e, which));
      return stack(names, down ? Shape{d, F} : Shape{F, d});
    }
  }
  QUINTET_THROW(InvalidArgument,
                "Hugging Face names: the parameter {} has no Hugging Face counterpart in a {} "
                "model (Llama, Qwen3, Mixtral and Qwen3-MoE have none)",
                full_name, model::model_family_name(m.family));
}

}  // namespace

HfNaming hf_naming(model::ModelFamily family) {
  if (family != model::ModelFamily::mixtral) return {};
  return {.moe_module = "block_sparse_moe",
          .expert_gate = "w1",
          .expert_up = "w3",
          .expert_down = "w2"};
}

HfParameter hf_parameter(const model::GptConfig& m, const HfNaming& n, std::string_view name) {
  const Shape table{m.vocab, m.hidden};
  if (name == "wte.weight") return single("model.embed_tokens.weight", table);
  if (name == "lm_head.weight" && !m.tied_embeddings) return single("lm_head.weight", table);
  if (name == "norm.weight") return single("model.norm.weight", {m.hidden});
  if (name.starts_with("block")) {
    const std::size_t dot = name.find('.');
    std::int64_t l = -1;
    const char* first = name.data() + 5;
    const char* last = name.data() + (dot == std::string_view::npos ? name.size() : dot);
    const auto [end, ec] = std::from_chars(first, last, l);
    if (ec == std::errc() && end == last && first != last && l >= 0 && l < m.layers &&
        dot != std::string_view::npos)
      return block_parameter(m, n, l, name.substr(dot + 1), name);
  }
  QUINTET_THROW(InvalidArgument,
                "Hugging Face names: the parameter {} has no Hugging Face counterpart in a {} "
                "model of {} layers",
                name, model::model_family_name(m.family), m.layers);
}

std::vector<std::int64_t> hf_dense_layers(std::int64_t layers, const HfSparseLayers& sparse) {
  const std::vector<std::int64_t>& only = sparse.mlp_only_layers;
  std::vector<std::int64_t> out;
  for (std::int64_t l = 0; l < layers; ++l) {
    if ((l + 1) % sparse.decoder_sparse_step != 0 ||
        std::find(only.begin(), only.end(), l) != only.end())
      out.push_back(l);
  }
  return out;
}

HfSparseLayers hf_sparse_layers(const model::GptConfig& m) {
  HfSparseLayers best;
  std::size_t fewest = static_cast<std::size_t>(m.layers) + 1;
  for (std::int64_t step = 1; step <= m.layers; ++step) {
    HfSparseLayers s{step, {}};
    bool holds_all = true;
    for (std::int64_t l = 0; l < m.layers; ++l) {
      const bool candidate = (l + 1) % step == 0;
      holds_all = holds_all && (candidate || !m.is_moe_block(l));
      if (candidate && !m.is_moe_block(l)) s.mlp_only_layers.push_back(l);
    }
    if (holds_all && s.mlp_only_layers.size() < fewest) {
      fewest = s.mlp_only_layers.size();
      best = std::move(s);
    }
  }
  return best;
}

std::vector<std::string> hf_parameter_names(const model::GptConfig& m) {
  std::vector<std::string> out{"wte.weight"};
  const bool grouped = m.kv_head_count() != m.heads;
  for (std::int64_t l = 0; l < m.layers; ++l) {
    const std::string b = fmt::format("block{}.", l);
    out.push_back(b + "norm1.weight");
    if (grouped) {
      out.push_back(b + "attn.q.weight");
      out.push_back(b + "attn.kv.weight");
      if (m.bias) {
        out.push_back(b + "attn.q.bias");
        out.push_back(b + "attn.kv.bias");
      }
    } else {
      out.push_back(b + "attn.qkv.weight");
      if (m.bias) out.push_back(b + "attn.qkv.bias");
    }
    if (m.qk_norm) {
      out.push_back(b + "attn.q_norm.weight");
      out.push_back(b + "attn.k_norm.weight");
    }
    out.push_back(b + "attn.proj.weight");
    if (m.bias && m.proj_bias) out.push_back(b + "attn.proj.bias");
    out.push_back(b + "norm2.weight");
    if (m.is_moe_block(l)) {
      out.push_back(b + "mlp.router.weight");
      out.push_back(b + "mlp.experts.fc.weight");
      out.push_back(b + "mlp.experts.up.weight");
      out.push_back(b + "mlp.experts.proj.weight");
    } else {
      out.push_back(b + "mlp.fc.weight");
      out.push_back(b + "mlp.up.weight");
      out.push_back(b + "mlp.proj.weight");
    }
  }
  out.push_back("norm.weight");
  if (!m.tied_embeddings) out.push_back("lm_head.weight");
  return out;
}

std::vector<std::pair<std::string, Shape>> hf_tensors(const model::GptConfig& m,
                                                      const HfNaming& n) {
  std::vector<std::pair<std::string, Shape>> out;
  std::unordered_set<std::string> seen;  // gate_up_proj holds two of our parameters
  for (const std::string& name : hf_parameter_names(m)) {
    for (const HfPiece& p : hf_parameter(m, n, name).pieces) {
      if (seen.insert(p.hf_name).second) out.emplace_back(p.hf_name, p.hf_shape);
    }
  }
  return out;
}

}  // namespace quintet::train
