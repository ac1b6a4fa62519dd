// GptConfig's derived sizes and its validation.
#include "quintet/parallel/model/gpt_config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"

namespace quintet::model {

std::int64_t GptConfig::mlp_width() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }

float GptConfig::output_init_std() const {
  if (proj_init_std > 0.0f) return proj_init_std;
  return init_std / std::sqrt(2.0f * static_cast<float>(layers));
}

bool GptConfig::is_moe_block(std::int64_t l) const {
  return mlp == MlpKind::moe && moe.every >= 1 && l % moe.every == 0 &&
         std::find(moe.dense_layers.begin(), moe.dense_layers.end(), l) == moe.dense_layers.end();
}

std::vector<std::int64_t> parse_layer_list(std::string_view text) {
  std::vector<std::int64_t> out;
  const auto bad = [text](std::string_view why) {
    QUINTET_THROW(InvalidArgument,
                  "layer list \"{}\": {}; expected ascending block indices separated by commas, "
                  "with ranges A-B, as \"0,1,5\" or \"0-2,5\"",
                  text, why);
  };
  const auto number = [&bad](std::string_view s) {
    std::int64_t v = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0)
      bad(fmt::format("\"{}\" is not a block index (0 or more)", s));
    return v;
  };
  std::size_t at = 0;
  while (!text.empty() && at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    const std::size_t dash = item.find('-');
    const std::int64_t first = number(item.substr(0, dash));
    const std::int64_t last =
        dash == std::string_view::npos ? first : number(item.substr(dash + 1));
    if (last < first) bad(fmt::format("the range {} ends below its start", item));
    if (!out.empty() && first <= out.back())
      bad(fmt::format("{} does not come after {}", first, out.back()));
    for (std::int64_t l = first; l <= last; ++l) out.push_back(l);
    at = comma + 1;
  }
  return out;
}

std::string layer_list_text(const std::vector<std::int64_t>& layers) {
  return fmt::format("{}", fmt::join(layers, ","));
}

std::int64_t GptConfig::expert_width() const {
  return moe.expert_ffn > 0 ? moe.expert_ffn : mlp_width();
}

namespace {
void check_divides(const char* name, std::int64_t v, int tp) {
  QUINTET_CHECK(v % tp == 0,
                "{} = {} is not divisible by the tensor-parallel size tp = {}; choose a {} that is "
                "a multiple of {} or another tp",
                name, v, tp, name, tp);
}

// The moe settings that differ from MoEConfig's defaults, as "moe.router.experts = 16, ...".
std::string changed_moe_settings(const MoEConfig& m) {
  const MoEConfig d;
  const expert::RouterConfig &r = m.router, &dr = d.router;
  std::vector<std::string> out;
  const auto note = [&out](bool changed, const char* name, const auto& value) {
    if (changed) out.push_back(fmt::format("moe.{} = {}", name, value));
  };
  note(r.experts != dr.experts, "router.experts", r.experts);
  note(r.top_k != dr.top_k, "router.top_k", r.top_k);
  note(r.score != dr.score, "router.score",
       r.score == expert::RouterScore::softmax ? "softmax" : "sigmoid");
  note(r.renormalize != dr.renormalize, "router.renormalize", r.renormalize);
  note(r.capacity_factor != dr.capacity_factor, "router.capacity_factor", r.capacity_factor);
  note(r.aux_loss_coeff != dr.aux_loss_coeff, "router.aux_loss_coeff", r.aux_loss_coeff);
  note(r.z_loss_coeff != dr.z_loss_coeff, "router.z_loss_coeff", r.z_loss_coeff);
  note(r.bias_rate != dr.bias_rate, "router.bias_rate", r.bias_rate);
  note(r.idle_warning_steps != dr.idle_warning_steps, "router.idle_warning_steps",
       r.idle_warning_steps);
  note(m.expert_ffn != d.expert_ffn, "expert_ffn", m.expert_ffn);
  note(m.shared_experts != d.shared_experts, "shared_experts", m.shared_experts);
  note(m.every != d.every, "every", m.every);
  note(m.dense_layers != d.dense_layers, "dense_layers", layer_list_text(m.dense_layers));
  note(m.overlap_chunks != d.overlap_chunks, "overlap_chunks", m.overlap_chunks);
  return fmt::format("{}", fmt::join(out, ", "));
}
}  // namespace

RecomputeKind parse_recompute_kind(std::string_view name) {
  if (name == "none") return RecomputeKind::none;
  if (name == "attention") return RecomputeKind::attention;
  if (name == "full") return RecomputeKind::full;
  QUINTET_THROW(InvalidArgument, "unknown recompute \"{}\"; use none, attention or full", name);
}

ModelFamily parse_model_family(std::string_view name) {
  if (name == "gpt2") return ModelFamily::gpt2;
  if (name == "llama") return ModelFamily::llama;
  if (name == "qwen3") return ModelFamily::qwen3;
  if (name == "mixtral") return ModelFamily::mixtral;
  if (name == "qwen3-moe") return ModelFamily::qwen3_moe;
  QUINTET_THROW(InvalidArgument,
                "unknown model family \"{}\"; use gpt2, llama, qwen3, mixtral or qwen3-moe", name);
}

std::string_view model_family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::gpt2:
      return "gpt2";
    case ModelFamily::llama:
      return "llama";
    case ModelFamily::qwen3:
      return "qwen3";
    case ModelFamily::mixtral:
      return "mixtral";
    case ModelFamily::qwen3_moe:
      return "qwen3-moe";
  }
  return "?";
}

bool is_moe_family(ModelFamily family) {
  return family == ModelFamily::mixtral || family == ModelFamily::qwen3_moe;
}

nn::NormKind parse_norm_kind(std::string_view name) {
  if (name == "layernorm") return nn::NormKind::layernorm;
  if (name == "rmsnorm") return nn::NormKind::rmsnorm;
  QUINTET_THROW(InvalidArgument, "unknown norm \"{}\"; use layernorm or rmsnorm", name);
}

nn::Activation parse_activation(std::string_view name) {
  if (name == "gelu") return nn::Activation::gelu;
  if (name == "swiglu") return nn::Activation::swiglu;
  QUINTET_THROW(InvalidArgument, "unknown activation \"{}\"; use gelu or swiglu", name);
}

void GptConfig::set_family(ModelFamily f) {
  family = f;
  const bool gpt2 = f == ModelFamily::gpt2;
  const bool qwen3 = f == ModelFamily::qwen3 || f == ModelFamily::qwen3_moe;
  norm = gpt2 ? nn::NormKind::layernorm : nn::NormKind::rmsnorm;
  eps = qwen3 ? 1e-6f : 1e-5f;
  activation = gpt2 ? nn::Activation::gelu : nn::Activation::swiglu;
  learned_positions = gpt2;
  rope = !gpt2;
  rope_theta = gpt2 ? GptConfig{}.rope_theta : f == ModelFamily::llama ? 500000.0 : 1000000.0;
  rope_scaling = {};
  bias = gpt2;
  proj_bias = true;
  qk_norm = qwen3;
  if (!is_moe_family(f)) return;
  // The MoE shape of the family's published models: Mixtral 8x7B and 8x22B, 8 experts top-2 of
  // the MLP's width; Qwen3-30B-A3B and 235B-A22B, 128 experts top-8 of moe_intermediate_size =
  // 3/8 of hidden (768 of 2048, 1536 of 4096). Both dropless, without shared experts or a
  // balancing bias, every block MoE, softmax over all experts then the top k renormalized
  // (Qwen3's norm_topk_prob).
  const bool mixtral = f == ModelFamily::mixtral;
  expert::RouterConfig& r = moe.router;
  r.experts = mixtral ? 8 : 128;
  r.top_k = mixtral ? 2 : 8;
  r.score = expert::RouterScore::softmax;
  r.renormalize = true;
  r.capacity_factor = 0.0f;
  r.bias_rate = 0.0f;
  moe.expert_ffn = mixtral ? 0 : std::max<std::int64_t>(1, 3 * hidden / 8);
  moe.shared_experts = 0;
  moe.every = 1;
  moe.dense_layers.clear();
}

namespace {
// base with family's structure; an MoE family's makes every MLP an MoE.
GptConfig of_family(GptConfig base, ModelFamily family) {
  base.set_family(family);
  if (is_moe_family(family)) base.mlp = MlpKind::moe;
  return base;
}
}  // namespace

GptConfig GptConfig::gpt2(const GptConfig& base) { return of_family(base, ModelFamily::gpt2); }
GptConfig GptConfig::llama(const GptConfig& base) { return of_family(base, ModelFamily::llama); }
GptConfig GptConfig::qwen3(const GptConfig& base) { return of_family(base, ModelFamily::qwen3); }
GptConfig GptConfig::mixtral(const GptConfig& base) {
  return of_family(base, ModelFamily::mixtral);
}
GptConfig GptConfig::qwen3_moe(const GptConfig& base) {
  return of_family(base, ModelFamily::qwen3_moe);
}
GptConfig GptConfig::gpt2() { return gpt2(GptConfig{}); }
GptConfig GptConfig::llama() { return llama(GptConfig{}); }
GptConfig GptConfig::qwen3() { return qwen3(GptConfig{}); }
GptConfig GptConfig::mixtral() { return mixtral(GptConfig{}); }
GptConfig GptConfig::qwen3_moe() { return qwen3_moe(GptConfig{}); }

void GptConfig::validate(int tp, int cp) const {
  validate_block(tp, cp);
  QUINTET_CHECK(vocab > 0, "GptConfig: vocab = {} must be > 0", vocab);
  check_divides("vocab", vocab, tp);
}

void GptConfig::validate_block(int tp, int cp) const {
  const auto positive = [](const char* name, std::int64_t v) {
    QUINTET_CHECK(v > 0, "GptConfig: {} = {} must be > 0", name, v);
  };
  QUINTET_CHECK(family == ModelFamily::gpt2 || is_moe_family(family) == (mlp == MlpKind::moe),
                "GptConfig: family = {} with mlp = {}; {} is a {} family, so set mlp = {} (or "
                "another family)",
                model_family_name(family), mlp == MlpKind::moe ? "moe" : "dense",
                model_family_name(family), is_moe_family(family) ? "mixture-of-experts" : "dense",
                is_moe_family(family) ? "MlpKind::moe" : "MlpKind::dense");
  // A dense model with MoE settings would train dense, silently ignoring them.
  if (mlp == MlpKind::dense) {
    const std::string changed = changed_moe_settings(moe);
    QUINTET_CHECK(changed.empty(),
                  "GptConfig: {} set, but mlp = dense builds no MoE layer, so they would be "
                  "ignored and a dense model trained; set mlp = MlpKind::moe for a mixture of "
                  "experts, or leave moe at its defaults for a dense model",
                  changed);
  }
  QUINTET_CHECK(!fp8_lm_head || fp8.mode != nn::Fp8Mode::off,
                "GptConfig: fp8_lm_head with fp8 = off: the LM head's FP8 follows fp8's recipe; "
                "set fp8 = hybrid too, or leave fp8_lm_head off");
  if (fp8.mode != nn::Fp8Mode::off) {
    nn::check_fp8_recipe(fp8);
    QUINTET_CHECK(cp == 1,
                  "GptConfig: fp8 = hybrid with cp = {}: each cp rank would scale its chunks of "
                  "the sequence apart; FP8 takes cp 1 for now",
                  cp);
  }
  positive("layers", layers);
  positive("hidden", hidden);
  positive("heads", heads);
  positive("seq_len", seq_len);
  QUINTET_CHECK(ffn_hidden >= 0, "GptConfig: ffn_hidden = {} must be > 0, or 0 for 4 * hidden",
                ffn_hidden);
  QUINTET_CHECK(init_std > 0.0f && proj_init_std >= 0.0f && eps > 0.0f,
                "GptConfig: init_std = {} and eps = {} must be > 0, proj_init_std = {} >= 0",
                init_std, eps, proj_init_std);
  QUINTET_CHECK(kv_heads >= 0 && head_dim >= 0,
                "GptConfig: kv_heads = {} and head_dim = {} must be > 0, or 0 for heads and "
                "hidden / heads",
                kv_heads, head_dim);
  QUINTET_CHECK(head_dim > 0 || hidden % heads == 0,
                "GptConfig: hidden = {} is not divisible by heads = {}; the head dimension is "
                "hidden / heads unless head_dim is set",
                hidden, heads);
  QUINTET_CHECK(heads % kv_head_count() == 0,
                "GptConfig: kv_heads = {} does not divide heads = {}; each key/value head serves "
                "heads / kv_heads query heads",
                kv_head_count(), heads);
  QUINTET_CHECK(learned_positions != rope,
                "GptConfig: learned_positions = {} and rope = {}; a model needs exactly one kind "
                "of position information (without either it cannot tell the order of tokens)",
                learned_positions, rope);
  QUINTET_CHECK(!rope || (head_size() % 2 == 0 && rope_theta > 0.0),
                "GptConfig: RoPE rotates pairs of the head dimension, which must be even (head "
                "dim = {}), with rope_theta > 0 (got {})",
                head_size(), rope_theta);
  QUINTET_CHECK(rope || rope_scaling.factor == 0.0,
                "GptConfig: rope_scaling (factor {}) without RoPE; set rope", rope_scaling.factor);
  nn::check_rope_scaling(rope_scaling, "GptConfig");
  QUINTET_CHECK(tp >= 1, "GptConfig: the tensor-parallel size tp = {} must be >= 1", tp);
  check_divides("heads", heads, tp);
  QUINTET_CHECK(kv_head_count() % tp == 0 || tp % kv_head_count() == 0,
                "GptConfig: kv_heads = {} and tp = {}: each tp rank holds the key/value heads its "
                "query heads read, split over tp when kv_heads is a multiple of tp and replicated "
                "over tp / kv_heads ranks when tp is a multiple of kv_heads; use such a pair",
                kv_head_count(), tp);
  check_divides("the MLP width (ffn_hidden)", mlp_width(), tp);
  QUINTET_CHECK(cp >= 1, "GptConfig: the context-parallel size cp = {} must be >= 1", cp);
  if (cp > 1) {
    context::check_cp_sequence(seq_len, cp);
    QUINTET_CHECK(!sequence_parallel || (seq_len / cp) % tp == 0,
                  "GptConfig: with sequence parallelism each cp rank's {} tokens (seq_len {} / cp "
                  "{}) split over tp {}, which does not divide them",
                  seq_len / cp, seq_len, cp, tp);
    QUINTET_CHECK(context_parallel != context::ContextParallelKind::all_to_all ||
                      heads % (static_cast<std::int64_t>(tp) * cp) == 0,
                  "GptConfig: all-to-all (ulysses) context parallelism splits the heads over tp "
                  "x cp, and heads = {} is not divisible by tp {} x cp {}; use ring attention or "
                  "another head count",
                  heads, tp, cp);
    if (context_parallel == context::ContextParallelKind::all_to_all) {
      // The key/value heads of each tp rank (one when replicated), split or repeated over cp.
      const std::int64_t local_kv = std::max<std::int64_t>(kv_head_count() / tp, 1);
      context::check_ulysses_heads(
          "GptConfig", heads / tp, local_kv, cp,
          fmt::format("heads {}, kv_heads {}, tp {}", heads, kv_head_count(), tp));
    }
  }
  QUINTET_CHECK(tp_overlap_chunks >= 1, "GptConfig: tp_overlap_chunks = {} must be >= 1",
                tp_overlap_chunks);
  if (tp > 1 && tp_overlap_chunks > 1) {
    const std::int64_t local = seq_len / cp / (sequence_parallel ? tp : 1);
    QUINTET_CHECK(local % tp_overlap_chunks == 0,
                  "GptConfig: tp overlap cuts each rank's sequence of {} tokens (seq_len {}{}{}) "
                  "into {} chunks, which do not divide it; choose a chunk count that divides {}",
                  local, seq_len, cp > 1 ? fmt::format(" / cp {}", cp) : std::string(),
                  sequence_parallel ? fmt::format(" / tp {}", tp) : std::string(),
                  tp_overlap_chunks, local);
  }
}

void GptConfig::validate_experts(int ep, int etp) const {
  if (mlp != MlpKind::moe) {
    QUINTET_CHECK(ep == 1,
                  "GptConfig: an expert-parallel layout (ep = {}) with mlp = dense: a dense model "
                  "has no experts to spread over ep, and its ep ranks would only repeat data "
                  "parallelism; set mlp = MlpKind::moe for a mixture of experts, or ep = 1",
                  ep);
    return;
  }
  moe.router.validate();
  QUINTET_CHECK(moe.every >= 1, "GptConfig: moe.every = {} must be >= 1", moe.every);
  for (std::size_t i = 0; i < moe.dense_layers.size(); ++i) {
    const std::int64_t l = moe.dense_layers[i];
    QUINTET_CHECK(l >= 0 && l < layers,
                  "GptConfig: moe.dense_layers holds block {}, and the model's blocks are 0 .. {}",
                  l, layers - 1);
    QUINTET_CHECK(i == 0 || l > moe.dense_layers[i - 1],
                  "GptConfig: moe.dense_layers [{}] is not ascending (each block once)",
                  layer_list_text(moe.dense_layers));
    QUINTET_CHECK(l % moe.every == 0,
                  "GptConfig: moe.dense_layers holds block {}, which is dense already (moe.every "
                  "= {} makes MoE only the blocks l % {} == 0); drop it from the list",
                  l, moe.every, moe.every);
  }
  std::int64_t moe_blocks = 0;
  for (std::int64_t l = 0; l < layers; ++l) moe_blocks += is_moe_block(l) ? 1 : 0;
  QUINTET_CHECK(moe_blocks > 0,
                "GptConfig: mlp = moe, and no block is MoE (moe.every = {}, moe.dense_layers [{}] "
                "of {} blocks): the MoE settings would be ignored; leave a block MoE, or train a "
                "dense model (mlp = dense)",
                moe.every, layer_list_text(moe.dense_layers), layers);
  QUINTET_CHECK(moe.expert_ffn >= 0 && moe.shared_experts >= 0,
                "GptConfig: moe.expert_ffn = {} and moe.shared_experts = {} must be >= 0",
                moe.expert_ffn, moe.shared_experts);
  QUINTET_CHECK(ep >= 1 && moe.router.experts % ep == 0,
                "GptConfig: {} experts are not divisible by the expert-parallel size ep = {}; "
                "use a multiple of {} experts or another ep",
                moe.router.experts, ep, ep);
  QUINTET_CHECK(etp >= 1 && expert_width() % etp == 0,
                "GptConfig: the expert width {} is not divisible by the expert-tensor-parallel "
                "size etp = {}",
                expert_width(), etp);
}

namespace {
// Parameters of each block's parts: the attention, the dense MLP, the norms, and an MoE MLP with
// `experts` of its experts counted.
std::int64_t dense_mlp_params(const GptConfig& c, std::int64_t f) {
  const std::int64_t d = c.hidden;
  return c.activation == nn::Activation::gelu ? 2 * d * f + f + d : 3 * d * f;
}
std::int64_t moe_mlp_params(const GptConfig& c, std::int64_t experts) {
  const std::int64_t d = c.hidden, f = c.expert_width();
  const std::int64_t per_expert = (c.activation == nn::Activation::gelu ? 2 : 3) * d * f;
  const std::int64_t shared =
      c.moe.shared_experts > 0 ? dense_mlp_params(c, c.moe.shared_experts * f) : 0;
  return c.moe.router.experts * d + experts * per_expert + shared;
}
std::int64_t block_params(const GptConfig& c, bool active) {
  const std::int64_t d = c.hidden;
  const std::int64_t norm_params = c.norm == nn::NormKind::layernorm ? 2 * d : d;
  // q, k, v and the output projection (and the QK-norm weights).
  const std::int64_t a = c.heads * c.head_size(), kv = c.kv_head_count() * c.head_size();
  const std::int64_t attn = 2 * d * a + 2 * d * kv +
                            (c.bias ? a + 2 * kv + (c.proj_bias ? d : 0) : 0) +
                            (c.qk_norm ? 2 * c.head_size() : 0);
  std::int64_t total = 0;
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::int64_t mlp =
        c.is_moe_block(l) ? moe_mlp_params(c, active ? c.moe.router.top_k : c.moe.router.experts)
                          : dense_mlp_params(c, c.mlp_width());
    total += attn + mlp + 2 * norm_params;
  }
  return total + norm_params + d * c.vocab;  // the final norm and the head
}
}  // namespace

std::int64_t GptConfig::non_embedding_params() const { return block_params(*this, false); }

std::int64_t GptConfig::active_non_embedding_params() const { return block_params(*this, true); }

std::int64_t GptConfig::total_params() const {
  const std::int64_t d = hidden;
  return non_embedding_params() - (tied_embeddings ? d * vocab : 0) + vocab * d +
         (learned_positions ? seq_len * d : 0);
}

}  // namespace quintet::model
