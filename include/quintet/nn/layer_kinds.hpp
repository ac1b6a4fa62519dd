// The kinds a transformer's layers choose between, shared by the model's config and its layers:
// the MLP's activation and the norm.
#pragma once

namespace quintet::nn {

// GELU: fc (dim -> hidden) -> gelu -> proj (hidden -> dim), with biases.
// SwiGLU: gate, up (dim -> hidden, no bias) -> silu(gate) * up -> proj (hidden -> dim, no bias).
enum class Activation { gelu, swiglu };
enum class NormKind { layernorm, rmsnorm };

}  // namespace quintet::nn
