// A tiny GPT (the library's model at tp = 1: token and position embedding, pre-norm transformer
// blocks, final LayerNorm, LM head and loss) and the deterministic token batches the
// data-parallel tests train it on, shared by the CPU (mpi/) and GPU tests. The reference run is
// one rank with nn::AdamW.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "quintet/collectives/mpi.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/data_parallel/data_parallel.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/model/gpt.hpp"

namespace dp_test {

using namespace quintet;

struct TinyGptConfig {
  std::int64_t vocab = 32;
  std::int64_t dim = 16;
  std::int64_t heads = 2;
  std::int64_t hidden = 32;
  std::int64_t seq = 8;
  int layers = 2;
  model::GptConfig gpt() const {
    return model::GptConfig{.layers = layers,
                            .hidden = dim,
                            .heads = heads,
                            .ffn_hidden = hidden,
                            .vocab = vocab,
                            .seq_len = seq};
  }
};

// The library GPT (quintet/parallel/model/gpt.hpp), whole, at tp = 1 over its own one-rank
// communicator (built first, so it outlives the layers that borrow it).
struct SoloTp {
  explicit SoloTp(const Device& device) : comm(make_self_communicator(device, "tiny_gpt.tp")) {}
  std::unique_ptr<Communicator> comm;
};
class TinyGpt : private SoloTp, public model::GptChunk {
 public:
  explicit TinyGpt(const TinyGptConfig& c, const Device& device = Device::cpu())
      : SoloTp(device), model::GptChunk(c.gpt(), {comm.get()}, model::ChunkSpec::whole(c.gpt())) {}
};

// Rows [row0, row0 + rows) of step's global batch: ids and next-token targets, i64 [rows, seq],
// the same on every rank (drawn on the host from the step number), on stream's device. They are
// allocated on stream (its pool), as everything the step uses: a batch allocated on another
// stream could get the block of the previous microbatch's batch, freed while stream still reads
// it.
struct Batch {
  Tensor ids, targets;
};
inline Batch batch_rows(const TinyGptConfig& c, int step, std::int64_t global_batch,
                        std::int64_t row0, std::int64_t rows, const Stream& stream) {
  std::mt19937_64 gen(1000 + step);
  std::uniform_int_distribution<std::int64_t> token(0, c.vocab - 1);
  std::vector<std::int64_t> all(static_cast<std::size_t>(global_batch * (c.seq + 1)));
  for (auto& t : all) t = token(gen);
  std::vector<std::int64_t> ids, targets;
  for (std::int64_t r = row0; r < row0 + rows; ++r) {
    for (std::int64_t s = 0; s < c.seq; ++s) {
      ids.push_back(all[static_cast<std::size_t>(r * (c.seq + 1) + s)]);
      targets.push_back(all[static_cast<std::size_t>(r * (c.seq + 1) + s + 1)]);
    }
  }
  return {Tensor::from_vector(ids, {rows, c.seq}).to(stream.device(), stream),
          Tensor::from_vector(targets, {rows, c.seq}).to(stream.device(), stream)};
}

// Forward and backward of one microbatch; the loss gradient is dloss (1/m for m microbatches).
// Returns the loss tensor (scalar f32, not read back).
inline Tensor train_microbatch(TinyGpt& model, const Batch& b, float dloss, const Stream& stream) {
  nn::Context ctx(stream);
  ctx.set_targets(b.targets, dloss);
  const Tensor loss = model.forward(ctx, b.ids);
  model.backward(ctx, Tensor());
  return loss;
}

// One data-parallel step's forward and backward: this dp rank's share of step's global batch
// (global_batch / dp rows from row rank * share) in `micro` microbatches of loss gradient 1/micro,
// the last one marked as such, then dp.finish (the reductions done, the gradients ready for the
// optimizer) on stream.
inline void train_data_parallel_step(TinyGpt& model, data_parallel::DataParallel& dp,
                                     const Mesh& mesh, const TinyGptConfig& c, int step,
                                     std::int64_t global_batch, int micro, const Stream& stream) {
  const std::int64_t local = global_batch / mesh.size(Axis::dp), rows = local / micro;
  dp.begin_step();
  for (int m = 0; m < micro; ++m) {
    dp.set_last_microbatch(m == micro - 1);
    const std::int64_t row0 = mesh.rank(Axis::dp) * local + m * rows;
    train_microbatch(model, batch_rows(c, step, global_batch, row0, rows, stream),
                     1.0f / static_cast<float>(micro), stream);
  }
  dp.finish(stream);
}

}  // namespace dp_test
