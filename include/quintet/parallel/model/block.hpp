// The transformer block of the library's model and the factories that fill its two slots
// (parallel/model/block.cpp).
//
// Pre-norm: h = x + attn(norm1(x)); y = h + mlp(norm2(h)), on x [B, S, d] (with sequence
// parallelism [B, S/tp, d], tp rank r holding positions [r*S/tp, (r+1)*S/tp)). Parameter names:
// norm1.*, attn.*, norm2.*, mlp.* (with the tensor-parallel slots: attn.qkv.weight [3, d/tp, d],
// attn.qkv.bias, attn.proj.*, mlp.fc.*, [mlp.up.weight], mlp.proj.*). With tp = 1 and no sequence
// parallelism a block equals nn::TransformerBlock of the same sizes and seed. The norms' parameters
// carry reduce_over_tp = sequence_parallel.
#pragma once

#include <memory>

#include "quintet/nn/module.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/model/groups.hpp"

namespace quintet::model {

// The module of config.attention: x [B, S(/tp), d] -> same shape.
std::unique_ptr<nn::Module> make_attention(const GptConfig& config, const ModelGroups& groups);
// The module of config.mlp: x [B, S(/tp), d] -> same shape.
std::unique_ptr<nn::Module> make_mlp(const GptConfig& config, const ModelGroups& groups);
// The norm of config.norm over d (ParallelLayerNorm or ParallelRMSNorm).
std::unique_ptr<nn::Module> make_norm(const GptConfig& config);

class TransformerBlock : public nn::Module {
 public:
  // Validates config against groups.tp (GptConfig::validate_block) before making any layer.
  TransformerBlock(const GptConfig& config, const ModelGroups& groups);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  nn::Module* norm1_;
  nn::Module* attn_;
  nn::Module* norm2_;
  nn::Module* mlp_;
};

// Throws InvalidArgument unless groups has every communicator the model needs.
void check_groups(const ModelGroups& groups);

}  // namespace quintet::model
