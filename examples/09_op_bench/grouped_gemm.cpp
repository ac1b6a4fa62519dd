// GroupedGemm: see grouped_gemm.hpp.
#include "grouped_gemm.hpp"

#include <array>
#include <climits>
#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>

namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusName(s) + " (" +
                             cublasGetStatusString(s) + ")");
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
  }
}

// cuBLAS's 32-bit interface takes int sizes.
int to_int(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw std::runtime_error(std::string("GroupedGemm: ") + what + " = " + std::to_string(v) +
                             " does not fit cuBLAS's int");
  }
  return static_cast<int>(v);
}

}  // namespace

GroupedGemm::GroupedGemm(const std::vector<GemmProblem>& problems, cudaDataType_t ab_type,
                         cudaDataType_t c_type, float beta, Grouping grouping)
    : ab_type_(ab_type), c_type_(c_type) {
  // The problems of each group, groups in order of first appearance.
  using Shape = std::array<std::int64_t, 8>;
  std::map<Shape, std::size_t> group_of;
  std::vector<std::vector<const GemmProblem*>> members;
  for (const GemmProblem& p : problems) {
    if (p.m == 0 || p.n == 0 || p.k == 0) continue;
    const Shape shape = {p.trans_a, p.trans_b, p.m, p.n, p.k, p.lda, p.ldb, p.ldc};
    const auto found = group_of.find(shape);
    if (grouping == Grouping::by_shape && found != group_of.end()) {
      members[found->second].push_back(&p);
      continue;
    }
    group_of.emplace(shape, members.size());
    members.push_back({&p});
    trans_a_.push_back(p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    trans_b_.push_back(p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    m_.push_back(to_int(p.m, "m"));
    n_.push_back(to_int(p.n, "n"));
    k_.push_back(to_int(p.k, "k"));
    lda_.push_back(to_int(p.lda, "lda"));
    ldb_.push_back(to_int(p.ldb, "ldb"));
    ldc_.push_back(to_int(p.ldc, "ldc"));
    alpha_.push_back(1.0f);
    beta_.push_back(beta);
  }
  std::vector<void*> a, b, c;
  for (const auto& group : members) {
    group_size_.push_back(static_cast<int>(group.size()));
    for (const GemmProblem* p : group) {
      a.push_back(const_cast<void*>(p->a));
      b.push_back(const_cast<void*>(p->b));
      c.push_back(p->c);
      flops_ +=
          2.0 * static_cast<double>(p->m) * static_cast<double>(p->n) * static_cast<double>(p->k);
    }
  }
  problems_ = static_cast<int>(a.size());
  check(cublasCreate(&handle_), "cublasCreate");
  if (problems_ == 0) return;
  const std::size_t count = 3 * static_cast<std::size_t>(problems_);
  check(cudaMallocHost(reinterpret_cast<void**>(&host_ptrs_), count * sizeof(void*)),
        "cudaMallocHost of the pointer arrays");
  check(cudaMalloc(reinterpret_cast<void**>(&device_ptrs_), count * sizeof(void*)),
        "cudaMalloc of the pointer arrays");
  for (int i = 0; i < problems_; ++i) {
    host_ptrs_[i] = a[i];
    host_ptrs_[problems_ + i] = b[i];
    host_ptrs_[2 * problems_ + i] = c[i];
  }
  check(cudaMemcpy(device_ptrs_, host_ptrs_, count * sizeof(void*), cudaMemcpyHostToDevice),
        "cudaMemcpy of the pointer arrays");
}

GroupedGemm::~GroupedGemm() {
  cudaFree(device_ptrs_);
  cudaFreeHost(host_ptrs_);
  cublasDestroy(handle_);
}

cublasStatus_t GroupedGemm::try_run(cudaStream_t stream) {
  if (problems_ == 0) return CUBLAS_STATUS_SUCCESS;
  const cublasStatus_t s = cublasSetStream(handle_, stream);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const void* const* a = device_ptrs_;
  const void* const* b = device_ptrs_ + problems_;
  void* const* c = device_ptrs_ + 2 * static_cast<std::ptrdiff_t>(problems_);
  return cublasGemmGroupedBatchedEx(handle_, trans_a_.data(), trans_b_.data(), m_.data(), n_.data(),
                                    k_.data(), alpha_.data(), a, ab_type_, lda_.data(), b, ab_type_,
                                    ldb_.data(), beta_.data(), c, c_type_, ldc_.data(),
                                    group_count(), group_size_.data(), CUBLAS_COMPUTE_32F);
}

void GroupedGemm::run(cudaStream_t stream) { check(try_run(stream), "cublasGemmGroupedBatchedEx"); }

void GroupedGemm::upload_and_run(cudaStream_t stream) {
  if (problems_ == 0) return;
  check(cudaMemcpyAsync(device_ptrs_, host_ptrs_,
                        3 * static_cast<std::size_t>(problems_) * sizeof(void*),
                        cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync of the pointer arrays");
  run(stream);
}

void GroupedGemm::clear_device_pointers(cudaStream_t stream) {
  if (problems_ == 0) return;
  check(cudaMemsetAsync(device_ptrs_, 0, 3 * static_cast<std::size_t>(problems_) * sizeof(void*),
                        stream),
        "cudaMemsetAsync of the pointer arrays");
}
