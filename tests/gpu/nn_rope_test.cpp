// RoPE on the GPU against the CPU op, in f32 and bf16: forward and backward, out of place and in
// place on the strided heads of a fused qkv and on the key heads of a fused key/value projection,
// positions from an offset and from [S] / [B, S] tensors (i32, i64), odd lengths and positions in
// the thousands (the f32 angle path must agree), head widths, strides and alignments that the
// kernel takes as 16-byte vectors and ones it takes element by element, tokens with more items than
// a block's threads hold at once (chunks), and token counts that give 4, 2 and 1 items a thread.
#include <vector>

#include "gpu/nn_gpu_compare.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {
const DType kDTypes[] = {DType::f32, DType::bf16};
// Batch, sequence, heads and head_dim of a case.
struct Dims {
  std::int64_t b, seq, h, d;
};
}  // namespace

TEST_CASE("rope on the GPU equals the CPU op") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  struct Case {
    std::int64_t b, seq, h, d;
    std::int64_t offset;
    int positions;  // 0: none, 1: [S] i32, 2: [B, S] i64
    double theta;
  };
  // Items of 16-byte vectors where D / 2 is a multiple of 8 in bf16, of 4 in f32; D = 2, 6, 20 (and
  // 16 in bf16) go element by element. Odd head counts (3, 5, 9) leave a warp's last items idle.
  // [1, 2048, 32, 64] (the bench's query heads) has enough tokens for 4 items a thread in f32 and
  // 2 in bf16, the others 1. H = 66, D = 256 has 1056 items a token in bf16 (2112 in f32), more
  // than a block's 256 threads hold at once, as has D = 512 in f32: those go in chunks.
  const Case cases[] = {
      {1, 1, 1, 2, 0, 0, 10000.0},     {2, 37, 3, 64, 0, 0, 10000.0},
      {1, 129, 4, 128, 3000, 0, 1e6},  {2, 33, 2, 96, 7, 1, 10000.0},
      {3, 17, 5, 256, 0, 2, 500000.0}, {1, 8, 8, 512, 123, 2, 10000.0},
      {2, 11, 9, 16, 5, 1, 10000.0},   {1, 7, 3, 20, 0, 0, 10000.0},
      {2, 5, 3, 6, 40, 2, 10000.0},    {1, 2048, 32, 64, 17, 1, 500000.0},
      {1, 3, 66, 256, 9, 2, 10000.0},
  };
  std::uint64_t seed = 100;
  for (const DType t : kDTypes) {
    for (const Case& c : cases) {
      INFO("dtype " << dtype_name(t) << " B " << c.b << " S " << c.seq << " H " << c.h << " D "
                    << c.d << " offset " << c.offset << " positions " << c.positions);
      const Input x = random_input({c.b, c.seq, c.h, c.d}, ++seed, t, s);
      Tensor pos_cpu;
      if (c.positions == 1) {
        std::vector<std::int32_t> p(c.seq);
        for (std::int64_t i = 0; i < c.seq; ++i) p[i] = static_cast<std::int32_t>((i * 37) % 4099);
        pos_cpu = Tensor::from_vector<std::int32_t>(p, {c.seq});
      } else if (c.positions == 2) {
        std::vector<std::int64_t> p(c.b * c.seq);
        for (std::int64_t i = 0; i < c.b * c.seq; ++i) p[i] = (i * 7919) % 8191;
        pos_cpu = Tensor::from_vector<std::int64_t>(p, {c.b, c.seq});
      }
      const Tensor pos_gpu = pos_cpu.defined() ? pos_cpu.to(gpu) : Tensor();
      nn::RopeOptions o;
      o.theta = c.theta;
      o.position_offset = c.offset;
      const Tensor y = nn::rope_forward(x.gpu, pos_gpu, o, s);
      const Tensor y_ref = nn::rope_forward(x.cpu, pos_cpu, o, cpu);
      CHECK(y.dtype() == t);
      CHECK_CLOSE(y, y_ref, s, t);
      const Tensor dx = nn::rope_backward(x.gpu, pos_gpu, o, s);
      CHECK_CLOSE(dx, nn::rope_backward(x.cpu, pos_cpu, o, cpu), s, t);
    }
  }
}

TEST_CASE("rope on the GPU rotates the heads of a fused qkv in place") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const std::int64_t B = 2, S = 45, H = 4, D = 64;
  std::uint64_t seed = 500;
  for (const DType t : kDTypes) {
    INFO("dtype " << dtype_name(t));
    const Input qkv = random_input({B, S, 3, H, D}, ++seed, t, s);
    nn::RopeOptions o;
    o.position_offset = 1000;
    for (int g = 0; g < 2; ++g) {
      nn::rope_forward_(nn::fused_qkv_heads(qkv.gpu, g).transpose(1, 2), Tensor(), o, s);
    }
    for (int g = 0; g < 3; ++g) {
      INFO("group " << g);
      const Tensor heads_cpu = nn::fused_qkv_heads(qkv.cpu, g).transpose(1, 2).contiguous();
      const Tensor want = g < 2 ? nn::rope_forward(heads_cpu, Tensor(), o, cpu) : heads_cpu;
      const Tensor got = nn::fused_qkv_heads(qkv.gpu, g).transpose(1, 2).contiguous(s);
      CHECK_CLOSE(got, want, s, t);
    }
    // The backward in place undoes it (up to the rounding of two passes in bf16).
    for (int g = 0; g < 2; ++g) {
      nn::rope_backward_(nn::fused_qkv_heads(qkv.gpu, g).transpose(1, 2), Tensor(), o, s);
    }
    CHECK_CLOSE(qkv.gpu, qkv.cpu, s, t);
  }
}

TEST_CASE("rope on the GPU rotates the key heads of a fused key/value projection in place") {
  // The key heads [B, S, KV, D] of kv [B, S, 2, KV, D] as the attention and the bench take them:
  // strided in S (2 KV D), vectors all the same. Positions [B, S] i64 and an offset; the values
  // stay as they were.
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const Dims cases[] = {{2, 300, 8, 64}, {1, 77, 3, 128}};  // h: the key heads
  std::uint64_t seed = 600;
  for (const DType t : kDTypes) {
    for (const Dims& c : cases) {
      INFO("dtype " << dtype_name(t) << " B " << c.b << " S " << c.seq << " KV " << c.h << " D "
                    << c.d);
      const Input kv = random_input({c.b, c.seq, 2, c.h, c.d}, ++seed, t, s);
      std::vector<std::int64_t> p(c.b * c.seq);
      for (std::int64_t i = 0; i < c.b * c.seq; ++i) p[i] = (i * 613) % 5003;
      const Tensor pos_cpu = Tensor::from_vector<std::int64_t>(p, {c.b, c.seq});
      const Tensor pos_gpu = pos_cpu.to(gpu);
      nn::RopeOptions o;
      o.theta = 500000.0;
      o.position_offset = 250;
      auto key_heads = [](const Tensor& kv) {
        return kv.transpose(0, 2).select(0).transpose(0, 1);
      };
      auto value_heads = [](const Tensor& kv) {
        return kv.transpose(0, 2).select(1).transpose(0, 1);
      };
      nn::rope_forward_(key_heads(kv.gpu), pos_gpu, o, s);
      CHECK_CLOSE(key_heads(kv.gpu).contiguous(s),
                  nn::rope_forward(key_heads(kv.cpu).contiguous(), pos_cpu, o, cpu), s, t);
      CHECK_CLOSE(value_heads(kv.gpu).contiguous(s), value_heads(kv.cpu).contiguous(), s, t);
      nn::rope_backward_(key_heads(kv.gpu), pos_gpu, o, s);
      CHECK_CLOSE(kv.gpu, kv.cpu, s, t);
    }
  }
}

TEST_CASE("rope on the GPU reads heads whose head_dim is strided") {
  // x [B, S, D, H] transposed to [B, S, H, D]: stride H in D, which the kernel takes element by
  // element; H = 40, D = 64 has 1280 items a token, more than a block holds at once (chunks).
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const Dims cases[] = {{2, 9, 8, 32}, {1, 5, 40, 64}};
  std::uint64_t seed = 700;
  for (const DType t : kDTypes) {
    for (const Dims& c : cases) {
      INFO("dtype " << dtype_name(t) << " H " << c.h << " D " << c.d);
      const Input x = random_input({c.b, c.seq, c.d, c.h}, ++seed, t, s);
      nn::RopeOptions o;
      o.position_offset = 11;
      const Tensor y = nn::rope_forward(x.gpu.transpose(2, 3), Tensor(), o, s);
      const Tensor want = nn::rope_forward(x.cpu.transpose(2, 3).contiguous(), Tensor(), o, cpu);
      CHECK_CLOSE(y, want, s, t);
      const Tensor dx = nn::rope_backward(x.gpu.transpose(2, 3), Tensor(), o, s);
      CHECK_CLOSE(dx, nn::rope_backward(x.cpu.transpose(2, 3).contiguous(), Tensor(), o, cpu), s,
                  t);
    }
  }
}

TEST_CASE("rope on the GPU takes heads that do not start on a 16-byte boundary") {
  // x = elements 1 .. D of rows of D + 8: unit stride in D and strides of whole vectors, but every
  // head one element past a 16-byte boundary, which the kernel takes element by element; in place.
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const std::int64_t B = 2, S = 13, H = 4, D = 64;
  std::uint64_t seed = 800;
  for (const DType t : kDTypes) {
    INFO("dtype " << dtype_name(t));
    const Input x = random_input({B, S, H, D + 8}, ++seed, t, s);
    nn::RopeOptions o;
    o.position_offset = 5;
    const Tensor want = nn::rope_forward(x.cpu.narrow(3, 1, D).contiguous(), Tensor(), o, cpu);
    nn::rope_forward_(x.gpu.narrow(3, 1, D), Tensor(), o, s);
    CHECK_CLOSE(x.gpu.narrow(3, 1, D).contiguous(s), want, s, t);
    CHECK_CLOSE(x.gpu.narrow(3, 0, 1).contiguous(s), x.cpu.narrow(3, 0, 1).contiguous(), s, t);
    CHECK_CLOSE(x.gpu.narrow(3, D + 1, 7).contiguous(s), x.cpu.narrow(3, D + 1, 7).contiguous(), s,
                t);
  }
}
