// The linear op on the GPU: y = x · wᵀ + b through cuBLASLt (bf16 or f32 inputs, f32
// accumulation, the bias added by cuBLASLt's epilogue), and its backward: dx = dy · w, and the
// weight gradient accumulated in f32 with beta = 1. The bias gradient comes from the same product
// (cuBLASLt's BGRADB epilogue sums dy as the product reads it) into a scratch vector that is then
// added into db, since the epilogue overwrites rather than accumulates; where cuBLASLt has no
// such algorithm, a column-sum kernel reads dy again.
//
// Row-major [rows, cols] buffers are column-major [cols, rows] to cuBLAS, so each row-major
// product below is written as the transposed column-major one.
#include "nn/cuda/cublaslt.hpp"
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

template <class T>
cudaDataType_t cuda_type();
template <>
cudaDataType_t cuda_type<float>() {
  return CUDA_R_32F;
}
template <>
cudaDataType_t cuda_type<bf16>() {
  return CUDA_R_16BF;
}

// y[r, :] = b (or 0): the product of an empty inner dimension.
template <class T>
__global__ void fill_rows_kernel(T* y, const T* b, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    y[i] = b ? b[i % cols] : from_float<T>(0.0f);
  }
}

// db[c] += g[c].
__global__ void add_vector_kernel(float* db, const float* g, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) db[i] += g[i];
}

// db[c] += sum over rows of dy[r, c]. Block (x: 256 columns, y: a chunk of rows); partial sums
// are added with atomics, one per column per chunk.
template <class T>
__global__ void column_sum_kernel(const T* dy, float* db, std::int64_t rows, std::int64_t cols,
                                  std::int64_t chunk) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * chunk;
  const std::int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float sum = 0.0f;
  for (std::int64_t r = r0; r < r1; ++r) sum += to_float(dy[r * cols + c]);
  atomicAdd(db + c, sum);
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                    const Stream& stream) {
  const std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  if (rows == 0 || out == 0) return;
  dispatch_compute(x.dtype(), "linear_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* bias = b.defined() ? ptr<T>(b) : nullptr;
    if (in == 0) {
      fill_rows_kernel<T>
          <<<grid_for(rows * out), kThreads, 0, stream.handle()>>>(ptr<T>(y), bias, rows, out);
      check_launch();
      return;
    }
    // yᵀ [out, rows] = op_T(w as [in, out]) · (x as [in, rows]).
    LtMatmul mm;
    mm.trans_a = true;
    mm.m = out;
    mm.n = rows;
    mm.k = in;
    mm.a = w.data_ptr();
    mm.lda = in;
    mm.b = x.data_ptr();
    mm.ldb = in;
    mm.d = y.data_ptr();
    mm.ldd = out;
    mm.ab_type = mm.d_type = cuda_type<T>();
    mm.bias = bias;
    lt_matmul(mm, stream);
  });
}

void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx,
                           const Stream& stream) {
  const std::int64_t rows = dy.size(0), out = dy.size(1), in = w.size(1);
  if (rows == 0 || in == 0) return;
  if (out == 0) {
    QUINTET_CUDA_CHECK(cudaMemsetAsync(dx.data_ptr(), 0, dx.nbytes(), stream.handle()));
    return;
  }
  dispatch_compute(dy.dtype(), "linear_backward_input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // dxᵀ [in, rows] = (w as [in, out]) · (dy as [out, rows]).
    LtMatmul mm;
    mm.m = in;
    mm.n = rows;
    mm.k = out;
    mm.a = w.data_ptr();
    mm.lda = in;
    mm.b = dy.data_ptr();
    mm.ldb = out;
    mm.d = dx.data_ptr();
    mm.ldd = in;
    mm.ab_type = mm.d_type = cuda_type<T>();
    lt_matmul(mm, stream);
  });
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            bool accumulate_dw, const Stream& stream) {
  const std::int64_t rows = dy.size(0), out = dy.size(1), in = x.size(1);
  if (rows == 0 && !accumulate_dw && dw.numel() > 0) Tensor(dw).fill_(0.0, stream);  // dw = 0
  if (rows == 0 || out == 0) return;
  dispatch_compute(dy.dtype(), "linear_backward_weight", [&](auto tag) {
    using T = typename decltype(tag)::type;
    bool bias_done = false;
    if (in > 0) {
      // dwᵀ [in, out] += (x as [in, rows]) · op_T(dy as [out, rows]), accumulated in f32 (= with
      // !accumulate_dw: beta 0, dw not read).
      LtMatmul mm;
      mm.trans_b = true;
      mm.m = in;
      mm.n = out;
      mm.k = rows;
      mm.a = x.data_ptr();
      mm.lda = in;
      mm.b = dy.data_ptr();
      mm.ldb = out;
      mm.d = dw.data_ptr();
      mm.ldd = in;
      mm.ab_type = cuda_type<T>();
      mm.d_type = CUDA_R_32F;
      mm.beta = accumulate_dw ? 1.0f : 0.0f;
      if (db.defined()) {
        const Tensor g = Tensor::empty({out}, DType::f32, dy.device(), stream);
        mm.bias_grad = g.data_ptr();
        if (try_lt_matmul(mm, stream)) {
          add_vector_kernel<<<grid_for(out), kThreads, 0, stream.handle()>>>(ptr<float>(db),
                                                                             ptr<float>(g), out);
          check_launch();
          bias_done = true;
        }
        mm.bias_grad = nullptr;
      }
      if (!bias_done) lt_matmul(mm, stream);
    }
    if (db.defined() && !bias_done) {
      // Chunks of at least 256 rows, at most 65535 of them (the grid's y limit).
      const std::int64_t chunk = std::max<std::int64_t>(256, (rows + 65534) / 65535);
      const dim3 grid(static_cast<unsigned>((out + kThreads - 1) / kThreads),
                      static_cast<unsigned>((rows + chunk - 1) / chunk));
      column_sum_kernel<T>
          <<<grid, kThreads, 0, stream.handle()>>>(ptr<T>(dy), ptr<float>(db), rows, out, chunk);
      check_launch();
    }
  });
}

}  // namespace quintet::nn::cuda_ops
