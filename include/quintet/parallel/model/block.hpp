// The transformer block of the library's model and the factories that fill its two slots
// (parallel/model/block.cpp).
//
// Pre-norm: h = x + attn(norm1(x)); y = h + mlp(norm2(h)), on x [B, S, d] (with sequence
// parallelism [B, S/tp, d], tp rank r holding positions [r*S/tp, (r+1)*S/tp)). Parameter names:
// norm1.*, attn.*, norm2.*, mlp.* (with the tensor-parallel slots: attn.qkv.weight [3, d/tp, d],
// attn.qkv.bias, attn.proj.*, mlp.fc.*, [mlp.up.weight], mlp.proj.*; an MoE block's
// mlp.router.weight, mlp.experts.*, [mlp.shared.*]). With tp = 1 and no sequence parallelism a
// block equals the tests' single-rank nn::TransformerBlock of the same sizes and seed. The norms'
// parameters carry reduce_over_tp = sequence_parallel.
#pragma once

#include <memory>

#include "quintet/nn/module.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/model/groups.hpp"
#include "quintet/parallel/tensor_parallel/norm.hpp"

namespace quintet::model {

// The module of config.attention: x [B, S(/tp), d] -> same shape.
std::unique_ptr<nn::Module> make_attention(const GptConfig& config, const ModelGroups& groups);
// The module of block `layer`'s MLP slot (the dense MLP, or with MlpKind::moe an
// expert::MoELayer where config.is_moe_block(layer)): x [B, S(/tp), d] -> same shape.
std::unique_ptr<nn::Module> make_mlp(const GptConfig& config, const ModelGroups& groups,
                                     std::int64_t layer = 0);
// The norm of config.norm over d (ParallelLayerNorm or ParallelRMSNorm).
std::unique_ptr<tensor_parallel::ParallelNorm> make_norm(const GptConfig& config);

class TransformerBlock : public nn::Module {
 public:
  // Block `layer` (its global index: it picks a dense or an MoE MLP). Validates config against
  // the groups (GptConfig::validate_block, validate_experts) before making any layer.
  TransformerBlock(const GptConfig& config, const ModelGroups& groups, std::int64_t layer = 0);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  // The MoE layer in the MLP slot, or null for a dense MLP.
  expert::MoELayer* moe() const { return moe_; }

 private:
  tensor_parallel::ParallelNorm* norm1_;
  nn::Module* attn_;
  tensor_parallel::ParallelNorm* norm2_;
  nn::Module* mlp_;
  expert::MoELayer* moe_ = nullptr;
};

// Throws InvalidArgument unless groups has every communicator the model needs.
void check_groups(const ModelGroups& groups);

}  // namespace quintet::model
