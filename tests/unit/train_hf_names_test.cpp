// The mapping between our parameters and Hugging Face tensors (train/hf_names.hpp), both ways:
// every parameter of each family's model is tiled exactly by its pieces, each piece a box of one
// Hugging Face tensor of the same sizes, and every Hugging Face tensor is covered exactly once by
// the pieces (so an export writes each element once); the names and shapes of a few by hand;
// Qwen3-MoE's sparse layers (decoder_sparse_step, mlp_only_layers) to dense blocks and back.
#include <map>
#include <string>
#include <vector>

#include "quintet/parallel/train/hf_names.hpp"
#include "support/catch.hpp"

using namespace quintet;
using train::HfNaming;

namespace {

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (const std::int64_t d : s) n *= d;
  return n;
}

model::GptConfig family(model::ModelFamily f) {
  model::GptConfig m;
  m.mlp = model::is_moe_family(f) ? model::MlpKind::moe : model::MlpKind::dense;
  m.set_family(f);
  m.layers = 2;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 6;
  m.ffn_hidden = 20;
  m.vocab = 30;
  if (m.mlp == model::MlpKind::moe) {
    m.moe.router.experts = 3;
    m.moe.router.top_k = 2;
    m.moe.expert_ffn = 10;
  }
  return m;
}

// Elements of each Hugging Face tensor the pieces of every parameter cover, checking each piece
// against its tensor and each parameter's pieces against the parameter.
std::map<std::string, std::int64_t> cover(const model::GptConfig& m, const HfNaming& n) {
  std::map<std::string, std::int64_t> covered;
  for (const std::string& name : train::hf_parameter_names(m)) {
    INFO(name);
    const train::HfParameter p = train::hf_parameter(m, n, name);
    std::int64_t total = 0;
    for (const train::HfPiece& piece : p.pieces) {
      INFO(piece.hf_name);
      REQUIRE(piece.start.size() == p.global_shape.size());
      const std::size_t drop = p.global_shape.size() - piece.hf_shape.size();
      REQUIRE(drop <= 1);
      if (drop == 1) REQUIRE(piece.sizes[0] == 1);
      for (std::size_t i = 0; i < p.global_shape.size(); ++i) {
        REQUIRE(piece.start[i] + piece.sizes[i] <= p.global_shape[i]);
        if (i >= drop)
          REQUIRE(piece.hf_start[i - drop] + piece.sizes[i] <= piece.hf_shape[i - drop]);
      }
      total += numel(piece.sizes);
      covered[piece.hf_name] += numel(piece.sizes);
    }
    CHECK(total == numel(p.global_shape));  // (the pieces are disjoint by construction: rows)
  }
  return covered;
}

}  // namespace

TEST_CASE("hf names: each family's parameters and Hugging Face tensors cover each other",
          "[train]") {
  for (const auto f : {model::ModelFamily::llama, model::ModelFamily::qwen3,
                       model::ModelFamily::mixtral, model::ModelFamily::qwen3_moe}) {
    for (const bool fused : {false, true}) {
      for (const bool tied : {false, true}) {
        INFO(model::model_family_name(f) << " fused " << fused << " tied " << tied);
        model::GptConfig m = family(f);
        m.tied_embeddings = tied;
        m.bias = f == model::ModelFamily::llama;  // q/k/v/o biases, as attention_bias
        HfNaming n = train::hf_naming(f);
        n.fused_experts = fused;
        const auto covered = cover(m, n);
        const auto tensors = train::hf_tensors(m, n);
        REQUIRE(covered.size() == tensors.size());
        for (const auto& [name, shape] : tensors) {
          INFO(name);
          CHECK(covered.at(name) == numel(shape));
        }
      }
    }
  }
}

TEST_CASE("hf names: Qwen3-MoE's dense layers, to moe.dense_layers and back", "[train]") {
  using Layers = std::vector<std::int64_t>;
  // transformers' rule: sparse iff not in mlp_only_layers and (l + 1) % step == 0.
  CHECK(train::hf_dense_layers(6, {2, {3}}) == Layers{0, 2, 3, 4});
  CHECK(train::hf_dense_layers(6, {1, {}}).empty());
  CHECK(train::hf_dense_layers(5, {3, {}}) == Layers{0, 1, 3, 4});
  CHECK(train::hf_dense_layers(4, {1, {0, 1}}) == Layers{0, 1});
  // Every pattern of 5 blocks with an MoE block (moe.every 1 and a list, or every 2 or 3): the
  // settings chosen make exactly those blocks sparse, and the usual ones come back as they were.
  model::GptConfig m = family(model::ModelFamily::qwen3_moe);
  m.layers = 5;
  for (const int every : {1, 2, 3}) {
    for (int mask = 0; mask < 32; ++mask) {
      m.moe.every = every;
      m.moe.dense_layers.clear();
      for (std::int64_t l = 0; l < 5; ++l) {
        if ((mask >> l & 1) != 0 && l % every == 0) m.moe.dense_layers.push_back(l);
      }
      Layers dense;
      for (std::int64_t l = 0; l < 5; ++l) {
        if (!m.is_moe_block(l)) dense.push_back(l);
      }
      if (dense.size() == 5) continue;
      INFO("every " << every << " dense " << model::layer_list_text(dense));
      CHECK(train::hf_dense_layers(5, train::hf_sparse_layers(m)) == dense);
    }
  }
  m.layers = 6;
  m.moe.every = 1;
  for (const train::HfSparseLayers& keys :
       {train::HfSparseLayers{1, {}}, {2, {}}, {2, {3}}, {1, {0, 1, 2}}, {3, {}}, {1, {5}}}) {
    m.moe.dense_layers = train::hf_dense_layers(6, keys);
    const train::HfSparseLayers back = train::hf_sparse_layers(m);
    CHECK(back.decoder_sparse_step == keys.decoder_sparse_step);
    CHECK(back.mlp_only_layers == keys.mlp_only_layers);
  }
  // A dense block of a Qwen3-MoE model is Qwen3MoeMLP, of intermediate_size; the MoE ones mlp.gate
  // and per-expert mlp.experts.E; the two cover each other.
  m.moe.dense_layers = {0, 2, 3, 4};
  const HfNaming n = train::hf_naming(model::ModelFamily::qwen3_moe);
  const train::HfParameter fc = train::hf_parameter(m, n, "block3.mlp.fc.weight");
  REQUIRE(fc.pieces.size() == 1);
  CHECK(fc.pieces[0].hf_name == "model.layers.3.mlp.gate_proj.weight");
  CHECK(fc.pieces[0].hf_shape == Shape{20, 16});
  CHECK(train::hf_parameter(m, n, "block5.mlp.router.weight").pieces[0].hf_name ==
        "model.layers.5.mlp.gate.weight");
  REQUIRE_THROWS_QUINTET(train::hf_parameter(m, n, "block0.mlp.router.weight"), InvalidArgument,
                         "no Hugging Face counterpart");
  const auto covered = cover(m, n);
  const auto tensors = train::hf_tensors(m, n);
  REQUIRE(covered.size() == tensors.size());
  for (const auto& [name, shape] : tensors) CHECK(covered.at(name) == numel(shape));
}

TEST_CASE("hf names: the Hub's names and shapes", "[train]") {
  model::GptConfig m = family(model::ModelFamily::mixtral);
  const HfNaming mixtral = train::hf_naming(model::ModelFamily::mixtral);
  // q apart and k, v fused with GQA; the experts stacked, Mixtral's names.
  const train::HfParameter kv = train::hf_parameter(m, mixtral, "block1.attn.kv.weight");
  CHECK(kv.global_shape == Shape{2, 12, 16});
  REQUIRE(kv.pieces.size() == 2);
  CHECK(kv.pieces[1].hf_name == "model.layers.1.self_attn.v_proj.weight");
  CHECK(kv.pieces[1].start == Shape{1, 0, 0});
  const train::HfParameter down = train::hf_parameter(m, mixtral, "block0.mlp.experts.proj.weight");
  CHECK(down.global_shape == Shape{3, 16, 10});
  REQUIRE(down.pieces.size() == 3);
  CHECK(down.pieces[2].hf_name == "model.layers.0.block_sparse_moe.experts.2.w2.weight");
  CHECK(down.pieces[2].hf_shape == Shape{16, 10});
  CHECK(train::hf_parameter(m, mixtral, "block0.mlp.router.weight").pieces[0].hf_name ==
        "model.layers.0.block_sparse_moe.gate.weight");
  // transformers 5's fused experts: up is the second half of gate_up_proj's rows.
  HfNaming fused = train::hf_naming(model::ModelFamily::qwen3_moe);
  fused.fused_experts = true;
  m = family(model::ModelFamily::qwen3_moe);
  const train::HfParameter up = train::hf_parameter(m, fused, "block1.mlp.experts.up.weight");
  REQUIRE(up.pieces.size() == 1);
  CHECK(up.pieces[0].hf_name == "model.layers.1.mlp.experts.gate_up_proj");
  CHECK(up.pieces[0].hf_shape == Shape{3, 20, 16});
  CHECK(up.pieces[0].hf_start == Shape{0, 10, 0});
  // Qwen2: no o_proj bias.
  m = family(model::ModelFamily::llama);
  m.bias = true;
  m.proj_bias = false;
  for (const auto& [name, shape] : train::hf_tensors(m, {}))
    CHECK(name.find("o_proj.bias") == std::string::npos);
  // Names the Hub has no counterpart for.
  REQUIRE_THROWS_QUINTET(train::hf_parameter(m, {}, "wpe.weight"), InvalidArgument,
                         "no Hugging Face counterpart");
  REQUIRE_THROWS_QUINTET(train::hf_parameter(m, {}, "block7.norm1.weight"), InvalidArgument,
                         "of 2 layers");
  m.tied_embeddings = true;
  REQUIRE_THROWS_QUINTET(train::hf_parameter(m, {}, "lm_head.weight"), InvalidArgument,
                         "no Hugging Face counterpart");
}
