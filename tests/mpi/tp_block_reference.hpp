// The single-rank transformer block (support/nn_layers.hpp) that a tensor-parallel
// model::TransformerBlock is checked against, configured from the sharded block's own GptConfig,
// so that a test states the block's settings once. Used by tp_layers_test and tp_train_test.
#pragma once

#include "quintet/parallel/model/gpt_config.hpp"
#include "support/catch.hpp"
#include "support/nn_layers.hpp"

namespace tp_test {

// The reference's config for the block of c. The reference is a GPT block with multi-head
// attention, biases on every attention projection or none, and its own MLP width: a c that asks
// for more (grouped-query heads, RoPE, q/k norms, another attention, a derived width or projection
// std, MoE, FP8) fails the test rather than being compared against a different block.
inline quintet::nn::TransformerBlockConfig reference_block_config(
    const quintet::model::GptConfig& c) {
  REQUIRE((c.kv_heads == 0 || c.kv_heads == c.heads));
  REQUIRE(c.head_dim == 0);
  REQUIRE(!c.rope);
  REQUIRE(!c.qk_norm);
  REQUIRE(c.proj_bias);
  REQUIRE(c.ffn_hidden > 0);
  REQUIRE(c.proj_init_std > 0.0f);
  REQUIRE(c.attention == quintet::model::AttentionKind::tensor_parallel);
  REQUIRE(c.mlp == quintet::model::MlpKind::dense);
  REQUIRE(c.fp8.mode == quintet::nn::Fp8Mode::off);
  return {.dim = c.hidden,
          .heads = c.heads,
          .hidden = c.ffn_hidden,
          .max_seq_len = c.seq_len,
          .norm = c.norm,
          .activation = c.activation,
          .bias = c.bias,
          .init_std = c.init_std,
          .proj_init_std = c.proj_init_std,
          .eps = c.eps};
}

}  // namespace tp_test
