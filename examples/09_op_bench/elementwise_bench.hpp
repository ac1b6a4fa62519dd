// The elementwise mode of 09_op_bench: the memory-bound kernels of a Llama-style block (RoPE,
// RMSNorm with the residual add, SwiGLU), forward and backward, against the memory bandwidth,
// on one GPU, in one run.
//
// Each kernel is called as the model calls it (RoPE on the query heads and on the strided key
// heads of the fused key/value projection; parallel/tensor_parallel/attention.cpp, norm.cpp,
// mlp.cpp) on bf16 tensors of the model's shapes. Its achieved bandwidth is bytes / time, the bytes
// being what the kernel must move at the least: every input read once and every output written once
// (listed per op in elementwise_bench.cpp; scratch and cache traffic not counted). Two bounds:
// a device-to-device cudaMemcpyAsync of a large buffer measured in the same run (2 x its size
// moved: read and written), and the GPU's nominal bandwidth (--nominal-gbps, NVIDIA's 4800 GB/s
// for the H200 by default). Times are medians of `iters` calls.
#pragma once

#include <cstdint>

#include "quintet/core/stream.hpp"

struct ElementwiseBenchOptions {
  bool json = false;
  int iters = 20;
  std::int64_t tokens = 4096;           // batch x sequence
  std::int64_t seq = 2048;              // RoPE's positions 0..seq-1, tokens / seq sequences
  std::int64_t hidden = 2048;           // RMSNorm's width d
  std::int64_t heads = 32;              // RoPE: query heads
  std::int64_t kv_heads = 8;            // RoPE: key heads (grouped-query attention)
  std::int64_t head_dim = 64;           // RoPE: each head's width
  std::int64_t ffn = 8192;              // SwiGLU's width F
  std::int64_t copy_bytes = 1LL << 30;  // the memcpy bound's buffer
  double nominal_gbps = 4800.0;         // the GPU's nominal bandwidth, GB/s (1e9 bytes/s)
  double rope_theta = 500000.0;         // Llama 3's
};

// Throws std::invalid_argument naming the option unless every size is positive, tokens divides
// by seq and head_dim is even.
void check_elementwise_options(const ElementwiseBenchOptions& opt);

// Measures and prints (text table or one JSON object per line) the copy bound and each op's
// forward and backward, on stream s (its device current).
void bench_elementwise(const ElementwiseBenchOptions& opt, const quintet::Stream& s);
