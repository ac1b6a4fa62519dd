// The library model (quintet/parallel/model/) in one process, at tp = 1 over a one-rank
// communicator: a model cut into 1, 2, 3 and 4 chunks holds exactly the one-chunk model's
// parameters (same names, same initial values), and running the chunks one after another gives
// the one-chunk model's loss and gradients bit for bit; tied embeddings equal an untied model whose
// head is a copy of the table, with the two gradients summed; a backward split into I and a
// deferred W (zero-bubble pipelines) equals the whole one; a tied table cut across chunks is an
// owner and a copy whose gradients sum to the one-chunk model's; the parameter counts equal the
// parameters built; an MoE model with dense blocks (moe.dense_layers) holds each block's own MLP
// and computes the same cut into chunks across the dense/MoE boundaries; and the bad inputs are
// refused with a message that names them.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "quintet/collectives/mpi.hpp"
#include "quintet/parallel/model/gpt.hpp"
#include "support/catch.hpp"
#include "support/gpt_small.hpp"

using namespace quintet;

namespace {

const Stream kCpu;

using gpt_small::Batch;
using gpt_small::make_batch;
model::GptConfig small_config() { return gpt_small::config(); }

std::vector<float> host(const Tensor& t) { return t.contiguous().to_vector<float>(); }

// Every parameter of a module tree by its full name.
std::map<std::string, nn::Parameter*> by_name(const nn::Module& m) {
  std::map<std::string, nn::Parameter*> out;
  for (auto& [name, p] : m.named_parameters()) {
    REQUIRE(out.emplace(name, p).second);
  }
  return out;
}

// Forward through the chunks in order, then backward in reverse: the loss.
Tensor run_chunks(std::vector<std::unique_ptr<model::GptChunk>>& chunks, const Batch& b,
                  float loss_scale) {
  nn::Context ctx(kCpu);
  ctx.set_targets(b.targets, loss_scale);
  Tensor x = b.ids;
  for (auto& chunk : chunks) x = chunk->forward(ctx, x);
  Tensor d;
  for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) d = (*it)->backward(ctx, d);
  REQUIRE(!d.defined());
  REQUIRE(ctx.pending() == 0);
  return x;
}

}  // namespace

TEST_CASE("model: chunks partition the one-chunk model and compute it bit for bit", "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  const model::ModelGroups groups{solo.get()};
  model::GptConfig c = small_config();
  c.activation = GENERATE(nn::Activation::gelu, nn::Activation::swiglu);
  const int n = GENERATE(1, 2, 3, 4);
  INFO(n << " chunks, swiglu = " << (c.activation == nn::Activation::swiglu));

  auto whole = model::build_gpt_chunk(c, groups, model::ChunkSpec::whole(c));
  nn::ParameterStore whole_store(*whole, DType::f32, kCpu, 77);
  const auto specs = model::split_into_chunks(c, n);
  REQUIRE(specs.size() == static_cast<std::size_t>(n));
  std::vector<std::unique_ptr<model::GptChunk>> chunks;
  std::vector<std::unique_ptr<nn::ParameterStore>> stores;
  std::int64_t next_layer = 0;
  for (const model::ChunkSpec& s : specs) {
    CHECK(s.first_layer == next_layer);
    CHECK(s.num_layers >= c.layers / n);
    CHECK(s.num_layers <= c.layers / n + 1);
    next_layer += s.num_layers;
    chunks.push_back(model::build_gpt_chunk(c, groups, s));
    stores.push_back(std::make_unique<nn::ParameterStore>(*chunks.back(), DType::f32, kCpu, 77));
  }
  CHECK(next_layer == c.layers);
  CHECK(specs.front().embedding);
  CHECK(specs.back().head);

  // The same names, each in exactly one chunk, with the same initial values.
  const auto want = by_name(*whole);
  std::map<std::string, nn::Parameter*> got;
  for (auto& chunk : chunks) {
    for (auto& [name, p] : by_name(*chunk)) REQUIRE(got.emplace(name, p).second);
  }
  REQUIRE(got.size() == want.size());
  for (auto& [name, p] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(host(got[name]->data()) == host(p->data()));
  }

  // The loss and every gradient, bit for bit, over two microbatches of accumulation.
  for (int micro = 0; micro < 2; ++micro) {
    const Batch b = make_batch(c, 10 + micro);
    std::vector<std::unique_ptr<model::GptChunk>> one;
    one.push_back(std::move(whole));
    const Tensor want_loss = run_chunks(one, b, 0.5f);
    whole = std::move(one.front());
    const Tensor got_loss = run_chunks(chunks, b, 0.5f);
    CHECK(got_loss.item() == want_loss.item());
    CHECK(got_loss.item() > 0.0);
  }
  for (auto& [name, p] : want) {
    INFO("gradient of " << name);
    CHECK(host(got[name]->grad()) == host(p->grad()));
  }
}

TEST_CASE("model: tied embeddings equal an untied head that copies the table", "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  const model::ModelGroups groups{solo.get()};
  model::GptConfig tied = small_config();
  tied.tied_embeddings = true;
  model::GptConfig untied = small_config();
  auto a = model::build_gpt_chunk(tied, groups, model::ChunkSpec::whole(tied));
  auto b = model::build_gpt_chunk(untied, groups, model::ChunkSpec::whole(untied));
  nn::ParameterStore sa(*a, DType::f32, kCpu, 5), sb(*b, DType::f32, kCpu, 5);
  REQUIRE(sa.parameters().size() + 1 == sb.parameters().size());
  nn::Parameter& table = sb.find("wte.weight");
  sb.find("lm_head.weight").data().copy_(table.data());

  const Batch batch = make_batch(tied, 3);
  nn::Context ca(kCpu), cb(kCpu);
  ca.set_targets(batch.targets);
  cb.set_targets(batch.targets);
  const double la = a->forward(ca, batch.ids).item(), lb = b->forward(cb, batch.ids).item();
  CHECK(la == Approx(lb).epsilon(1e-6));
  a->backward(ca, Tensor());
  b->backward(cb, Tensor());
  const std::vector<float> ga = host(sa.find("wte.weight").grad());
  const std::vector<float> g_table = host(table.grad());
  const std::vector<float> g_head = host(sb.find("lm_head.weight").grad());
  REQUIRE(ga.size() == g_table.size());
  for (std::size_t i = 0; i < ga.size(); ++i) {
    INFO("element " << i);
    CHECK(ga[i] == Approx(g_table[i] + g_head[i]).margin(1e-6).epsilon(1e-4));
  }
  CHECK(tied.total_params() + tied.vocab * tied.hidden == untied.total_params());
  CHECK(tied.non_embedding_params() == untied.non_embedding_params());
}

TEST_CASE(
    "model: a tied table cut across chunks is an owner and a copy whose gradients sum to "
    "the one-chunk model's",
    "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  const model::ModelGroups groups{solo.get()};
  model::GptConfig c = small_config();
  c.tied_embeddings = true;
  const int n = GENERATE(2, 3);
  INFO(n << " chunks");
  auto whole = model::build_gpt_chunk(c, groups, model::ChunkSpec::whole(c));
  nn::ParameterStore whole_store(*whole, DType::f32, kCpu, 9);
  CHECK(whole_store.find("wte.weight").attributes().tied == nn::TiedRole::none);
  std::vector<std::unique_ptr<model::GptChunk>> chunks;
  std::vector<std::unique_ptr<nn::ParameterStore>> stores;
  for (const model::ChunkSpec& s : model::split_into_chunks(c, n)) {
    chunks.push_back(model::build_gpt_chunk(c, groups, s));
    stores.push_back(std::make_unique<nn::ParameterStore>(*chunks.back(), DType::f32, kCpu, 9));
  }
  nn::Parameter& owner = stores.front()->find("wte.weight");
  nn::Parameter& copy = stores.back()->find("wte.weight");
  CHECK(owner.attributes().tied == nn::TiedRole::owner);
  CHECK(copy.attributes().tied == nn::TiedRole::copy);
  CHECK(host(owner.data()) == host(whole_store.find("wte.weight").data()));
  CHECK(host(copy.data()) == host(owner.data()));  // one name, one init draw
  REQUIRE_THROWS_QUINTET(stores.back()->find("lm_head.weight"), InvalidArgument,
                         "no parameter named 'lm_head.weight'");  // the head borrows the copy

  const Batch b = make_batch(c, 4);
  std::vector<std::unique_ptr<model::GptChunk>> one;
  one.push_back(std::move(whole));
  const double want = run_chunks(one, b, 1.0f).item();
  CHECK(run_chunks(chunks, b, 1.0f).item() == Approx(want).epsilon(1e-6));
  const std::vector<float> g_whole = host(whole_store.find("wte.weight").grad());
  const std::vector<float> g_owner = host(owner.grad()), g_copy = host(copy.grad());
  REQUIRE(g_whole.size() == g_owner.size());
  for (std::size_t i = 0; i < g_whole.size(); ++i) {
    INFO("element " << i);
    CHECK(g_owner[i] + g_copy[i] == Approx(g_whole[i]).margin(1e-6).epsilon(1e-4));
  }
  // Marked once tied, always before a store exists.
  REQUIRE_THROWS_QUINTET(owner.set_tied(nn::TiedRole::none), InvalidArgument,
                         "set_tied after a ParameterStore was built");
}

TEST_CASE("model: parameter counts equal the parameters built", "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  model::GptConfig c = small_config();
  c.activation = GENERATE(nn::Activation::gelu, nn::Activation::swiglu);
  c.norm = GENERATE(nn::NormKind::layernorm, nn::NormKind::rmsnorm);
  c.bias = GENERATE(true, false);
  c.proj_bias = GENERATE(true, false);  // Qwen2: biases on q, k, v only
  c.tied_embeddings = GENERATE(false, true);
  c.learned_positions = GENERATE(true, false);
  c.rope = !c.learned_positions;
  // Grouped-query attention (heads 4, 1 key/value head) with its own head dim, and QK-norm.
  if (GENERATE(false, true)) {
    c.heads = 4;
    c.kv_heads = 1;
    c.head_dim = 6;
  }
  c.qk_norm = GENERATE(false, true);
  auto m = model::build_gpt_chunk(c, {solo.get()}, model::ChunkSpec::whole(c));
  std::int64_t total = 0, embeddings = 0;
  for (auto& [name, p] : m->named_parameters()) {
    total += p->numel();
    if (name == "wte.weight" || name == "wpe.weight") embeddings += p->numel();
  }
  CHECK(c.total_params() == total);
  const auto params = m->named_parameters();
  CHECK(std::count_if(params.begin(), params.end(), [](const auto& p) {
          return p.first == "block0.attn.proj.bias";
        }) == (c.bias && c.proj_bias ? 1 : 0));
  // The LM head is counted in the 6 N FLOPs even when it shares the table.
  CHECK(c.non_embedding_params() ==
        total - embeddings + (c.tied_embeddings ? c.vocab * c.hidden : 0));
}

TEST_CASE("model: bad configs, chunks and calls are refused with their names", "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  const model::ModelGroups groups{solo.get()};
  const model::GptConfig c = small_config();
  model::GptConfig bad = c;
  bad.heads = 3;
  REQUIRE_THROWS_QUINTET(model::build_gpt_chunk(bad, groups, model::ChunkSpec::whole(bad)),
                         InvalidArgument, "hidden = 16 is not divisible by heads = 3");
  bad = c;
  bad.vocab = 0;
  REQUIRE_THROWS_QUINTET(bad.validate(1), InvalidArgument, "vocab = 0 must be > 0");
  bad = c;
  bad.fp8_lm_head = true;  // the LM head's FP8 without the model's
  REQUIRE_THROWS_QUINTET(bad.validate(1), InvalidArgument, "fp8_lm_head with fp8 = off");
  // With it, the head (tied or not) has its FP8 scales; without, only the blocks do.
  for (const bool tied : {false, true}) {
    for (const bool head : {false, true}) {
      model::GptConfig f = c;
      f.fp8.mode = nn::Fp8Mode::hybrid;
      f.fp8_lm_head = head;
      f.tied_embeddings = tied;
      const auto chunk = model::build_gpt_chunk(f, groups, model::ChunkSpec::whole(f));
      std::vector<std::string> head_scales;
      for (const auto& [name, s] : chunk->named_fp8_scales()) {
        if (name.rfind("lm_head.", 0) == 0) head_scales.push_back(name);
      }
      INFO("tied " << tied << ", fp8_lm_head " << head);
      CHECK(head_scales ==
            (head ? std::vector<std::string>{"lm_head.fp8_x", "lm_head.fp8_w", "lm_head.fp8_dy"}
                  : std::vector<std::string>{}));
    }
  }
  REQUIRE_THROWS_QUINTET(model::build_gpt_chunk(c, {}, model::ChunkSpec::whole(c)), InvalidArgument,
                         "no tensor-parallel communicator");
  REQUIRE_THROWS_QUINTET(model::split_into_chunks(c, 5), InvalidArgument, "5 chunks for 4 layers");
  REQUIRE_THROWS_QUINTET(model::split_into_chunks(c, 0), InvalidArgument, "0 chunks");
  REQUIRE_THROWS_QUINTET(model::build_gpt_chunk(c, groups, model::ChunkSpec{3, 2, false, true}),
                         InvalidArgument, "layers [3, 5) are not inside the model's 4 layers");
  REQUIRE_THROWS_QUINTET(model::build_gpt_chunk(c, groups, model::ChunkSpec{0, 0, false, false}),
                         InvalidArgument, "an empty chunk");

  auto m = model::build_gpt_chunk(c, groups, model::ChunkSpec::whole(c));
  nn::ParameterStore store(*m, DType::f32, kCpu, 1);
  const Batch b = make_batch(c, 1);
  nn::Context no_targets(kCpu);
  REQUIRE_THROWS_QUINTET(m->forward(no_targets, b.ids), InvalidArgument, "no targets for the loss");
  nn::Context ctx(kCpu);
  ctx.set_targets(b.targets);
  m->forward(ctx, b.ids);
  REQUIRE_THROWS_QUINTET(m->backward(ctx, Tensor::zeros({})), InvalidArgument,
                         "takes an undefined tensor");
}

TEST_CASE("model: MoE settings or an ep layout on a dense model are refused, naming them",
          "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  const model::ModelGroups groups{solo.get()};
  model::GptConfig dense = small_config();
  dense.moe.router.experts = 16;
  dense.moe.router.capacity_factor = 1.5f;
  const char* why =
      "moe.router.experts = 16, moe.router.capacity_factor = 1.5 set, but mlp = "
      "dense builds no MoE layer";
  REQUIRE_THROWS_QUINTET(dense.validate(1), InvalidArgument, why);
  REQUIRE_THROWS_QUINTET(model::build_gpt_chunk(dense, groups, model::ChunkSpec::whole(dense)),
                         InvalidArgument, why);
  REQUIRE_THROWS_QUINTET(small_config().validate_experts(2, 1), InvalidArgument,
                         "an expert-parallel layout (ep = 2) with mlp = dense");
  // The same settings with mlp = moe are a valid MoE model at ep 2; a dense one at ep 1 is fine.
  model::GptConfig moe = dense;
  moe.mlp = model::MlpKind::moe;
  moe.validate(1);
  moe.validate_experts(2, 1);
  small_config().validate(1);
  small_config().validate_experts(1, 1);
}

TEST_CASE("model: an MoE model's dense blocks, whole and cut across the dense/MoE boundaries",
          "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  const model::ModelGroups groups{solo.get()};
  model::GptConfig c = small_config();  // 4 blocks, dense MLP 24 wide
  c.activation = nn::Activation::swiglu;
  c.mlp = model::MlpKind::moe;
  c.moe.router.experts = 4;
  c.moe.router.top_k = 2;
  c.moe.expert_ffn = 8;
  c.moe.dense_layers = model::parse_layer_list("0,2");
  c.validate(1);
  c.validate_experts(1, 1);
  CHECK((!c.is_moe_block(0) && c.is_moe_block(1) && !c.is_moe_block(2) && c.is_moe_block(3)));
  auto whole = model::build_gpt_chunk(c, groups, model::ChunkSpec::whole(c));
  const auto want = by_name(*whole);
  // Dense blocks hold the dense MLP at its own width, MoE blocks the router and the experts.
  CHECK(want.at("block0.mlp.fc.weight")->shape() == Shape{24, 16});
  CHECK(want.at("block2.mlp.proj.weight")->shape() == Shape{16, 24});
  CHECK(want.at("block1.mlp.experts.fc.weight")->shape() == Shape{4, 8, 16});
  CHECK(want.at("block3.mlp.router.weight")->shape() == Shape{4, 16});
  CHECK((want.count("block0.mlp.router.weight") == 0 && want.count("block1.mlp.fc.weight") == 0));
  std::int64_t total = 0;
  for (auto& [name, p] : want) total += p->numel();
  CHECK(c.total_params() == total);

  // Cut into 2 chunks (a dense and an MoE block each) and 3 (an MoE block alone): the same
  // parameters and the one-chunk model's loss and gradients, bit for bit.
  nn::ParameterStore whole_store(*whole, DType::f32, kCpu, 5);
  const int n = GENERATE(2, 3);
  INFO(n << " chunks");
  std::vector<std::unique_ptr<model::GptChunk>> chunks;
  std::vector<std::unique_ptr<nn::ParameterStore>> stores;
  for (const model::ChunkSpec& s : model::split_into_chunks(c, n)) {
    chunks.push_back(model::build_gpt_chunk(c, groups, s));
    stores.push_back(std::make_unique<nn::ParameterStore>(*chunks.back(), DType::f32, kCpu, 5));
  }
  std::size_t moe_layers = 0;
  for (auto& chunk : chunks) moe_layers += chunk->moe_layers().size();
  CHECK(moe_layers == 2);
  std::map<std::string, nn::Parameter*> got;
  for (auto& chunk : chunks) {
    for (auto& [name, p] : by_name(*chunk)) REQUIRE(got.emplace(name, p).second);
  }
  REQUIRE(got.size() == want.size());
  for (auto& [name, p] : want) CHECK(host(got.at(name)->data()) == host(p->data()));
  const Batch b = make_batch(c, 3);
  std::vector<std::unique_ptr<model::GptChunk>> one;
  one.push_back(std::move(whole));
  const Tensor want_loss = run_chunks(one, b, 1.0f);
  const Tensor got_loss = run_chunks(chunks, b, 1.0f);
  CHECK(got_loss.item() == want_loss.item());
  for (auto& [name, p] : want) {
    INFO("gradient of " << name);
    CHECK(host(got.at(name)->grad()) == host(p->grad()));
  }
}

TEST_CASE("model: dense-block lists, read and refused", "[model]") {
  CHECK(model::parse_layer_list("").empty());
  CHECK(model::parse_layer_list("0-2,5,7-8") == std::vector<std::int64_t>{0, 1, 2, 5, 7, 8});
  CHECK(model::layer_list_text({0, 1, 2, 5}) == "0,1,2,5");
  CHECK(model::parse_layer_list(model::layer_list_text({3, 9})) == std::vector<std::int64_t>{3, 9});
  REQUIRE_THROWS_QUINTET(model::parse_layer_list("1,a"), InvalidArgument,
                         "\"a\" is not a block index");
  REQUIRE_THROWS_QUINTET(model::parse_layer_list("0,"), InvalidArgument,
                         "\"\" is not a block index");
  REQUIRE_THROWS_QUINTET(model::parse_layer_list("3,1"), InvalidArgument,
                         "1 does not come after 3");
  REQUIRE_THROWS_QUINTET(model::parse_layer_list("0-2,2"), InvalidArgument,
                         "2 does not come after 2");
  REQUIRE_THROWS_QUINTET(model::parse_layer_list("4-2"), InvalidArgument,
                         "the range 4-2 ends below its start");
  REQUIRE_THROWS_QUINTET(model::parse_layer_list("-1"), InvalidArgument, "is not a block index");

  model::GptConfig c = small_config();  // 4 blocks
  c.mlp = model::MlpKind::moe;
  c.moe.dense_layers = {0, 4};
  REQUIRE_THROWS_QUINTET(c.validate_experts(1, 1), InvalidArgument,
                         "moe.dense_layers holds block 4, and the model's blocks are 0 .. 3");
  c.moe.dense_layers = {2, 1};
  REQUIRE_THROWS_QUINTET(c.validate_experts(1, 1), InvalidArgument,
                         "moe.dense_layers [2,1] is not ascending");
  c.moe.every = 2;
  c.moe.dense_layers = {1};
  REQUIRE_THROWS_QUINTET(c.validate_experts(1, 1), InvalidArgument,
                         "holds block 1, which is dense already (moe.every = 2");
  c.moe.dense_layers = {0, 2};
  REQUIRE_THROWS_QUINTET(c.validate_experts(1, 1), InvalidArgument,
                         "mlp = moe, and no block is MoE (moe.every = 2, moe.dense_layers [0,2] of "
                         "4 blocks)");
  c.moe.dense_layers = {2};
  c.validate_experts(1, 1);  // block 0 is MoE
  CHECK((c.is_moe_block(0) && !c.is_moe_block(1) && !c.is_moe_block(2) && !c.is_moe_block(3)));
  // On a dense model the list is an MoE setting that would be ignored.
  model::GptConfig dense = small_config();
  dense.moe.dense_layers = {1};
  REQUIRE_THROWS_QUINTET(dense.validate(1), InvalidArgument,
                         "moe.dense_layers = 1 set, but mlp = dense builds no MoE layer");
  // An MoE family's structure makes every block MoE again.
  c.set_family(model::ModelFamily::qwen3_moe);
  CHECK((c.moe.every == 1 && c.moe.dense_layers.empty()));
}

TEST_CASE("model: the families' named constructors set their structure and keep the sizes",
          "[model]") {
  using model::GptConfig;
  using model::ModelFamily;
  const GptConfig sizes{.layers = 3,
                        .hidden = 64,
                        .heads = 8,
                        .kv_heads = 2,
                        .ffn_hidden = 96,
                        .vocab = 40,
                        .seq_len = 16};
  const GptConfig llama = GptConfig::llama(sizes);
  CHECK(llama.family == ModelFamily::llama);
  CHECK(llama.norm == nn::NormKind::rmsnorm);
  CHECK(llama.activation == nn::Activation::swiglu);
  CHECK((llama.rope && !llama.learned_positions && !llama.bias && !llama.qk_norm));
  CHECK(llama.rope_theta == 500000.0);
  CHECK(llama.eps == 1e-5f);
  CHECK(llama.mlp == model::MlpKind::dense);
  CHECK((llama.layers == 3 && llama.hidden == 64 && llama.heads == 8 && llama.kv_heads == 2 &&
         llama.ffn_hidden == 96 && llama.vocab == 40 && llama.seq_len == 16));
  llama.validate(2);

  const GptConfig qwen3 = GptConfig::qwen3(sizes);
  CHECK((qwen3.qk_norm && qwen3.rope && !qwen3.bias && qwen3.rope_theta == 1000000.0 &&
         qwen3.eps == 1e-6f && qwen3.norm == nn::NormKind::rmsnorm));
  qwen3.validate(2);

  // The MoE families' shape: softmax over all experts, the top k renormalized, dropless, no
  // shared experts or balancing bias, every block MoE, whatever moe held before.
  GptConfig moe_sizes = sizes;
  moe_sizes.moe.router = {.experts = 6,
                          .top_k = 1,
                          .score = expert::RouterScore::sigmoid,
                          .renormalize = false,
                          .capacity_factor = 1.5f,
                          .bias_rate = 0.01f};
  moe_sizes.moe.expert_ffn = 40;
  moe_sizes.moe.shared_experts = 1;
  moe_sizes.moe.every = 2;
  const auto routed_as_families_do = [](const GptConfig& c) {
    const expert::RouterConfig& r = c.moe.router;
    return c.mlp == model::MlpKind::moe && r.score == expert::RouterScore::softmax &&
           r.renormalize && r.capacity_factor == 0.0f && r.bias_rate == 0.0f &&
           c.moe.shared_experts == 0 && c.moe.every == 1;
  };
  const GptConfig mixtral = GptConfig::mixtral(moe_sizes);
  CHECK(routed_as_families_do(mixtral));
  CHECK((mixtral.moe.router.experts == 8 && mixtral.moe.router.top_k == 2));
  CHECK((mixtral.activation == nn::Activation::swiglu && !mixtral.qk_norm && mixtral.rope));
  CHECK((mixtral.moe.expert_ffn == 0 && mixtral.expert_width() == 96));  // the MLP's width
  CHECK((mixtral.hidden == 64 && mixtral.kv_heads == 2 && mixtral.ffn_hidden == 96));
  mixtral.validate(2);
  mixtral.validate_experts(2, 1);
  const GptConfig qwen3_moe = GptConfig::qwen3_moe(moe_sizes);
  CHECK(routed_as_families_do(qwen3_moe));
  CHECK((qwen3_moe.moe.router.experts == 128 && qwen3_moe.moe.router.top_k == 8 &&
         qwen3_moe.qk_norm));
  CHECK(qwen3_moe.expert_width() == 24);  // its own width, 3/8 of hidden
  qwen3_moe.validate(2);
  qwen3_moe.validate_experts(2, 1);
  // Qwen3-30B-A3B's sizes give its moe_intermediate_size, 768; the training's loss coefficients
  // are left as they were.
  GptConfig a3b = moe_sizes;
  a3b.hidden = 2048;
  a3b.moe.router.aux_loss_coeff = 0.002f;
  a3b.set_family(ModelFamily::qwen3_moe);
  CHECK((a3b.moe.expert_ffn == 768 && a3b.moe.router.aux_loss_coeff == 0.002f));
  CHECK(a3b.mlp == model::MlpKind::dense);  // set_family leaves the MLP kind
  // Set after, moe overrides the family's shape.
  GptConfig wider = GptConfig::mixtral(sizes);
  wider.moe.router.experts = 4;
  wider.moe.expert_ffn = 32;
  CHECK(wider.expert_width() == 32);
  wider.validate(2);
  wider.validate_experts(2, 2);
  // A dense family leaves moe as it was.
  GptConfig dense = moe_sizes;
  dense.set_family(ModelFamily::llama);
  CHECK((dense.moe.router.experts == 6 && dense.moe.expert_ffn == 40 && dense.moe.every == 2));

  // gpt2 is the default model, and set_family(gpt2) restores every field a family sets.
  const auto same_structure = [](const GptConfig& a, const GptConfig& b) {
    return a.family == b.family && a.norm == b.norm && a.eps == b.eps &&
           a.activation == b.activation && a.learned_positions == b.learned_positions &&
           a.rope == b.rope && a.rope_theta == b.rope_theta && a.bias == b.bias &&
           a.qk_norm == b.qk_norm;
  };
  CHECK(same_structure(GptConfig::gpt2(), GptConfig{}));
  GptConfig back = qwen3;
  back.set_family(ModelFamily::gpt2);
  CHECK(same_structure(back, GptConfig{}));
  CHECK(back.kv_heads == 2);

  // A family of the other MLP kind, and a model without positions, are refused naming both.
  GptConfig bad = GptConfig::mixtral(sizes);
  bad.mlp = model::MlpKind::dense;
  bad.moe = {};
  REQUIRE_THROWS_QUINTET(bad.validate(1), InvalidArgument,
                         "family = mixtral with mlp = dense; mixtral is a mixture-of-experts");
  bad = GptConfig::llama(sizes);
  bad.mlp = model::MlpKind::moe;
  REQUIRE_THROWS_QUINTET(bad.validate(1), InvalidArgument,
                         "family = llama with mlp = moe; llama is a dense family");
  bad = GptConfig::llama(sizes);
  bad.rope = false;
  REQUIRE_THROWS_QUINTET(bad.validate(1), InvalidArgument,
                         "learned_positions = false and rope = false");
  CHECK(model::parse_model_family("qwen3-moe") == ModelFamily::qwen3_moe);
  CHECK(model::model_family_name(ModelFamily::qwen3_moe) == "qwen3-moe");
  REQUIRE_THROWS_QUINTET(model::parse_model_family("gpt3"), InvalidArgument,
                         "use gpt2, llama, qwen3, mixtral or qwen3-moe");
}

TEST_CASE("model: a backward split into I and deferred W equals the whole backward", "[model]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  model::GptConfig c = small_config();
  c.tied_embeddings = GENERATE(false, true);
  c.activation = GENERATE(nn::Activation::gelu, nn::Activation::swiglu);
  auto a = model::build_gpt_chunk(c, {solo.get()}, model::ChunkSpec::whole(c));
  auto b = model::build_gpt_chunk(c, {solo.get()}, model::ChunkSpec::whole(c));
  nn::ParameterStore sa(*a, DType::f32, kCpu, 8), sb(*b, DType::f32, kCpu, 8);
  int marked = 0;
  sb.add_grad_ready_hook([&](nn::Parameter&) { ++marked; });
  const Batch batch = make_batch(c, 4);
  nn::Context ca(kCpu), cb(kCpu);
  ca.set_targets(batch.targets);
  cb.set_targets(batch.targets);
  a->forward(ca, batch.ids);
  b->forward(cb, batch.ids);
  a->backward(ca, Tensor());
  cb.set_defer_weight_gradients(true);
  b->backward(cb, Tensor());  // I: input gradients now, the weight gradients queued
  cb.set_defer_weight_gradients(false);
  const std::size_t params = sb.parameters().size();
  // Only the norms (fused dx + dweight kernels) ran; the rest wait for W, and so do all the marks.
  for (const nn::Parameter* p : sb.parameters()) {
    if (p->name().find("norm") == std::string::npos) {
      INFO(p->name() << " before W");
      CHECK(host(p->grad()) == std::vector<float>(static_cast<std::size_t>(p->numel()), 0.0f));
    }
  }
  CHECK(marked == 0);
  CHECK(cb.deferred_count() > 0);
  cb.run_deferred_gradients();  // W
  CHECK(cb.deferred_count() == 0);
  CHECK(static_cast<std::size_t>(marked) == params);
  for (nn::Parameter* p : sa.parameters()) {
    INFO("gradient of " << p->name());
    CHECK(host(sb.find(p->name()).grad()) == host(p->grad()));
  }
}
