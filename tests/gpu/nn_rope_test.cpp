// RoPE on the GPU against the CPU op, in f32 and bf16: forward and backward, out of place and in
// place on the strided heads of a fused qkv, positions from an offset and from [S] / [B, S] tensors
// (i32, i64), odd lengths and positions in the thousands (the f32 angle path must agree), head
// widths and strides that the vectorized kernel takes and ones it leaves to the scalar kernel.
#include <vector>

#include "gpu/nn_gpu_compare.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {
const DType kDTypes[] = {DType::f32, DType::bf16};
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
  // The vectorized kernel takes halves of whole 16-byte vectors (D / 2 a multiple of 8 in bf16, of
  // 4 in f32) and up to 4 heads a thread (H = 5, 9: heads left over); D = 2, 20 take the scalar
  // one.
  const Case cases[] = {
      {1, 1, 1, 2, 0, 0, 10000.0},     {2, 37, 3, 64, 0, 0, 10000.0},
      {1, 129, 4, 128, 3000, 0, 1e6},  {2, 33, 2, 96, 7, 1, 10000.0},
      {3, 17, 5, 256, 0, 2, 500000.0}, {1, 8, 8, 512, 123, 2, 10000.0},
      {2, 11, 9, 16, 5, 1, 10000.0},   {1, 7, 3, 20, 0, 0, 10000.0},
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

TEST_CASE("rope on the GPU reads heads whose head_dim is strided") {
  // x [B, S, D, H] transposed to [B, S, H, D]: stride H in D, which the scalar kernel takes.
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const std::int64_t B = 2, S = 9, H = 8, D = 32;
  std::uint64_t seed = 700;
  for (const DType t : kDTypes) {
    INFO("dtype " << dtype_name(t));
    const Input x = random_input({B, S, D, H}, ++seed, t, s);
    nn::RopeOptions o;
    o.position_offset = 11;
    const Tensor y = nn::rope_forward(x.gpu.transpose(2, 3), Tensor(), o, s);
    const Tensor want = nn::rope_forward(x.cpu.transpose(2, 3).contiguous(), Tensor(), o, cpu);
    CHECK_CLOSE(y, want, s, t);
  }
}
