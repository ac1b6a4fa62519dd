// Loading a Hugging Face checkpoint's weights into a TrainingModel (hf_checkpoint.hpp): every
// check first, on every rank and without communication; then each rank reads its own boxes.
#include <fmt/format.h>

#include <unordered_set>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/data/safetensors.hpp"
#include "quintet/nn/optimizer.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"  // run_on_every_rank
#include "quintet/parallel/train/hf_checkpoint.hpp"

namespace quintet::train {

namespace {

// The model a job built from hf must have: config.json's values, by its keys.
void check_model_is(const HfModel& hf, const model::GptConfig& m) {
  const model::GptConfig& h = hf.model;
  const auto check = [&](const char* key, auto ours, auto theirs) {
    QUINTET_CHECK(ours == theirs,
                  "load_hf_weights: the model has {} = {}, {} says {}; build the model from a job "
                  "that apply_hf_config set from it",
                  key, ours, hf.config_path, theirs);
  };
  check("family", model::model_family_name(m.family), model::model_family_name(h.family));
  check("num_hidden_layers", m.layers, h.layers);
  check("hidden_size", m.hidden, h.hidden);
  check("num_attention_heads", m.heads, h.heads);
  check("num_key_value_heads", m.kv_head_count(), h.kv_head_count());
  check("head_dim", m.head_size(), h.head_size());
  check("vocab_size", m.vocab, h.vocab);
  check("tie_word_embeddings", m.tied_embeddings, h.tied_embeddings);
  check("attention_bias", m.bias, h.bias);
  check("o_proj bias", m.bias && m.proj_bias, h.bias && h.proj_bias);
  check("qk_norm", m.qk_norm, h.qk_norm);
  check("rms_norm_eps", m.eps, h.eps);
  check("rope_theta", m.rope_theta, h.rope_theta);
  check("rope_scaling factor", m.rope_scaling.factor, h.rope_scaling.factor);
  check("rope_scaling low_freq_factor", m.rope_scaling.low_freq_factor,
        h.rope_scaling.low_freq_factor);
  check("rope_scaling high_freq_factor", m.rope_scaling.high_freq_factor,
        h.rope_scaling.high_freq_factor);
  check("rope_scaling original_max_position_embeddings",
        m.rope_scaling.original_max_position_embeddings,
        h.rope_scaling.original_max_position_embeddings);
  check("norm", static_cast<int>(m.norm), static_cast<int>(h.norm));
  check("activation", static_cast<int>(m.activation), static_cast<int>(h.activation));
  check("rope", m.rope, h.rope);
  check("moe", m.mlp == model::MlpKind::moe, h.mlp == model::MlpKind::moe);
  if (h.mlp == model::MlpKind::moe) {
    check("experts", m.moe.router.experts, h.moe.router.experts);
    check("num_experts_per_tok", m.moe.router.top_k, h.moe.router.top_k);
    check("norm_topk_prob", m.moe.router.renormalize, h.moe.router.renormalize);
    check("router softmax", m.moe.router.score == expert::RouterScore::softmax, true);
    check("expert width", m.expert_width(), h.expert_width());
    check("shared experts", m.moe.shared_experts, 0);
  }
  const auto dense_blocks = [](const model::GptConfig& c) {
    std::vector<std::int64_t> out;
    for (std::int64_t l = 0; l < c.layers; ++l) {
      if (!c.is_moe_block(l)) out.push_back(l);
    }
    return out;
  };
  const std::vector<std::int64_t> dense = dense_blocks(h);
  check("dense layers (decoder_sparse_step, mlp_only_layers)",
        model::layer_list_text(dense_blocks(m)), model::layer_list_text(dense));
  if (!dense.empty()) check("intermediate_size", m.mlp_width(), h.mlp_width());
}

// How this checkpoint names its MoE blocks: the module (block_sparse_moe or mlp) and whether
// the experts are transformers 5's fused tensors, by what the first MoE layer holds.
HfNaming naming_of(const HfModel& hf, const data::SafetensorsCheckpoint& ckpt) {
  HfNaming n = hf.naming;
  if (hf.model.mlp != model::MlpKind::moe) return n;
  std::int64_t first = 0;
  while (first + 1 < hf.model.layers && !hf.model.is_moe_block(first)) ++first;
  for (const std::string& module : {hf.naming.moe_module, std::string("mlp")}) {
    const std::string p = fmt::format("model.layers.{}.{}.experts.", first, module);
    if (ckpt.contains(p + "gate_up_proj")) {
      n.moe_module = module;
      n.fused_experts = true;
      return n;
    }
    if (ckpt.contains(p + "0." + n.expert_gate + ".weight")) {
      n.moe_module = module;
      return n;
    }
  }
  return n;  // the missing tensors are named by the check that follows
}

bool ignored(const std::string& name, const model::GptConfig& m) {
  // Older checkpoints hold RoPE's inverse frequencies (a buffer); a tied model's lm_head, when a
  // file has one, is the embedding for Hugging Face too.
  return name.ends_with(".rotary_emb.inv_freq") || (m.tied_embeddings && name == "lm_head.weight");
}

// The file holding name (for messages).
std::string file_of(const data::SafetensorsCheckpoint& ckpt, const std::string& name) {
  return ckpt.file_of(name).path();
}

// Every tensor the model needs is in ckpt, of a float dtype and config.json's shape; every tensor
// of ckpt is one the model uses.
void check_tensors(const HfModel& hf, const HfNaming& naming,
                   const data::SafetensorsCheckpoint& ckpt) {
  const auto expected = hf_tensors(hf.model, naming);
  std::unordered_set<std::string> names;
  for (const auto& [name, shape] : expected) {
    names.insert(name);
    QUINTET_CHECK(ckpt.contains(name), "{}: no tensor {}, which the {} model of {} has{}",
                  ckpt.path(), name, hf.architecture, hf.config_path,
                  hf.model.mlp == model::MlpKind::moe
                      ? fmt::format(" (experts looked for as {}.experts.E.{}.weight or the fused "
                                    "experts.gate_up_proj / down_proj)",
                                    naming.moe_module, naming.expert_gate)
                      : std::string());
    const data::SafetensorsEntry& e = ckpt.entry(name);
    QUINTET_CHECK(e.supported && is_floating(e.dtype) && e.dtype != DType::f64,
                  "{}: tensor {} is {}; Quintet imports F32, BF16 and F16 weights",
                  file_of(ckpt, name), name, e.dtype_name);
    ckpt.check_shape(name, shape, hf.config_path);
  }
  for (const std::string& name : ckpt.names()) {
    QUINTET_CHECK(names.contains(name) || ignored(name, hf.model),
                  "{}: tensor {} is not part of the {} model {} describes (left unused, the "
                  "import would not be the model the checkpoint holds)",
                  file_of(ckpt, name), name, hf.architecture, hf.config_path);
  }
}

// What one parameter of this rank reads: its box of the global tensor and the pieces of
// Hugging Face tensors in it.
struct Read {
  std::string hf_name;
  std::vector<data::IndexRange> hf_box;  // in the Hugging Face tensor
  Shape local_start, sizes;              // in this rank's parameter
};
struct ParameterReads {
  nn::Parameter* param;
  std::vector<Read> reads;
};

std::vector<ParameterReads> plan(const model::GptConfig& m, const HfNaming& naming,
                                 TrainingStage& stage) {
  std::vector<ParameterReads> out;
  for (nn::Parameter* p : stage.store->parameters()) {
    const nn::ParameterAttributes& a = p->attributes();
    const Shape& local = p->shape();
    const Shape global = a.full_shape.empty() ? local : a.full_shape;
    const Shape start = a.full_shape.empty() ? Shape(local.size(), 0) : a.shard_start;
    const HfParameter hp = hf_parameter(m, naming, p->name());
    QUINTET_CHECK(hp.global_shape == global,
                  "load_hf_weights: parameter {} is {} in the model, {} in the Hugging Face "
                  "mapping",
                  p->name(), shape_str(global), shape_str(hp.global_shape));
    ParameterReads pr{p, {}};
    std::int64_t covered = 0;
    for (const HfPiece& piece : hp.pieces) {
      Read r{piece.hf_name, {}, {}, {}};
      const std::size_t drop = global.size() - piece.hf_shape.size();  // 0 or 1
      bool empty = false;
      std::int64_t n = 1;
      for (std::size_t i = 0; i < global.size(); ++i) {
        const std::int64_t lo = std::max(start[i], piece.start[i]);
        const std::int64_t hi = std::min(start[i] + local[i], piece.start[i] + piece.sizes[i]);
        empty = empty || hi <= lo;
        r.local_start.push_back(lo - start[i]);
        r.sizes.push_back(hi - lo);
        n *= std::max<std::int64_t>(hi - lo, 0);
        if (i >= drop) {
          const std::int64_t b = piece.hf_start[i - drop] + (lo - piece.start[i]);
          r.hf_box.push_back({b, b + (hi - lo)});
        }
      }
      if (empty) continue;
      covered += n;
      pr.reads.push_back(std::move(r));
    }
    QUINTET_CHECK(covered == p->numel(),
                  "load_hf_weights: the Hugging Face pieces cover {} of the {} elements of {}",
                  covered, p->numel(), p->name());
    out.push_back(std::move(pr));
  }
  return out;
}

}  // namespace

void load_hf_weights(const HfModel& hf, TrainingModel& model, Communicator& world) {
  const model::GptConfig& m = model.config().model;
  check_model_is(hf, m);
  const data::SafetensorsCheckpoint ckpt = data::SafetensorsCheckpoint::open(hf.dir);
  const HfNaming naming = naming_of(hf, ckpt);
  check_tensors(hf, naming, ckpt);
  std::vector<std::vector<ParameterReads>> plans;
  for (TrainingStage& s : model.stages()) plans.push_back(plan(m, naming, s));

  const Stream& stream = model.stream();
  checkpoint::run_on_every_rank(world, "load_hf_weights", [&] {
    for (std::size_t si = 0; si < plans.size(); ++si) {
      TrainingStage& s = model.stages()[si];
      const nn::ParameterStore& store = *s.store;
      s.optimizer->wait_for_parameters(stream);
      const DType acc = nn::accum_dtype(store.dtype());
      // One parameter at a time (no buffer the size of the store): its exact value read in the
      // accumulation dtype, given to the optimizer's master copy, then rounded into p.data().
      s.optimizer->restart(stream);
      for (const ParameterReads& pr : plans[si]) {
        nn::Parameter& p = *pr.param;
        Tensor master = Tensor::empty(p.shape(), acc, store.device(), stream);
        master.fill_(0.0, stream);  // what no HF tensor covers (a padded vocabulary's rows)
        for (const Read& r : pr.reads) {
          Tensor dest = master;
          for (std::size_t i = 0; i < r.sizes.size(); ++i)
            dest = dest.narrow(static_cast<int>(i), r.local_start[i], r.sizes[i]);
          const Tensor src = ckpt.read_box(r.hf_name, r.hf_box, acc).view(r.sizes);
          dest.copy_(src.to(store.device(), stream), stream);
        }
        s.optimizer->set_master(p, master, stream);
        p.data().copy_(master.to(p.data().dtype(), stream), stream);
      }
      for (expert::MoELayer* layer : s.chunk->moe_layers()) {  // balancing starts fresh too
        layer->set_balance_bias(
            std::vector<float>(static_cast<std::size_t>(layer->balance_bias().numel()), 0.0f));
      }
      stream.synchronize();
    }
  });
}

}  // namespace quintet::train
