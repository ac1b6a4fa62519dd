// The GPT composition of tensor_parallel.hpp (tp_gpt.hpp) under mpirun: with tp = the whole job
// (2, 3, 4), with and without sequence parallelism, the loss and every parameter gradient equal
// the same model at tp = 1 (each rank builds it over a one-rank communicator, same seed).
// f32, tolerance tp_support.hpp's.
#include "tp_gpt.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace tp_test;

TEST_CASE("tp GPT (embeddings, blocks, norm, LM head, cross-entropy) equals tp = 1", "[tp]") {
  const Stream cpu;
  World world = cpu_world();
  Communicator& tp = world.comm();
  std::unique_ptr<Communicator> solo = tp.split(tp.rank(), 0, "solo");
  const bool sp = GENERATE(false, true);
  INFO("tp = " << tp.size() << ", sequence_parallel = " << sp);
  constexpr std::int64_t kB = 2, kS = 12, kVocab = 48;
  ParallelTransformerConfig c{.dim = 24,
                              .heads = 12,
                              .hidden = 48,
                              .max_seq_len = 16,
                              .norm = nn::NormKind::rmsnorm,
                              .init_std = 0.3f,
                              .proj_init_std = 0.2f,
                              .sequence_parallel = sp};
  TinyGpt mine(tp, c, kVocab, 2);
  c.sequence_parallel = false;
  TinyGpt ref(*solo, c, kVocab, 2);
  nn::ParameterStore my_store(mine, DType::f32, cpu, 9), ref_store(ref, DType::f32, cpu, 9);
  require_params_match(mine, ref, tp, false);

  std::vector<std::int64_t> ids(kB * kS), targets(kB * kS);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int64_t>((5 * i + 1) % kVocab);
    targets[i] = static_cast<std::int64_t>((13 * i + 7) % kVocab);
  }
  targets[4] = -100;
  const Tensor id_t = Tensor::from_vector(ids, {kB, kS});
  const Tensor tg_t = Tensor::from_vector(targets, {kB, kS});

  VocabParallelCrossEntropy my_ce(tp, kVocab), ref_ce(*solo, kVocab);
  nn::Context my_ctx(cpu), ref_ctx(cpu);
  const Tensor my_logits = mine.forward(my_ctx, id_t);
  const Tensor ref_logits = ref.forward(ref_ctx, id_t);
  require_close(my_logits, chunk(ref_logits, 2, tp.rank(), tp.size()), "logits");
  const auto my_loss = my_ce.forward(my_logits, tg_t, cpu);
  const auto ref_loss = ref_ce.forward(ref_logits, tg_t, cpu);
  require_close(my_loss.loss, ref_loss.loss, "loss");
  mine.backward(my_ctx, my_ce.backward(my_logits, tg_t, my_loss, 1.0f, cpu));
  ref.backward(ref_ctx, ref_ce.backward(ref_logits, tg_t, ref_loss, 1.0f, cpu));
  REQUIRE(my_ctx.pending() == 0);
  require_params_match(mine, ref, tp, true);
}
