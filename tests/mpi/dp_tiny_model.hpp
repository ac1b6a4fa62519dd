// A tiny GPT (token embedding, pre-norm transformer blocks, final LayerNorm, linear head) and the
// deterministic token batches the data-parallel tests train it on, shared by the CPU (mpi/) and
// GPU tests. Only nn layers and ops: the reference run is one rank with nn::AdamW.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "quintet/nn/layers.hpp"
#include "quintet/nn/ops.hpp"

namespace dp_test {

using namespace quintet;

struct TinyGptConfig {
  std::int64_t vocab = 32;
  std::int64_t dim = 16;
  std::int64_t heads = 2;
  std::int64_t hidden = 32;
  std::int64_t seq = 8;
  int layers = 2;
};

class TinyGpt : public nn::Module {
 public:
  explicit TinyGpt(const TinyGptConfig& c) {
    tok_ = &add_module("tok", std::make_unique<nn::Embedding>(c.vocab, c.dim));
    nn::TransformerBlockConfig bc;
    bc.dim = c.dim, bc.heads = c.heads, bc.hidden = c.hidden, bc.max_seq_len = c.seq;
    for (int i = 0; i < c.layers; ++i) {
      blocks_.push_back(
          &add_module(fmt::format("block{}", i), std::make_unique<nn::TransformerBlock>(bc)));
    }
    norm_ = &add_module("norm", std::make_unique<nn::LayerNorm>(c.dim));
    head_ = &add_module("head", std::make_unique<nn::Linear>(c.dim, c.vocab));
  }
  // ids [batch, seq] -> logits [batch, seq, vocab]
  Tensor forward(nn::Context& ctx, const Tensor& ids) override {
    Tensor x = tok_->forward(ctx, ids);
    for (nn::TransformerBlock* b : blocks_) x = b->forward(ctx, x);
    return head_->forward(ctx, norm_->forward(ctx, x));
  }
  Tensor backward(nn::Context& ctx, const Tensor& dlogits) override {
    Tensor dy = norm_->backward(ctx, head_->backward(ctx, dlogits));
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) dy = (*it)->backward(ctx, dy);
    tok_->backward(ctx, dy);
    return Tensor();
  }

 private:
  nn::Embedding* tok_;
  std::vector<nn::TransformerBlock*> blocks_;
  nn::LayerNorm* norm_;
  nn::Linear* head_;
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
  const Tensor logits = model.forward(ctx, b.ids);
  nn::CrossEntropyOutput ce = nn::cross_entropy_forward(logits, b.targets, -1, stream);
  const Tensor dlogits =
      nn::cross_entropy_backward(logits, b.targets, ce.lse, ce.valid_count, dloss, -1, stream);
  model.backward(ctx, dlogits);
  return ce.loss;
}

}  // namespace dp_test
