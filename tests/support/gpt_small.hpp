// A small library model (quintet/parallel/model/) and its token batches, for the tests that run
// it in one process on the CPU (tests/unit/model_gpt_test.cpp, nn_lazy_zero_grad_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/core/tensor.hpp"
#include "quintet/parallel/model/gpt_config.hpp"

namespace gpt_small {

// 4 blocks, hidden 16, 2 heads, vocabulary 20, sequences of 8.
inline quintet::model::GptConfig config() {
  return quintet::model::GptConfig{.layers = 4,
                                   .hidden = 16,
                                   .heads = 2,
                                   .ffn_hidden = 24,
                                   .vocab = 20,
                                   .seq_len = 8,
                                   .init_std = 0.3f,
                                   .proj_init_std = 0.2f};
}

struct Batch {
  quintet::Tensor ids, targets;
};
// 2 sequences of token ids and targets [2, seq_len], a different pattern for each seed.
inline Batch make_batch(const quintet::model::GptConfig& c, std::uint64_t seed) {
  std::vector<std::int64_t> ids, targets;
  for (std::int64_t i = 0; i < 2 * c.seq_len; ++i) {
    ids.push_back(static_cast<std::int64_t>((seed * 7 + 5 * i + 3) % c.vocab));
    targets.push_back(static_cast<std::int64_t>((seed * 11 + 3 * i + 1) % c.vocab));
  }
  return {quintet::Tensor::from_vector(ids, {2, c.seq_len}),
          quintet::Tensor::from_vector(targets, {2, c.seq_len})};
}

}  // namespace gpt_small
