// Attention on tensor cores: the scores of a bounded chunk of (batch, head) pairs are
// materialised in f32 by batched cuBLAS GEMMs (bf16 or f32 in, f32 accumulate), a row kernel
// fuses the scale, the causal mask with offsets, the max, the log-sum-exp and the probabilities,
// and more batched GEMMs multiply by v (forward) or form the gradients (backward, which
// recomputes the probabilities from the saved log-sum-exp like flash-attention). See
// attention_gemm.hpp for the contract.
//
// Blocking: (batch, key/value head) pairs in chunks of cb, each chunk's query heads one group
// member at a time (grouped-query attention: member g of every key/value head of the chunk in one
// batched GEMM, so K and V are read in place, never repeated), and query rows in blocks of qn, so
// that one block's scores [cb, qn, kn] (f32, plus the probabilities in the compute dtype) fit in
// kScoreBudget. With as many key/value heads as query heads the group has one member. A causal
// query block only multiplies the keys its last row can see (kn <= Sk), so splitting the queries of
// a causal attention into blocks skips most of the masked half.
//
// cuBLAS is column-major. A row-major [r, c] matrix X with row pitch ld is, to cuBLAS, the
// column-major c×r matrix Xᵀ with leading dimension ld. Per (batch, head), with row-major
// Q [qn, D] (pitch D), K and V [kn, D] (pitch D), S/P/dP/dS [qn, kn] (pitch kn):
//   S = Q·Kᵀ       <=> Sᵀ (kn×qn) = K·Qᵀ: A = K stored as Kᵀ (D×kn) so op_T; B = Q stored as Qᵀ
//                      (D×qn) so op_N: gemm(T, N, m=kn, n=qn, k=D, A=K lda=D, B=Q ldb=D, C=S
//                      ldc=kn). dP = dO·Vᵀ is the same with (V, dO).
//   O = P·V        <=> Oᵀ (D×qn) = Vᵀ·Pᵀ: A = V stored as Vᵀ (D×kn), op_N; B = P stored as Pᵀ
//                      (kn×qn), op_N: gemm(N, N, m=D, n=qn, k=kn, A=V lda=D, B=P ldb=kn, C=O
//                      ldc=D). dQ = dS·K is the same with (K, dS).
//   dV = Pᵀ·dO     <=> dVᵀ (D×kn) = dOᵀ·P: A = dO stored as dOᵀ (D×qn), op_N; B = P stored as Pᵀ
//                      (kn×qn), op_T: gemm(N, T, m=D, n=kn, k=qn, A=dO lda=D, B=P ldb=kn, C=dV
//                      ldc=D). dK = dSᵀ·Q is the same with (Q, dS).
// Batch strides: Q/dO/O/dQ group*Sq*D (a query block starts q0*D into each), K/V/dK/dV Sk*D, the
// score buffers qn*kn (compact).
#include "nn/cuda/attention_gemm.hpp"

#include <algorithm>
#include <climits>
#include <memory>
#include <type_traits>

#include "nn/cuda/cublas_handles.hpp"
#include "nn/cuda/kernel_common.cuh"
#include "quintet/core/allocator.hpp"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

// Bytes of score-side buffers of one block (f32 scores + probabilities in the compute dtype).
constexpr std::int64_t kScoreBudget = std::int64_t{512} << 20;
// A causal attention's query rows are split into blocks of at least this many rows (at most 8
// blocks), so that each block's GEMMs stop at the last key it can see.
constexpr std::int64_t kCausalQueryBlock = 256;

// C = alpha * op(A)·op(B) + beta * C for `batch` matrices, column-major (see the file comment).
struct Gemm {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  std::int64_t batch = 0;
  cudaDataType_t ab_type = CUDA_R_32F;
  cudaDataType_t c_type = CUDA_R_32F;
  float beta = 0.0f;
};

int as_int(std::int64_t v, const char* what) {
  QUINTET_CHECK(v >= 0 && v <= INT_MAX, "attention: GEMM {} = {} exceeds cuBLAS's int range", what,
                v);
  return static_cast<int>(v);
}

void gemm(cublasHandle_t h, const Gemm& g) {
  const float alpha = 1.0f;
  QUINTET_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      as_int(g.m, "m"), as_int(g.n, "n"), as_int(g.k, "k"), &alpha, g.a, g.ab_type,
      as_int(g.lda, "lda"), g.stride_a, g.b, g.ab_type, as_int(g.ldb, "ldb"), g.stride_b, &g.beta,
      g.c, g.c_type, as_int(g.ldc, "ldc"), g.stride_c, as_int(g.batch, "batch"), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

// One block of score rows: the cb (batch, query head) pairs bh0, bh0 + step, ... x query rows
// [q0, q0 + qn), each row kn keys long (also the row pitch of the score buffers).
struct Rows {
  std::int64_t qn, kn, q0;
  std::int64_t sq;    // query rows per (batch, head) of the tensors
  std::int64_t bh0;   // first (batch, query head) pair of the block
  std::int64_t step;  // between the block's (batch, query head) pairs: the group size
  std::int64_t q_offset, k_offset;
  bool causal;
  float scale;
  int d;
};

// Keys [0, visible_keys) of query row i are visible (causal: k_offset + j <= q_offset + i).
__device__ __forceinline__ std::int64_t visible_keys(const Rows& r, std::int64_t i) {
  if (!r.causal) return r.kn;
  const std::int64_t e = r.q_offset + i - r.k_offset + 1;
  return e < 0 ? 0 : (e < r.kn ? e : r.kn);
}

// One block per score row. kForward: lse = log sum_j exp(scale * s_j) over the visible keys
// (written), else lse is read (the backward's merged one). p_j = exp(scale * s_j - lse) for a
// visible key of a row with finite lse, else 0.
template <class T, bool kForward>
__global__ void probs_kernel(const float* s, T* p, float* lse, Rows r) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const std::int64_t i = r.q0 + row % r.qn;
  const std::int64_t g = (r.bh0 + row / r.qn * r.step) * r.sq + i;
  const std::int64_t jend = visible_keys(r, i);
  s += row * r.kn;
  p += row * r.kn;
  float l;
  if (kForward) {
    float m = -INFINITY;
    for (std::int64_t j = threadIdx.x; j < jend; j += blockDim.x) m = fmaxf(m, s[j]);
    m = block_max(m, scratch) * r.scale;  // scale > 0
    if (jend == 0) {                      // uniform over the block
      l = -INFINITY;
    } else {
      float sum = 0.0f;
      for (std::int64_t j = threadIdx.x; j < jend; j += blockDim.x) sum += expf(r.scale * s[j] - m);
      l = m + logf(block_sum(sum, scratch));
    }
    if (threadIdx.x == 0) lse[g] = l;
  } else {
    l = lse[g];
  }
  const bool any = l != -INFINITY;
  for (std::int64_t j = threadIdx.x; j < r.kn; j += blockDim.x) {
    p[j] = from_float<T>(any && j < jend ? expf(r.scale * s[j] - l) : 0.0f);
  }
}

// One block per score row: delta = sum_c dout[g, c] * out[g, c]; then in place over the
// probabilities: ds_j = p_j * (dp_j - delta) * scale (the scale of the scores folded in).
template <class T>
__global__ void dscores_kernel(const float* dp, T* pds, const T* dout, const T* out, Rows r) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const std::int64_t g = (r.bh0 + row / r.qn * r.step) * r.sq + r.q0 + row % r.qn;
  float delta = 0.0f;
  for (int c = threadIdx.x; c < r.d; c += blockDim.x) {
    delta += to_float(dout[g * r.d + c]) * to_float(out[g * r.d + c]);
  }
  delta = block_sum(delta, scratch);
  dp += row * r.kn;
  pds += row * r.kn;
  for (std::int64_t j = threadIdx.x; j < r.kn; j += blockDim.x) {
    pds[j] = from_float<T>(to_float(pds[j]) * (dp[j] - delta) * r.scale);
  }
}

// lse rows of a block whose queries see no key: -inf.
__global__ void fill_lse_kernel(float* lse, Rows r, std::int64_t cb) {
  for (std::int64_t idx = global_index(); idx < cb * r.qn; idx += global_stride()) {
    lse[(r.bh0 + idx / r.qn * r.step) * r.sq + r.q0 + idx % r.qn] = -INFINITY;
  }
}

template <class T>
__global__ void convert_kernel(const float* src, T* dst, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) dst[i] = from_float<T>(src[i]);
}

// The blocking of one call (see the file comment).
struct Plan {
  std::int64_t bh, sq, sk, d;  // bh: (batch, key/value head) pairs
  std::int64_t group;          // query heads per key/value head
  std::int64_t cb = 1;         // (batch, key/value head) pairs per chunk
  std::int64_t qn = 1;         // query rows per block
  std::int64_t q_blocks = 1;   // blocks of query rows: ceil(sq / qn)
  std::int64_t es = 0;         // bytes of one element of the compute dtype
  std::size_t score_bytes = 0, probs_offset = 0, total_bytes = 0;
};

Plan make_plan(const Tensor& q, const Tensor& k, const AttentionOptions& o) {
  Plan p;
  p.group = q.size(1) / k.size(1);
  p.bh = q.size(0) * k.size(1);
  p.sq = q.size(2);
  p.sk = k.size(2);
  p.d = q.size(3);
  p.es = static_cast<std::int64_t>(dtype_size(q.dtype()));
  p.qn = p.sq;
  if (o.causal) {
    const std::int64_t target = std::max(kCausalQueryBlock, (p.sq + 7) / 8);
    // Worth it when the first block sees fewer than all keys.
    if (target < p.sq && o.q_offset + target - o.k_offset < p.sk) p.qn = target;
  }
  const std::int64_t row_bytes = std::max<std::int64_t>(p.sk, 1) * (4 + p.es);
  const std::int64_t max_rows = std::max<std::int64_t>(1, kScoreBudget / row_bytes);
  p.qn = std::max<std::int64_t>(1, std::min(p.qn, max_rows));
  const std::int64_t nq = (p.sq + p.qn - 1) / p.qn;
  p.qn = std::max<std::int64_t>(1, (p.sq + nq - 1) / nq);  // balanced blocks
  p.q_blocks = (p.sq + p.qn - 1) / p.qn;
  const std::int64_t cb_max = std::max<std::int64_t>(1, std::min(p.bh, max_rows / p.qn));
  const std::int64_t chunks = (p.bh + cb_max - 1) / cb_max;
  p.cb = std::max<std::int64_t>(1, (p.bh + chunks - 1) / chunks);
  const std::int64_t scores = p.cb * p.qn * std::max<std::int64_t>(p.sk, 1);
  p.score_bytes = static_cast<std::size_t>(scores) * 4;
  p.probs_offset = (p.score_bytes + 255) / 256 * 256;
  p.total_bytes = p.probs_offset + static_cast<std::size_t>(scores * p.es);
  return p;
}

// Keys the query rows [q0, q0 + qn) can see: [0, kn).
std::int64_t block_keys(const AttentionOptions& o, std::int64_t q0, std::int64_t qn,
                        std::int64_t sk) {
  if (!o.causal) return sk;
  const std::int64_t e = o.q_offset + q0 + qn - o.k_offset;
  return std::max<std::int64_t>(0, std::min(e, sk));
}

// c0: the chunk's first (batch, key/value head) pair; g: the group member.
Rows make_rows(const Plan& p, const AttentionOptions& o, std::int64_t c0, std::int64_t g,
               std::int64_t q0, std::int64_t qn, std::int64_t kn) {
  Rows r;
  r.qn = qn;
  r.kn = kn;
  r.q0 = q0;
  r.sq = p.sq;
  r.bh0 = c0 * p.group + g;
  r.step = p.group;
  r.q_offset = o.q_offset;
  r.k_offset = o.k_offset;
  r.causal = o.causal;
  r.scale = o.scale;
  r.d = static_cast<int>(p.d);
  return r;
}

template <class T>
constexpr cudaDataType_t cuda_type() {
  return std::is_same<T, float>::value ? CUDA_R_32F : CUDA_R_16BF;
}

// Threads of a row kernel over rows of n keys (at least 32, at most 1024).
unsigned threads_for(std::int64_t n) { return static_cast<unsigned>(row_threads(n)); }

void check_grid(std::int64_t blocks) {
  QUINTET_CHECK(blocks <= 0x7fffffff, "attention: {} thread blocks exceed the grid limit", blocks);
}

// Zeroes rows [q0, q0 + qn) of the cb query heads of a block (Rows r) of a [BH, Sq, D] tensor.
void zero_query_rows(void* base, const Plan& p, const Rows& r, std::int64_t cb, std::int64_t q0,
                     std::int64_t qn, const Stream& stream) {
  char* first = static_cast<char*>(base) + ((r.bh0 * p.sq + q0) * p.d) * p.es;
  QUINTET_CUDA_CHECK(cudaMemset2DAsync(first, static_cast<std::size_t>(r.step * p.sq * p.d * p.es),
                                       0, static_cast<std::size_t>(qn * p.d * p.es),
                                       static_cast<std::size_t>(cb), stream.handle()));
}

template <class T>
void forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                  const Tensor& out, const Tensor& lse, const Stream& stream) {
  const Plan p = make_plan(q, k, o);
  const std::shared_ptr<void> ws = cuda_allocate(p.total_bytes, stream.device(), stream);
  float* scores = static_cast<float*>(ws.get());
  T* probs = reinterpret_cast<T*>(static_cast<char*>(ws.get()) + p.probs_offset);
  const cublasHandle_t h = cublas_handle(stream);
  const T *qp = ptr<T>(q), *kp = ptr<T>(k), *vp = ptr<T>(v);
  T* op = ptr<T>(out);
  float* lp = ptr<float>(lse);
  const std::int64_t d = p.d;
  const std::int64_t q_stride = p.group * p.sq * d;  // between the query heads of a block
  for (std::int64_t c0 = 0; c0 < p.bh; c0 += p.cb) {
    const std::int64_t cb = std::min(p.cb, p.bh - c0);
    for (std::int64_t blk = 0; blk < p.group * p.q_blocks; ++blk) {
      const std::int64_t g = blk / p.q_blocks, q0 = blk % p.q_blocks * p.qn;  // member, rows
      const std::int64_t qn = std::min(p.qn, p.sq - q0);
      const std::int64_t kn = block_keys(o, q0, qn, p.sk);
      const Rows r = make_rows(p, o, c0, g, q0, qn, kn);
      const std::int64_t q_first = (r.bh0 * p.sq + q0) * d;
      if (kn == 0) {  // no query row of the block sees a key: out 0, lse -inf
        zero_query_rows(op, p, r, cb, q0, qn, stream);
        fill_lse_kernel<<<grid_for(cb * qn), kThreads, 0, stream.handle()>>>(lp, r, cb);
        check_launch();
        continue;
      }
      Gemm s;  // S = Q·Kᵀ
      s.trans_a = true;
      s.m = kn;
      s.n = qn;
      s.k = d;
      s.a = kp + c0 * p.sk * d;
      s.lda = d;
      s.stride_a = p.sk * d;
      s.b = qp + q_first;
      s.ldb = d;
      s.stride_b = q_stride;
      s.c = scores;
      s.ldc = kn;
      s.stride_c = qn * kn;
      s.batch = cb;
      s.ab_type = cuda_type<T>();
      s.c_type = CUDA_R_32F;
      gemm(h, s);
      check_grid(cb * qn);
      probs_kernel<T, true>
          <<<static_cast<unsigned>(cb * qn), threads_for(kn), 0, stream.handle()>>>(scores, probs,
                                                                                    lp, r);
      check_launch();
      Gemm pv;  // O = P·V
      pv.m = d;
      pv.n = qn;
      pv.k = kn;
      pv.a = vp + c0 * p.sk * d;
      pv.lda = d;
      pv.stride_a = p.sk * d;
      pv.b = probs;
      pv.ldb = kn;
      pv.stride_b = qn * kn;
      pv.c = op + q_first;
      pv.ldc = d;
      pv.stride_c = q_stride;
      pv.batch = cb;
      pv.ab_type = cuda_type<T>();
      pv.c_type = cuda_type<T>();
      gemm(h, pv);
    }
  }
}

template <class T>
void backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const AttentionOptions& o,
                   const Tensor& dq, const Tensor& dk, const Tensor& dv, const Stream& stream) {
  const Plan p = make_plan(q, k, o);
  const std::int64_t d = p.d;
  constexpr bool kF32 = std::is_same<T, float>::value;
  // dk, dv accumulate over the query blocks in f32: in place for f32, else in scratch [cb, Sk, D]
  // f32 buffers converted at the end of each chunk.
  const std::size_t acc_elems = static_cast<std::size_t>(p.cb * p.sk * d);
  const std::size_t acc_offset = (p.total_bytes + 255) / 256 * 256;
  const std::size_t total = kF32 ? p.total_bytes : acc_offset + 2 * acc_elems * sizeof(float);
  const std::shared_ptr<void> ws = cuda_allocate(total, stream.device(), stream);
  float* scores = static_cast<float*>(ws.get());                                   // S, then dP
  T* probs = reinterpret_cast<T*>(static_cast<char*>(ws.get()) + p.probs_offset);  // P, then dS
  float* acc_k_buf =
      kF32 ? nullptr : reinterpret_cast<float*>(static_cast<char*>(ws.get()) + acc_offset);
  float* acc_v_buf = kF32 ? nullptr : acc_k_buf + acc_elems;
  const cublasHandle_t h = cublas_handle(stream);
  const T *qp = ptr<T>(q), *kp = ptr<T>(k), *vp = ptr<T>(v), *dop = ptr<T>(dout),
          *outp = ptr<T>(out);
  T *dqp = ptr<T>(dq), *dkp = ptr<T>(dk), *dvp = ptr<T>(dv);
  float* lp = const_cast<float*>(ptr<float>(lse));  // only read (probs_kernel<T, false>)
  const cudaDataType_t ab = cuda_type<T>();
  const std::int64_t q_stride = p.group * p.sq * d;  // between the query heads of a block
  for (std::int64_t c0 = 0; c0 < p.bh; c0 += p.cb) {
    const std::int64_t cb = std::min(p.cb, p.bh - c0);
    float* acc_k = kF32 ? reinterpret_cast<float*>(dkp + c0 * p.sk * d) : acc_k_buf;
    float* acc_v = kF32 ? reinterpret_cast<float*>(dvp + c0 * p.sk * d) : acc_v_buf;
    const std::size_t chunk_bytes = static_cast<std::size_t>(cb * p.sk * d) * sizeof(float);
    QUINTET_CUDA_CHECK(cudaMemsetAsync(acc_k, 0, chunk_bytes, stream.handle()));
    QUINTET_CUDA_CHECK(cudaMemsetAsync(acc_v, 0, chunk_bytes, stream.handle()));
    // dk, dv sum over every query block of every member of the group.
    for (std::int64_t blk = 0; blk < p.group * p.q_blocks; ++blk) {
      const std::int64_t gm = blk / p.q_blocks, q0 = blk % p.q_blocks * p.qn;  // member, rows
      const std::int64_t qn = std::min(p.qn, p.sq - q0);
      const std::int64_t kn = block_keys(o, q0, qn, p.sk);
      const Rows r = make_rows(p, o, c0, gm, q0, qn, kn);
      if (kn == 0) {  // these queries see no key: dq 0, nothing for dk, dv
        zero_query_rows(dqp, p, r, cb, q0, qn, stream);
        continue;
      }
      const std::int64_t q_first = (r.bh0 * p.sq + q0) * d;
      const T* qb = qp + q_first;
      const T* dob = dop + q_first;
      const T* kb = kp + c0 * p.sk * d;
      const T* vb = vp + c0 * p.sk * d;
      // "scores" form: C (kn×qn) = op_T(A: [kn, D] rows)·(B: [qn, D] rows)ᵀ, f32.
      auto scores_gemm = [&](const T* a, const T* b) {
        Gemm g;
        g.trans_a = true;
        g.m = kn;
        g.n = qn;
        g.k = d;
        g.a = a;
        g.lda = d;
        g.stride_a = p.sk * d;
        g.b = b;
        g.ldb = d;
        g.stride_b = q_stride;
        g.c = scores;
        g.ldc = kn;
        g.stride_c = qn * kn;
        g.batch = cb;
        g.ab_type = ab;
        g.c_type = CUDA_R_32F;
        gemm(h, g);
      };
      // "key-side" form: acc (+)= (X: [qn, D] rows)ᵀ-weighted: C (D×kn) += Xᵀ·probs, f32.
      auto key_grad_gemm = [&](const T* x, float* acc) {
        Gemm g;
        g.trans_b = true;
        g.m = d;
        g.n = kn;
        g.k = qn;
        g.a = x;
        g.lda = d;
        g.stride_a = q_stride;
        g.b = probs;
        g.ldb = kn;
        g.stride_b = qn * kn;
        g.c = acc;
        g.ldc = d;
        g.stride_c = p.sk * d;
        g.batch = cb;
        g.ab_type = ab;
        g.c_type = CUDA_R_32F;
        g.beta = 1.0f;
        gemm(h, g);
      };
      check_grid(cb * qn);
      const unsigned blocks = static_cast<unsigned>(cb * qn);
      scores_gemm(kb, qb);  // S = Q·Kᵀ
      probs_kernel<T, false><<<blocks, threads_for(kn), 0, stream.handle()>>>(scores, probs, lp, r);
      check_launch();
      key_grad_gemm(dob, acc_v);  // dV += Pᵀ·dO
      scores_gemm(vb, dob);       // dP = dO·Vᵀ
      dscores_kernel<T><<<blocks, threads_for(std::max<std::int64_t>(kn, d)), 0, stream.handle()>>>(
          scores, probs, dop, outp, r);
      check_launch();
      Gemm g;  // dQ = dS·K
      g.m = d;
      g.n = qn;
      g.k = kn;
      g.a = kb;
      g.lda = d;
      g.stride_a = p.sk * d;
      g.b = probs;
      g.ldb = kn;
      g.stride_b = qn * kn;
      g.c = dqp + q_first;
      g.ldc = d;
      g.stride_c = q_stride;
      g.batch = cb;
      g.ab_type = ab;
      g.c_type = ab;
      gemm(h, g);
      key_grad_gemm(qb, acc_k);  // dK += dSᵀ·Q
    }
    if (!kF32) {
      const std::int64_t n = cb * p.sk * d;
      convert_kernel<T>
          <<<grid_for(n), kThreads, 0, stream.handle()>>>(acc_k, dkp + c0 * p.sk * d, n);
      check_launch();
      convert_kernel<T>
          <<<grid_for(n), kThreads, 0, stream.handle()>>>(acc_v, dvp + c0 * p.sk * d, n);
      check_launch();
    }
  }
}

}  // namespace

bool attention_gemm_preferred(const Tensor& q) {
  return (q.size(3) * static_cast<std::int64_t>(dtype_size(q.dtype()))) % 16 == 0;
}

void attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionOptions& options, const Tensor& out, const Tensor& lse,
                            const Stream& stream) {
  if (q.size(0) * q.size(1) == 0 || q.size(2) == 0) return;
  dispatch_compute(q.dtype(), "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_impl<T>(q, k, v, options, out, lse, stream);
  });
}

void attention_backward_gemm(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                             const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Stream& stream) {
  if (q.size(0) * q.size(1) == 0) return;
  if (q.size(2) == 0) {  // no query: the key gradients are zero
    QUINTET_CUDA_CHECK(cudaMemsetAsync(dk.data_ptr(), 0, dk.nbytes(), stream.handle()));
    QUINTET_CUDA_CHECK(cudaMemsetAsync(dv.data_ptr(), 0, dv.nbytes(), stream.handle()));
    return;
  }
  dispatch_compute(q.dtype(), "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_impl<T>(dout, q, k, v, out, lse, options, dq, dk, dv, stream);
  });
}

}  // namespace quintet::nn::cuda_ops
