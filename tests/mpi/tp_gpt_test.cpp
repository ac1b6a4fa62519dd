// The library GPT (quintet/parallel/model/gpt.hpp: vocab-parallel embedding, position embedding,
// blocks, final norm, column-parallel LM head, vocab-parallel loss) under mpirun: with tp = the
// whole job (2, 3, 4), with and without sequence parallelism, untied and tied embeddings, the loss
// and every parameter gradient equal the same model at tp = 1 (each rank builds it over a
// one-rank communicator, same seed). f32, tolerance tp_support.hpp's.
#include "quintet/parallel/model/gpt.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace tp_test;

TEST_CASE("tp GPT (embeddings, blocks, norm, LM head, cross-entropy) equals tp = 1", "[tp]") {
  const Stream cpu;
  World world = cpu_world();
  Communicator& tp = world.comm();
  std::unique_ptr<Communicator> solo = tp.split(tp.rank(), 0, "solo");
  const bool sp = GENERATE(false, true);
  const bool tied = GENERATE(false, true);
  INFO("tp = " << tp.size() << ", sequence_parallel = " << sp << ", tied = " << tied);
  constexpr std::int64_t kB = 2, kS = 12;
  model::GptConfig c{.layers = 2,
                     .hidden = 24,
                     .heads = 12,
                     .ffn_hidden = 48,
                     .vocab = 48,
                     .seq_len = 16,
                     .norm = nn::NormKind::rmsnorm,
                     .tied_embeddings = tied,
                     .init_std = 0.3f,
                     .proj_init_std = 0.2f,
                     .sequence_parallel = sp};
  model::GptChunk mine(c, {&tp}, model::ChunkSpec::whole(c));
  c.sequence_parallel = false;
  model::GptChunk ref(c, {solo.get()}, model::ChunkSpec::whole(c));
  nn::ParameterStore my_store(mine, DType::f32, cpu, 9), ref_store(ref, DType::f32, cpu, 9);
  require_params_match(mine, ref, tp, false);
  if (tied) REQUIRE(mine.named_parameters().size() == ref.named_parameters().size());

  std::vector<std::int64_t> ids(kB * kS), targets(kB * kS);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int64_t>((5 * i + 1) % c.vocab);
    targets[i] = static_cast<std::int64_t>((13 * i + 7) % c.vocab);
  }
  targets[4] = -100;
  const Tensor id_t = Tensor::from_vector(ids, {kB, kS});
  const Tensor tg_t = Tensor::from_vector(targets, {kB, kS});

  nn::Context my_ctx(cpu), ref_ctx(cpu);
  my_ctx.set_targets(tg_t, 0.5f);
  ref_ctx.set_targets(tg_t, 0.5f);
  const Tensor my_loss = mine.forward(my_ctx, id_t);
  const Tensor ref_loss = ref.forward(ref_ctx, id_t);
  require_close(my_loss, ref_loss, "loss");
  REQUIRE(!mine.backward(my_ctx, Tensor()).defined());
  ref.backward(ref_ctx, Tensor());
  REQUIRE(my_ctx.pending() == 0);
  require_params_match(mine, ref, tp, true);
}
